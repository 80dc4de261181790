//! Where files, batches and every item's result are kept: the embedded
//! store (a data directory, the default) or the shared one (the cluster's
//! Redis for the records, an S3-compatible object store for the files'
//! bytes), so that any replica can take over another's batch.
//!
//! Both keep the same promises: an item's result is written once (a
//! second [`Store::record`] of it does nothing), a file is whole or
//! absent, and a batch's counts move with its results, never from an
//! older copy. The runner runs a batch only while it holds it
//! ([`Store::claim`]): always with the embedded store, under a lease that
//! expires with its replica with the shared one.

mod embedded;
mod shared;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::protocol::batch::{Batch, FileObject};
pub use embedded::Embedded;
pub use shared::{Shared, SharedConfig};

/// A store failure, as the API answers it (500, or 507 for a full disk;
/// the message says what).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("batch store: {0}")]
    Db(String),
    #[error("batch store, file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The embedded database's file failed (a full disk among others);
    /// it is opened again at its next use.
    #[error("batch store database: {0}")]
    Disk(std::io::Error),
    #[error("batch store: a stored record does not read back: {0}")]
    Corrupt(String),
    /// The shared store's connection to `[cluster]`'s store could not be
    /// set up.
    #[error("batch store (redis)")]
    Connect(#[source] crate::cluster::ConnectError),
    /// The shared store's Redis or object store failed.
    #[error("batch store ({0}): {1}")]
    Remote(&'static str, String),
}

impl StoreError {
    /// Whether it failed for want of space (the API answers 507).
    pub fn is_full(&self) -> bool {
        let io = match self {
            StoreError::Io { source, .. } | StoreError::Disk(source) => source,
            _ => return false,
        };
        matches!(
            io.kind(),
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
        )
    }
}

/// A file and the tenant it belongs to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredFile {
    pub owner: String,
    pub file: FileObject,
}

/// A batch and the tenant it belongs to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredBatch {
    pub owner: String,
    pub batch: Batch,
}

/// One item's result: its line of the output (`ok`) or error file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ItemResult {
    pub ok: bool,
    pub line: String,
    /// (prompt, cached, completion, reasoning) tokens of its answer.
    pub usage: (u64, u64, u64, u64),
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

/// What [`Store::take_items`] found of the lines it was offered.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Taken {
    /// Lines this replica may run now (their leases taken or renewed).
    pub taken: Vec<u32>,
    /// Lines with a result.
    pub done: Vec<u32>,
    /// Lines another replica runs (its lease has not expired).
    pub busy: Vec<u32>,
}

/// The store the batch service uses.
#[derive(Debug)]
pub enum Store {
    Embedded(Arc<Embedded>),
    Shared(Box<Shared>),
}

/// Runs `f` on the blocking pool: the embedded store's calls wait for
/// the disk.
async fn blocking<R: Send + 'static>(
    store: &Arc<Embedded>,
    f: impl FnOnce(&Embedded) -> R + Send + 'static,
) -> R {
    let s = store.clone();
    match tokio::task::spawn_blocking(move || f(&s)).await {
        Ok(r) => r,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

impl Store {
    /// A fresh local temporary file for an upload to be written into
    /// (both stores take uploads through the data directory).
    pub async fn temp_file(&self, id: &str) -> Result<(PathBuf, std::fs::File), StoreError> {
        let id = id.to_owned();
        match self {
            Store::Embedded(e) => blocking(e, move |s| s.temp_file(&id)).await,
            Store::Shared(s) => s.temp_file(&id),
        }
    }

    /// Keeps the temporary file `tmp` as file `f`'s bytes, then its record:
    /// a crash between the two leaves orphan bytes, never a record without
    /// its bytes.
    pub async fn put_file(&self, tmp: PathBuf, f: StoredFile) -> Result<(), StoreError> {
        match self {
            Store::Embedded(e) => blocking(e, move |s| s.put_file(&tmp, &f)).await,
            Store::Shared(s) => s.put_file(&tmp, &f).await,
        }
    }

    /// Writes `lines` as a new file of `f`'s (its `bytes` set here).
    pub async fn write_file(
        &self,
        f: StoredFile,
        lines: Vec<String>,
    ) -> Result<StoredFile, StoreError> {
        match self {
            Store::Embedded(e) => {
                blocking(e, move |s| {
                    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
                    s.write_file(f, &refs)
                })
                .await
            }
            Store::Shared(s) => s.write_file(f, &lines).await,
        }
    }

    pub async fn file(&self, id: &str) -> Result<Option<StoredFile>, StoreError> {
        let id = id.to_owned();
        match self {
            Store::Embedded(e) => blocking(e, move |s| s.file(&id)).await,
            Store::Shared(s) => s.file(&id).await,
        }
    }

    /// Every file, or `owner`'s, oldest first.
    pub async fn files(&self, owner: Option<&str>) -> Result<Vec<StoredFile>, StoreError> {
        let owner = owner.map(str::to_owned);
        let mut files = match self {
            Store::Embedded(e) => blocking(e, move |s| s.files(owner.as_deref())).await?,
            Store::Shared(s) => s.files(owner.as_deref()).await?,
        };
        files.sort_by(|a, b| (a.file.created_at, &a.file.id).cmp(&(b.file.created_at, &b.file.id)));
        Ok(files)
    }

    /// A file's bytes.
    pub async fn content(&self, id: &str) -> Result<Vec<u8>, StoreError> {
        let id = id.to_owned();
        match self {
            Store::Embedded(e) => blocking(e, move |s| s.content(&id)).await,
            Store::Shared(s) => s.content(&id).await,
        }
    }

    /// Removes a file's record, then its bytes.
    pub async fn delete_file(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_owned();
        match self {
            Store::Embedded(e) => blocking(e, move |s| s.delete_file(&id)).await,
            Store::Shared(s) => s.delete_file(&id).await,
        }
    }

    /// Writes a new batch (changes go through [`Store::update`]).
    pub async fn put_batch(&self, b: StoredBatch) -> Result<(), StoreError> {
        match self {
            Store::Embedded(e) => blocking(e, move |s| s.put_batch(&b)).await,
            Store::Shared(s) => s.put_batch(&b).await,
        }
    }

    /// Changes batch `id` atomically (its counts and usage, which
    /// [`Store::record`] moves, as they are then; the shared store may call
    /// `f` again on a fresher copy when another replica wrote between); the
    /// batch as written, `None` if there is none.
    pub async fn update(
        &self,
        id: &str,
        f: impl FnMut(&mut Batch) + Send + 'static,
    ) -> Result<Option<StoredBatch>, StoreError> {
        let id = id.to_owned();
        match self {
            Store::Embedded(e) => blocking(e, move |s| s.update(&id, f)).await,
            Store::Shared(s) => s.update(&id, f).await,
        }
    }

    /// The batches not yet ended.
    pub async fn active_batches(&self) -> Result<Vec<StoredBatch>, StoreError> {
        match self {
            Store::Embedded(e) => blocking(e, Embedded::active_batches).await,
            Store::Shared(s) => s.active_batches().await,
        }
    }

    pub async fn batch(&self, id: &str) -> Result<Option<StoredBatch>, StoreError> {
        let id = id.to_owned();
        match self {
            Store::Embedded(e) => blocking(e, move |s| s.batch(&id)).await,
            Store::Shared(s) => s.batch(&id).await,
        }
    }

    /// Every batch, or `owner`'s, newest first.
    pub async fn batches(&self, owner: Option<&str>) -> Result<Vec<StoredBatch>, StoreError> {
        let owner = owner.map(str::to_owned);
        let mut out = match self {
            Store::Embedded(e) => blocking(e, move |s| s.batches(owner.as_deref())).await?,
            Store::Shared(s) => s.batches(owner.as_deref()).await?,
        };
        out.sort_by(|a, b| {
            (b.batch.created_at, &b.batch.id).cmp(&(a.batch.created_at, &a.batch.id))
        });
        Ok(out)
    }

    /// Records item `line` of batch `id`, once: its result, and its batch's
    /// counts and usage, together (and drops its progress). `false` (and nothing written) when the
    /// item already has a result or the batch is gone.
    pub async fn record(
        &self,
        id: &str,
        line: u32,
        result: ItemResult,
    ) -> Result<bool, StoreError> {
        self.record_all(id, vec![(line, result)])
            .await
            .map(|n| n == 1)
    }

    /// Records each `(line, result)` of batch `id` that has no result yet,
    /// with its batch's counts and usage, together; how many were new.
    pub async fn record_all(
        &self,
        id: &str,
        results: Vec<(u32, ItemResult)>,
    ) -> Result<usize, StoreError> {
        let id = id.to_owned();
        match self {
            Store::Embedded(e) => {
                blocking(e, move |s| {
                    s.record_all(&id, results.iter().map(|(l, r)| (*l, r)))
                })
                .await
            }
            Store::Shared(s) => s.record_all(&id, &results).await,
        }
    }

    /// Keeps `progress` (what item `line` of batch `id` has generated so
    /// far, as the runner serializes it) until the item's result is
    /// recorded, so that whoever runs the item next continues from it;
    /// nothing when it has a result already.
    pub async fn save_progress(
        &self,
        id: &str,
        line: u32,
        progress: Vec<u8>,
    ) -> Result<(), StoreError> {
        let id = id.to_owned();
        match self {
            Store::Embedded(e) => blocking(e, move |s| s.save_progress(&id, line, &progress)).await,
            Store::Shared(s) => s.save_progress(&id, line, &progress).await,
        }
    }

    /// What [`Store::save_progress`] kept for item `line` of batch `id`.
    pub async fn progress(&self, id: &str, line: u32) -> Result<Option<Vec<u8>>, StoreError> {
        let id = id.to_owned();
        match self {
            Store::Embedded(e) => blocking(e, move |s| s.progress(&id, line)).await,
            Store::Shared(s) => s.progress(&id, line).await,
        }
    }

    /// The results of batch `id`, by line.
    pub async fn results(&self, id: &str) -> Result<BTreeMap<u32, ItemResult>, StoreError> {
        let id = id.to_owned();
        match self {
            Store::Embedded(e) => blocking(e, move |s| s.results(&id)).await,
            Store::Shared(s) => s.results(&id).await,
        }
    }

    /// Removes every batch that ended before `before` (Unix seconds): its
    /// record, its items' results and its output and error files. Input
    /// files stay (their owners delete them). Returns how many went.
    pub async fn purge(&self, before: u64) -> Result<usize, StoreError> {
        match self {
            Store::Embedded(e) => blocking(e, move |s| s.purge(before)).await,
            Store::Shared(s) => s.purge(before).await,
        }
    }

    /// The files `owner` keeps, and their bytes.
    pub async fn held_by(&self, owner: &str) -> Result<(usize, u64), StoreError> {
        let files = self.files(Some(owner)).await?;
        Ok((files.len(), files.iter().map(|f| f.file.bytes).sum()))
    }

    /// Which of the batches `ids` this replica runs now: all of them with
    /// the embedded store; with the shared one, those whose lease it takes
    /// (nobody held it, or its holder stopped renewing it) or renews.
    pub async fn claim(&self, ids: &[String]) -> Result<HashSet<String>, StoreError> {
        match self {
            Store::Embedded(_) => Ok(ids.iter().cloned().collect()),
            Store::Shared(s) => s.claim(ids).await,
        }
    }

    /// Of `lines` of batch `id` (in order), at most `n` this replica may
    /// run now: all of the first `n` with the embedded store; with the
    /// shared one those with no result and no lease of another replica's
    /// that runs yet, each under a lease of this replica's (taken, or
    /// renewed: offer the lines running here again each step) that
    /// expires as a batch's does. Several replicas then run one batch's
    /// items, and the items of one that dies go to the others.
    pub async fn take_items(&self, id: &str, lines: &[u32], n: usize) -> Result<Taken, StoreError> {
        match self {
            Store::Embedded(_) => Ok(Taken {
                taken: lines.iter().copied().take(n).collect(),
                ..Taken::default()
            }),
            Store::Shared(s) => s.take_items(id, lines, n).await,
        }
    }

    /// Gives up this replica's leases of `lines` of batch `id` (at
    /// shutdown), so that another replica takes them at once.
    pub async fn release_items(&self, id: &str, lines: &[u32]) {
        if let Store::Shared(s) = self {
            s.release_items(id, lines).await;
        }
    }

    /// Gives up the leases of the batches this replica runs (at shutdown),
    /// so that another replica takes them over at once.
    pub async fn release(&self, ids: &[String]) {
        if let Store::Shared(s) = self {
            s.release(ids).await;
        }
    }

    /// Times the embedded database was opened again after a failure of
    /// its file since start (0 for the shared store, whose connections
    /// reconnect on their own).
    pub fn reopens(&self) -> u64 {
        match self {
            Store::Embedded(e) => e.reopens(),
            Store::Shared(_) => 0,
        }
    }

    /// Whether the store's records are shared between replicas.
    pub fn is_shared(&self) -> bool {
        matches!(self, Store::Shared(_))
    }
}
