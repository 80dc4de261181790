//! A batch's end: the lines of the items that never got an answer, the
//! output and error files, and its final status.

use std::sync::Arc;

use super::{Runs, item_id, read_items};
use crate::batch::Batches;
use crate::batch::store::{ItemResult, StoreError, StoredBatch, StoredFile};
use crate::protocol::batch::{FileObject, Status, error_line};

impl Runs {
    /// Ends a batch as `target`: items that never got an answer get an
    /// error line (cancelled, expired), then the output and error files
    /// are written and the batch takes its final status.
    pub(super) async fn finalize(
        &mut self,
        b: &Arc<Batches>,
        sb: StoredBatch,
        target: Status,
    ) -> Result<(), StoreError> {
        let id = sb.batch.id.clone();
        // Stop what is in flight: those items get their cancelled or expired
        // line below.
        let run = self.forget(&b.runner, &id);
        let mut total = None;
        if target != Status::Completed {
            let items = match run {
                Some(r) => r.items,
                None => Arc::new(read_items(b, &sb, false).await.unwrap_or_default()),
            };
            let (code, message) = if target == Status::Expired {
                ("batch_expired", "the batch's completion window ended first")
            } else {
                ("batch_cancelled", "the batch was cancelled first")
            };
            // A batch cancelled or expired while validating counts its items
            // here.
            total = Some(u32::try_from(items.len()).unwrap_or(u32::MAX));
            // Every item without a result gets its line, in one transaction.
            let lines: Vec<(u32, ItemResult)> = items
                .iter()
                .map(|item| {
                    let line = error_line(&item_id(&id, item.line), &item.custom_id, code, message);
                    let result = ItemResult {
                        ok: false,
                        line,
                        usage: (0, 0, 0, 0),
                    };
                    (item.line, result)
                })
                .collect();
            b.store.record_all(&id, lines).await?;
        }
        let results = b.store.results(&id).await?;
        let now = crate::clock::unix_seconds();
        let (mut output, mut errors) = (None, None);
        for (ok, suffix) in [(true, "output"), (false, "errors")] {
            let lines: Vec<String> = results
                .values()
                .filter(|r| r.ok == ok)
                .map(|r| r.line.clone())
                .collect();
            if lines.is_empty() {
                continue;
            }
            // One id per batch and kind: finalizing again after a crash
            // rewrites the same file.
            let file = StoredFile {
                owner: sb.owner.clone(),
                file: FileObject::new(
                    format!("file-{}-{suffix}", id.trim_start_matches("batch_")),
                    0,
                    now,
                    format!("{id}_{suffix}.jsonl"),
                    "batch_output",
                ),
            };
            let written = b.store.write_file(file, lines).await?;
            *if ok { &mut output } else { &mut errors } = Some(written.file.id);
        }
        b.store
            .update(&id, move |batch| {
                if let Some(t) = total.filter(|_| batch.request_counts.total == 0) {
                    batch.request_counts.total = t;
                }
                batch.output_file_id.clone_from(&output);
                batch.error_file_id.clone_from(&errors);
                batch.status = target;
                match target {
                    Status::Completed => batch.completed_at = Some(now),
                    Status::Expired => batch.expired_at = Some(now),
                    Status::Cancelled => batch.cancelled_at = Some(now),
                    _ => {}
                }
            })
            .await?;
        b.ended_now(&sb.owner, target);
        b.store.release(std::slice::from_ref(&id)).await;
        Ok(())
    }
}
