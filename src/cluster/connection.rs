//! The store's connection: one Redis node (`redis://`, `rediss://`), or
//! the primary that Redis Sentinel names (`redis+sentinel://`), found again
//! after a failover. Every user of the store (the cluster's sync, the
//! Responses ids' origins, the shared batch store) goes through it.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisFuture, RedisResult, Value};

use crate::config::{ClusterPolicy, SentinelStore};
use crate::fault::Blame;

/// Why the store's connection could not be set up. Nothing was sent yet:
/// Redis did not take what the policy gives it, so it is the policy's
/// fault and trying again cannot help.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// A node's URL (with the policy's password) is not one Redis takes.
    #[error("cluster store {url}")]
    Url {
        url: String,
        #[source]
        source: redis::RedisError,
    },
    /// The client of the store's node could not be made.
    #[error("cluster store")]
    Client(#[source] redis::RedisError),
    /// The client of the sentinels could not be made.
    #[error("cluster store sentinels")]
    Sentinels(#[source] redis::RedisError),
}

impl ConnectError {
    /// Whose fault it is: the policy's, so this gateway's.
    pub fn blame(&self) -> Blame {
        Blame::Gateway
    }

    /// Whether trying again can help: not before the policy changes.
    pub fn retryable(&self) -> bool {
        false
    }
}

/// A client of the policy's store (a single node), with its password
/// (nothing is sent yet).
fn client(policy: &ClusterPolicy) -> Result<redis::Client, ConnectError> {
    let info = node_info(&policy.store, policy)?;
    redis::Client::open(info).map_err(ConnectError::Client)
}

/// `url` as connection information, with the policy's password.
fn node_info(url: &str, policy: &ClusterPolicy) -> Result<redis::ConnectionInfo, ConnectError> {
    let mut info = url
        .into_connection_info()
        .map_err(|source| ConnectError::Url {
            url: url.to_owned(),
            source,
        })?;
    if let Some(pw) = &policy.password {
        let redis = info.redis_settings().clone().set_password(&pw.0);
        info = info.set_redis_settings(redis);
    }
    Ok(info)
}

/// A lazy connection to the policy's store, each call and reconnection
/// bounded by `timeout`: nothing is sent until the first call, so a store
/// that is down at start stops nothing.
pub fn connection(policy: &ClusterPolicy, timeout: Duration) -> Result<Connection, ConnectError> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(1)
        .set_max_delay(timeout);
    let (current, sentinel) = match policy.sentinel() {
        None => {
            let m = ConnectionManager::new_lazy_with_config(client(policy)?, config.clone())
                .map_err(ConnectError::Client)?;
            (Some(m), None)
        }
        Some(SentinelStore { tls, hosts, name }) => {
            let scheme = if tls { "rediss" } else { "redis" };
            let sentinels = hosts
                .iter()
                .map(|h| node_info(&format!("{scheme}://{h}"), policy))
                .collect::<Result<Vec<_>, _>>()?;
            let sentinel = Sentinel::build(sentinels).map_err(ConnectError::Sentinels)?;
            let mut node = SentinelNodeConnectionInfo::default();
            if tls {
                node = node.set_tls_mode(redis::TlsMode::Secure);
            }
            if let Some(pw) = &policy.password {
                node = node.set_redis_connection_info(
                    redis::RedisConnectionInfo::default().set_password(&pw.0),
                );
            }
            let link = SentinelLink {
                sentinel: tokio::sync::Mutex::new(sentinel),
                name,
                node,
                timeout,
            };
            (None, Some(link))
        }
    };
    Ok(Connection {
        inner: Arc::new(Inner {
            config,
            current: Mutex::new(current),
            sentinel,
        }),
    })
}

/// A connection to the store, shared by its clones. With Sentinel, the
/// primary is asked of the sentinels before the first call and again after
/// any call fails (the primary died, or was demoted and answers
/// `READONLY`), so that calls go to the new primary once the sentinels
/// have promoted one.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<Inner>,
}

struct Inner {
    config: ConnectionManagerConfig,
    /// The node calls go to; `None` until the sentinels have named one.
    current: Mutex<Option<ConnectionManager>>,
    sentinel: Option<SentinelLink>,
}

struct SentinelLink {
    sentinel: tokio::sync::Mutex<Sentinel>,
    /// The name the sentinels know the primary by.
    name: String,
    /// How to reach the primary (TLS, password).
    node: SentinelNodeConnectionInfo,
    timeout: Duration,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("sentinel", &self.inner.sentinel.as_ref().map(|s| &s.name))
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// The node to call: the one in use, or the primary the sentinels name
    /// now (asked at most once at a time, within the call's timeout).
    async fn node(&self) -> RedisResult<ConnectionManager> {
        if let Some(m) = self.inner.current.lock().clone() {
            return Ok(m);
        }
        let Some(link) = &self.inner.sentinel else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "no store node",
            )));
        };
        let mut sentinel = link.sentinel.lock().await;
        // Another call may have found it while this one waited.
        if let Some(m) = self.inner.current.lock().clone() {
            return Ok(m);
        }
        let asked = sentinel.async_master_for(&link.name, Some(&link.node));
        let client = tokio::time::timeout(link.timeout, asked)
            .await
            .map_err(|_| {
                redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "the sentinels did not name a primary in time",
                ))
            })??;
        let m = ConnectionManager::new_lazy_with_config(client, self.inner.config.clone())?;
        *self.inner.current.lock() = Some(m.clone());
        Ok(m)
    }

    /// A call failed: with Sentinel, ask for the primary again next time.
    fn failed(&self) {
        if self.inner.sentinel.is_some() {
            *self.inner.current.lock() = None;
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut node = self.node().await?;
            let answer = node.req_packed_command(cmd).await;
            if answer.is_err() {
                self.failed();
            }
            answer
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut node = self.node().await?;
            let answer = node.req_packed_commands(pipeline, offset, count).await;
            if answer.is_err() {
                self.failed();
            }
            answer
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
