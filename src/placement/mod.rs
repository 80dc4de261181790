//! `fairway placement`: the Kubernetes side of placement. A kube-scheduler
//! extender and a validating admission webhook, over HTTPS, that apply
//! `core::placement`'s rules to what the agents on the GPU nodes read.
//!
//! A process of its own, not a listener of `fairway serve`: it answers the
//! API server and the scheduler, not clients; it scales, restarts and
//! fails independently of the data path (a webhook outage must not take
//! the gateway with it, nor a gateway rollout the webhook), and it reads
//! the node agents, which the gateway does not. It shares the policy file,
//! so `fairway check` validates its `[placement]` section with the rest.
//!
//! Endpoints:
//! - `POST /filter`, `POST /prioritize`: the extender (`ExtenderArgs` in;
//!   `ExtenderFilterResult`, `HostPriorityList` out);
//! - `POST /validate`: `AdmissionReview` v1 for pod `CREATE` (refuses a
//!   model pod no known node can take, or one created already bound to a
//!   node without headroom) and `pods/binding` (refuses a binding to a node
//!   without headroom; allowed bindings reserve the model's memory on the
//!   GPU chosen, unless `dryRun`);
//! - `GET /nodes`: the nodes as the rules see them, the reservations and
//!   the latest decisions with their messages;
//! - `GET /metrics`: decisions by kind and result, refusals by rule, agent
//!   reads, nodes known and fresh, reservations (Prometheus text);
//! - `GET /healthz` (always 200), `GET /readyz` (200 once the agents have
//!   been polled once).
//!
//! Placement runs as several replicas behind one Service: with a
//! `[cluster]` section in the policy they share the pods seen at `CREATE`
//! and the reservations through the cluster's store (`shared`), so that
//! both refuse a node the other just filled; without one, each replica
//! judges with its own reservations only.
//!
//! Every answer is computed from memory (a binding also reads and writes
//! its node's reservations in the store, within half a second a call):
//! the agents are polled in the background every `poll_interval`, so a
//! request never waits on an agent and the webhook answers well within
//! Kubernetes' timeout. Bodies are bounded (16 MiB, 10 s): a length
//! declared over the bound is refused at the header, and a refused HTTP/2
//! body is read to its end (up to twice the bound), so that the client
//! sees the 413 rather than a stream reset. A pod without the
//! `fairway.dev/model-size-gb` annotation is not placement's business and
//! is always allowed.

mod decide;
pub mod k8s;
pub mod nodes;
mod report;
mod service;
mod shared;

pub use service::{StartError, load, serve};
