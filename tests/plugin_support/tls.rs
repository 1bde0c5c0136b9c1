//! TLS with client-certificate authentication for the fake API server, as kube-apiserver
//! serves it: a throw-away CA signs a serving certificate for 127.0.0.1 and a client
//! certificate (`CN=system:node:<node>`, `O=system:nodes`); the server refuses a handshake
//! without a client certificate the CA signed.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::TlsAcceptor;

/// The server side and what a client needs to reach it.
pub struct Tls {
    /// Accepts connections, verifying the client's certificate.
    pub acceptor: TlsAcceptor,
    /// What the client needs.
    pub client: ClientPems,
}

/// What a client needs to reach a server [`Tls`] serves: PEM texts for its kubeconfig.
#[derive(Clone, Debug)]
pub struct ClientPems {
    /// The CA (`certificate-authority-data`).
    pub ca: String,
    /// The client's certificate (`client-certificate-data`).
    pub cert: String,
    /// The client's key (`client-key-data`).
    pub key: String,
}

/// A kubeconfig for the fake API server at `addr`, the one both test servers write: plain
/// HTTP without credentials when `tls` is `None`, otherwise HTTPS with the server's CA and
/// the client's certificate and key.
pub fn kubeconfig(addr: std::net::SocketAddr, tls: Option<&ClientPems>) -> String {
    use base64::Engine as _;
    let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
    let (scheme, cluster_tls, user) = match tls {
        None => ("http", String::new(), "{}".to_string()),
        Some(t) => (
            "https",
            format!("\n    certificate-authority-data: {}", b64(&t.ca)),
            format!(
                "\n    client-certificate-data: {}\n    client-key-data: {}",
                b64(&t.cert),
                b64(&t.key)
            ),
        ),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {scheme}://{addr}{cluster_tls}\n\
         contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
         current-context: fake\nusers:\n- name: fake\n  user: {user}\n"
    )
}

impl Tls {
    /// A fresh CA with a serving certificate for `127.0.0.1`/`localhost` and a client
    /// certificate for node `node`.
    pub fn generate(node: &str) -> Tls {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "gpu-dra-test-ca");
        let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca, ca_key);

        let server_key = KeyPair::generate().expect("server key");
        let server = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("server params")
            .signed_by(&server_key, &issuer)
            .expect("server certificate");

        let client_key = KeyPair::generate().expect("client key");
        let mut client = CertificateParams::new(Vec::<String>::new()).expect("client params");
        client
            .distinguished_name
            .push(DnType::CommonName, format!("system:node:{node}"));
        client
            .distinguished_name
            .push(DnType::OrganizationName, "system:nodes");
        let client_cert = client
            .signed_by(&client_key, &issuer)
            .expect("client certificate");

        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca_cert.der().clone()).expect("CA root");
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::clone(&provider),
        )
        .build()
        .expect("client verifier");
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der()));
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![CertificateDer::from(server.der().to_vec())], key)
            .expect("server config");
        Tls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            client: ClientPems {
                ca: ca_cert.pem(),
                cert: client_cert.pem(),
                key: client_key.serialize_pem(),
            },
        }
    }
}
