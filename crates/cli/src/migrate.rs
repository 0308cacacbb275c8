//! `jobq migrate`: apply the PostgreSQL store's schema migrations by hand
//! (servers also apply them at startup, under the same advisory lock).

use anyhow::Context;

use crate::output::Out;

/// The flags of `jobq migrate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The PostgreSQL URL (`postgres://user:pass@host/db`).
    #[arg(long, env = "JOBQ_STORE", hide_env_values = true)]
    pub store: String,
}

/// Applies the migrations the database lacks and says which.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let applied = jobq_server::store::postgres::migrate(&args.store)
        .await
        .with_context(|| {
            format!(
                "migrating {}",
                jobq_server::store::postgres::redact(&args.store)
            )
        })?;
    let latest = jobq_server::store::postgres::schema::MIGRATIONS
        .last()
        .map_or(0, |m| m.0);
    if applied.is_empty() {
        Out { json: false }.line(format!("schema is up to date (version {latest})"))?;
    } else {
        let list: Vec<String> = applied.iter().map(ToString::to_string).collect();
        Out { json: false }.line(format!(
            "applied migrations {}; schema at version {latest}",
            list.join(", ")
        ))?;
    }
    Ok(())
}
