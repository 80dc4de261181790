//! Several gateway replicas, one policy. Each replica registers in a shared
//! Redis store with a heartbeat, publishes each tenant's demand at it (the
//! requests per second arriving there) and reads every replica's, and
//! enforces its share of each tenant's limits: its part of the cluster's
//! demand for the tenant (see
//! [`SchedulerSpec::shared_by`](crate::core::spec::SchedulerSpec::shared_by)).
//! The core stays sans-IO: it is handed a new spec when the count or a
//! share changes, and no request waits on the store.
//!
//! Shares follow skewed ingress within a few sync intervals; exact
//! admission while ingress moves needs the leases of a later step. While
//! the store is unreachable (`on_store_failure = "local"`) a replica keeps
//! the last shares it computed, logs the change once and counts it in
//! `fairway_cluster_store_up`; when the store returns it registers again
//! and resyncs. The replicas also share where each prefix lives
//! (`homes`), so that prefix-aware routing keeps one partition of the
//! prefixes over the engines. `docs/cluster.md` has the design and the
//! bounds.

mod connection;
mod homes;
mod member;
mod shares;
mod store;
mod sync;

pub use connection::{ConnectError, Connection, connection};
pub use homes::{Entry, Ledger};
pub use member::*;
pub use shares::{DemandMeter, Shape, apportion, shares, water_fill};
pub use store::{Answer, Demands, Store, lease_prefix, undistributed};
pub use sync::{Replica, Syncer, join};
