//! The items in flight: one `JoinSet` that the runner's task owns, so
//! that an item's end reaches the runner only through it, after its start
//! was recorded (an item spawned first and recorded after could end in
//! between, leave a record that no end would remove, and hold its batch
//! open until it expired).
//!
//! One set for every batch rather than one per batch: the runner waits
//! on one `join_next` beside its timers, and a batch's items stop through
//! their abort handles, kept here by batch and line.

use std::collections::HashMap;

use tokio::task::{AbortHandle, Id, JoinError, JoinSet};

/// Items in flight, each a task returning `T`.
pub(super) struct ItemSet<T> {
    tasks: JoinSet<T>,
    /// Each running task's batch and line.
    of: HashMap<Id, (String, u32)>,
    /// Each batch's tasks, by line.
    by_batch: HashMap<String, HashMap<u32, AbortHandle>>,
}

impl<T> Default for ItemSet<T> {
    fn default() -> Self {
        ItemSet {
            tasks: JoinSet::new(),
            of: HashMap::new(),
            by_batch: HashMap::new(),
        }
    }
}

/// How an item's task ended: with its value, or with a panic (an aborted
/// task's end is not reported: whoever stopped it knows).
pub(super) type Ended<T> = (String, u32, Result<T, JoinError>);

impl<T: Send + 'static> ItemSet<T> {
    /// Runs `line` of `batch` as a task.
    pub(super) fn start(
        &mut self,
        batch: &str,
        line: u32,
        task: impl Future<Output = T> + Send + 'static,
    ) {
        let handle = self.tasks.spawn(task);
        self.of.insert(handle.id(), (batch.to_owned(), line));
        self.by_batch
            .entry(batch.to_owned())
            .or_default()
            .insert(line, handle);
    }

    /// Whether `line` of `batch` is in flight.
    pub(super) fn running(&self, batch: &str, line: u32) -> bool {
        self.by_batch
            .get(batch)
            .is_some_and(|lines| lines.contains_key(&line))
    }

    /// The lines of `batch` in flight.
    pub(super) fn lines(&self, batch: &str) -> Vec<u32> {
        self.by_batch
            .get(batch)
            .map_or_else(Vec::new, |lines| lines.keys().copied().collect())
    }

    /// The batches with items in flight.
    pub(super) fn batches(&self) -> Vec<String> {
        self.by_batch.keys().cloned().collect()
    }

    /// How many of `batch`'s items are in flight.
    pub(super) fn in_flight(&self, batch: &str) -> usize {
        self.by_batch.get(batch).map_or(0, HashMap::len)
    }

    /// Whether no task is left, in flight or stopped and not yet joined.
    pub(super) fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Stops `batch`'s items; their ends are not reported.
    pub(super) fn stop(&mut self, batch: &str) {
        for handle in self
            .by_batch
            .remove(batch)
            .into_iter()
            .flat_map(HashMap::into_values)
        {
            handle.abort();
            self.of.remove(&handle.id());
        }
    }

    /// Stops every item.
    pub(super) fn stop_all(&mut self) {
        let batches: Vec<String> = self.by_batch.keys().cloned().collect();
        for b in batches {
            self.stop(&b);
        }
    }

    /// The next item to end (waits; `None` when none is in flight).
    pub(super) async fn next(&mut self) -> Option<Ended<T>> {
        loop {
            let joined = self.tasks.join_next_with_id().await?;
            if let Some(ended) = self.ended(joined) {
                return Some(ended);
            }
        }
    }

    /// An item that has ended, if any (does not wait).
    pub(super) fn try_next(&mut self) -> Option<Ended<T>> {
        loop {
            let joined = self.tasks.try_join_next_with_id()?;
            if let Some(ended) = self.ended(joined) {
                return Some(ended);
            }
        }
    }

    fn ended(&mut self, joined: Result<(Id, T), JoinError>) -> Option<Ended<T>> {
        let (id, result) = match joined {
            Ok((id, value)) => (id, Ok(value)),
            Err(e) => (e.id(), Err(e)),
        };
        // Stopped: forgotten then.
        let (batch, line) = self.of.remove(&id)?;
        if let Some(lines) = self.by_batch.get_mut(&batch) {
            lines.remove(&line);
            if lines.is_empty() {
                self.by_batch.remove(&batch);
            }
        }
        Some((batch, line, result))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_item_that_ends_at_once_is_in_flight_until_its_end_is_taken() {
        let mut set = ItemSet::default();
        // Ends before `start` returns, on another worker.
        set.start("b", 1, async { 7 });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(set.running("b", 1) && set.in_flight("b") == 1);
        let (batch, line, value) = set.try_next().expect("it has ended");
        assert_eq!((batch.as_str(), line, value.unwrap()), ("b", 1, 7));
        assert_eq!(set.in_flight("b"), 0);
        assert!(set.is_empty() && set.try_next().is_none());
    }

    #[tokio::test]
    async fn a_stopped_batchs_items_end_unreported_and_others_go_on() {
        let mut set = ItemSet::default();
        for line in 0..3 {
            set.start("stopped", line, std::future::pending::<u32>());
        }
        set.start("other", 9, async { 9 });
        set.stop("stopped");
        assert_eq!(set.in_flight("stopped"), 0);
        let (batch, line, value) = set.next().await.unwrap();
        assert_eq!((batch.as_str(), line, value.unwrap()), ("other", 9, 9));
        assert_eq!(set.in_flight("other"), 0);
        // The aborted tasks' ends are drained, not reported.
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(100), set.next())
                .await
                .unwrap()
                .is_none()
        );
        assert!(set.is_empty());
    }

    #[tokio::test]
    async fn a_panicked_item_is_reported_with_its_batch_and_line() {
        let mut set: ItemSet<u32> = ItemSet::default();
        set.start("b", 4, async { panic!("item panicked") });
        let (batch, line, value) = set.next().await.unwrap();
        assert_eq!((batch.as_str(), line), ("b", 4));
        assert!(value.unwrap_err().is_panic());
    }
}
