//! A running batch's step: which of its items start (under their leases,
//! with the shared store), and, at the holder of its lease, its end once
//! every item has a result.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::{Run, Runs, item_task, read_items};
use crate::batch::Batches;
use crate::batch::store::{StoreError, StoredBatch};
use crate::protocol::batch::{Item, Status};

/// Free places per model pool in this step: its healthy backends' windows
/// (this replica's share of them, in a cluster) and `surplus` less what it
/// holds now (live and batch, queued and in flight), or less the runner's
/// items of the model in flight if more (an item waiting out a 429 or
/// 503 before it tries again is in no queue, yet holds its place).
#[derive(Default)]
pub(super) struct Room {
    free: HashMap<String, u32>,
    surplus: u32,
    /// The runner's items in flight, by model.
    items: HashMap<String, u32>,
}

/// Items a replica sharing batches holds queued beyond its share of the
/// windows: a cluster apportions each pool's windows by the replicas'
/// backlogs, so a replica with none of a batch's items queued would get
/// no slots to run any (and a replica holding every slot would keep them).
const SHARED_SURPLUS: u32 = 8;

impl Room {
    /// The room of a step of `runs`.
    pub(super) fn for_step(b: &Batches, runs: &Runs) -> Room {
        Room {
            surplus: if b.store.is_shared() {
                SHARED_SURPLUS
            } else {
                0
            },
            items: runs.items_by_model(),
            ..Room::default()
        }
    }

    fn take(&mut self, b: &Batches, model: &str) -> bool {
        let surplus = self.surplus;
        let items = self.items.get(model).copied().unwrap_or(0);
        let free = self.free.entry(model.to_owned()).or_insert_with(|| {
            let live = b.gw.live();
            match b
                .gw
                .model_pool(&live, model, crate::core::spec::Api::OpenAi, None)
            {
                Ok((pool, _, _)) => {
                    let (capacity, held) = b.gw.sched().pool_load(pool);
                    (capacity + surplus).saturating_sub(held.max(items))
                }
                Err(_) => 0,
            }
        });
        if *free == 0 {
            return false;
        }
        *free -= 1;
        true
    }
}

/// Lines offered to the store beyond those this step has room for, per
/// line with room: others' running ones and those with a result are
/// skipped without a step lost.
const OFFERED_PER_ROOM: usize = 4;
/// How long a line another replica runs is not offered again.
const ELSEWHERE_FOR: Duration = Duration::from_secs(1);

impl Runs {
    /// The items in flight, by model.
    fn items_by_model(&self) -> HashMap<String, u32> {
        let mut out: HashMap<String, u32> = HashMap::new();
        for (id, run) in &self.runs {
            for line in self.items.lines(id) {
                if let Some(item) = run.item(line) {
                    *out.entry(item.model.clone()).or_default() += 1;
                }
            }
        }
        out
    }

    /// Starts what `sb`'s items have room for (under their leases, with
    /// the shared store) and, at the holder of its lease (`coordinator`),
    /// finalizes it once every item has a result.
    pub(super) async fn advance(
        &mut self,
        b: &Arc<Batches>,
        sb: StoredBatch,
        room: &mut Room,
        coordinator: bool,
    ) -> Result<(), StoreError> {
        let id = sb.batch.id.clone();
        if !self.runs.contains_key(&id) {
            // It read when the batch started: what fails here is the
            // store (the object store not answering, read again at the next
            // look) or a file removed from under it (the batch then ends
            // when it expires).
            let items = match read_items(b, &sb, false).await {
                Ok(items) => items,
                Err(errors) => {
                    static LOG: crate::clock::Throttled =
                        crate::clock::Throttled::new(crate::clock::REMOTE_LOG_EVERY);
                    if let Some(left_out) = LOG.allow() {
                        let cause = errors
                            .first()
                            .map(|e| e.message.clone())
                            .unwrap_or_default();
                        tracing::warn!(batch = %id, %cause, left_out, "batch input unreadable; read again at the next look");
                    }
                    return Ok(());
                }
            };
            let items_len = items.len();
            let done: HashSet<u32> = b.store.results(&id).await?.into_keys().collect();
            self.runs.entry(id.clone()).or_insert(Run {
                items: Arc::new(items),
                done_at_start: done.len(),
                done,
                unstored: BTreeMap::new(),
                retry_at: HashMap::new(),
                elsewhere: HashMap::new(),
                tries: HashMap::new(),
                first: if b.store.is_shared() {
                    rand::random_range(0..items_len.max(1))
                } else {
                    0
                },
                started: tokio::time::Instant::now(),
                projected: None,
            });
            b.runner.batch_resumes.lock().entry(id.clone()).or_default();
        }
        let total = usize::try_from(sb.batch.request_counts.total).unwrap_or(usize::MAX);
        let c = &sb.batch.request_counts;
        // Every replica's results, where several run the batch.
        let counted = usize::try_from(c.completed + c.failed).unwrap_or(0);
        let (finished, promoted, held, offered, room_for) = {
            let Some(run) = self.runs.get_mut(&id) else {
                return Ok(());
            };
            run.projected = run.projection(total, crate::clock::unix_seconds());
            // Its window cannot be met at this rate: its items go in their
            // owner's live lane, by its weight, rather than in the batch lane.
            let promoted = run
                .projected
                .zip(sb.batch.expires_at)
                .is_some_and(|(p, e)| p > e);
            let now = tokio::time::Instant::now();
            run.elsewhere.retain(|_, until| *until > now);
            // Lines this replica holds (running, or waiting to be tried
            // again): their leases are renewed.
            let mut held = self.items.lines(&id);
            held.extend(
                (run.retry_at.iter())
                    .filter(|(_, t)| **t > now)
                    .map(|(line, _)| *line),
            );
            let (mut offered, mut room_for) = (Vec::new(), 0);
            let (head, tail) = run.items.split_at(run.first.min(run.items.len()));
            for item in tail.iter().chain(head) {
                if run.done.contains(&item.line)
                    || run.unstored.contains_key(&item.line)
                    || self.items.running(&id, item.line)
                    || run.retry_at.get(&item.line).is_some_and(|t| *t > now)
                    || run.elsewhere.contains_key(&item.line)
                {
                    continue;
                }
                if room.take(b, &item.model) {
                    room_for += 1;
                } else if offered.len() >= OFFERED_PER_ROOM * room_for {
                    continue;
                }
                offered.push(item.line);
            }
            (
                coordinator
                    && run.done.len().max(counted) >= total
                    && self.items.in_flight(&id) == 0
                    && run.unstored.is_empty(),
                promoted,
                held,
                offered,
                room_for,
            )
        };
        if finished {
            // Finalized from the store's results, not from what this runner
            // counted: a store whose primary failed over may have lost the
            // last results written to it (replication is asynchronous). What
            // it lacks runs again rather than going missing from the output.
            let stored: HashSet<u32> = b.store.results(&id).await?.into_keys().collect();
            if stored.len() < total {
                if let Some(run) = self.runs.get_mut(&id) {
                    let before = run.done.len();
                    run.done.retain(|line| stored.contains(line));
                    tracing::warn!(
                        batch = %id,
                        lost = before - run.done.len(),
                        "batch items' results missing from the store; they run again"
                    );
                }
                b.runner.wake();
                return Ok(());
            }
            let now = crate::clock::unix_seconds();
            let moved = b
                .store
                .update(&id, move |batch| {
                    if batch.status == Status::InProgress {
                        batch.status = Status::Finalizing;
                        batch.finalizing_at = Some(now);
                    }
                })
                .await?;
            return match moved {
                Some(sb) if sb.batch.status == Status::Finalizing => {
                    self.finalize(b, sb, Status::Completed).await
                }
                _ => Ok(()),
            };
        }
        let mut lines = held.clone();
        lines.extend(&offered);
        let taken = b
            .store
            .take_items(&id, &lines, held.len() + room_for)
            .await?;
        let Some(run) = self.runs.get_mut(&id) else {
            return Ok(());
        };
        run.done.extend(&taken.done);
        let until = tokio::time::Instant::now() + ELSEWHERE_FOR;
        run.elsewhere
            .extend(taken.busy.iter().map(|line| (*line, until)));
        let start: Vec<Item> = (taken.taken.iter())
            .filter(|line| !held.contains(line))
            .filter_map(|line| run.item(*line).cloned())
            .collect();
        let deadline = Duration::from_secs(
            sb.batch
                .expires_at
                .unwrap_or(0)
                .saturating_sub(crate::clock::unix_seconds()),
        );
        for item in start {
            let line = item.line;
            let tries = self
                .runs
                .get(&id)
                .and_then(|r| r.tries.get(&line).copied())
                .unwrap_or(0)
                + 1;
            let task = item_task(
                b.clone(),
                (id.clone(), sb.owner.clone(), sb.batch.endpoint.clone()),
                item,
                (deadline, promoted, tries),
            );
            self.items.start(&id, line, task);
        }
        Ok(())
    }
}
