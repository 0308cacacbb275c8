//! How the client commands and `jobq work` reach the server: the global
//! `--server`, `--token`, `--insecure`, `--ca-cert`, `--client-cert` and
//! `--client-key`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use jobq_client::{Client, Connect, WorkerBuilder};

/// The connection flags, global to every subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct Conn {
    /// The jobq server to talk to (client commands and `work`); `https://`
    /// for TLS.
    #[arg(
        long,
        global = true,
        env = "JOBQ_SERVER",
        default_value = "http://127.0.0.1:50051"
    )]
    pub server: String,

    /// Bearer token sent with every call (see `jobq token new`). Over
    /// plaintext `http://` it is sent only to this machine (`localhost`,
    /// 127.0.0.0/8, `::1`), unless `--insecure`.
    #[arg(long, global = true, env = "JOBQ_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// Send `--token` over plaintext `http://` to another machine anyway:
    /// anyone on the path can read it and call the server as you. Use an
    /// `https://` `--server` instead where you can. (`jobq serve` has an
    /// `--insecure` of its own, for listening without TLS.)
    #[arg(long, global = true, env = "JOBQ_INSECURE")]
    pub insecure: bool,

    /// CA certificate (PEM) that signed the server's certificate, for
    /// `https://` servers whose CA the system does not trust.
    #[arg(long, global = true, env = "JOBQ_CA_CERT")]
    pub ca_cert: Option<PathBuf>,

    /// Client certificate (PEM) for servers that require one (mTLS).
    #[arg(long, global = true, env = "JOBQ_CLIENT_CERT", requires = "client_key")]
    pub client_cert: Option<PathBuf>,

    /// The client certificate's private key (PEM).
    #[arg(long, global = true, env = "JOBQ_CLIENT_KEY", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
}

fn read(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read the {what} {}", path.display()))
}

impl Conn {
    fn connect_options(&self) -> anyhow::Result<Connect> {
        let mut connect = Client::builder(self.server.clone()).insecure(self.insecure);
        if let Some(token) = &self.token {
            connect = connect.token(token.clone());
        }
        if let Some(ca) = &self.ca_cert {
            connect = connect.ca_cert(read(ca, "CA certificate")?);
        }
        if let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) {
            connect = connect.identity(read(cert, "client certificate")?, read(key, "client key")?);
        }
        Ok(connect)
    }

    /// Connects; a refused connection reads as UNAVAILABLE.
    pub async fn client(&self) -> anyhow::Result<Client> {
        match self.connect_options()?.connect().await {
            Ok(client) => Ok(client),
            // The client's message names the URL and the cause (connection
            // refused, no scheme, a bad certificate).
            Err(err @ jobq_client::Error::Connect { .. }) => {
                Err(tonic::Status::unavailable(err.to_string()).into())
            }
            Err(err) => Err(err).with_context(|| format!("cannot connect to {}", self.server)),
        }
    }

    /// A client that connects on its first call, and again after the
    /// connection breaks (for commands that outlive a server restart).
    pub fn lazy_client(&self) -> anyhow::Result<Client> {
        Ok(self.connect_options()?.connect_lazy()?)
    }

    /// A worker builder for this server, with the token and TLS applied.
    pub fn worker(&self) -> anyhow::Result<WorkerBuilder> {
        let mut builder =
            jobq_client::Worker::builder(self.server.as_str()).insecure(self.insecure);
        if let Some(token) = &self.token {
            builder = builder.token(token.clone());
        }
        if let Some(ca) = &self.ca_cert {
            builder = builder.ca_cert(read(ca, "CA certificate")?);
        }
        if let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) {
            builder = builder.identity(read(cert, "client certificate")?, read(key, "client key")?);
        }
        Ok(builder)
    }
}
