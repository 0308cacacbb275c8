//! The sled backend's own error type: what sled itself reports, and what
//! the payload files ([`super::payload_files`]) meet. Decoding and fsync
//! failures of sled's log are the crate's [`crate::Error::Corrupt`].

use std::path::PathBuf;

/// A failure inside sled or of a payload file.
#[derive(Debug, thiserror::Error)]
pub enum SledError {
    /// sled reported an error (I/O, a full disk, corruption it detected).
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    /// A payload file (or its folder) could not be written, read or removed.
    #[error("cannot {action} payload file {}: {source}", path.display())]
    PayloadFile {
        /// The file or folder.
        path: PathBuf,
        /// What failed: create, write, fsync, read, remove, list.
        action: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl From<SledError> for crate::Error {
    fn from(err: SledError) -> crate::Error {
        crate::Error::Storage(Box::new(err))
    }
}
