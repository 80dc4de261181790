//! Routing: pick one backend among a pool's open candidates.
//!
//! A strategy is a function of the candidates and an RNG the caller owns.
//! Scores use the gateway's own in-flight count **plus** the backend's
//! polled `waiting`: readings are stale between scrapes, and without our
//! own sends every request in a burst would pick the same "shortest"
//! backend. Candidates reach this module already filtered for window room
//! and headroom (see `scheduler`).

mod candidate;
mod pick;
mod prefix;

pub use candidate::Candidate;
pub use pick::*;
pub use prefix::{Placement, SPILL_GAP, prefix_aware, prefix_greedy};
