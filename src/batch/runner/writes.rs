//! The runner's view of its store: whether it takes the runner's calls,
//! and when to look again after a failure.

use std::sync::Arc;
use std::time::Duration;

use crate::batch::Batches;
use crate::batch::store::{ItemResult, StoreError};

/// Whether the store takes the runner's writes. After a failure the
/// runner waits `backoff` (doubling from [`BACKOFF_MIN`] to
/// [`BACKOFF_MAX`] while it keeps failing) before it looks at the store
/// again, and says so once, not at every item.
#[derive(Debug, Default)]
pub(super) struct StoreWrites {
    /// Since when, and when to try again.
    failing: Option<(tokio::time::Instant, tokio::time::Instant)>,
    backoff: Duration,
    /// Calls of the runner's that the store failed, since start.
    pub failures_total: u64,
}

const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

impl StoreWrites {
    /// Whether the runner may use the store now.
    pub(super) fn ready(&self, now: tokio::time::Instant) -> bool {
        self.failing.is_none_or(|(_, next)| now >= next)
    }

    /// Whether the store took the runner's last call.
    pub fn up(&self) -> bool {
        self.failing.is_none()
    }

    /// A call failed: the runner's own look at the store (`step`), which
    /// doubles the wait while the store keeps failing, or an item's
    /// result (several at once when the store fails), which starts it.
    pub(super) fn failed(&mut self, e: &StoreError, step: bool) {
        let now = tokio::time::Instant::now();
        self.failures_total += 1;
        let since = match self.failing {
            None => {
                tracing::warn!(error = %e, "batch runner: the store failed; starting no items and keeping their results until it works again");
                self.backoff = BACKOFF_MIN;
                now
            }
            Some((since, _)) if step => {
                self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                since
            }
            Some(_) => return,
        };
        self.failing = Some((since, now + self.backoff));
    }

    pub(super) fn worked(&mut self) {
        if let Some((since, _)) = self.failing.take() {
            tracing::info!(
                after_s = since.elapsed().as_secs_f64(),
                failures = self.failures_total,
                "batch runner: the store works again"
            );
        }
    }
}

impl super::Runs {
    /// Writes the results the store refused before, each batch's in one
    /// call.
    pub(super) async fn store_held(&mut self, b: &Arc<Batches>) -> Result<(), StoreError> {
        for (id, run) in self.runs.iter_mut().filter(|(_, r)| !r.unstored.is_empty()) {
            let results: Vec<(u32, ItemResult)> =
                run.unstored.iter().map(|(l, r)| (*l, r.clone())).collect();
            b.store.record_all(id, results).await?;
            for (line, _) in std::mem::take(&mut run.unstored) {
                run.done.insert(line);
            }
        }
        Ok(())
    }
}
