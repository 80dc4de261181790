//! The floor under the gateway's data path: a reverse proxy with the
//! gateway's runtime shape and nothing else. One current-thread runtime
//! per worker accepting on its own `SO_REUSEPORT` socket, hyper's HTTP/1
//! server, the gateway's per-thread backend pool (`fairway::gateway::connections`)
//! and round robin over the backends: no policy, no body parsing, no
//! metrics, no log.
//!
//! What a request costs here is what any proxy built on hyper and tokio
//! pays on this machine; what the gateway costs above it is its policy.
//! `benches/e2e.sh` runs it beside nginx and the gateway (its "floor"
//! rows).
//!
//!   cargo bench --bench floor -- LISTEN WORKERS BACKEND [BACKEND...]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::uri::Authority;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket};

use fairway::gateway::connections;
use fairway::gateway::upstream;

/// The gateway's allocator, for a like-for-like floor.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

struct Shared {
    backends: Vec<Authority>,
    next: AtomicUsize,
}

async fn proxy(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<connections::Body>, fairway::protocol::upstream::UpstreamError> {
    let (mut parts, body) = req.into_parts();
    // The request body is read whole, as the gateway reads it.
    let body = body.collect().await?.to_bytes();
    let i = shared.next.fetch_add(1, Ordering::Relaxed) % shared.backends.len();
    let backend = &shared.backends[i];
    parts.uri = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .parse()
        .unwrap();
    parts
        .headers
        .insert(http::header::HOST, backend.as_str().parse().unwrap());
    let up = Request::from_parts(parts, upstream::whole(body));
    connections::send(backend, up).await
}

fn listener(addr: SocketAddr) -> TcpListener {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_reuseport(true).unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind(addr).unwrap();
    socket.listen(1024).unwrap()
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    // `cargo bench` with no bench named runs every bench target with no
    // arguments: this one is a server, started by benches/e2e.sh.
    if args.is_empty() {
        eprintln!(
            "floor: a server for benches/e2e.sh; usage: floor LISTEN WORKERS BACKEND [BACKEND...]"
        );
        return;
    }
    let [listen, workers, backends @ ..] = args.as_slice() else {
        eprintln!("usage: floor LISTEN WORKERS BACKEND [BACKEND...]");
        std::process::exit(2);
    };
    let addr: SocketAddr = listen.parse().expect("LISTEN");
    let shared = Arc::new(Shared {
        backends: backends
            .iter()
            .map(|b| b.parse().expect("BACKEND: host:port"))
            .collect(),
        next: AtomicUsize::new(0),
    });
    let threads: Vec<_> = (0..workers.parse::<usize>().expect("WORKERS"))
        .map(|_| {
            let shared = shared.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let listener = listener(addr);
                    loop {
                        let Ok((stream, _)) = listener.accept().await else {
                            continue;
                        };
                        stream.set_nodelay(true).unwrap();
                        let shared = shared.clone();
                        tokio::spawn(async move {
                            let service = service_fn(move |req| proxy(shared.clone(), req));
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        });
                    }
                });
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}
