//! The shared store: several replicas' batches in one place, so that any
//! replica can take over a batch whose replica died.
//!
//! - The records (files, batches, each item's result, each batch's counts
//!   and usage, the leases) are in the cluster's Redis (`[cluster] store`),
//!   under `{<key_prefix>:batch}:` (one hash tag: the scripts below touch
//!   several keys at once, which Redis Cluster allows within one slot;
//!   batch records are small next to the data path's).
//! - A file's bytes are objects in an S3-compatible store (`[batch]
//!   object_store`), under `<prefix>/files/<id>`, written whole before the
//!   record that names them.
//!
//! The same promises as the embedded store, each kept by one script run
//! atomically in Redis: an item's result is set only if it has none
//! (`HSETNX`) and its batch's counts move in the same script; a batch is
//! changed by compare-and-set on its stored JSON (read, changed here,
//! written only if nobody wrote between, else read again); its counts and
//! usage live in a hash of their own, which the JSON never overwrites.
//!
//! A batch is run by the replica holding its lease (`lease:<id>`, the
//! replica's name, expiring after `[cluster] replica_ttl` unless renewed):
//! a replica that dies stops renewing, and the next to look takes the
//! batch over; its items that were in flight have no result and run again.

mod leases;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use redis::Script;

use super::{ItemResult, StoreError, StoredBatch, StoredFile, decode, encode};
use crate::protocol::batch::Batch;

/// Writes batch `ARGV[1]` as `ARGV[3]` if its stored JSON is `ARGV[2]`
/// (an empty `ARGV[2]`: if there is none); keeps the index of batches not
/// yet ended (`ARGV[4]` = 1: ended). 1 written, 0 another wrote first.
const CAS: &str = r"
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (cur or '') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
if ARGV[4] == '1' then redis.call('SREM', KEYS[2], ARGV[1])
else redis.call('SADD', KEYS[2], ARGV[1]) end
return 1
";

/// Records results of batch `ARGV[1]` (`KEYS`: batches, its results, its
/// counts, its items' progress, its items' leases): after it, 7 values
/// per item (line, result JSON, ok 1/0, prompt, cached, completion and
/// reasoning tokens); each item without a result gets it and moves the
/// counts, and its progress and lease go. How many were new (0 when the
/// batch is gone).
const RECORD: &str = r"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
local new = 0
for i = 2, #ARGV, 7 do
  redis.call('HDEL', KEYS[4], ARGV[i])
  redis.call('HDEL', KEYS[5], ARGV[i])
  if redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1]) == 1 then
    new = new + 1
    if ARGV[i + 2] == '1' then redis.call('HINCRBY', KEYS[3], 'completed', 1)
    else redis.call('HINCRBY', KEYS[3], 'failed', 1) end
    local p, c, o, r = tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5]), tonumber(ARGV[i + 6])
    redis.call('HINCRBY', KEYS[3], 'input', p)
    redis.call('HINCRBY', KEYS[3], 'cached', c)
    redis.call('HINCRBY', KEYS[3], 'output', o)
    redis.call('HINCRBY', KEYS[3], 'reasoning', r)
  end
end
return new
";

/// Keeps progress `ARGV[2]` of item `ARGV[1]` (`KEYS`: the batch's
/// results, its items' progress) unless the item has a result.
const PROGRESS: &str = r"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 1
";

/// What the shared store needs: the cluster's Redis, this replica's name,
/// and the object store for the files' bytes.
#[derive(Debug)]
pub struct SharedConfig<'a> {
    pub cluster: &'a crate::config::ClusterPolicy,
    pub replica: &'a str,
    /// `s3://bucket[/prefix]`.
    pub object_store: &'a str,
    /// An S3-compatible endpoint other than AWS's (`http://` allowed).
    pub endpoint: Option<&'a str>,
    /// Where uploads are written before they go to the object store.
    pub data_dir: &'a Path,
}

pub struct Shared {
    con: crate::cluster::Connection,
    /// `{<key_prefix>:batch}:`.
    keys: String,
    replica: String,
    lease_ms: u64,
    objects: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    tmp: PathBuf,
    cas: Script,
    record: Script,
    progress: Script,
    take: Script,
    release_items: Script,
    claim: Script,
    release: Script,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("keys", &self.keys)
            .field("objects", &self.objects.to_string())
            .finish_non_exhaustive()
    }
}

fn redis_failed(e: redis::RedisError) -> StoreError {
    StoreError::Remote("redis", e.to_string())
}

fn objects_failed(e: object_store::Error) -> StoreError {
    StoreError::Remote("object store", e.to_string())
}

/// A batch's counts and usage from its counts hash, over its JSON's.
fn overlay(b: &mut Batch, counts: &HashMap<String, u64>) {
    let n = |k: &str| counts.get(k).copied().unwrap_or(0);
    let c = &mut b.request_counts;
    c.completed = u32::try_from(n("completed")).unwrap_or(u32::MAX);
    c.failed = u32::try_from(n("failed")).unwrap_or(u32::MAX);
    let u = &mut b.usage;
    u.input_tokens = n("input");
    u.input_tokens_details.cached_tokens = n("cached");
    u.output_tokens = n("output");
    u.output_tokens_details.reasoning_tokens = n("reasoning");
    u.total_tokens = u.input_tokens + u.output_tokens;
}

impl Shared {
    /// Connects lazily (nothing is sent until the first call).
    pub fn connect(c: &SharedConfig<'_>) -> Result<Shared, StoreError> {
        let con = crate::cluster::connection(c.cluster, Duration::from_secs(10))
            .map_err(StoreError::Connect)?;
        // `s3://bucket/prefix`: the builder reads the bucket, the keys go
        // under the prefix.
        let prefix = c
            .object_store
            .split_once("://")
            .and_then(|(_, rest)| rest.split_once('/'))
            .map_or("", |(_, p)| p.trim_matches('/'));
        let mut s3 = object_store::aws::AmazonS3Builder::from_env().with_url(c.object_store);
        if let Some(ep) = c.endpoint {
            s3 = s3
                .with_endpoint(ep)
                .with_allow_http(ep.starts_with("http://"))
                .with_virtual_hosted_style_request(false);
        }
        let objects = s3.build().map_err(objects_failed)?;
        let tmp = c.data_dir.join("tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|source| StoreError::Io {
            path: tmp.clone(),
            source,
        })?;
        Ok(Shared {
            con,
            keys: format!("{{{}:batch}}:", c.cluster.key_prefix),
            replica: c.replica.to_owned(),
            lease_ms: u64::try_from(c.cluster.replica_ttl.as_millis()).unwrap_or(u64::MAX),
            objects: Arc::new(objects),
            prefix: ObjectPath::from(prefix),
            tmp,
            cas: Script::new(CAS),
            record: Script::new(RECORD),
            progress: Script::new(PROGRESS),
            take: Script::new(leases::TAKE),
            release_items: Script::new(leases::RELEASE_ITEMS),
            claim: Script::new(leases::CLAIM),
            release: Script::new(leases::RELEASE),
        })
    }

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.keys)
    }

    fn object(&self, id: &str) -> ObjectPath {
        self.prefix.child("files").child(id)
    }

    fn con(&self) -> crate::cluster::Connection {
        self.con.clone()
    }

    pub fn temp_file(&self, id: &str) -> Result<(PathBuf, std::fs::File), StoreError> {
        let path = self.tmp.join(id);
        let f = std::fs::File::create(&path).map_err(|source| StoreError::Io {
            path: path.clone(),
            source,
        })?;
        Ok((path, f))
    }

    /// Uploads `tmp` (in parts, as big as it is), then writes the record.
    pub async fn put_file(&self, tmp: &Path, f: &StoredFile) -> Result<(), StoreError> {
        let uploaded = async {
            let mut src = tokio::fs::File::open(tmp)
                .await
                .map_err(|source| StoreError::Io {
                    path: tmp.to_path_buf(),
                    source,
                })?;
            let mut dst = object_store::buffered::BufWriter::new(
                self.objects.clone(),
                self.object(&f.file.id),
            );
            let copied = tokio::io::copy(&mut src, &mut dst).await;
            let done = match copied {
                Ok(_) => tokio::io::AsyncWriteExt::shutdown(&mut dst).await,
                Err(e) => {
                    let _ = dst.abort().await;
                    Err(e)
                }
            };
            done.map_err(|e| StoreError::Remote("object store", e.to_string()))
        }
        .await;
        let _ = std::fs::remove_file(tmp);
        uploaded?;
        let recorded = self.put_record(f).await;
        if recorded.is_err() {
            // No record: its bytes go too (best effort; the store is
            // failing).
            let _ = self.objects.delete(&self.object(&f.file.id)).await;
        }
        recorded
    }

    async fn put_record(&self, f: &StoredFile) -> Result<(), StoreError> {
        redis::cmd("HSET")
            .arg(self.key("files"))
            .arg(&f.file.id)
            .arg(encode(f))
            .query_async::<()>(&mut self.con())
            .await
            .map_err(redis_failed)
    }

    pub async fn write_file(
        &self,
        mut f: StoredFile,
        lines: &[String],
    ) -> Result<StoredFile, StoreError> {
        let mut bytes = Vec::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
        for l in lines {
            bytes.extend_from_slice(l.as_bytes());
            bytes.push(b'\n');
        }
        f.file.bytes = bytes.len() as u64;
        self.objects
            .put(&self.object(&f.file.id), bytes.into())
            .await
            .map_err(objects_failed)?;
        self.put_record(&f).await?;
        Ok(f)
    }

    pub async fn file(&self, id: &str) -> Result<Option<StoredFile>, StoreError> {
        let v: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(self.key("files"))
            .arg(id)
            .query_async(&mut self.con())
            .await
            .map_err(redis_failed)?;
        v.map(|v| decode(&v)).transpose()
    }

    pub async fn files(&self, owner: Option<&str>) -> Result<Vec<StoredFile>, StoreError> {
        let all: HashMap<String, Vec<u8>> = redis::cmd("HGETALL")
            .arg(self.key("files"))
            .query_async(&mut self.con())
            .await
            .map_err(redis_failed)?;
        let mut out = Vec::new();
        for v in all.values() {
            let f: StoredFile = decode(v)?;
            if owner.is_none_or(|o| o == f.owner) {
                out.push(f);
            }
        }
        Ok(out)
    }

    pub async fn content(&self, id: &str) -> Result<Vec<u8>, StoreError> {
        let got = self
            .objects
            .get(&self.object(id))
            .await
            .map_err(objects_failed)?;
        Ok(got.bytes().await.map_err(objects_failed)?.to_vec())
    }

    pub async fn delete_file(&self, id: &str) -> Result<bool, StoreError> {
        let removed: u32 = redis::cmd("HDEL")
            .arg(self.key("files"))
            .arg(id)
            .query_async(&mut self.con())
            .await
            .map_err(redis_failed)?;
        if removed > 0 {
            self.delete_object(id).await;
        }
        Ok(removed > 0)
    }

    /// Removes a file's bytes; bytes a failure leaves behind are orphans
    /// no record names.
    async fn delete_object(&self, id: &str) {
        if let Err(e) = self.objects.delete(&self.object(id)).await {
            tracing::warn!(file = id, error = %e, "batch store: a file's bytes were not removed");
        }
    }

    /// Writes `new` over `old` (`None`: over nothing); `false` when another
    /// write came first.
    async fn cas(&self, old: Option<&[u8]>, new: &StoredBatch) -> Result<bool, StoreError> {
        let written: u32 = self
            .cas
            .key(self.key("batches"))
            .key(self.key("active"))
            .arg(&new.batch.id)
            .arg(old.unwrap_or_default())
            .arg(encode(new))
            .arg(if new.batch.status.is_final() {
                "1"
            } else {
                "0"
            })
            .invoke_async(&mut self.con())
            .await
            .map_err(redis_failed)?;
        Ok(written == 1)
    }

    pub async fn put_batch(&self, b: &StoredBatch) -> Result<(), StoreError> {
        if self.cas(None, b).await? {
            Ok(())
        } else {
            Err(StoreError::Db(format!("batch '{}' exists", b.batch.id)))
        }
    }

    /// Reads batch `id`'s stored JSON and its counts.
    async fn read(&self, id: &str) -> Result<Option<(Vec<u8>, StoredBatch)>, StoreError> {
        let (raw, counts): (Option<Vec<u8>>, HashMap<String, u64>) = redis::pipe()
            .cmd("HGET")
            .arg(self.key("batches"))
            .arg(id)
            .cmd("HGETALL")
            .arg(self.key(&format!("counts:{id}")))
            .query_async(&mut self.con())
            .await
            .map_err(redis_failed)?;
        let Some(raw) = raw else {
            return Ok(None);
        };
        let mut b: StoredBatch = decode(&raw)?;
        overlay(&mut b.batch, &counts);
        Ok(Some((raw, b)))
    }

    pub async fn update(
        &self,
        id: &str,
        mut f: impl FnMut(&mut Batch),
    ) -> Result<Option<StoredBatch>, StoreError> {
        // Each retry means another replica's write landed in between.
        for _ in 0..64 {
            let Some((raw, mut b)) = self.read(id).await? else {
                return Ok(None);
            };
            f(&mut b.batch);
            if self.cas(Some(&raw), &b).await? {
                return Ok(Some(b));
            }
        }
        Err(StoreError::Db(format!(
            "batch '{id}' kept changing under 64 tries to update it"
        )))
    }

    /// Batches by id, with their counts; missing ones left out.
    async fn read_many(&self, ids: &[String]) -> Result<Vec<StoredBatch>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let raws: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
            .arg(self.key("batches"))
            .arg(ids)
            .query_async(&mut self.con())
            .await
            .map_err(redis_failed)?;
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.cmd("HGETALL").arg(self.key(&format!("counts:{id}")));
        }
        let counts: Vec<HashMap<String, u64>> = pipe
            .query_async(&mut self.con())
            .await
            .map_err(redis_failed)?;
        let mut out = Vec::new();
        for (raw, counts) in raws.into_iter().zip(counts) {
            if let Some(raw) = raw {
                let mut b: StoredBatch = decode(&raw)?;
                overlay(&mut b.batch, &counts);
                out.push(b);
            }
        }
        Ok(out)
    }

    pub async fn active_batches(&self) -> Result<Vec<StoredBatch>, StoreError> {
        let ids: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.key("active"))
            .query_async(&mut self.con())
            .await
            .map_err(redis_failed)?;
        self.read_many(&ids).await
    }

    pub async fn batch(&self, id: &str) -> Result<Option<StoredBatch>, StoreError> {
        Ok(self.read(id).await?.map(|(_, b)| b))
    }

    pub async fn batches(&self, owner: Option<&str>) -> Result<Vec<StoredBatch>, StoreError> {
        let ids: Vec<String> = redis::cmd("HKEYS")
            .arg(self.key("batches"))
            .query_async(&mut self.con())
            .await
            .map_err(redis_failed)?;
        let mut all = self.read_many(&ids).await?;
        all.retain(|b| owner.is_none_or(|o| o == b.owner));
        Ok(all)
    }

    pub async fn record_all(
        &self,
        id: &str,
        results: &[(u32, ItemResult)],
    ) -> Result<usize, StoreError> {
        let mut call = self.record.key(self.key("batches"));
        call.key(self.key(&format!("results:{id}")))
            .key(self.key(&format!("counts:{id}")))
            .key(self.key(&format!("progress:{id}")))
            .key(self.key(&format!("items:{id}")))
            .arg(id);
        for (line, r) in results {
            let (p, c, o, reasoning) = r.usage;
            call.arg(line)
                .arg(encode(r))
                .arg(if r.ok { "1" } else { "0" })
                .arg(p)
                .arg(c)
                .arg(o)
                .arg(reasoning);
        }
        let new: usize = call
            .invoke_async(&mut self.con())
            .await
            .map_err(redis_failed)?;
        Ok(new)
    }

    pub async fn save_progress(
        &self,
        id: &str,
        line: u32,
        progress: &[u8],
    ) -> Result<(), StoreError> {
        self.progress
            .key(self.key(&format!("results:{id}")))
            .key(self.key(&format!("progress:{id}")))
            .arg(line)
            .arg(progress)
            .invoke_async::<i64>(&mut self.con())
            .await
            .map(drop)
            .map_err(redis_failed)
    }

    pub async fn progress(&self, id: &str, line: u32) -> Result<Option<Vec<u8>>, StoreError> {
        redis::cmd("HGET")
            .arg(self.key(&format!("progress:{id}")))
            .arg(line)
            .query_async(&mut self.con())
            .await
            .map_err(redis_failed)
    }

    pub async fn results(&self, id: &str) -> Result<BTreeMap<u32, ItemResult>, StoreError> {
        let all: HashMap<u32, Vec<u8>> = redis::cmd("HGETALL")
            .arg(self.key(&format!("results:{id}")))
            .query_async(&mut self.con())
            .await
            .map_err(redis_failed)?;
        all.into_iter()
            .map(|(line, v)| Ok((line, decode(&v)?)))
            .collect()
    }

    pub async fn purge(&self, before: u64) -> Result<usize, StoreError> {
        let ended: Vec<StoredBatch> = self
            .batches(None)
            .await?
            .into_iter()
            .filter(|b| b.batch.ended_at().is_some_and(|t| t < before))
            .collect();
        for sb in &ended {
            let id = &sb.batch.id;
            let outputs: Vec<&String> = [&sb.batch.output_file_id, &sb.batch.error_file_id]
                .into_iter()
                .flatten()
                .collect();
            let mut pipe = redis::pipe();
            pipe.atomic()
                .cmd("HDEL")
                .arg(self.key("batches"))
                .arg(id)
                .ignore()
                .cmd("DEL")
                .arg(self.key(&format!("results:{id}")))
                .arg(self.key(&format!("counts:{id}")))
                .arg(self.key(&format!("progress:{id}")))
                .arg(self.key(&format!("items:{id}")))
                .ignore();
            for f in &outputs {
                pipe.cmd("HDEL").arg(self.key("files")).arg(*f).ignore();
            }
            pipe.query_async::<()>(&mut self.con())
                .await
                .map_err(redis_failed)?;
            for f in outputs {
                self.delete_object(f).await;
            }
        }
        Ok(ended.len())
    }
}
