//! `cordon completions bash|zsh|fish`: the shell completion script for the whole command line,
//! generated from the same definitions the parser uses.

use std::process::ExitCode;

use clap::{Args, CommandFactory, ValueEnum};
use clap_complete::Shell;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: ShellArg,
}

/// The shells a script is generated for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ShellArg {
    /// bash (source it, or put it in ~/.local/share/bash-completion/completions/cordon).
    Bash,
    /// zsh (put it as `_cordon` in a directory of $fpath).
    Zsh,
    /// fish (put it in ~/.config/fish/completions/cordon.fish).
    Fish,
}

/// Print the script to stdout.
pub fn completions(args: CompletionsArgs) -> anyhow::Result<ExitCode> {
    let shell = match args.shell {
        ShellArg::Bash => Shell::Bash,
        ShellArg::Zsh => Shell::Zsh,
        ShellArg::Fish => Shell::Fish,
    };
    let mut command = crate::args::Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "cordon", &mut script);
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&script)
        .and_then(|()| stdout.flush())
        .map_err(|error| anyhow::anyhow!("failed to write the completion script: {error}"))?;
    Ok(ExitCode::SUCCESS)
}
