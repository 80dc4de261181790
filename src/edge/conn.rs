//! One client connection's life: the slot it holds under the connection
//! caps, the count of its requests in flight, and the loop that drives it
//! and ends it gracefully when the gateway drains or when it has been idle
//! (no request in flight) for `[server] idle_timeout`. Also the
//! file-descriptor reserve and the rate-limited log of connections that
//! end in a protocol error.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper_util::server::graceful::GracefulConnection;
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::gateway::state::Gateway;

/// File descriptors kept free of client connections, for the listeners,
/// backend health checks and scrapes, the policy file, logs and traces.
pub const FD_RESERVE: usize = 64;

/// The most client connections the process's file-descriptor limit allows
/// while keeping [`FD_RESERVE`] free: each client connection may also hold
/// one connection to a backend. `None` when the limit is unknown or
/// unlimited.
pub fn fd_connection_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))?
        .split_whitespace()
        .nth(3)?
        .parse::<usize>()
        .ok()?;
    Some(soft.saturating_sub(FD_RESERVE) / 2)
}

/// Open connections by client address.
type ByClient = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// The share of the connection cap that connections which have not sent a
/// request yet may hold (at least one).
const UNPROVEN_SHARE: usize = 4;

/// The client connection caps: a total, and optionally one per address.
///
/// Slots are earned: a connection that has not sent a request that
/// authenticated (a tenant's key, the admin token, or any request when
/// the policy declares no tenants) is *unproven*, and the unproven ones
/// hold at most a quarter of the total ([`UNPROVEN_SHARE`]); a new
/// connection beyond that closes the oldest unproven one. So connections
/// that send nothing, or only what answers without a key (`GET
/// /v1/models`), cannot hold the listener: they churn within their
/// quarter, while a client that sends its keyed request as it connects is
/// proven at once and keeps its slot.
pub struct Caps {
    total: Arc<Semaphore>,
    per_client: Option<usize>,
    by_client: ByClient,
    /// Unproven connections, oldest first (some may have been proven or
    /// closed since: dropped when the queue is next full).
    unproven: Mutex<std::collections::VecDeque<Unproven>>,
    /// `[server] max_connections`, and the cap in force: lower while the
    /// file-descriptor limit is (read again every [`FD_CHECK_EVERY`]).
    configured: usize,
    cap: Mutex<CapState>,
}

/// The connection cap in force, and the permits still to be taken out of
/// the total after it was lowered (those in use when it was).
struct CapState {
    current: usize,
    owed: usize,
    checked: Instant,
}

/// How often an accept reads the file-descriptor limit again, so that the
/// cap follows a limit lowered (or raised) while the gateway runs.
const FD_CHECK_EVERY: Duration = Duration::from_secs(2);

/// A connection that had not sent a request when it was accepted.
struct Unproven {
    activity: std::sync::Weak<Activity>,
    evict: CancellationToken,
    permit: Held,
}

/// A connection's permit under the total cap, which a newer connection
/// may take back while the connection is unproven: its slot is free at
/// once, not when its task next runs (on a busy worker, after the accepts
/// in hand).
type Held = Arc<Mutex<Option<OwnedSemaphorePermit>>>;

impl Unproven {
    /// Still open and without a request that authenticated.
    fn waiting(&self) -> bool {
        self.activity.upgrade().is_some_and(|a| !a.proven())
    }

    /// Closes it and frees its slot now.
    fn give_way(self) {
        drop(self.permit.lock().take());
        self.evict.cancel();
    }
}

/// Why a connection was refused at accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapReached {
    /// `max_connections` (or the fd reserve) reached.
    Total,
    /// `max_connections_per_client` reached for this address.
    PerClient,
}

impl Caps {
    /// Caps of `configured` connections (`[server] max_connections`),
    /// `total` of them usable now (the file-descriptor limit's share),
    /// and `per_client` from one address.
    pub fn new(configured: usize, total: usize, per_client: Option<usize>) -> Self {
        Caps {
            total: Arc::new(Semaphore::new(total)),
            per_client,
            by_client: Arc::default(),
            unproven: Mutex::default(),
            configured,
            cap: Mutex::new(CapState {
                current: total,
                owed: 0,
                checked: Instant::now(),
            }),
        }
    }

    /// Follows the file-descriptor limit: read again at most every
    /// [`FD_CHECK_EVERY`], the cap lowered or raised to its share (the
    /// permits in use when it is lowered are taken out as they return).
    /// Returns the cap in force.
    fn follow_fd_limit(&self) -> usize {
        let mut s = self.cap.lock();
        if s.owed > 0 {
            s.owed -= self.total.forget_permits(s.owed);
        }
        if s.checked.elapsed() < FD_CHECK_EVERY {
            return s.current;
        }
        s.checked = Instant::now();
        let want = fd_connection_limit()
            .map_or(self.configured, |fd| fd.min(self.configured))
            .max(1);
        if want == s.current {
            return want;
        }
        tracing::warn!(
            max_connections = want,
            was = s.current,
            configured = self.configured,
            reserve = FD_RESERVE,
            "the file-descriptor limit changed: client connections capped anew"
        );
        if want < s.current {
            s.owed += s.current - want;
            s.owed -= self.total.forget_permits(s.owed);
        } else {
            let mut more = want - s.current;
            let cancelled = more.min(s.owed);
            s.owed -= cancelled;
            more -= cancelled;
            self.total.add_permits(more);
        }
        s.current = want;
        want
    }

    /// A slot for a connection from `ip` whose requests `activity` counts,
    /// held while it is open; the connection is unproven until its first
    /// request, and closed if [`Slot::evicted`] fires before that.
    pub fn acquire(
        &self,
        ip: IpAddr,
        activity: &Arc<Activity>,
        gw: &Arc<Gateway>,
    ) -> Result<Slot, CapReached> {
        let unproven_cap = (self.follow_fd_limit() / UNPROVEN_SHARE).max(1);
        let mut q = self.unproven.lock();
        let permit = match self.total.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                // Full: the oldest connection without a request gives way.
                q.retain(Unproven::waiting);
                if let Some(oldest) = q.pop_front() {
                    oldest.give_way();
                }
                self.total
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| CapReached::Total)?
            }
        };
        let client = match self.per_client {
            None => None,
            Some(cap) => {
                let mut by = self.by_client.lock();
                let n = by.entry(ip).or_insert(0);
                if *n >= cap {
                    return Err(CapReached::PerClient);
                }
                *n += 1;
                Some((ip, self.by_client.clone()))
            }
        };
        let evict = CancellationToken::new();
        if q.len() >= unproven_cap {
            q.retain(Unproven::waiting);
        }
        while q.len() >= unproven_cap {
            if let Some(oldest) = q.pop_front() {
                oldest.give_way();
            }
        }
        let permit: Held = Arc::new(Mutex::new(Some(permit)));
        q.push_back(Unproven {
            activity: Arc::downgrade(activity),
            evict: evict.clone(),
            permit: permit.clone(),
        });
        drop(q);
        gw.metrics()
            .edge
            .open_connections
            .fetch_add(1, Ordering::Relaxed);
        Ok(Slot {
            _permit: permit,
            client,
            gw: gw.clone(),
            evict,
        })
    }
}

/// A client connection's hold on the caps; released when it closes.
pub struct Slot {
    _permit: Held,
    client: Option<(IpAddr, ByClient)>,
    gw: Arc<Gateway>,
    evict: CancellationToken,
}

impl Slot {
    /// Fires when newer unproven connections push this one out while it
    /// is unproven itself.
    pub async fn evicted(&self) {
        self.evict.cancelled().await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some((ip, by)) = &self.client {
            let mut by = by.lock();
            if let Some(n) = by.get_mut(ip) {
                *n -= 1;
                if *n == 0 {
                    by.remove(ip);
                }
            }
        }
        self.gw
            .metrics()
            .edge
            .open_connections
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// One connection's requests in flight and when the last one ended.
pub struct Activity {
    base: Instant,
    /// A request that authenticated has come (the connection is proven).
    proven: std::sync::atomic::AtomicBool,
    in_flight: AtomicU32,
    /// Milliseconds from `base` to the end of the last request.
    last_ms: AtomicU64,
}

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Activity {
            base: Instant::now(),
            proven: std::sync::atomic::AtomicBool::new(false),
            in_flight: AtomicU32::new(0),
            last_ms: AtomicU64::new(0),
        })
    }

    /// Whether a request that authenticated has come on the connection.
    pub fn proven(&self) -> bool {
        self.proven.load(Ordering::Acquire)
    }

    fn prove(&self) {
        if !self.proven.load(Ordering::Relaxed) {
            self.proven.store(true, Ordering::Release);
        }
    }

    /// How long the connection has had no request in flight (`None`: one
    /// is in flight now).
    fn idle_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let last = self.base + Duration::from_millis(self.last_ms.load(Ordering::Acquire));
        Some(Instant::now().saturating_duration_since(last))
    }
}

/// A request in flight on a connection, from its call until its response
/// body is dropped (written out, or the connection closed).
pub struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(a: &Arc<Activity>) -> Self {
        a.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(a.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let ms = u64::try_from(self.0.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.last_ms.store(ms, Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The per-connection service: the edge, counting requests in flight,
/// and proving the connection with its first request that authenticates.
#[derive(Clone)]
pub struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
    /// Whose keys prove the connection; `None`: any request does (the
    /// admin listener, whose connections are not capped).
    keys: Option<Arc<Gateway>>,
    /// The client's address, appended to each request's
    /// `X-Forwarded-For` ([`crate::net::headers::forwarded_for`]), made
    /// once per connection.
    peer: Option<http::HeaderValue>,
}

impl<S> Tracked<S> {
    pub fn new(
        inner: S,
        activity: Arc<Activity>,
        peer: std::net::SocketAddr,
        keys: Option<Arc<Gateway>>,
    ) -> Self {
        Tracked {
            inner,
            activity,
            keys,
            peer: http::HeaderValue::from_str(&peer.ip().to_string()).ok(),
        }
    }

    /// Whether `headers` authenticate: a tenant's key (or the trusted
    /// tenant header, or nothing when the policy declares no tenants), or
    /// the admin token. Asked only until the connection is proven.
    fn authenticates(&self, headers: &http::HeaderMap) -> bool {
        let Some(gw) = &self.keys else {
            return true;
        };
        let live = gw.live();
        crate::gateway::tenant::authenticate(&live, headers).is_ok()
            || live
                .policy
                .server
                .admin_token
                .is_some_and(|want| crate::edge::admin::bears_token(headers, &want))
    }
}

impl<S, ReqB, ResB> tower::Service<Request<ReqB>> for Tracked<S>
where
    S: tower::Service<Request<ReqB>, Response = Response<ResB>>,
{
    type Response = Response<TrackedBody<ResB>>;
    type Error = S::Error;
    type Future = TrackedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        if !self.activity.proven() && self.authenticates(req.headers()) {
            self.activity.prove();
        }
        if let Some(peer) = &self.peer {
            req.headers_mut()
                .append(crate::net::headers::X_FORWARDED_FOR, peer.clone());
        }
        TrackedFuture {
            guard: Some(InFlight::start(&self.activity)),
            inner: self.inner.call(req),
        }
    }
}

pin_project_lite::pin_project! {
    /// The edge's future; the request counts as in flight while it runs
    /// (dropped with it if the client goes away first).
    pub struct TrackedFuture<F> {
        #[pin]
        inner: F,
        guard: Option<InFlight>,
    }
}

impl<F, B, E> Future for TrackedFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<TrackedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let resp = std::task::ready!(this.inner.poll(cx))?;
        let guard = this.guard.take();
        Poll::Ready(Ok(resp.map(|inner| TrackedBody {
            inner,
            _guard: guard,
        })))
    }
}

pin_project_lite::pin_project! {
    /// A response body; the request stays in flight until it is dropped.
    pub struct TrackedBody<B> {
        #[pin]
        inner: B,
        _guard: Option<InFlight>,
    }
}

impl<B: Body> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// How a connection ended.
pub enum Ended {
    /// Closed by either side, or after a graceful shutdown.
    Closed,
    /// Closed by Fairway after `idle_timeout` with no request in flight.
    Idle,
    /// Ended with an error (a client's protocol error, a reset).
    Error(Box<dyn std::error::Error + Send + Sync>),
}

/// How long an idle connection has to close after its graceful shutdown
/// starts; then it is dropped. (An HTTP/2 client must answer the PING
/// that follows GOAWAY, and one that never answers would otherwise stay.)
const IDLE_GRACE: Duration = Duration::from_secs(1);

/// Drives `conn` to its end. When `stop` is cancelled (drain) or the
/// connection has had no request in flight for `idle_timeout`, it is shut
/// down gracefully: HTTP/1 closes after the response in progress, HTTP/2
/// sends GOAWAY and closes when its streams end. An idle connection that
/// has not closed [`IDLE_GRACE`] later is dropped.
pub async fn drive<C>(
    conn: C,
    activity: &Activity,
    idle_timeout: Duration,
    stop: &CancellationToken,
) -> Ended
where
    C: GracefulConnection<Error = Box<dyn std::error::Error + Send + Sync>>,
{
    let mut conn = std::pin::pin!(conn);
    let mut closing = None;
    let check = tokio::time::sleep(idle_timeout);
    let mut check = std::pin::pin!(check);
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                return match (r, closing) {
                    (Err(e), _) => Ended::Error(e),
                    (Ok(()), Some(how)) => how,
                    (Ok(()), None) => Ended::Closed,
                };
            }
            () = stop.cancelled(), if closing.is_none() => {
                conn.as_mut().graceful_shutdown();
                closing = Some(Ended::Closed);
            }
            () = check.as_mut(), if !matches!(closing, Some(Ended::Closed)) => {
                let idle = activity.idle_for();
                if closing.is_some() {
                    if idle.is_some() {
                        return Ended::Idle;
                    }
                    check.as_mut().reset(Instant::now() + IDLE_GRACE);
                    continue;
                }
                match idle {
                    Some(idle) if idle >= idle_timeout => {
                        conn.as_mut().graceful_shutdown();
                        closing = Some(Ended::Idle);
                        check.as_mut().reset(Instant::now() + IDLE_GRACE);
                    }
                    Some(idle) => check.as_mut().reset(Instant::now() + (idle_timeout - idle)),
                    None => check.as_mut().reset(Instant::now() + idle_timeout),
                }
            }
        }
    }
}

/// Whether a connection's error is the client breaking the protocol (a
/// malformed request, an HTTP/2 flood such as rapid reset), not an
/// ordinary hang-up.
pub fn is_protocol_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<hyper::Error>()
            && (h.is_parse() || h.is_parse_too_large() || h.is_parse_status())
        {
            return true;
        }
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return h2.is_go_away()
                && h2
                    .reason()
                    .is_some_and(|r| r != h2::Reason::NO_ERROR && r != h2::Reason::CANCEL);
        }
        cur = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn activity_is_idle_only_with_nothing_in_flight() {
        let a = Activity::new();
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(a.idle_for(), Some(Duration::from_secs(5)));
        let g = InFlight::start(&a);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(a.idle_for(), None);
        drop(g);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(a.idle_for(), Some(Duration::from_secs(2)));
    }
}
