//! The runner: one task that moves every unfinished batch along.
//!
//! - `validating`: the input file is read against the policy (every
//!   problem with its line, `batch::read_input`); a file with any problem
//!   makes the batch `failed` with its `errors`, before any item runs.
//! - `in_progress`: items run as their owner's requests through the
//!   gateway's request path ([`crate::gateway::request::handle`], with a
//!   [`BatchItem`] in place of the API key), in the pool's batch lane.
//!   Each pool gets as many items at once as its healthy backends' windows
//!   add up to, less the items already there: the lane holds enough to
//!   fill every slot live traffic leaves, never a fixed number. An item
//!   refused for its owner's limits (429) or not dispatched in time (503)
//!   waits for its `retry-after` and runs again; a 5xx or a broken answer
//!   is retried twice; any other answer is its result. An item that can
//!   resume is streamed and, when live work preempts it mid-answer,
//!   continued from the tokens it had ([`super::attempt`]). When every item has
//!   one, the batch is `finalizing`, then `completed` with its files.
//! - `cancelling`: items in flight are stopped; the batch is `cancelled`
//!   with what finished.
//! - past `expires_at`: the same, `expired`.
//!
//! Finalizing writes the output file (answered items, 2xx) and the error
//! file (the rest, each item once: an HTTP answer, or `batch_cancelled`
//! / `batch_expired` for items that never got one), in input order.
//!
//! While a batch runs its completion is projected from its items' rate;
//! projected past `expires_at`, its items go in their owner's live lane
//! (`Lane::Promoted`). Ended batches past `[batch] retention` are removed
//! every minute ([`super::store::Store::purge`]).
//!
//! After a restart the runner picks up every unfinished batch: an item
//! that was in flight has no result and runs again; one with a result is
//! not run again ([`super::store::Store::record`] writes a result once).
//!
//! When the store refuses a write (a full disk, its server down), the
//! runner keeps the results it could not store and starts nothing new: it
//! tries the store again after a backoff that doubles from 1 s to 30 s,
//! writes what it kept, and goes on. An item whose result could not be
//! stored is never sent to its backend again for that (`writes`).
//!
//! The runner's task owns the running batches (`Runs`) and its items'
//! tasks (`items`): an item's task runs it and stores its result, and the
//! runner takes what it came to from the set it spawned it in. What the
//! API and the scrapes read of it is published after each change
//! ([`Runner`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

mod advance;
mod finalize;
mod items;
mod writes;

use items::ItemSet;
use writes::StoreWrites;

use super::Batches;
use super::attempt::{Resumes, Target, Tried, try_item};
use super::store::{ItemResult, StoreError, StoredBatch};
use crate::protocol::batch::{Errors, Item, Limits, Status, read_input};

/// How often the runner looks at the batches when nothing wakes it.
const TICK: Duration = Duration::from_millis(250);
/// How often ended batches past their retention are removed (at most).
const PURGE_EVERY: Duration = Duration::from_secs(60);

/// What the runner shows the API and the scrapes, and how they wake it.
/// Its own state is its task's (`Runs`).
#[derive(Default)]
pub struct Runner {
    wake: tokio::sync::Notify,
    /// Each running batch's view, as the runner last published it.
    views: Mutex<HashMap<String, RunView>>,
    /// Since start, by tenant.
    resumes: Mutex<BTreeMap<String, Resumes>>,
    /// Each running batch's, since the runner picked it up.
    batch_resumes: Mutex<HashMap<String, Resumes>>,
    /// The unfinished batches as the last step read them (every replica's,
    /// with the shared store), for the scrapes.
    seen: Mutex<Vec<StoredBatch>>,
    writes: Mutex<StoreWrites>,
    /// Results the store refused, held until it takes them, as last
    /// published.
    held: AtomicUsize,
}

/// What the runner knows of a running batch now.
#[derive(Clone, Copy, Debug)]
pub struct RunView {
    /// Items sent to the request path now.
    pub in_flight: u32,
    /// When its last item is projected to have a result (Unix seconds),
    /// once one of its items has finished.
    pub projected: Option<u64>,
    /// Its items' preemptions since the runner picked it up.
    pub resumes: Resumes,
}

impl Runner {
    /// Each running batch's view, by id.
    pub fn runs(&self) -> HashMap<String, RunView> {
        let mut views = self.views.lock().clone();
        for (id, r) in self.batch_resumes.lock().iter() {
            if let Some(v) = views.get_mut(id) {
                v.resumes = *r;
            }
        }
        views
    }

    /// The unfinished batches as the last look read them.
    pub fn seen(&self) -> Vec<StoredBatch> {
        self.seen.lock().clone()
    }

    /// Whether the store takes the runner's writes, its failures since
    /// start, and the results held until it does.
    pub fn store_writes(&self) -> (bool, u64, usize) {
        let w = self.writes.lock();
        (w.up(), w.failures_total, self.held.load(Ordering::Relaxed))
    }

    /// Preemptions of items and what became of them since start, by
    /// tenant.
    pub fn resumes(&self) -> BTreeMap<String, Resumes> {
        self.resumes.lock().clone()
    }

    /// An item's call to the store failed (its result, its progress).
    pub(super) fn store_failed(&self, e: &StoreError) {
        self.writes.lock().failed(e, false);
    }

    /// Counts a preemption (or what became of it) of an item of `t`'s, for
    /// its tenant and its batch.
    pub(super) fn note(&self, t: &Target<'_>, f: impl Fn(&mut Resumes)) {
        f(self.resumes.lock().entry(t.owner.to_owned()).or_default());
        if let Some(r) = self.batch_resumes.lock().get_mut(t.batch) {
            f(r);
        }
    }

    /// Looks at the batches now (a batch was created or cancelled, an item
    /// ended).
    pub fn wake(&self) {
        self.wake.notify_one();
    }
}

/// The runner's own state: the running batches, and their items in
/// flight.
#[derive(Default)]
struct Runs {
    runs: HashMap<String, Run>,
    items: ItemSet<ItemEnd>,
}

/// A running batch.
struct Run {
    items: Arc<Vec<Item>>,
    /// Lines with a result in the store.
    done: HashSet<u32>,
    /// Results the store refused, written before anything new starts.
    unstored: BTreeMap<u32, ItemResult>,
    /// Lines waiting to be tried again, and when.
    retry_at: HashMap<u32, tokio::time::Instant>,
    /// Lines another replica runs (the shared store), not offered again
    /// until their lease could have expired.
    elsewhere: HashMap<u32, tokio::time::Instant>,
    tries: HashMap<u32, u32>,
    /// Where this replica's look at its items starts: 0 with the embedded
    /// store; at random with the shared one, so that replicas sharing the
    /// batch take items from different parts of it rather than all
    /// offering the same lines, the one with the head start holding them.
    first: usize,
    /// When the runner picked it up, and how many items had results then.
    started: tokio::time::Instant,
    done_at_start: usize,
    /// When its last item is projected to have a result (Unix seconds).
    projected: Option<u64>,
}

impl Run {
    /// Its item of input line `line` (its items are in input order).
    fn item(&self, line: u32) -> Option<&Item> {
        let i = self
            .items
            .binary_search_by_key(&line, |item| item.line)
            .ok()?;
        self.items.get(i)
    }

    /// When its last item will have a result at the rate its items have
    /// had one since the runner picked it up; `None` until one has.
    fn projection(&self, total: usize, now: u64) -> Option<u64> {
        let done = self.done.len().saturating_sub(self.done_at_start);
        let elapsed = self.started.elapsed().as_secs_f64();
        if done == 0 || elapsed <= 0.0 {
            return None;
        }
        let left = total.saturating_sub(self.done.len()) as f64;
        Some(now + (left * elapsed / done as f64).ceil() as u64)
    }
}

pub(super) async fn run(b: Arc<Batches>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let retention = b.limits.retention;
    let mut purge = tokio::time::interval(retention.min(PURGE_EVERY));
    purge.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut state = Runs::default();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = b.runner.wake.notified() => {}
            _ = tick.tick() => {}
            Some(ended) = state.items.next(), if !state.items.is_empty() => {
                state.item_ended(ended);
                while let Some(ended) = state.items.try_next() {
                    state.item_ended(ended);
                }
            }
            _ = purge.tick() => {
                let before = crate::clock::unix_seconds().saturating_sub(retention.as_secs());
                match b.store.purge(before).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(batches = n, "batches past their retention removed"),
                    Err(e) => tracing::warn!(error = %e, "batch runner: purge failed; retrying"),
                }
                continue;
            }
        }
        if b.runner.writes.lock().ready(tokio::time::Instant::now()) {
            match state.step(&b).await {
                Ok(()) => b.runner.writes.lock().worked(),
                Err(e) => b.runner.writes.lock().failed(&e, true),
            }
        }
        state.publish(&b.runner);
    }
    // Items in flight run again at the next start (or at the replica that
    // takes the batch over): they have no result.
    for id in state.items.batches() {
        b.store.release_items(&id, &state.items.lines(&id)).await;
    }
    state.items.stop_all();
    let held: Vec<String> = state.runs.keys().cloned().collect();
    b.store.release(&held).await;
}

impl Runs {
    /// One look at every unfinished batch, earliest deadline first, once
    /// the results the store refused before are written.
    async fn step(&mut self, b: &Arc<Batches>) -> Result<(), StoreError> {
        self.store_held(b).await?;
        let mut active = b.store.active_batches().await?;
        active.sort_by_key(|s| s.batch.expires_at);
        b.runner.seen.lock().clone_from(&active);
        b.refresh_ended().await;
        let ids: Vec<String> = active.iter().map(|s| s.batch.id.clone()).collect();
        let mine = b.store.claim(&ids).await?;
        // With the shared store every replica runs items of every batch in
        // progress, each item under a lease of its own
        // (`Store::take_items`); the holder of the batch's lease alone
        // validates, finalizes, cancels and expires it.
        let helping: HashSet<String> = active
            .iter()
            .filter(|sb| b.store.is_shared() && sb.batch.status == Status::InProgress)
            .map(|sb| sb.batch.id.clone())
            .filter(|id| !mine.contains(id))
            .collect();
        // A batch that ended, or that another replica took over (this one
        // missed renewing its lease): its items here stop.
        let gone: Vec<String> = self
            .runs
            .keys()
            .filter(|id| !mine.contains(*id) && !helping.contains(*id))
            .cloned()
            .collect();
        for id in gone {
            self.forget(&b.runner, &id);
        }
        let now = crate::clock::unix_seconds();
        let mut room = advance::Room::for_step(b, self);
        for sb in active {
            if helping.contains(&sb.batch.id) {
                self.advance(b, sb, &mut room, false).await?;
                continue;
            }
            if !mine.contains(&sb.batch.id) {
                continue;
            }
            let expired = sb.batch.expires_at.is_some_and(|e| now >= e);
            match sb.batch.status {
                Status::Validating if expired => self.finalize(b, sb, Status::Expired).await?,
                Status::Validating => validate(b, sb).await?,
                Status::InProgress if expired => self.finalize(b, sb, Status::Expired).await?,
                Status::InProgress => self.advance(b, sb, &mut room, true).await?,
                Status::Cancelling => self.finalize(b, sb, Status::Cancelled).await?,
                Status::Finalizing => self.finalize(b, sb, Status::Completed).await?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Stops a batch here: its items in flight, its run (returned).
    fn forget(&mut self, runner: &Runner, id: &str) -> Option<Run> {
        self.items.stop(id);
        runner.batch_resumes.lock().remove(id);
        self.runs.remove(id)
    }

    /// What the API and the scrapes read of the runner, now.
    fn publish(&self, runner: &Runner) {
        let views = self
            .runs
            .iter()
            .map(|(id, r)| {
                let view = RunView {
                    in_flight: u32::try_from(self.items.in_flight(id)).unwrap_or(u32::MAX),
                    projected: r.projected,
                    resumes: Resumes::default(),
                };
                (id.clone(), view)
            })
            .collect();
        *runner.views.lock() = views;
        let held = self.runs.values().map(|r| r.unstored.len()).sum();
        runner.held.store(held, Ordering::Relaxed);
    }

    /// What an item's try came to, into its run (a panicked try is tried
    /// again after a while).
    fn item_ended(&mut self, (id, line, ended): items::Ended<ItemEnd>) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        let (tries, ended) = match ended {
            Ok(ItemEnd { tries, ended }) => (tries, ended),
            Err(e) => {
                tracing::error!(batch = %id, line, error = %e, "batch item's task failed; it runs again");
                let tries = run.tries.get(&line).copied().unwrap_or(0) + 1;
                (tries, Ended::Again(Duration::from_secs(1)))
            }
        };
        match ended {
            Ended::Stored => {
                run.done.insert(line);
            }
            Ended::Held(result) => {
                run.unstored.insert(line, result);
            }
            Ended::Again(after) => {
                run.tries.insert(line, tries);
                run.retry_at
                    .insert(line, tokio::time::Instant::now() + after);
            }
        }
    }
}

/// The input file's items, checked against the policy now (`models`: that
/// each names a model it serves; a running batch is read again without,
/// so that an item for a model removed since gets the gateway's 404).
async fn read_items(
    b: &Arc<Batches>,
    sb: &StoredBatch,
    models: bool,
) -> Result<Vec<Item>, Vec<crate::protocol::batch::LineError>> {
    let text = match b.store.content(&sb.batch.input_file_id).await {
        Ok(t) => t,
        Err(e) => {
            return Err(vec![crate::protocol::batch::LineError {
                code: "file_unreadable".into(),
                message: format!("the input file cannot be read: {e}"),
                line: None,
                param: Some("input_file_id".into()),
            }]);
        }
    };
    let live = b.gw.live();
    let max_body_bytes = live.policy.server.max_body_bytes;
    let gw = b.gw.clone();
    let known = move |m: &str| {
        !models
            || gw
                .model_pool(&live, m, crate::core::spec::Api::OpenAi, None)
                .is_ok()
    };
    let limits = Limits {
        endpoint: &sb.batch.endpoint,
        max_lines: b.limits.max_lines,
        max_body_bytes,
        known_model: &known,
    };
    read_input(&text, &limits)
}

async fn validate(b: &Arc<Batches>, sb: StoredBatch) -> Result<(), StoreError> {
    let now = crate::clock::unix_seconds();
    let read = read_items(b, &sb, true).await;
    b.store
        .update(&sb.batch.id, move |batch| {
            if batch.status != Status::Validating {
                return;
            }
            match &read {
                Ok(items) => {
                    batch.status = Status::InProgress;
                    batch.in_progress_at = Some(now);
                    batch.request_counts.total = u32::try_from(items.len()).unwrap_or(u32::MAX);
                    let first = items.first().map(|i| i.model.clone());
                    if items.iter().all(|i| Some(&i.model) == first.as_ref()) {
                        batch.model = first;
                    }
                }
                Err(errors) => {
                    batch.status = Status::Failed;
                    batch.failed_at = Some(now);
                    batch.errors = Some(Errors {
                        object: "list".into(),
                        data: errors.clone(),
                    });
                }
            }
        })
        .await?;
    b.runner.wake();
    Ok(())
}

/// What one try of an item came to, for its run.
enum Ended {
    /// Its result is in the store.
    Stored,
    /// The store refused its result: kept, and written once the store
    /// works again (the item is not sent again for the store's failure).
    Held(ItemResult),
    /// Tried again after a while.
    Again(Duration),
}

/// An item's task's value: its try's number and what it came to.
struct ItemEnd {
    tries: u32,
    ended: Ended,
}

/// Runs one try of an item (its `tries`th) and stores its result.
async fn item_task(
    b: Arc<Batches>,
    (id, owner, endpoint): (String, String, String),
    item: Item,
    (deadline, promoted, tries): (Duration, bool, u32),
) -> ItemEnd {
    let rid = item_id(&id, item.line);
    let target = Target {
        batch: &id,
        line: item.line,
        owner: &owner,
        endpoint: &endpoint,
        rid: &rid,
        deadline,
        promoted,
    };
    let tried = try_item(&b, &target, &item, tries).await;
    let ended = match tried {
        Tried::Done(result) => match b.store.record(&id, item.line, result.clone()).await {
            Ok(_) => Ended::Stored,
            Err(e) => {
                b.runner.store_failed(&e);
                Ended::Held(result)
            }
        },
        Tried::Again(after) => {
            b.runner.note(&target, |r| r.retried += 1);
            Ended::Again(after)
        }
    };
    ItemEnd { tries, ended }
}

/// The item's id in its output line and its request's `x-request-id`.
fn item_id(batch: &str, line: u32) -> String {
    format!("batch_req_{}_{line}", batch.trim_start_matches("batch_"))
}
