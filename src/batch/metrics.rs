//! The batch families of `/metrics` (docs/batch.md lists them).

use std::collections::BTreeMap;

use super::runner::RunView;
use super::store::StoredBatch;
use super::{Batches, ENDED_COUNTED_FOR, EndedCounts, attempt};
use crate::prom::{self, Kind};

impl Batches {
    /// The batch families of `/metrics`: batches by tenant and status, and
    /// the items of unfinished batches by tenant and state (`pending`,
    /// `running`, `completed`, `failed`). Label values are tenant names
    /// from the policy and the fixed statuses.
    pub fn encode_metrics(&self, out: &mut String) {
        let all = self.runner.seen();
        let mut batches = self
            .ended
            .lock()
            .as_ref()
            .map(|(_, c)| c.clone())
            .unwrap_or_default();
        // The running batches among the unfinished (the runner has not
        // picked up one just created).
        let runs = self.runner.runs();
        let running: Vec<(&StoredBatch, &RunView)> = all
            .iter()
            .filter_map(|sb| Some((sb, runs.get(&sb.batch.id)?)))
            .collect();
        let mut items: BTreeMap<(String, &str), u64> = BTreeMap::new();
        for sb in &all {
            *batches
                .entry((sb.owner.clone(), status_name(sb.batch.status)))
                .or_default() += 1;
            let c = sb.batch.request_counts;
            let run = u64::from(runs.get(&sb.batch.id).map_or(0, |r| r.in_flight));
            let left = u64::from(c.total.saturating_sub(c.completed + c.failed));
            for (state, n) in [
                ("pending", left.saturating_sub(run)),
                ("running", run),
                ("completed", u64::from(c.completed)),
                ("failed", u64::from(c.failed)),
            ] {
                *items.entry((sb.owner.clone(), state)).or_default() += n;
            }
        }
        let resumes = self.runner.resumes();
        let (up, failures, held) = self.runner.store_writes();
        write_families(
            out,
            &Scrape {
                batches,
                items,
                running,
                resumes,
                store: (up, failures, held),
                reopens: self.store.reopens(),
            },
        );
    }
}

/// What one scrape read of the batches.
struct Scrape<'a> {
    /// Batches by (tenant, status).
    batches: EndedCounts,
    /// Items of unfinished batches by (tenant, state).
    items: BTreeMap<(String, &'static str), u64>,
    running: Vec<(&'a StoredBatch, &'a RunView)>,
    /// Items' preemptions and retries by tenant.
    resumes: BTreeMap<String, attempt::Resumes>,
    /// The runner's store writes: up, failures, results held.
    store: (bool, u64, usize),
    reopens: u64,
}

/// The batch families, in their order in `/metrics`.
fn write_families(w: &mut String, s: &Scrape) {
    let mut f = prom::family(
        w,
        "fairway_batches",
        Kind::Gauge,
        "Batches kept, by tenant and status (ended ones counted at most every 15 s).",
    );
    for ((t, status), n) in &s.batches {
        f.sample(&[("tenant", t), ("status", status)], n);
    }
    let mut f = prom::family(
        w,
        "fairway_batch_items",
        Kind::Gauge,
        "Items of unfinished batches, by tenant and state (pending, running: sent to the request path, completed, failed).",
    );
    for ((t, state), n) in &s.items {
        f.sample(&[("tenant", t), ("state", state)], n);
    }
    let mut f = prom::family(
        w,
        "fairway_batch_deadline_slack_seconds",
        Kind::Gauge,
        "Per running batch: its expiry less its projected completion at the rate its items finish (negative: it will not make its window; its items are then promoted).",
    );
    for (sb, r) in &s.running {
        if let (Some(at), Some(e)) = (r.projected, sb.batch.expires_at) {
            let slack = e as f64 - at as f64;
            f.sample(&[("tenant", &sb.owner), ("batch", &sb.batch.id)], slack);
        }
    }
    write_resumes(w, &s.resumes);
    write_store(w, s.store, s.reopens);
    write_running(w, &s.running);
}

/// Items' preemptions, resumptions and retries by tenant.
fn write_resumes(w: &mut String, resumes: &BTreeMap<String, attempt::Resumes>) {
    type Field = fn(&attempt::Resumes) -> u64;
    let families: [(&str, &str, Field); 5] = [
        (
            "fairway_batch_items_preempted_total",
            "Resumable batch items cut mid-answer by a preemption, by tenant.",
            |r| r.preempted,
        ),
        (
            "fairway_batch_items_resumed_total",
            "Continuations of preempted batch items sent from the tokens they had, by tenant.",
            |r| r.resumed,
        ),
        (
            "fairway_batch_items_restarted_total",
            "Preempted batch items that could not resume and started again from zero, by tenant.",
            |r| r.restarted,
        ),
        (
            "fairway_batch_resume_tokens_saved_total",
            "Generated tokens that resumed batch items kept rather than generated again, by tenant.",
            |r| r.tokens_saved,
        ),
        (
            "fairway_batch_items_retried_total",
            "Batch items sent again after an answer that asked for it (a 429 or 503, a 5xx, a broken answer), by tenant.",
            |r| r.retried,
        ),
    ];
    for (name, help, field) in families {
        let mut f = prom::family(w, name, Kind::Counter, help);
        for (t, r) in resumes {
            f.sample(&[("tenant", t)], field(r));
        }
    }
}

/// The batch store as the runner finds it: `(up, failures, held)` and
/// the embedded store's reopens.
fn write_store(w: &mut String, (up, failures, held): (bool, u64, usize), reopens: u64) {
    for (name, kind, help, value) in [
        (
            "fairway_batch_store_up",
            Kind::Gauge,
            "1 while the batch store takes the runner's calls; 0 after a failure, until it does again (the runner then starts no items).",
            u64::from(up),
        ),
        (
            "fairway_batch_store_failures_total",
            Kind::Counter,
            "Calls of the batch runner's that the store failed.",
            failures,
        ),
        (
            "fairway_batch_store_reopens_total",
            Kind::Counter,
            "Times the embedded batch store's database was opened again after a failure of its file (a full disk freed since).",
            reopens,
        ),
        (
            "fairway_batch_results_held",
            Kind::Gauge,
            "Batch items' results the store refused, held to be written once it works again (their items are not run again).",
            held as u64,
        ),
    ] {
        prom::family(w, name, kind, help).sample(&[], value);
    }
}

/// The preemptions of each running batch, since the runner picked it up.
fn write_running(w: &mut String, running: &[(&StoredBatch, &RunView)]) {
    let mut f = prom::family(
        w,
        "fairway_batch_running_preemptions",
        Kind::Gauge,
        "Per running batch, since the runner picked it up: its items cut mid-answer (preempted), continued from their tokens (resumed) or started again (restarted).",
    );
    for (sb, r) in running {
        let r = &r.resumes;
        for (what, n) in [
            ("preempted", r.preempted),
            ("resumed", r.resumed),
            ("restarted", r.restarted),
        ] {
            let labels = [
                ("tenant", &*sb.owner),
                ("batch", &sb.batch.id),
                ("what", what),
            ];
            f.sample(&labels, n);
        }
    }
    let mut f = prom::family(
        w,
        "fairway_batch_running_tokens_kept",
        Kind::Gauge,
        "Per running batch, since the runner picked it up: generated tokens its resumed items kept.",
    );
    for (sb, r) in running {
        let labels = [("tenant", &*sb.owner), ("batch", &sb.batch.id)];
        f.sample(&labels, r.resumes.tokens_saved);
    }
}

impl Batches {
    /// Counts a batch of `owner`'s that this replica just ended as
    /// `status` at once (the next recount includes it anyway).
    pub(super) fn ended_now(&self, owner: &str, status: crate::protocol::batch::Status) {
        if let Some((_, counts)) = self.ended.lock().as_mut() {
            *counts
                .entry((owner.to_owned(), status_name(status)))
                .or_default() += 1;
        }
    }

    /// Counts the ended batches by (tenant, status) again when the count
    /// is older than [`ENDED_COUNTED_FOR`] (the runner calls it; a store
    /// that cannot be read keeps the last count).
    pub(super) async fn refresh_ended(&self) {
        let fresh = self
            .ended
            .lock()
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < ENDED_COUNTED_FOR);
        if fresh {
            return;
        }
        let Ok(all) = self.store.batches(None).await else {
            return;
        };
        let mut counts = EndedCounts::new();
        for sb in all {
            if sb.batch.status.is_final() {
                *counts
                    .entry((sb.owner, status_name(sb.batch.status)))
                    .or_default() += 1;
            }
        }
        *self.ended.lock() = Some((tokio::time::Instant::now(), counts));
    }
}

/// A status as the API names it.
fn status_name(s: crate::protocol::batch::Status) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}
