//! The embedded store (the default): files, batches and each item's result in a data
//! directory, no server to run. Metadata and results live in one `redb`
//! database (`batches.redb`, each write a transaction committed to disk
//! before it is answered); a file's bytes live beside it
//! (`files/<id>`), written to a temporary name, synced and renamed, so a
//! file is whole or absent.
//!
//! An item's result is written once: [`Embedded::record`] inserts it and adds
//! it to its batch's counts and usage in the same transaction, and does
//! nothing for an item already recorded. An item run again after a crash
//! (it was in flight, with no result yet) therefore counts once and is in
//! the output once.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::RwLock;
use redb::{Database, ReadableTable, TableDefinition};

use super::{ItemResult, StoreError, StoredBatch, StoredFile, decode, encode};
use crate::protocol::batch::Batch;

const FILES: TableDefinition<&str, &[u8]> = TableDefinition::new("files");
const BATCHES: TableDefinition<&str, &[u8]> = TableDefinition::new("batches");
const RESULTS: TableDefinition<(&str, u32), &[u8]> = TableDefinition::new("results");
/// What items answering have generated so far, until their results.
const PROGRESS: TableDefinition<(&str, u32), &[u8]> = TableDefinition::new("progress");
/// The ids of the batches not yet ended: what the runner reads every
/// step, whatever the number of ended batches kept.
const ACTIVE: TableDefinition<&str, ()> = TableDefinition::new("active");

/// A `redb` failure as the store reports it: the database file's I/O
/// (a full disk among others) as [`StoreError::Disk`], after which
/// `redb` refuses every call until the database is opened again.
fn failed(e: impl Into<redb::Error>) -> StoreError {
    match e.into() {
        redb::Error::Io(io) => StoreError::Disk(io),
        redb::Error::PreviousIo => StoreError::Disk(std::io::Error::other(
            "an earlier write to the database failed; it is opened again",
        )),
        e => StoreError::Db(e.to_string()),
    }
}

/// Opens (or creates) the database in `dir` with its tables.
fn open_db(dir: &Path) -> Result<Database, StoreError> {
    let db = Database::create(dir.join("batches.redb")).map_err(failed)?;
    let w = db.begin_write().map_err(failed)?;
    w.open_table(FILES).map_err(failed)?;
    w.open_table(BATCHES).map_err(failed)?;
    w.open_table(RESULTS).map_err(failed)?;
    w.open_table(PROGRESS).map_err(failed)?;
    w.open_table(ACTIVE).map_err(failed)?;
    w.commit().map_err(failed)?;
    Ok(db)
}

/// Writes batch `b` and keeps the index of batches not yet ended with it.
fn write_batch(w: &redb::WriteTransaction, b: &StoredBatch) -> Result<(), StoreError> {
    let id = b.batch.id.as_str();
    w.open_table(BATCHES)
        .map_err(failed)?
        .insert(id, encode(b).as_slice())
        .map_err(failed)?;
    let mut active = w.open_table(ACTIVE).map_err(failed)?;
    if b.batch.status.is_final() {
        active.remove(id).map_err(failed)?;
    } else {
        active.insert(id, ()).map_err(failed)?;
    }
    Ok(())
}

pub struct Embedded {
    dir: PathBuf,
    /// `None` while it cannot be opened again after a failure.
    db: RwLock<Option<Database>>,
    /// A call failed on the database file's I/O: the next one opens it
    /// again first (`redb` answers every call after such a failure with
    /// an error until then).
    broken: AtomicBool,
    /// Times it was opened again since start.
    reopens: AtomicU64,
    /// Taken by each write for its whole transaction.
    writer: parking_lot::Mutex<()>,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded").field("dir", &self.dir).finish()
    }
}

impl Embedded {
    /// Opens (or creates) the store in `dir`. Temporary files a crash left
    /// behind are removed.
    pub fn open(dir: &Path) -> Result<Embedded, StoreError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| StoreError::Io { path, source }
        };
        let files = dir.join("files");
        std::fs::create_dir_all(&files).map_err(io(&files))?;
        let tmp = dir.join("tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
        let db = open_db(dir)?;
        Ok(Embedded {
            dir: dir.to_path_buf(),
            db: RwLock::new(Some(db)),
            broken: AtomicBool::new(false),
            reopens: AtomicU64::new(0),
            writer: parking_lot::Mutex::new(()),
        })
    }

    /// Times the database was opened again after a failure since start.
    pub fn reopens(&self) -> u64 {
        self.reopens.load(Ordering::Relaxed)
    }

    /// Runs a read of the database's.
    fn reading<R>(
        &self,
        f: impl FnOnce(&Database) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        self.with(f)
    }

    /// Runs a write of the database's, one at a time: after a write fails
    /// on the file's I/O, `redb` must not be written again until it is
    /// opened again (it asserts so), and the next write opens it first.
    fn writing<R>(
        &self,
        f: impl FnOnce(&Database) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let _turn = self.writer.lock();
        self.with(f)
    }

    /// Runs `f` on the database, opening it again first when a call
    /// failed on its file's I/O since (what `redb` asks after such a
    /// failure: a full disk freed since then leaves a working store, not
    /// one that fails until a restart). A panic in `redb` is such a
    /// failure too, not the caller's.
    fn with<R>(&self, f: impl FnOnce(&Database) -> Result<R, StoreError>) -> Result<R, StoreError> {
        if self.broken.load(Ordering::Acquire) {
            self.reopen()?;
        }
        let db = self.db.read();
        let Some(db) = db.as_ref() else {
            return Err(StoreError::Db("the database is not open".into()));
        };
        let out =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(db))).unwrap_or_else(|_| {
                Err(StoreError::Disk(std::io::Error::other(
                    "the database failed",
                )))
            });
        if let Err(StoreError::Disk(_)) = &out {
            self.broken.store(true, Ordering::Release);
        }
        out
    }

    fn reopen(&self) -> Result<(), StoreError> {
        let mut db = self.db.write();
        if !self.broken.load(Ordering::Acquire) {
            return Ok(()); // another call opened it meanwhile
        }
        // The old one first: `redb` locks its file while open.
        *db = None;
        let opened = open_db(&self.dir)?;
        *db = Some(opened);
        self.broken.store(false, Ordering::Release);
        self.reopens.fetch_add(1, Ordering::Relaxed);
        tracing::info!(dir = %self.dir.display(), "batch store: the database was opened again after a write failure");
        Ok(())
    }

    /// A fresh temporary file for an upload to be written into.
    pub fn temp_file(&self, id: &str) -> Result<(PathBuf, std::fs::File), StoreError> {
        let path = self.dir.join("tmp").join(id);
        let f = std::fs::File::create(&path).map_err(|source| StoreError::Io {
            path: path.clone(),
            source,
        })?;
        Ok((path, f))
    }

    fn blob(&self, id: &str) -> PathBuf {
        self.dir.join("files").join(id)
    }

    /// Keeps the temporary file `tmp` (synced here) as file `f`'s bytes,
    /// then its record: a crash between the two leaves an orphan blob,
    /// never a record without its bytes; a record that cannot be written
    /// takes its bytes with it.
    pub fn put_file(&self, tmp: &Path, f: &StoredFile) -> Result<(), StoreError> {
        let path = self.blob(&f.file.id);
        let io = |source| StoreError::Io {
            path: path.clone(),
            source,
        };
        std::fs::File::open(tmp)
            .and_then(|f| f.sync_all())
            .map_err(io)?;
        std::fs::rename(tmp, &path).map_err(io)?;
        if let Ok(d) = std::fs::File::open(self.dir.join("files")) {
            let _ = d.sync_all();
        }
        let recorded = self.writing(|db| {
            let w = db.begin_write().map_err(failed)?;
            w.open_table(FILES)
                .map_err(failed)?
                .insert(f.file.id.as_str(), encode(f).as_slice())
                .map_err(failed)?;
            w.commit().map_err(failed)
        });
        if recorded.is_err() {
            // No record: its bytes go too.
            let _ = std::fs::remove_file(&path);
        }
        recorded
    }

    /// Writes `lines` as a new file of `f`'s (its `bytes` set here).
    pub fn write_file(&self, mut f: StoredFile, lines: &[&str]) -> Result<StoredFile, StoreError> {
        let (tmp, mut out) = self.temp_file(&f.file.id)?;
        let io = |source| StoreError::Io {
            path: tmp.clone(),
            source,
        };
        let mut n = 0u64;
        let mut w = std::io::BufWriter::new(&mut out);
        for l in lines {
            w.write_all(l.as_bytes()).map_err(io)?;
            w.write_all(b"\n").map_err(io)?;
            n += l.len() as u64 + 1;
        }
        w.flush().map_err(io)?;
        drop(w);
        drop(out);
        f.file.bytes = n;
        self.put_file(&tmp, &f)?;
        Ok(f)
    }

    pub fn file(&self, id: &str) -> Result<Option<StoredFile>, StoreError> {
        self.reading(|db| {
            let r = db.begin_read().map_err(failed)?;
            let t = r.open_table(FILES).map_err(failed)?;
            t.get(id)
                .map_err(failed)?
                .map(|v| decode(v.value()))
                .transpose()
        })
    }

    /// Every file, or `owner`'s.
    pub fn files(&self, owner: Option<&str>) -> Result<Vec<StoredFile>, StoreError> {
        self.reading(|db| {
            let r = db.begin_read().map_err(failed)?;
            let t = r.open_table(FILES).map_err(failed)?;
            let mut out = Vec::new();
            for e in t.iter().map_err(failed)? {
                let (_, v) = e.map_err(failed)?;
                let f: StoredFile = decode(v.value())?;
                if owner.is_none_or(|o| o == f.owner) {
                    out.push(f);
                }
            }
            Ok(out)
        })
    }

    /// A file's bytes.
    pub fn content(&self, id: &str) -> Result<Vec<u8>, StoreError> {
        let path = self.blob(id);
        std::fs::read(&path).map_err(|source| StoreError::Io { path, source })
    }

    /// Removes a file's record, then its bytes.
    pub fn delete_file(&self, id: &str) -> Result<bool, StoreError> {
        self.writing(|db| {
            let w = db.begin_write().map_err(failed)?;
            let removed = w
                .open_table(FILES)
                .map_err(failed)?
                .remove(id)
                .map_err(failed)?
                .is_some();
            w.commit().map_err(failed)?;
            if removed {
                let _ = std::fs::remove_file(self.blob(id));
            }
            Ok(removed)
        })
    }

    /// Writes a new batch (changes go through [`Embedded::update`]).
    pub fn put_batch(&self, b: &StoredBatch) -> Result<(), StoreError> {
        self.writing(|db| {
            let w = db.begin_write().map_err(failed)?;
            write_batch(&w, b)?;
            w.commit().map_err(failed)
        })
    }

    /// Changes batch `id` in one transaction (its counts and usage, which
    /// [`Embedded::record`] moves, are read inside it, never from an older
    /// copy); the batch as written, `None` if there is none.
    pub fn update(
        &self,
        id: &str,
        f: impl FnOnce(&mut Batch),
    ) -> Result<Option<StoredBatch>, StoreError> {
        self.writing(|db| {
            let w = db.begin_write().map_err(failed)?;
            let out = {
                let t = w.open_table(BATCHES).map_err(failed)?;
                let Some(mut b) = t
                    .get(id)
                    .map_err(failed)?
                    .map(|v| decode::<StoredBatch>(v.value()))
                    .transpose()?
                else {
                    return Ok(None);
                };
                drop(t);
                f(&mut b.batch);
                write_batch(&w, &b)?;
                b
            };
            w.commit().map_err(failed)?;
            Ok(Some(out))
        })
    }

    /// The batches not yet ended.
    pub fn active_batches(&self) -> Result<Vec<StoredBatch>, StoreError> {
        self.reading(|db| {
            let r = db.begin_read().map_err(failed)?;
            let active = r.open_table(ACTIVE).map_err(failed)?;
            let batches = r.open_table(BATCHES).map_err(failed)?;
            let mut out = Vec::new();
            for e in active.iter().map_err(failed)? {
                let (id, _) = e.map_err(failed)?;
                if let Some(v) = batches.get(id.value()).map_err(failed)? {
                    out.push(decode(v.value())?);
                }
            }
            Ok(out)
        })
    }

    pub fn batch(&self, id: &str) -> Result<Option<StoredBatch>, StoreError> {
        self.reading(|db| {
            let r = db.begin_read().map_err(failed)?;
            let t = r.open_table(BATCHES).map_err(failed)?;
            t.get(id)
                .map_err(failed)?
                .map(|v| decode(v.value()))
                .transpose()
        })
    }

    /// Every batch, or `owner`'s.
    pub fn batches(&self, owner: Option<&str>) -> Result<Vec<StoredBatch>, StoreError> {
        self.reading(|db| {
            let r = db.begin_read().map_err(failed)?;
            let t = r.open_table(BATCHES).map_err(failed)?;
            let mut out = Vec::new();
            for e in t.iter().map_err(failed)? {
                let (_, v) = e.map_err(failed)?;
                let b: StoredBatch = decode(v.value())?;
                if owner.is_none_or(|o| o == b.owner) {
                    out.push(b);
                }
            }
            Ok(out)
        })
    }

    /// Records item `line` of batch `id`, once: its result, and its batch's
    /// counts and usage, in one transaction. `false` (and nothing written)
    /// when the item already has a result or the batch is gone.
    pub fn record(&self, id: &str, line: u32, result: &ItemResult) -> Result<bool, StoreError> {
        self.record_all(id, std::iter::once((line, result)))
            .map(|n| n == 1)
    }

    /// Records each `(line, result)` of batch `id` that has no result yet,
    /// with its batch's counts and usage, in one transaction (one commit to
    /// disk for a whole cancelled batch); how many were new.
    pub fn record_all<'r>(
        &self,
        id: &str,
        results: impl IntoIterator<Item = (u32, &'r ItemResult)>,
    ) -> Result<usize, StoreError> {
        self.writing(|db| {
            let w = db.begin_write().map_err(failed)?;
            let mut new = 0;
            {
                let mut batches = w.open_table(BATCHES).map_err(failed)?;
                let Some(mut b) = batches
                    .get(id)
                    .map_err(failed)?
                    .map(|v| decode::<StoredBatch>(v.value()))
                    .transpose()?
                else {
                    return Ok(0);
                };
                let mut table = w.open_table(RESULTS).map_err(failed)?;
                let mut progress = w.open_table(PROGRESS).map_err(failed)?;
                for (line, result) in results {
                    progress.remove((id, line)).map_err(failed)?;
                    if table.get((id, line)).map_err(failed)?.is_some() {
                        continue;
                    }
                    let c = &mut b.batch.request_counts;
                    if result.ok {
                        c.completed += 1;
                    } else {
                        c.failed += 1;
                    }
                    let (prompt, cached, completion, reasoning) = result.usage;
                    let u = &mut b.batch.usage;
                    u.input_tokens += prompt;
                    u.input_tokens_details.cached_tokens += cached;
                    u.output_tokens += completion;
                    u.output_tokens_details.reasoning_tokens += reasoning;
                    u.total_tokens += prompt + completion;
                    table
                        .insert((id, line), encode(result).as_slice())
                        .map_err(failed)?;
                    new += 1;
                }
                if new == 0 {
                    return Ok(0);
                }
                batches.insert(id, encode(&b).as_slice()).map_err(failed)?;
            }
            w.commit().map_err(failed)?;
            Ok(new)
        })
    }

    /// Keeps `progress` for item `line` of batch `id` until its result is
    /// recorded; nothing when it has one.
    pub fn save_progress(&self, id: &str, line: u32, progress: &[u8]) -> Result<(), StoreError> {
        self.writing(|db| {
            let w = db.begin_write().map_err(failed)?;
            {
                if w.open_table(RESULTS)
                    .map_err(failed)?
                    .get((id, line))
                    .map_err(failed)?
                    .is_some()
                {
                    return Ok(());
                }
                let mut t = w.open_table(PROGRESS).map_err(failed)?;
                t.insert((id, line), progress).map_err(failed)?;
            }
            w.commit().map_err(failed)
        })
    }

    /// What [`Self::save_progress`] kept for item `line` of batch `id`.
    pub fn progress(&self, id: &str, line: u32) -> Result<Option<Vec<u8>>, StoreError> {
        self.reading(|db| {
            let r = db.begin_read().map_err(failed)?;
            let t = r.open_table(PROGRESS).map_err(failed)?;
            Ok(t.get((id, line))
                .map_err(failed)?
                .map(|v| v.value().to_vec()))
        })
    }

    /// The results of batch `id`, by line.
    pub fn results(&self, id: &str) -> Result<BTreeMap<u32, ItemResult>, StoreError> {
        self.reading(|db| {
            let r = db.begin_read().map_err(failed)?;
            let t = r.open_table(RESULTS).map_err(failed)?;
            let mut out = BTreeMap::new();
            for e in t.range((id, 0)..=(id, u32::MAX)).map_err(failed)? {
                let (k, v) = e.map_err(failed)?;
                out.insert(k.value().1, decode(v.value())?);
            }
            Ok(out)
        })
    }

    /// Removes every batch that ended before `before` (Unix seconds): its
    /// record, its items' results and its output and error files, in one
    /// transaction, then those files' bytes. Input files stay (their
    /// owners delete them). Returns how many batches went.
    pub fn purge(&self, before: u64) -> Result<usize, StoreError> {
        self.writing(|db| {
            let w = db.begin_write().map_err(failed)?;
            let mut gone = Vec::new();
            let n = {
                let mut batches = w.open_table(BATCHES).map_err(failed)?;
                let mut ended = Vec::new();
                for e in batches.iter().map_err(failed)? {
                    let (k, v) = e.map_err(failed)?;
                    let b: StoredBatch = decode(v.value())?;
                    if b.batch.ended_at().is_some_and(|t| t < before) {
                        ended.push((k.value().to_owned(), b));
                    }
                }
                let mut results = w.open_table(RESULTS).map_err(failed)?;
                let mut progress = w.open_table(PROGRESS).map_err(failed)?;
                let mut files = w.open_table(FILES).map_err(failed)?;
                for (id, b) in &ended {
                    batches.remove(id.as_str()).map_err(failed)?;
                    let range = (id.as_str(), 0)..=(id.as_str(), u32::MAX);
                    results
                        .retain_in(range.clone(), |_, _| false)
                        .map_err(failed)?;
                    // Items cut at the batch's end keep none.
                    progress.retain_in(range, |_, _| false).map_err(failed)?;
                    for f in [&b.batch.output_file_id, &b.batch.error_file_id]
                        .into_iter()
                        .flatten()
                    {
                        if files.remove(f.as_str()).map_err(failed)?.is_some() {
                            gone.push(f.clone());
                        }
                    }
                }
                ended.len()
            };
            w.commit().map_err(failed)?;
            for f in gone {
                let _ = std::fs::remove_file(self.blob(&f));
            }
            Ok(n)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::batch::{CreateBatch, FileObject, Status};

    fn batch(id: &str) -> StoredBatch {
        let c = CreateBatch::parse(
            br#"{"input_file_id":"file-x","endpoint":"/v1/chat/completions","completion_window":"24h"}"#,
        )
        .unwrap();
        let mut b = Batch::new(id.into(), c, 1, crate::protocol::batch::WINDOW_SECONDS);
        b.status = Status::InProgress;
        StoredBatch {
            owner: "t".into(),
            batch: b,
        }
    }

    #[test]
    fn an_item_is_recorded_once_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Embedded::open(dir.path()).unwrap();
            s.put_batch(&batch("b1")).unwrap();
            let r = ItemResult {
                ok: true,
                line: "{}".into(),
                usage: (3, 1, 4, 0),
            };
            assert!(s.record("b1", 2, &r).unwrap());
            assert!(!s.record("b1", 2, &r).unwrap());
            assert!(!s.record("gone", 2, &r).unwrap());
            let f = StoredFile {
                owner: "t".into(),
                file: FileObject::new("file-1".into(), 0, 5, "out.jsonl".into(), "batch_output"),
            };
            s.write_file(f, &["a", "bc"]).unwrap();
        }
        let s = Embedded::open(dir.path()).unwrap();
        let b = s.batch("b1").unwrap().unwrap();
        assert_eq!(b.batch.request_counts.completed, 1);
        assert_eq!(b.batch.usage.total_tokens, 7);
        assert_eq!(s.results("b1").unwrap().len(), 1);
        assert_eq!(s.content("file-1").unwrap(), b"a\nbc\n");
        assert_eq!(s.file("file-1").unwrap().unwrap().file.bytes, 5);
        // The index of batches not yet ended follows their status.
        assert_eq!(s.active_batches().unwrap().len(), 1);
        s.update("b1", |b| b.status = Status::Completed).unwrap();
        assert!(s.active_batches().unwrap().is_empty());
        assert_eq!(
            s.batch("b1")
                .unwrap()
                .unwrap()
                .batch
                .request_counts
                .completed,
            1
        );
        // Many results in one transaction, each once.
        let mut b2 = batch("b2");
        b2.batch.request_counts.total = 3;
        s.put_batch(&b2).unwrap();
        let r = ItemResult {
            ok: false,
            line: "{}".into(),
            usage: (0, 0, 0, 0),
        };
        assert!(s.record("b2", 1, &r).unwrap());
        assert_eq!(s.record_all("b2", [(1, &r), (2, &r), (3, &r)]).unwrap(), 2);
        assert_eq!(
            s.batch("b2").unwrap().unwrap().batch.request_counts.failed,
            3
        );
        assert!(s.delete_file("file-1").unwrap());
        assert!(s.content("file-1").is_err());
    }
}
