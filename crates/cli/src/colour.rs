//! Whether stdout gets ANSI colours: `--color auto|always|never` beside `NO_COLOR`. `auto`
//! (the default) colours a terminal when `NO_COLOR` is unset (or empty) and `TERM` is not
//! `dumb`; `always` and `never` are what they say, whatever the environment. The choice is
//! made once per process, from the global flag, before a subcommand runs.

use std::io::IsTerminal as _;
use std::sync::OnceLock;

use clap::ValueEnum;

/// The `--color` flag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    /// Colour a terminal unless NO_COLOR is set or TERM is dumb.
    #[default]
    Auto,
    /// Always colour.
    Always,
    /// Never colour.
    Never,
}

static CHOICE: OnceLock<ColorChoice> = OnceLock::new();

/// Record the process's choice (the first call wins; later ones change nothing).
pub fn init(choice: ColorChoice) {
    if CHOICE.set(choice).is_err() {
        tracing::debug!(?choice, "colour choice already made; keeping the first");
    }
}

/// Whether to colour stdout.
pub fn stdout_enabled() -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
    let dumb = std::env::var("TERM").is_ok_and(|term| term == "dumb");
    decide(
        CHOICE.get().copied().unwrap_or_default(),
        std::io::stdout().is_terminal(),
        no_color,
        dumb,
    )
}

/// The decision, from its inputs.
pub fn decide(choice: ColorChoice, is_terminal: bool, no_color: bool, dumb: bool) -> bool {
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => is_terminal && !no_color && !dumb,
    }
}

/// `text` in the SGR colour `code` (`32` green, …) when `enabled`, else as it is.
pub fn paint(text: &str, code: &str, enabled: bool) -> String {
    if enabled {
        format!("\x1b[{code}m{text}\x1b[0m")
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_needs_a_terminal_without_no_color_or_a_dumb_term() {
        use ColorChoice::*;
        assert!(decide(Auto, true, false, false));
        assert!(!decide(Auto, false, false, false));
        assert!(!decide(Auto, true, true, false));
        assert!(!decide(Auto, true, false, true));
        assert!(decide(Always, false, true, true));
        assert!(!decide(Never, true, false, false));
        assert_eq!(paint("ok", "32", true), "\x1b[32mok\x1b[0m");
        assert_eq!(paint("ok", "32", false), "ok");
    }
}
