//! `jobq completions SHELL`: the shell completion script, on stdout.

use std::io::Write;

use clap::CommandFactory;

use crate::cli::Cli;

/// A shell `jobq completions` writes a script for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    /// `source <(jobq completions bash)`, or save it under
    /// `/etc/bash_completion.d/jobq`.
    Bash,
    /// Save it as `_jobq` in a directory of `$fpath`.
    Zsh,
    /// Save it as `~/.config/fish/completions/jobq.fish`.
    Fish,
}

/// Options of `jobq completions`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: Shell,
}

/// Runs `jobq completions`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut out = Vec::new();
    write(args.shell, &mut out);
    std::io::stdout().lock().write_all(&out)?;
    Ok(())
}

/// Writes the script for `shell` to `out`.
pub fn write(shell: Shell, out: &mut impl Write) {
    let mut cmd = Cli::command();
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(shell, &mut cmd, "jobq", out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shell_gets_a_script_naming_the_subcommands() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let mut out = Vec::new();
            write(shell, &mut out);
            let text = String::from_utf8(out).unwrap();
            for sub in ["enqueue", "list", "cancel", "work", "completions"] {
                assert!(text.contains(sub), "{shell:?} script lacks {sub}");
            }
            assert!(
                !text.contains(crate::watchdog::SUBCOMMAND),
                "{shell:?} script offers the internal watchdog"
            );
        }
    }
}
