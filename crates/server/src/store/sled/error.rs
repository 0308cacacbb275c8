//! The sled backend's own error type: what sled itself reports. Decoding
//! and fsync failures are the crate's [`crate::Error::Corrupt`].

/// A failure inside sled.
#[derive(Debug, thiserror::Error)]
pub enum SledError {
    /// sled reported an error (I/O, a full disk, corruption it detected).
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
}

impl From<SledError> for crate::Error {
    fn from(err: SledError) -> crate::Error {
        crate::Error::Storage(Box::new(err))
    }
}
