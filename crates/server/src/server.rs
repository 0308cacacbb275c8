//! TODO
use crate::config::Config;
/// Placeholder.
pub async fn run(_c: Config) {}
/// Placeholder.
pub async fn serve() {}
