//! TODO
/// Placeholder.
pub struct SledStore;
