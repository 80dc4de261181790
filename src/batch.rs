//! Batches the gateway runs for its tenants (the OpenAI Batch API):
//! files and batches kept in a store (`store`), and a runner (`runner`)
//! that feeds each batch's items into the gateway's own request path as
//! its owner's work in the pools' batch lane (dispatched only while no
//! live request waits; preempted by live work like any batch request),
//! and writes each item's answer once.
//!
//! The HTTP routes are the edge's (`edge::batch_api`); this module is what
//! they call: [`Batches`] checks ownership and limits and keeps the
//! records, in the embedded store (a data directory) or the shared one
//! (the cluster's Redis and an S3-compatible object store), whose leases
//! let another replica take over a batch whose replica died.

pub mod attempt;
mod messages;
mod metrics;
pub mod runner;
pub mod store;

use std::sync::Arc;

use crate::config::BatchPolicy;
use crate::gateway::state::Gateway;
use crate::protocol::batch::{Batch, CreateBatch, FileObject, Status};
use store::{Store, StoreError, StoredBatch, StoredFile};

/// Who asks: a tenant sees only its own files and batches; the operator
/// (the admin token) sees every tenant's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    Operator,
    Tenant(String),
}

impl Scope {
    fn sees(&self, owner: &str) -> bool {
        match self {
            Scope::Operator => true,
            Scope::Tenant(t) => t == owner,
        }
    }

    fn owner(&self) -> Option<&str> {
        match self {
            Scope::Operator => None,
            Scope::Tenant(t) => Some(t),
        }
    }
}

/// Why a call was refused.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// 404: no such file or batch (or not the caller's).
    #[error("No {0} with id '{1}'.")]
    NotFound(&'static str, String),
    /// 400: the request is wrong; the message says how.
    #[error("{0}")]
    Invalid(String),
    /// 409: the call does not fit the object's state.
    #[error("{0}")]
    Conflict(String),
    /// 413: over a size limit.
    #[error("{0}")]
    TooLarge(String),
    /// 500/507: the store failed; nothing was half written.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The batch service: the store, its limits, and the runner's state.
pub struct Batches {
    store: Store,
    limits: BatchPolicy,
    gw: Arc<Gateway>,
    runner: runner::Runner,
    /// Ended batches by (tenant, status), and when they were counted: a
    /// scrape reads the whole store at most every [`ENDED_COUNTED_FOR`].
    ended: parking_lot::Mutex<Option<(tokio::time::Instant, EndedCounts)>>,
}

type EndedCounts = std::collections::BTreeMap<(String, String), u64>;

/// How long a count of the ended batches serves the scrapes.
const ENDED_COUNTED_FOR: std::time::Duration = std::time::Duration::from_secs(15);

impl std::fmt::Debug for Batches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batches")
            .field("store", &self.store)
            .finish()
    }
}

/// A fresh id: `prefix` and 24 hex digits.
fn new_id(prefix: &str) -> String {
    format!("{prefix}{:024x}", rand::random::<u128>() >> 32)
}

impl Batches {
    /// Opens the store: the embedded one in the policy's `data_dir`
    /// (creating it), or the shared one (`[batch] object_store` with
    /// `[cluster]`'s store; `replica` names this replica in its leases).
    pub fn open(
        policy: &BatchPolicy,
        cluster: Option<&crate::config::ClusterPolicy>,
        replica: &str,
        gw: Arc<Gateway>,
    ) -> Result<Arc<Batches>, StoreError> {
        let store = match (&policy.object_store, cluster) {
            (Some(objects), Some(cluster)) => {
                Store::Shared(Box::new(store::Shared::connect(&store::SharedConfig {
                    cluster,
                    replica,
                    object_store: objects,
                    endpoint: policy.object_store_endpoint.as_deref(),
                    data_dir: &policy.data_dir,
                })?))
            }
            _ => Store::Embedded(Arc::new(store::Embedded::open(&policy.data_dir)?)),
        };
        Ok(Arc::new(Batches {
            store,
            limits: policy.clone(),
            gw,
            runner: runner::Runner::default(),
            ended: parking_lot::Mutex::new(None),
        }))
    }

    pub fn limits(&self) -> &BatchPolicy {
        &self.limits
    }

    /// A temporary file for an upload, and its future id.
    pub async fn begin_upload(
        &self,
    ) -> Result<(String, std::path::PathBuf, std::fs::File), BatchError> {
        let id = new_id("file-");
        let (path, f) = self.store.temp_file(&id).await?;
        Ok((id, path, f))
    }

    /// Keeps an upload written to `tmp` as file `id` of `owner`, if the
    /// tenant's quota allows it; refused or failed, nothing of it stays.
    pub async fn finish_upload(
        &self,
        owner: &str,
        (id, tmp): (String, std::path::PathBuf),
        filename: String,
        purpose: String,
        bytes: u64,
    ) -> Result<FileObject, BatchError> {
        let (max_files, max_bytes) = (
            self.limits.max_files_per_tenant,
            self.limits.max_bytes_per_tenant,
        );
        let kept = async {
            let (files, held) = self.store.held_by(owner).await?;
            if files >= max_files || held.saturating_add(bytes) > max_bytes {
                return Err(BatchError::TooLarge(format!(
                    "tenant '{owner}' keeps {files} files of {held} bytes; the limits are \
                     {max_files} files and {max_bytes} bytes: delete some first"
                )));
            }
            let f = StoredFile {
                owner: owner.to_owned(),
                file: FileObject::new(id, bytes, crate::clock::unix_seconds(), filename, &purpose),
            };
            let out = f.file.clone();
            self.store.put_file(tmp.clone(), f).await?;
            Ok(out)
        }
        .await;
        if kept.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        kept
    }

    async fn stored_file(&self, scope: &Scope, id: &str) -> Result<StoredFile, BatchError> {
        match self.store.file(id).await? {
            Some(f) if scope.sees(&f.owner) => Ok(f),
            _ => Err(BatchError::NotFound("file", id.to_owned())),
        }
    }

    pub async fn file(&self, scope: &Scope, id: &str) -> Result<FileObject, BatchError> {
        Ok(self.stored_file(scope, id).await?.file)
    }

    pub async fn files(&self, scope: &Scope) -> Result<Vec<FileObject>, BatchError> {
        let files = self.store.files(scope.owner()).await?;
        Ok(files.into_iter().map(|f| f.file).collect())
    }

    pub async fn content(&self, scope: &Scope, id: &str) -> Result<Vec<u8>, BatchError> {
        self.stored_file(scope, id).await?;
        Ok(self.store.content(id).await?)
    }

    /// Deletes a file; one a batch still running reads is kept (409).
    pub async fn delete_file(&self, scope: &Scope, id: &str) -> Result<(), BatchError> {
        self.stored_file(scope, id).await?;
        let busy = self
            .store
            .active_batches()
            .await?
            .iter()
            .any(|b| b.batch.input_file_id == id);
        if busy {
            return Err(BatchError::Conflict(format!(
                "file '{id}' is the input of a batch still running"
            )));
        }
        self.store.delete_file(id).await?;
        Ok(())
    }

    /// Creates a batch of `owner`'s file: `validating` until the runner has
    /// read the file.
    pub async fn create(&self, owner: &str, body: &[u8]) -> Result<Batch, BatchError> {
        let c = CreateBatch::parse(body).map_err(|e| BatchError::Invalid(e.to_string()))?;
        let scope = Scope::Tenant(owner.to_owned());
        let input = self.stored_file(&scope, &c.input_file_id).await?;
        if input.file.purpose != "batch" {
            return Err(BatchError::Invalid(format!(
                "file '{}' has purpose '{}', not 'batch'",
                input.file.id, input.file.purpose
            )));
        }
        let now = crate::clock::unix_seconds();
        let b = StoredBatch {
            owner: owner.to_owned(),
            batch: Batch::new(new_id("batch_"), c, now, self.limits.window.as_secs()),
        };
        let out = b.batch.clone();
        self.store.put_batch(b).await?;
        self.runner.wake();
        Ok(out)
    }

    async fn stored_batch(&self, scope: &Scope, id: &str) -> Result<StoredBatch, BatchError> {
        match self.store.batch(id).await? {
            Some(b) if scope.sees(&b.owner) => Ok(b),
            _ => Err(BatchError::NotFound("batch", id.to_owned())),
        }
    }

    pub async fn batch(&self, scope: &Scope, id: &str) -> Result<Batch, BatchError> {
        let mut b = self.stored_batch(scope, id).await?.batch;
        self.project(std::slice::from_mut(&mut b));
        Ok(b)
    }

    /// The caller's batches, newest first.
    pub async fn batches(&self, scope: &Scope) -> Result<Vec<Batch>, BatchError> {
        let bs = self.store.batches(scope.owner()).await?;
        let mut bs: Vec<Batch> = bs.into_iter().map(|b| b.batch).collect();
        self.project(&mut bs);
        Ok(bs)
    }

    /// Every tenant's batches, newest first, each with its owner (the
    /// operator's usage view: one read of the store for every tenant).
    pub async fn batches_by_owner(&self) -> Result<Vec<(String, Batch)>, BatchError> {
        let bs = self.store.batches(None).await?;
        let (owners, mut bs): (Vec<String>, Vec<Batch>) =
            bs.into_iter().map(|b| (b.owner, b.batch)).unzip();
        self.project(&mut bs);
        Ok(owners.into_iter().zip(bs).collect())
    }

    /// Fills in the running batches' projections.
    fn project(&self, batches: &mut [Batch]) {
        let runs = self.runner.runs();
        for b in batches {
            if let Some(at) = runs.get(&b.id).and_then(|r| r.projected) {
                b.projected_completion_at = Some(at);
                b.deadline_at_risk = Some(b.expires_at.is_some_and(|e| at > e));
            }
        }
    }

    /// Starts cancelling a batch: no item starts any more, items in flight
    /// are stopped, finished items are kept in its output.
    pub async fn cancel(&self, scope: &Scope, id: &str) -> Result<Batch, BatchError> {
        let b = self.stored_batch(scope, id).await?;
        if !matches!(
            b.batch.status,
            Status::Validating | Status::InProgress | Status::Cancelling
        ) {
            return Err(BatchError::Conflict(format!(
                "batch '{id}' has ended and cannot be cancelled"
            )));
        }
        let now = crate::clock::unix_seconds();
        let out = self
            .store
            .update(id, move |b| {
                if matches!(b.status, Status::Validating | Status::InProgress) {
                    b.status = Status::Cancelling;
                    b.cancelling_at = Some(now);
                }
            })
            .await?;
        self.runner.wake();
        out.map(|b| b.batch)
            .ok_or_else(|| BatchError::NotFound("batch", id.to_owned()))
    }

    /// Runs the batches until `shutdown`: those unfinished at start first.
    pub async fn run(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        runner::run(self, shutdown).await;
    }
}
