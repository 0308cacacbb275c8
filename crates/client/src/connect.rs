//! How a [`Client`] reaches its server: the URL, a bearer token, and TLS
//! (a CA to trust, a client identity for mTLS). [`Connect`] is the builder;
//! [`Credentials`] is the interceptor that adds the token to every call.

use std::{fmt, time::Duration};

use tonic::{
    metadata::{Ascii, MetadataValue},
    service::Interceptor,
    transport::{Certificate, ClientTlsConfig, Endpoint, Identity},
    Request, Status,
};

use crate::{Client, Error, Result};

/// Adds `authorization: Bearer <token>` to every call (or nothing).
#[derive(Clone, Default)]
pub struct Credentials {
    bearer: Option<MetadataValue<Ascii>>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the secret.
        f.debug_struct("Credentials")
            .field("token", &self.bearer.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Credentials {
    /// No token.
    pub fn none() -> Self {
        Self::default()
    }

    /// A bearer token.
    ///
    /// # Errors
    /// [`Error::Config`] when the token has characters a header cannot carry.
    pub fn bearer(token: &str) -> Result<Self> {
        let value = format!("Bearer {}", token.trim())
            .parse()
            .map_err(|_| Error::Config("the token has characters a header cannot carry".into()))?;
        Ok(Self {
            bearer: Some(value),
        })
    }
}

impl Interceptor for Credentials {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        if let Some(value) = &self.bearer {
            req.metadata_mut().insert("authorization", value.clone());
        }
        Ok(req)
    }
}

/// Connection options for a [`Client`]; start with [`Client::builder`].
///
/// `https://` URLs use TLS: the server's certificate is checked against
/// [`ca_cert`](Self::ca_cert) if given, else against the system's roots.
/// A token is not sent over plaintext `http://` to another machine unless
/// [`insecure`](Self::insecure) says so.
#[derive(Clone)]
pub struct Connect {
    url: String,
    token: Option<String>,
    insecure: bool,
    ca_cert: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    domain: Option<String>,
    timeout: Option<Duration>,
}

impl fmt::Debug for Connect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connect")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("insecure", &self.insecure)
            .field("ca_cert", &self.ca_cert.is_some())
            .field("identity", &self.identity.is_some())
            .field("domain", &self.domain)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Connect {
    pub(crate) fn new(url: String) -> Self {
        Self {
            url,
            token: None,
            insecure: false,
            ca_cert: None,
            identity: None,
            domain: None,
            timeout: None,
        }
    }

    /// Most time each call may take, Lease streams aside (they last as long
    /// as the worker) and a Dequeue's `wait` on top: past it the call fails
    /// with `DEADLINE_EXCEEDED`, and the server, told by the `grpc-timeout`
    /// header, gives up on what it has not begun to commit. Default: none;
    /// zero is refused when connecting. A timed-out Enqueue may still have
    /// happened: retry it with a `key`. A [`Worker`](crate::Worker) bounds
    /// its own calls too; on a client with a shorter timeout, that one
    /// applies to its acks and heartbeats as well.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sends `authorization: Bearer <token>` with every call.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        // An empty token (an unset `$JOBQ_TOKEN` read as "") is no token,
        // as in the Python client, not a malformed `Bearer ` header.
        let token = token.into();
        self.token = (!token.trim().is_empty()).then_some(token);
        self
    }

    /// Lets the token travel over plaintext `http://` to a host that is
    /// not this machine (anyone on the path can read it, and call the
    /// server as you). Without it, connecting with a token to an `http://`
    /// URL whose host is not `localhost` or a loopback address
    /// (127.0.0.0/8, `::1`) is refused before anything is sent. Default:
    /// false. Use `https://` instead where you can.
    pub fn insecure(mut self, insecure: bool) -> Self {
        self.insecure = insecure;
        self
    }

    /// Trusts this CA (PEM) for the server's certificate.
    pub fn ca_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_cert = Some(pem.into());
        self
    }

    /// Presents this certificate chain and key (PEM) to a server that asks
    /// for client certificates (mTLS).
    pub fn identity(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// The name the server's certificate must carry, when it differs from
    /// the URL's host.
    pub fn domain(mut self, name: impl Into<String>) -> Self {
        self.domain = Some(name.into());
        self
    }

    /// HTTP/2 keepalive, so a server that vanished without a FIN (power
    /// loss, network partition) is noticed by the open Lease stream instead
    /// of it hanging forever; TLS when the URL is `https://`.
    fn endpoint(&self) -> Result<Endpoint> {
        // tonic takes `127.0.0.1:50051` as a URI and fails later with a bare
        // "transport error"; say what is wrong instead.
        if !self.url.contains("://") {
            return Err(self.error(
                format!("the URL has no scheme; did you mean http://{}?", self.url),
                None,
            ));
        }
        let mut endpoint = Endpoint::from_shared(self.url.clone())
            .map_err(|e| self.error(crate::error::chain(&e), None))?
            .connect_timeout(Duration::from_secs(5))
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(20))
            .keep_alive_while_idle(true);
        let tls_asked = self.ca_cert.is_some() || self.identity.is_some() || self.domain.is_some();
        if self.url.starts_with("https://") {
            let mut tls = ClientTlsConfig::new();
            tls = match &self.ca_cert {
                Some(pem) => tls.ca_certificate(Certificate::from_pem(pem)),
                None => tls.with_native_roots(),
            };
            if let Some((cert, key)) = &self.identity {
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            if let Some(domain) = &self.domain {
                tls = tls.domain_name(domain.clone());
            }
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| self.error(crate::error::chain(&e), None))?;
        } else if tls_asked {
            return Err(Error::Config(format!(
                "a CA, a client certificate or a TLS domain was given, but {} is not an https:// URL",
                self.url
            )));
        }
        Ok(endpoint)
    }

    /// `source` is set for a failure to reach the server (worth retrying),
    /// and not for settings that cannot work.
    fn error(&self, cause: String, source: Option<tonic::transport::Error>) -> Error {
        Error::Connect {
            url: self.url.clone(),
            cause,
            source,
        }
    }

    fn transport_error(&self, err: tonic::transport::Error) -> Error {
        let chain = crate::error::chain(&err);
        // tonic's own top level says nothing the causes do not.
        let cause = chain.strip_prefix("transport error: ").unwrap_or(&chain);
        self.error(cause.to_owned(), Some(err))
    }

    fn check_timeout(&self) -> Result<()> {
        if self.timeout == Some(Duration::ZERO) {
            return Err(Error::Config(
                "a zero timeout would fail every call; leave it unset for none".into(),
            ));
        }
        Ok(())
    }

    /// The token's header; refused, before anything is sent, for a token
    /// that would travel in clear to another machine.
    fn credentials(&self) -> Result<Credentials> {
        let Some(token) = &self.token else {
            return Ok(Credentials::none());
        };
        if !self.insecure {
            if let Some(host) = crate::loopback::plaintext_remote(&self.url) {
                return Err(Error::Config(format!(
                    "refusing to send the token in clear to {host}: {} is plaintext http:// and \
                     {host} is not this machine; use https://, or allow it with \
                     insecure(true) (the CLI's --insecure)",
                    self.url
                )));
            }
        }
        Credentials::bearer(token)
    }

    /// Connects now.
    ///
    /// # Errors
    /// [`Error::Connect`] (naming the URL and the cause) when the URL or TLS
    /// settings are malformed or nothing answers; [`Error::Config`] for a bad
    /// token, or one that would travel in clear (see [`insecure`](Self::insecure)).
    pub async fn connect(self) -> Result<Client> {
        self.check_timeout()?;
        let credentials = self.credentials()?;
        let channel = self
            .endpoint()?
            .connect()
            .await
            .map_err(|e| self.transport_error(e))?;
        Ok(Client::with_credentials(channel, credentials)
            .with_timeout(self.timeout)
            .with_url(&self.url))
    }

    /// Connects on first use, so it succeeds while the server is still
    /// down; calls made before it is up fail with `UNAVAILABLE`.
    ///
    /// # Errors
    /// As [`connect`](Self::connect), except that nothing is dialled yet.
    pub fn connect_lazy(self) -> Result<Client> {
        self.check_timeout()?;
        let credentials = self.credentials()?;
        Ok(
            Client::with_credentials(self.endpoint()?.connect_lazy(), credentials)
                .with_timeout(self.timeout)
                .with_url(&self.url),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Connect;

    #[tokio::test]
    async fn a_zero_timeout_is_refused_and_a_huge_one_is_clamped() {
        let zero = Connect::new("http://127.0.0.1:1".into()).timeout(std::time::Duration::ZERO);
        let err = zero.connect_lazy().expect_err("zero");
        assert!(err.to_string().contains("zero timeout"), "{err}");
        let huge = Connect::new("http://127.0.0.1:1".into()).timeout(std::time::Duration::MAX);
        let client = huge.connect_lazy().expect("huge");
        // tonic panics on a timeout grpc-timeout cannot say.
        let _ = client.request(());
    }

    #[test]
    fn tls_settings_on_a_plaintext_url_are_refused_not_ignored() {
        for connect in [
            Connect::new("http://127.0.0.1:1".into()).domain("jobs.internal"),
            Connect::new("http://127.0.0.1:1".into()).ca_cert(b"pem".to_vec()),
        ] {
            let err = connect.endpoint().expect_err("plaintext with TLS settings");
            assert!(err.to_string().contains("not an https:// URL"), "{err}");
        }
        assert!(Connect::new("https://127.0.0.1:1".into())
            .domain("jobs.internal")
            .endpoint()
            .is_ok());
    }

    #[tokio::test]
    async fn a_token_is_not_sent_in_clear_to_another_machine() {
        // 192.0.2.0/24 is TEST-NET-1: nothing answers there, so a refusal
        // that came from dialling would take the connect timeout, not be
        // at once and say why.
        for url in ["http://192.0.2.1:50051", "http://jobs.internal:50051"] {
            let with_token = || Connect::new(url.into()).token("s3cret");
            let err = with_token().connect_lazy().expect_err(url);
            assert!(
                matches!(&err, crate::Error::Config(m) if m.contains("refusing to send the token in clear") && m.contains("insecure")),
                "{url}: {err}"
            );
            let started = std::time::Instant::now();
            let err = with_token().connect().await.expect_err(url);
            assert!(matches!(err, crate::Error::Config(_)), "{url}: {err}");
            assert!(started.elapsed() < std::time::Duration::from_secs(1));
            // Said so: allowed. Without a token: nothing to protect.
            assert!(with_token().insecure(true).connect_lazy().is_ok(), "{url}");
            assert!(Connect::new(url.into()).connect_lazy().is_ok(), "{url}");
        }
        for url in [
            "http://127.0.0.1:50051",
            "http://127.0.0.2:50051",
            "http://localhost:50051",
            "http://[::1]:50051",
            "https://jobs.internal:50051",
        ] {
            let connect = Connect::new(url.into()).token("s3cret");
            assert!(connect.connect_lazy().is_ok(), "{url}");
        }
    }

    #[test]
    fn an_empty_token_is_no_token() {
        assert_eq!(
            Connect::new("http://127.0.0.1:1".into()).token("").token,
            None
        );
        assert_eq!(
            Connect::new("http://127.0.0.1:1".into()).token("  ").token,
            None
        );
        assert_eq!(
            Connect::new("http://127.0.0.1:1".into())
                .token("s3cret")
                .token,
            Some("s3cret".to_owned())
        );
    }
}
