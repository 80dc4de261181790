//! TLS termination on the client listener (rustls, ring provider).
//!
//! The certificate chain and key are PEM files named by `[server] tls`. They
//! are read at start and again on every policy reload, so an operator rotates
//! a certificate by replacing the files and reloading (SIGHUP, a change to the
//! policy file, or `POST /admin/reload`); connections already open keep the
//! configuration they were accepted with. ALPN offers `h2` then `http/1.1`.

use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use std::path::Path;

/// How long a client may take to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{section}.cert {path}: {msg}")]
    Cert {
        section: &'static str,
        path: String,
        msg: String,
    },
    #[error("{section}.key {path}: {msg}")]
    Key {
        section: &'static str,
        path: String,
        msg: String,
    },
    #[error("{0}: certificate and key do not make a valid configuration: {1}")]
    Config(&'static str, rustls::Error),
}

/// Completes the TLS handshake of `stream` from `peer` within
/// [`HANDSHAKE_TIMEOUT`]; a failed or slow handshake is logged at debug and
/// gives `None`. Run it in the connection's own task, so that a slow client
/// never holds up the accept loop.
pub async fn handshake(
    config: Arc<ServerConfig>,
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
    let accept = tokio_rustls::TlsAcceptor::from(config).accept(stream);
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, accept).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            None
        }
    }
}

/// Reads the PEM files `cert` (the chain) and `key` that the policy's
/// `section` names (`server.tls`, named in errors) and builds the server
/// configuration.
pub fn load(cert: &Path, key: &Path, section: &'static str) -> Result<Arc<ServerConfig>, TlsError> {
    let cert_path = cert.display().to_string();
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::Cert {
            section,
            path: cert_path.clone(),
            msg: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Cert {
            section,
            path: cert_path,
            msg: "no CERTIFICATE block found".to_owned(),
        });
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key {
        section,
        path: key.display().to_string(),
        msg: e.to_string(),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(section, e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Config(section, e))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
