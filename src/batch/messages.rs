//! Anthropic's Message Batches over the same store and runner
//! ([`crate::protocol::message_batches`] has the shapes): a create's
//! requests are written as the batch's input file (the tenant's, listed
//! with its files), the batch runs its items through `/v1/messages`, and
//! its object and results are read back in Anthropic's shape.

use serde_json::Value;

use super::store::StoredFile;
use super::{BatchError, Batches, Scope, StoredBatch, new_id};
use crate::protocol::batch::{Batch, CreateBatch, FileObject, WINDOWS};
use crate::protocol::message_batches::{self as mb, Counts};

impl Batches {
    /// Creates a message batch of `owner`'s from `POST
    /// /v1/messages/batches`'s body: `in_progress` to the caller at once
    /// (Anthropic has no validating state), checked against the policy as
    /// any batch's file is before its first item runs.
    pub async fn create_messages(&self, owner: &str, body: &[u8]) -> Result<Value, BatchError> {
        let requests = mb::parse_create(body)
            .map_err(|e| BatchError::Invalid(crate::fault::Chain(&e).to_string()))?;
        if requests.len() > self.limits.max_lines {
            return Err(BatchError::TooLarge(format!(
                "a batch holds at most {} requests here, not {}",
                self.limits.max_lines,
                requests.len()
            )));
        }
        let live = self.gw.live();
        for (i, r) in requests.iter().enumerate() {
            let model = r.params["model"].as_str().unwrap_or_default();
            let api = crate::core::spec::Api::OpenAi;
            if self.gw.model_pool(&live, model, api, None).is_err() {
                return Err(BatchError::Invalid(format!(
                    "requests.{i}.params.model: the model '{model}' is not served here"
                )));
            }
        }
        let id = new_id(mb::ID_PREFIX);
        let now = crate::clock::unix_seconds();
        let lines = mb::input_lines(&requests);
        let file = StoredFile {
            owner: owner.to_owned(),
            file: FileObject::new(
                format!("file-{id}"),
                0,
                now,
                format!("{id}_requests.jsonl"),
                "batch",
            ),
        };
        let written = self.store.write_file(file, lines).await?;
        let c = CreateBatch {
            input_file_id: written.file.id,
            endpoint: mb::ENDPOINT.to_owned(),
            completion_window: WINDOWS[0].to_owned(),
            metadata: None,
        };
        let b = StoredBatch {
            owner: owner.to_owned(),
            batch: Batch::new(id, c, now, self.limits.window.as_secs()),
        };
        self.store.put_batch(b.clone()).await?;
        self.runner.wake();
        let counts = Counts {
            processing: u32::try_from(requests.len()).unwrap_or(u32::MAX),
            ..Counts::default()
        };
        Ok(mb::message_batch(&b.batch, counts))
    }

    /// A message batch of the caller's, in Anthropic's shape.
    pub async fn message_batch(&self, scope: &Scope, id: &str) -> Result<Value, BatchError> {
        let b = self.stored_message_batch(scope, id).await?;
        let counts = self.counts(&b.batch).await?;
        Ok(mb::message_batch(&b.batch, counts))
    }

    /// The caller's message batches, newest first: at most `limit` after
    /// the one `after_id` (or before `before_id`), and whether more
    /// follow.
    pub async fn message_batches(
        &self,
        scope: &Scope,
        limit: usize,
        after_id: Option<&str>,
        before_id: Option<&str>,
    ) -> Result<(Vec<Value>, bool), BatchError> {
        let all: Vec<Batch> = self
            .store
            .batches(scope.owner())
            .await?
            .into_iter()
            .map(|b| b.batch)
            .filter(|b| b.id.starts_with(mb::ID_PREFIX))
            .collect();
        let at = |id: &str| all.iter().position(|b| b.id == id);
        let (from, to) = match (after_id, before_id) {
            (Some(a), _) => {
                let from = at(a).map_or(all.len(), |i| i + 1);
                (from, (from + limit).min(all.len()))
            }
            (None, Some(b)) => {
                let to = at(b).unwrap_or(0);
                (to.saturating_sub(limit), to)
            }
            (None, None) => (0, limit.min(all.len())),
        };
        let more = if before_id.is_some() && after_id.is_none() {
            from > 0
        } else {
            to < all.len()
        };
        let mut page = Vec::with_capacity(to - from);
        for b in &all[from..to] {
            page.push(mb::message_batch(b, self.counts(b).await?));
        }
        Ok((page, more))
    }

    /// An ended message batch's results as Anthropic's JSONL, in the
    /// order of its requests.
    pub async fn message_results(&self, scope: &Scope, id: &str) -> Result<Vec<u8>, BatchError> {
        let b = self.stored_message_batch(scope, id).await?;
        if !b.batch.status.is_final() {
            return Err(BatchError::Conflict(format!(
                "message batch '{id}' has not ended: its results are not ready"
            )));
        }
        let mut out = Vec::new();
        for r in self.store.results(id).await?.values() {
            out.extend_from_slice(mb::result_line(r.ok, &r.line).as_bytes());
            out.push(b'\n');
        }
        Ok(out)
    }

    async fn stored_message_batch(
        &self,
        scope: &Scope,
        id: &str,
    ) -> Result<StoredBatch, BatchError> {
        match self.stored_batch(scope, id).await {
            Ok(b) if b.batch.id.starts_with(mb::ID_PREFIX) => Ok(b),
            Ok(_) => Err(BatchError::NotFound("message batch", id.to_owned())),
            Err(BatchError::NotFound(..)) => {
                Err(BatchError::NotFound("message batch", id.to_owned()))
            }
            Err(e) => Err(e),
        }
    }

    /// A message batch's counts: from its results once it has ended (which
    /// were cancelled or expired shows there only).
    async fn counts(&self, b: &Batch) -> Result<Counts, BatchError> {
        if !b.status.is_final() {
            return Ok(Counts::running(b));
        }
        let results = self.store.results(&b.id).await?;
        Ok(Counts::ended(
            results.values().map(|r| (r.ok, r.line.as_str())),
        ))
    }
}
