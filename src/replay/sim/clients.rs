//! Closed-loop clients: a client's next request goes when its previous
//! one ends (`WorkRequest::client`), not at a time of its own.

use std::collections::HashMap;

use crate::core::time::Instant;
use crate::replay::workload::WorkRequest;

/// Which requests wait for which, and those released to go.
#[derive(Debug, Default)]
pub(super) struct Clients {
    /// By request: its client's next request, and that one's own time
    /// (it goes no sooner).
    follows: Vec<Option<(usize, Instant)>>,
    /// By request: it waits for its client's previous request.
    waits: Vec<bool>,
    /// Requests released by their predecessor's end, and when they go.
    released: Vec<(Instant, usize)>,
}

impl Clients {
    pub(super) fn new(workload: &[WorkRequest]) -> Self {
        let mut c = Clients {
            follows: vec![None; workload.len()],
            waits: vec![false; workload.len()],
            released: Vec::new(),
        };
        let mut last: HashMap<u64, usize> = HashMap::new();
        for (i, w) in workload.iter().enumerate() {
            if let Some(client) = w.client
                && let Some(prev) = last.insert(client, i)
            {
                c.follows[prev] = Some((i, Instant::from_secs_f64(w.t)));
                c.waits[i] = true;
            }
        }
        c
    }

    /// Whether request `i` waits for its client's previous one (it goes
    /// when released, not at its time).
    pub(super) fn waits(&self, i: usize) -> bool {
        self.waits.get(i).copied().unwrap_or(false)
    }

    /// Request `i` ended at `end`: its client's next one may go.
    pub(super) fn ended(&mut self, i: usize, end: Instant) {
        if let Some(&Some((next, earliest))) = self.follows.get(i) {
            self.released.push((end.max(earliest), next));
        }
    }

    /// When the next released request goes.
    pub(super) fn next_at(&self) -> Option<Instant> {
        self.released.iter().map(|r| r.0).min()
    }

    /// A released request due by `now`.
    pub(super) fn due(&mut self, now: Instant) -> Option<usize> {
        let k = self.released.iter().position(|r| r.0 <= now)?;
        Some(self.released.swap_remove(k).1)
    }
}
