//! TLS for the gRPC listener (`--tls-cert`, `--tls-key`, and
//! `--tls-client-ca` for mTLS), through rustls with the ring provider: no
//! OpenSSL.

use std::path::Path;

use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use crate::{
    config::Config,
    error::{Error, Result},
};

fn read(path: &Path, flag: &str) -> Result<Vec<u8>> {
    let bytes =
        std::fs::read(path).map_err(|e| Error::Io(format!("{flag} {}: {e}", path.display())))?;
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(Error::Io(format!(
            "{flag} {}: not a PEM file (no -----BEGIN line)",
            path.display()
        )));
    }
    Ok(bytes)
}

/// The TLS settings the flags ask for; `None` for plaintext.
///
/// # Errors
/// A certificate without its key (or the reverse), a client CA without a
/// server certificate, a file that cannot be read or is not PEM, or a
/// certificate and key rustls cannot use.
pub fn server_config(config: &Config) -> Result<Option<ServerTlsConfig>> {
    let (cert, key) = match (&config.tls_cert, &config.tls_key) {
        (None, None) => {
            if config.tls_client_ca.is_some() {
                return Err(Error::Io(
                    "--tls-client-ca needs --tls-cert and --tls-key: client certificates are checked during the TLS handshake".into(),
                ));
            }
            return Ok(None);
        }
        (Some(cert), Some(key)) => (cert, key),
        _ => {
            return Err(Error::Io(
                "--tls-cert and --tls-key go together: give both, or neither".into(),
            ))
        }
    };
    // One process-wide crypto provider, chosen here rather than left to
    // rustls' feature detection (which fails when two are compiled in).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let identity = Identity::from_pem(read(cert, "--tls-cert")?, read(key, "--tls-key")?);
    // A TLS handshake must finish within --handshake-timeout too: a peer
    // that sends half a ClientHello does not keep its connection slot.
    let mut tls = ServerTlsConfig::new()
        .identity(identity)
        .timeout(config.handshake_timeout);
    if let Some(ca) = &config.tls_client_ca {
        // Mandatory client certificates: tonic's default is not optional.
        tls = tls
            .client_ca_root(Certificate::from_pem(read(ca, "--tls-client-ca")?))
            .client_auth_optional(false);
    }
    // Parsed now, before the store opens: a swapped or broken certificate
    // or key refuses the start rather than failing after it.
    tonic::transport::Server::builder()
        .tls_config(tls.clone())
        .map_err(|e| Error::Io(format!("TLS: {e}")))?;
    Ok(Some(tls))
}
