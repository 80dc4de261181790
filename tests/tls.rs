//! TLS termination on the client listener: HTTPS over HTTP/1.1 and h2 (ALPN),
//! certificate rotation on reload, and clear errors for bad certificate files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use fairway::PolicySource;
use fairway::config::load_policy;
use fairway::edge::server::Server;
use http_body_util::{BodyExt, Full};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use support::*;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/tls")
        .join(name)
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fairway-tls-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A policy file in `dir` with `tls` pointing at `cert.pem`/`key.pem` there
/// (relative paths, resolved against the file's directory).
fn write_policy(dir: &Path, backend: &str, cert: &str) -> PathBuf {
    std::fs::copy(data(&format!("{cert}.pem")), dir.join("cert.pem")).unwrap();
    std::fs::copy(data(&format!("{cert}.key")), dir.join("key.pem")).unwrap();
    let text = format!(
        r#"{SERVER}tls = {{ cert = "cert.pem", key = "key.pem" }}

[[pools]]
model = "m"
[[pools.backends]]
url = "http://{backend}"

[[tenants]]
name = "t"
api_keys = ["k"]
"#
    );
    let path = dir.join("fairway.toml");
    std::fs::write(&path, text).unwrap();
    path
}

async fn start(path: &Path) -> Server {
    let (policy, text) = load_policy(path).unwrap_or_else(|e| panic!("{e:?}"));
    Server::start(
        policy,
        PolicySource {
            path: Some(path.to_owned()),
            text,
        },
    )
    .await
    .expect("gateway starts with TLS")
}

fn connector(alpn: &[&[u8]]) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(data("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsConnector::from(Arc::new(config))
}

/// One request over a fresh TLS connection; returns the negotiated ALPN
/// protocol, the server's leaf certificate and the response.
async fn https(
    gw: &Server,
    alpn: &[&[u8]],
) -> (Option<Vec<u8>>, CertificateDer<'static>, u16, Bytes) {
    let tcp = TcpStream::connect(gw.addr()).await.unwrap();
    let tls = connector(alpn)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("TLS handshake with the gateway");
    let (_, conn) = tls.get_ref();
    let proto = conn.alpn_protocol().map(<[u8]>::to_vec);
    let leaf = conn.peer_certificates().unwrap()[0].clone().into_owned();
    let io = hyper_util::rt::TokioIo::new(tls);
    let req = http::Request::post(format!(
        "https://localhost:{}/v1/chat/completions",
        gw.addr().port()
    ))
    .header("authorization", "Bearer k")
    .header("content-type", "application/json")
    .body(Full::new(Bytes::from(chat("m", 4, false))))
    .unwrap();
    let resp = if proto.as_deref() == Some(b"h2") {
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    };
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (proto, leaf, status, body)
}

fn leaf_of(name: &str) -> CertificateDer<'static> {
    CertificateDer::pem_file_iter(data(&format!("{name}.pem")))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn https_over_http1_and_h2_and_plain_http_is_refused() {
    let b = sim("m", 8).await;
    let path = write_policy(&temp_dir("serve"), &b.addr().to_string(), "server-a");
    let gw = start(&path).await;

    let (proto, leaf, status, body) = https(&gw, &[b"http/1.1"]).await;
    assert_eq!(proto.as_deref(), Some(&b"http/1.1"[..]));
    assert_eq!(leaf, leaf_of("server-a"));
    assert_eq!(status, 200, "{body:?}");
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > 0);

    let (proto, _, status, _) = https(&gw, &[b"h2", b"http/1.1"]).await;
    assert_eq!(proto.as_deref(), Some(&b"h2"[..]), "h2 is offered first");
    assert_eq!(status, 200);

    // Plain HTTP on the TLS port gets no HTTP answer.
    let r = client()
        .request(post(
            gw.addr(),
            "/v1/chat/completions",
            Some("k"),
            chat("m", 4, false),
        ))
        .await;
    assert!(
        r.is_err(),
        "plain HTTP must not be served on a TLS listener"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn reload_rotates_the_certificate_for_new_connections() {
    let b = sim("m", 8).await;
    let dir = temp_dir("rotate");
    let path = write_policy(&dir, &b.addr().to_string(), "server-a");
    let gw = start(&path).await;
    assert_eq!(https(&gw, &[b"http/1.1"]).await.1, leaf_of("server-a"));

    // Replace the PEM files; the policy file itself is unchanged.
    std::fs::copy(data("server-b.pem"), dir.join("cert.pem")).unwrap();
    std::fs::copy(data("server-b.key"), dir.join("key.pem")).unwrap();
    assert_eq!(reload(&gw).await.status, 200);
    let (_, leaf, status, _) = https(&gw, &[b"http/1.1"]).await;
    assert_eq!(leaf, leaf_of("server-b"));
    assert_eq!(status, 200);

    // A broken key on reload is refused; the running certificate stays.
    std::fs::write(dir.join("key.pem"), "not a key").unwrap();
    let r = reload(&gw).await;
    assert!(
        r.status.is_client_error() || r.status.is_server_error(),
        "{}",
        r.text()
    );
    assert!(r.text().contains("server.tls.key"), "{}", r.text());
    assert_eq!(https(&gw, &[b"http/1.1"]).await.1, leaf_of("server-b"));
    gw.shutdown().await;
}

#[tokio::test]
async fn missing_or_mismatched_certificate_files_stop_the_start_with_the_key_named() {
    let b = sim("m", 8).await;
    let dir = temp_dir("bad");
    let path = write_policy(&dir, &b.addr().to_string(), "server-a");
    std::fs::remove_file(dir.join("cert.pem")).unwrap();
    let (policy, text) = load_policy(&path).unwrap();
    let err = Server::start(
        policy.clone(),
        PolicySource {
            path: None,
            text: text.clone(),
        },
    )
    .await
    .err()
    .expect("start fails without the certificate");
    assert!(err.to_string().contains("server.tls.cert"), "{err}");

    // A key that does not match the certificate.
    std::fs::copy(data("server-a.pem"), dir.join("cert.pem")).unwrap();
    std::fs::copy(data("server-b.key"), dir.join("key.pem")).unwrap();
    let err = Server::start(policy, PolicySource { path: None, text })
        .await
        .err()
        .expect("start fails with a key for another certificate");
    assert!(err.to_string().contains("server.tls"), "{err}");
}
