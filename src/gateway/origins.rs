//! Which backend created each recent Responses API response, so that a
//! later call naming the response (`previous_response_id`, a retrieval)
//! goes to the backend that stored it. Bounded in age and count. With a
//! `[cluster]` store the record is also kept there ([`SharedOrigins`]), so
//! that a call at another replica finds it too.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use parking_lot::Mutex;

use crate::core::ids::{BackendId, TenantId};
use crate::core::time::Instant;

/// How long the gateway remembers which backend created a response.
pub const RESPONSE_MEMORY: Duration = Duration::from_secs(3600);
/// Most response ids remembered (about 100 bytes each).
pub const RESPONSES_REMEMBERED: usize = 100_000;
/// Which backend created each recent Responses API response, for whom.
#[derive(Debug, Default)]
pub struct ResponseOrigins {
    inner: Mutex<Origins>,
}

#[derive(Debug, Default)]
struct Origins {
    by_id: HashMap<Box<str>, Origin>,
    /// Ids in the order they were remembered (so also of expiry).
    order: VecDeque<(Instant, Box<str>)>,
}

#[derive(Debug, Clone, Copy)]
struct Origin {
    backend: BackendId,
    tenant: TenantId,
    at: Instant,
}

impl ResponseOrigins {
    /// Remembers that `backend` created response `id` for `tenant`.
    pub fn remember(&self, now: Instant, id: &str, backend: BackendId, tenant: TenantId) {
        let mut o = self.inner.lock();
        o.forget_old(now, 1);
        let id: Box<str> = id.into();
        o.order.push_back((now, id.clone()));
        o.by_id.insert(
            id,
            Origin {
                backend,
                tenant,
                at: now,
            },
        );
    }

    /// The backend that created `id`, if it did so for `tenant`.
    pub fn find(&self, now: Instant, id: &str, tenant: TenantId) -> Option<BackendId> {
        let mut o = self.inner.lock();
        o.forget_old(now, 0);
        o.by_id
            .get(id)
            .filter(|origin| origin.tenant == tenant)
            .map(|origin| origin.backend)
    }

    /// Ids remembered now.
    pub fn len(&self) -> usize {
        self.inner.lock().by_id.len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The cluster's copy of the origins, in `[cluster]`'s store: response id
/// → the backend and tenant, by name (ids are each replica's own), kept
/// [`RESPONSE_MEMORY`].
pub struct SharedOrigins {
    con: crate::cluster::Connection,
    /// `<key_prefix>:response:`
    prefix: String,
}

impl std::fmt::Debug for SharedOrigins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedOrigins")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl SharedOrigins {
    /// A lazy connection to the policy's store (nothing is sent yet).
    pub fn connect(
        policy: &crate::config::ClusterPolicy,
    ) -> Result<SharedOrigins, crate::cluster::ConnectError> {
        let con = crate::cluster::connection(policy, policy.sync_interval)?;
        Ok(SharedOrigins {
            con,
            prefix: format!("{}:response:", policy.key_prefix),
        })
    }

    /// Records that `backend` created response `id` for `tenant`, in the
    /// background: a store that is slow or down costs the response
    /// nothing (the other replicas then answer 404 for it, as before).
    pub fn remember(&self, id: &str, backend: &str, tenant: &str) {
        let mut con = self.con.clone();
        let key = format!("{}{id}", self.prefix);
        let value = format!("{backend}\u{1f}{tenant}");
        tokio::spawn(async move {
            let set: redis::RedisResult<()> = redis::cmd("SET")
                .arg(key)
                .arg(value)
                .arg("EX")
                .arg(RESPONSE_MEMORY.as_secs())
                .query_async(&mut con)
                .await;
            if let Err(e) = set {
                tracing::debug!(error = %e, "a response's origin was not shared with the cluster");
            }
        });
    }

    /// The backend and tenant, by name, that response `id` was created
    /// by and for; `None` when the store has none (or does not answer).
    pub async fn find(&self, id: &str) -> Option<(String, String)> {
        let mut con = self.con.clone();
        let v: Option<String> = redis::cmd("GET")
            .arg(format!("{}{id}", self.prefix))
            .query_async(&mut con)
            .await
            .ok()?;
        let (backend, tenant) = v?
            .split_once('\u{1f}')
            .map(|(b, t)| (b.to_owned(), t.to_owned()))?;
        Some((backend, tenant))
    }
}

impl Origins {
    /// Forgets ids older than [`RESPONSE_MEMORY`], and the oldest until
    /// `room` more fit.
    fn forget_old(&mut self, now: Instant, room: usize) {
        while let Some((at, _)) = self.order.front() {
            let expired = now.saturating_since(*at) >= RESPONSE_MEMORY;
            if !expired && self.order.len() + room <= RESPONSES_REMEMBERED {
                break;
            }
            if let Some((at, id)) = self.order.pop_front()
                && self.by_id.get(&id).is_some_and(|o| o.at == at)
            {
                // Not remembered again since.
                self.by_id.remove(&id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_found_by_their_tenant_only_and_forgotten_in_time() {
        let o = ResponseOrigins::default();
        let t0 = Instant::from_nanos(1);
        let (a, b) = (TenantId(0), TenantId(1));
        o.remember(t0, "resp_1", BackendId(3), a);
        assert_eq!(o.find(t0, "resp_1", a), Some(BackendId(3)));
        assert_eq!(o.find(t0, "resp_1", b), None);
        assert_eq!(o.find(t0, "resp_2", a), None);
        let later = t0 + RESPONSE_MEMORY;
        assert_eq!(o.find(later, "resp_1", a), None);
        assert!(o.is_empty());
    }

    #[test]
    fn memory_is_bounded() {
        let o = ResponseOrigins::default();
        let t0 = Instant::from_nanos(1);
        for i in 0..RESPONSES_REMEMBERED + 10 {
            o.remember(t0, &format!("resp_{i}"), BackendId(0), TenantId(0));
        }
        assert_eq!(o.len(), RESPONSES_REMEMBERED);
        assert_eq!(o.find(t0, "resp_0", TenantId(0)), None);
        let last = format!("resp_{}", RESPONSES_REMEMBERED + 9);
        assert_eq!(o.find(t0, &last, TenantId(0)), Some(BackendId(0)));
    }
}
