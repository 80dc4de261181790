//! What the client listener's edge counts by itself, before a request
//! reaches the scheduling path ([`EdgeCounters`]), and its families in the
//! exposition.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::prom::{self, Kind};

/// What the client listener's edge did by itself, before a request reached
/// the scheduling path.
#[derive(Debug, Default)]
pub struct EdgeCounters {
    /// Connections closed at accept: `[server] max_connections` reached.
    pub refused_connections: AtomicU64,
    /// Connections closed at accept: `[server] max_connections_per_client`
    /// reached for their address.
    pub refused_per_client: AtomicU64,
    /// Connections closed after `[server] idle_timeout` with no request.
    pub closed_idle: AtomicU64,
    /// Connections closed before their first request, pushed out by newer
    /// ones or at `[server] header_read_timeout` (`edge::conn::Caps`).
    pub evicted_unproven: AtomicU64,
    /// Connections ended by the client's protocol error.
    pub closed_protocol_error: AtomicU64,
    /// Requests answered 503: `[server] max_requests` reached.
    pub refused_requests: AtomicU64,
    /// Client connections open now.
    pub open_connections: AtomicU64,
    /// Handler panics turned into a 500.
    pub panics: AtomicU64,
    /// Failed `accept` calls (out of file descriptors and the like).
    pub accept_errors: AtomicU64,
}

impl EdgeCounters {
    /// Writes the edge's families.
    pub(super) fn encode(&self, w: &mut String) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        prom::family(
            w,
            "fairway_listener_refusals_total",
            Kind::Counter,
            "Connections and requests the client listener refused at its caps ([server] max_connections, max_connections_per_client, max_requests).",
        )
        .sample(&[("limit", "connections")], get(&self.refused_connections))
        .sample(&[("limit", "connections_per_client")], get(&self.refused_per_client))
        .sample(&[("limit", "requests")], get(&self.refused_requests));
        prom::family(
            w,
            "fairway_connections_closed_total",
            Kind::Counter,
            "Client connections Fairway closed: idle for [server] idle_timeout, ended by the client's protocol error (malformed requests, HTTP/2 floods), or closed before their first request (pushed out by newer connections past the unproven share of max_connections, or at header_read_timeout).",
        )
        .sample(&[("reason", "no_request")], get(&self.evicted_unproven))
        .sample(&[("reason", "idle")], get(&self.closed_idle))
        .sample(&[("reason", "protocol_error")], get(&self.closed_protocol_error));
        prom::family(
            w,
            "fairway_open_connections",
            Kind::Gauge,
            "Client connections open now.",
        )
        .sample(&[], get(&self.open_connections));
        prom::family(
            w,
            "fairway_panics_total",
            Kind::Counter,
            "Handler panics answered with a 500.",
        )
        .sample(&[], get(&self.panics));
        prom::family(
            w,
            "fairway_accept_errors_total",
            Kind::Counter,
            "Failed accepts on the client and admin listeners (out of file descriptors and the like).",
        )
        .sample(&[], get(&self.accept_errors));
        prom::family(
            w,
            "fairway_log_lines_dropped_total",
            Kind::Counter,
            "Log lines (access log included) dropped because the log's output could not keep up and its buffer (--log-buffer) was full.",
        )
        .sample(&[], super::log_writer::dropped_lines());
    }
}
