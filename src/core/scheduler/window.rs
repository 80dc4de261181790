//! The per-backend dispatch window, adapted on every reading (AIMD).

use crate::core::reading::Reading;

use super::state::BackendState;

impl BackendState {
    /// Halves the window when the engine has a backlog or KV is at
    /// `watermark`; grows it by one when the window is the limit and the
    /// engine has headroom. So the engine's own queue stays near empty, and
    /// queueing — and fairness — stays in the gateway.
    pub(super) fn adapt_window(&mut self, reading: &Reading, watermark: f64) {
        // Requests wait inside an engine for two reasons: a backlog (the
        // batch is full, or KV is), which the window must not feed, and the
        // next step boundary, a few milliseconds that any busy engine shows.
        // Only the first is pressure: waiting counts while the engine runs
        // at least the whole window (or when the dialect does not say how
        // many run).
        //
        // In a cluster the engine also runs the other replicas' requests:
        // the test is whether it runs at least the whole cluster's window,
        // this replica's window over its share of it.
        let backlogged = reading.waiting.is_some_and(|w| w > 0)
            && reading
                .running
                .is_none_or(|r| f64::from(r) * self.window_share >= f64::from(self.window) - 1e-9);
        let pressured = backlogged || reading.kv_usage.is_some_and(|k| k >= watermark);
        if pressured {
            self.window = (self.window / 2).max(1);
        } else if self.in_flight + 1 >= self.window {
            // Grow only when the window is actually the limit.
            self.window = (self.window + 1).min(self.max_inflight);
        }
    }
}
