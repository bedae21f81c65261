//! The CLI's log subscriber: where `tracing` events (Cordon's own and, bridged from `log`,
//! those of russh, bollard and reqwest) go and which of them show. Logs never reach stdout:
//! stdout carries `--json` results and, for `cordon mcp`, the protocol itself.
//!
//! The level: `-v` info, `-vv` debug, `-vvv` trace, warn without a flag. `CORDON_LOG` (or,
//! when it is unset, `RUST_LOG`) adds `EnvFilter` directives on top (`cordon_remote=trace`,
//! `russh=debug,info`); a bare level there replaces the one the flags chose.
//!
//! It does not decide what is logged: the library crates emit their own events.

use std::path::Path;
use std::sync::Mutex;

use tracing_subscriber::filter::{EnvFilter, LevelFilter};
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::util::SubscriberInitExt;

/// Why logging could not be set up (a configuration error: exit 2).
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// `CORDON_LOG`/`RUST_LOG` holds a directive `EnvFilter` rejects.
    #[error(
        "failed to parse {variable} ({value:?}): {source}; write directives such as `debug` or `cordon_remote=trace,info`"
    )]
    Filter {
        /// The variable read.
        variable: &'static str,
        /// Its value.
        value: String,
        /// The parser's reason.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// `--log-file` could not be opened safely.
    #[error("failed to open the log file: {0}")]
    File(#[from] cordon_core::hostfile::HostFileError),
    /// Another subscriber is already installed (cannot happen in the binary).
    #[error("failed to install the log subscriber: {0}")]
    Install(#[from] tracing_subscriber::util::TryInitError),
}

/// The level `-v` repeated `verbose` times selects.
pub fn level_for(verbose: u8) -> LevelFilter {
    match verbose {
        0 => LevelFilter::WARN,
        1 => LevelFilter::INFO,
        2 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

/// The filter variable in force and its value: `CORDON_LOG` when set, else `RUST_LOG` (an
/// empty value counts as unset).
fn filter_variable(get: impl Fn(&'static str) -> Option<String>) -> Option<(&'static str, String)> {
    ["CORDON_LOG", "RUST_LOG"].into_iter().find_map(|name| {
        get(name)
            .filter(|value| !value.trim().is_empty())
            .map(|value| (name, value))
    })
}

/// Build the filter: the flags' level as the default, the variable's directives on top.
fn build_filter(
    verbose: u8,
    get: impl Fn(&'static str) -> Option<String>,
) -> Result<EnvFilter, LogError> {
    let builder = EnvFilter::builder().with_default_directive(level_for(verbose).into());
    match filter_variable(get) {
        Some((variable, value)) => builder.parse(&value).map_err(|source| LogError::Filter {
            variable,
            value,
            source,
        }),
        None => Ok(builder.parse_lossy("")),
    }
}

/// Install the process-wide subscriber: events to stderr, or appended to `log_file` (opened
/// without following a symlink, never blocking on a FIFO, created 0600).
pub fn init(verbose: u8, log_file: Option<&Path>) -> Result<(), LogError> {
    let filter = build_filter(verbose, |name| std::env::var(name).ok())?;
    let writer = match log_file {
        Some(path) => {
            let file =
                cordon_core::hostfile::open_write(path, cordon_core::hostfile::WriteMode::Append)?;
            BoxMakeWriter::new(Mutex::new(file))
        }
        None => BoxMakeWriter::new(std::io::stderr),
    };
    // `try_init` also routes `log` records (russh, bollard, reqwest) into this subscriber.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .finish()
        .try_init()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(
        pairs: &'a [(&'static str, &'a str)],
    ) -> impl Fn(&'static str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        }
    }

    #[test]
    fn flags_choose_the_level() {
        assert_eq!(level_for(0), LevelFilter::WARN);
        assert_eq!(level_for(1), LevelFilter::INFO);
        assert_eq!(level_for(2), LevelFilter::DEBUG);
        assert_eq!(level_for(3), LevelFilter::TRACE);
        assert_eq!(level_for(9), LevelFilter::TRACE);
    }

    #[test]
    fn cordon_log_wins_over_rust_log() {
        assert_eq!(
            filter_variable(env(&[("RUST_LOG", "trace"), ("CORDON_LOG", "info")])),
            Some(("CORDON_LOG", "info".to_owned()))
        );
        assert_eq!(
            filter_variable(env(&[("RUST_LOG", "trace")])),
            Some(("RUST_LOG", "trace".to_owned()))
        );
        assert_eq!(filter_variable(env(&[])), None);
        assert_eq!(
            filter_variable(env(&[("CORDON_LOG", " "), ("RUST_LOG", "debug")])),
            Some(("RUST_LOG", "debug".to_owned()))
        );
    }

    #[test]
    fn filter_levels() {
        let max = |verbose, pairs| build_filter(verbose, env(pairs)).map(|f| f.max_level_hint());
        assert_eq!(max(0, &[]).ok().flatten(), Some(LevelFilter::WARN));
        assert_eq!(max(2, &[]).ok().flatten(), Some(LevelFilter::DEBUG));
        // A target directive adds to the flags' level; a bare level replaces it.
        assert_eq!(
            max(0, &[("RUST_LOG", "russh=trace")]).ok().flatten(),
            Some(LevelFilter::TRACE)
        );
        assert_eq!(
            max(3, &[("CORDON_LOG", "error")]).ok().flatten(),
            Some(LevelFilter::ERROR)
        );
    }

    #[test]
    fn a_bad_directive_is_an_error_naming_the_variable() {
        let error = build_filter(0, env(&[("CORDON_LOG", "cordon=loud")])).unwrap_err();
        assert!(
            error.to_string().starts_with("failed to parse CORDON_LOG"),
            "{error}"
        );
    }
}
