//! A throwaway PKI for the TLS tests (rcgen): a CA, a server certificate
//! for `localhost` and 127.0.0.1, and a client certificate; and a tokens
//! file. Everything is written as PEM into a temporary folder.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// PEM files of one CA and the certificates it signed.
pub struct Pki {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

fn write(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, pem).expect("write PEM");
    path
}

impl Pki {
    /// A new CA named `name` and its certificates, in `dir/<name>-*.pem`.
    pub fn new(dir: &Path, name: &str) -> Pki {
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, format!("jobq test CA {name}"));
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("CA key"))
            .expect("self-sign the CA");

        let server_key = KeyPair::generate().expect("server key");
        let mut server = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        server
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().expect("ip")));
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_cert = server.signed_by(&server_key, &ca).expect("sign server");

        let client_key = KeyPair::generate().expect("client key");
        let mut client = CertificateParams::new(Vec::<String>::new()).expect("params");
        client
            .distinguished_name
            .push(DnType::CommonName, format!("worker of {name}"));
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_cert = client.signed_by(&client_key, &ca).expect("sign client");

        Pki {
            ca: write(dir, &format!("{name}-ca.pem"), &ca.pem()),
            server_cert: write(dir, &format!("{name}-server.pem"), &server_cert.pem()),
            server_key: write(
                dir,
                &format!("{name}-server.key"),
                &server_key.serialize_pem(),
            ),
            client_cert: write(dir, &format!("{name}-client.pem"), &client_cert.pem()),
            client_key: write(
                dir,
                &format!("{name}-client.key"),
                &client_key.serialize_pem(),
            ),
        }
    }

    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(&self.ca).expect("read CA")
    }

    pub fn client_identity(&self) -> (Vec<u8>, Vec<u8>) {
        (
            std::fs::read(&self.client_cert).expect("read client cert"),
            std::fs::read(&self.client_key).expect("read client key"),
        )
    }
}

/// Writes a tokens file: each (name, secret, roles, queues).
pub fn tokens_file(path: &Path, tokens: &[(&str, &str, &[&str], &[&str])]) {
    let quote = |xs: &[&str]| {
        xs.iter()
            .map(|x| format!("\"{x}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let text: String = tokens
        .iter()
        .map(|(name, secret, roles, queues)| {
            format!(
                "[[token]]\nname = \"{name}\"\nsha256 = \"{}\"\nqueues = [{}]\nroles = [{}]\n\n",
                jobq_server::auth::digest_hex(secret),
                quote(queues),
                quote(roles)
            )
        })
        .collect();
    // Atomically (a temporary file renamed over it), as an operator
    // should: a SIGHUP for an earlier change may make the server read the
    // file at any moment, and a file caught half-written (truncated, so
    // empty) reads as a valid file with no tokens.
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, text).expect("write tokens file");
    std::fs::rename(&tmp, path).expect("move tokens file into place");
}
