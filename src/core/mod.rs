//! The sans-IO scheduling core: admission, fair queue, dispatch windows,
//! routing and GPU-seconds accounting. Every time-dependent method takes
//! `now`; nothing here reads a clock, opens a socket, spawns, logs or counts.
//! [`scheduler::Scheduler`] composes the parts; the live proxy and the
//! replay simulator both drive it. It is configured with a
//! [`spec::SchedulerSpec`], which the config layer builds from the policy:
//! the core depends on std, thiserror and rand, and on no other Fairway
//! module (`tests/architecture.rs` checks).

pub mod accounting;
pub mod admission;
pub mod fairness;
pub mod ids;
pub mod placement;
pub mod prefix;
pub mod queue;
pub mod reading;
pub mod routing;
pub mod scheduler;
pub mod spec;
pub mod time;
