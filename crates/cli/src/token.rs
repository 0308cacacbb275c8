//! `jobq token new NAME --roles … --queues …`: a fresh secret, shown once,
//! and the `[[token]]` entry to paste into the `--auth-tokens` file.

use anyhow::{bail, Context};
use jobq_server::auth::{digest_hex, Role, Tokens};
use rand::{rngs::OsRng, TryRngCore};

use crate::output::Out;

/// `jobq token …`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The token subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Make a new token: prints its secret (once) and its TOML entry.
    New(NewArgs),
}

/// `jobq token new`.
#[derive(Debug, clap::Args)]
pub struct NewArgs {
    /// The token's name (recorded as the owner of the leases it takes).
    pub name: String,
    /// Roles, comma-separated: produce, consume, read, admin.
    #[arg(long, value_delimiter = ',', required = true)]
    pub roles: Vec<Role>,
    /// Queue globs, comma-separated (`emails,billing.*`, or `*` for all).
    #[arg(long, value_delimiter = ',', required = true)]
    pub queues: Vec<String>,
}

/// 256 bits from the operating system's generator, as hex.
fn fresh_secret() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    OsRng
        .try_fill_bytes(&mut bytes)
        .context("the operating system's random generator failed")?;
    Ok(format!(
        "jobq_{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

fn quoted(s: &str) -> anyhow::Result<String> {
    if s.chars().any(|c| c == '"' || c == '\\' || c.is_control()) {
        bail!("{s:?}: quotes, backslashes and control characters are not allowed");
    }
    Ok(format!("\"{s}\""))
}

/// Runs `jobq token …`.
pub fn run(out: Out, args: Args) -> anyhow::Result<()> {
    let Command::New(args) = args.command;
    let secret = fresh_secret()?;
    let sha256 = digest_hex(&secret);
    let list = |items: Vec<String>| -> anyhow::Result<String> {
        Ok(items
            .iter()
            .map(|s| quoted(s))
            .collect::<anyhow::Result<Vec<_>>>()?
            .join(", "))
    };
    let roles: Vec<String> = args.roles.iter().map(|r| r.as_str().to_owned()).collect();
    let entry = format!(
        "[[token]]\nname = {}\nsha256 = \"{sha256}\"\nqueues = [{}]\nroles = [{}]\n",
        quoted(&args.name)?,
        list(args.queues.clone())?,
        list(roles)?,
    );
    // What we print must be what the server accepts.
    Tokens::parse(&entry).context("the entry would not be accepted")?;
    if out.json {
        let value = serde_json::json!({
            "name": args.name,
            "secret": secret,
            "sha256": sha256,
            "toml": entry,
        });
        out.json(&value)?;
    } else {
        out.line(format!(
            "secret (shown only now; give it to the caller, e.g. as JOBQ_TOKEN):\n\n  {secret}\n"
        ))?;
        out.line(format!(
            "add this to the --auth-tokens file, then `kill -HUP` the server:\n\n{entry}"
        ))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_long_and_fresh() {
        let (a, b) = (fresh_secret().unwrap(), fresh_secret().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), "jobq_".len() + 64);
    }
}
