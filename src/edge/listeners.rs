//! Binding the listeners: the client port (one `SO_REUSEPORT` socket a
//! worker, joined only by this gateway's own) and the admin port.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket};

use crate::config::Policy;

/// The bound client and admin listeners.
#[derive(Debug)]
pub struct Listeners {
    pub api: TcpListener,
    pub admin: TcpListener,
}

impl Listeners {
    /// Binds the policy's `listen` and `admin_listen`.
    pub async fn bind(policy: &Policy) -> std::io::Result<Listeners> {
        Ok(Listeners {
            api: bind_api(policy.server.listen)?,
            admin: TcpListener::bind(policy.server.admin_listen).await?,
        })
    }
}

/// The client listener on `addr`, for the workers to share. The port
/// must be free: it is bound once without `SO_REUSEPORT` first, which
/// fails if anything listens there, even a socket that allows sharing (a
/// second gateway started on the same port would otherwise join this
/// one's listener silently, and take part of its traffic).
pub(super) fn bind_api(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let addr = std::net::TcpListener::bind(addr)?.local_addr()?;
    bind_shared(addr)
}

/// A listener on `addr` that more sockets of this process can join
/// (`SO_REUSEPORT`): each worker accepts on a socket of its own, and the
/// kernel spreads new connections over them. (The kernel lets only
/// sockets of the same user join.)
pub(super) fn bind_shared(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// The client listener's sockets, one per worker: `api` and, bound to its
/// address, `workers - 1` more. A listener the caller bound without
/// `SO_REUSEPORT` cannot be joined: then fewer workers serve (with a
/// warning).
pub(super) fn worker_sockets(api: TcpListener, workers: usize) -> Vec<std::net::TcpListener> {
    let addr = api.local_addr();
    let mut sockets: Vec<_> = api.into_std().into_iter().collect();
    let Ok(addr) = addr else {
        return sockets;
    };
    for _ in 1..workers {
        match bind_shared(addr).and_then(TcpListener::into_std) {
            Ok(s) => sockets.push(s),
            Err(e) => {
                tracing::warn!(error = %e, workers = sockets.len(), "cannot share the client listener with more workers");
                break;
            }
        }
    }
    sockets
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn the_client_port_must_be_free_even_of_shared_listeners() {
        let shared = bind_api("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = shared.local_addr().unwrap();
        // The workers' sockets join it...
        let _worker = bind_shared(addr).unwrap();
        // ...but a second gateway on the same port is refused.
        let e = bind_api(addr).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
        let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let e = bind_api(plain.local_addr().unwrap()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
    }
}
