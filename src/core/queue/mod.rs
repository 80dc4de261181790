//! The fair queue of one pool: per-tenant FIFO queues and the order across
//! tenants chosen by the discipline.
//!
//! `drf` and `wfq` are virtual-time fair queueing after the Virtual Token
//! Counter (Sheng et al., "Fairness in Serving Large Language Models", OSDI
//! 2024): the next dispatch goes to the backlogged tenant with the smallest
//! counter; counters advance by `cost / weight`; a tenant that becomes
//! backlogged is lifted to the smallest backlogged counter (or to the
//! counter of the last dispatch when none is backlogged), so idle time banks
//! no credit. A dispatch charges an estimate that the completion corrects;
//! the lift compares counters that count only part of the estimates still
//! in flight (the `in_flight_credit`, by default half of them: the work
//! an in-flight request has done on average). All of them would lift a
//! returning tenant to estimates far above the real cost — a burst
//! dispatched on a per-token average learned at light load — that the
//! others only refund later, and keep it waiting for minutes; none of
//! them would credit it with work the others have not yet received, and
//! serve it ahead of them until that is spent. `drf` and `wfq` differ
//! only in the cost charged (see [`cost`]). `fifo` and `priority` are
//! baselines: arrival order, and strict priority by tenant class (which
//! starves `batch` tenants under load).
//!
//! Invariant: a tenant is in `backlogged` iff it has a live queued request,
//! and its key there is its current ordering key; it is in `floors` with
//! `counter - (1 - in_flight_credit) * pending` under the same condition.
//! All operations are O(log tenants) amortised; cancelled entries are
//! skipped lazily.

pub mod cost;
mod fair_queue;

pub use fair_queue::*;
