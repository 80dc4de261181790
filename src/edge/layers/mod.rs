//! The client listener's edge: tower layers for the concerns every request
//! meets before the scheduling path (request id, panics, the listener's
//! request cap, drain, body limit). [`crate::edge::stack::edge`] stacks
//! them, and its doc lists the order. Admission, queueing and routing are
//! not layers: they need the parsed body and the core's decision, so they
//! stay one `async fn` in [`crate::gateway::request`].

pub mod body_limit;
pub mod drain;
pub mod panic;
pub mod request_id;
pub mod request_limit;
pub mod sensitive;

pub use body_limit::BodyLimitLayer;
pub use drain::DrainLayer;
pub use panic::PanicResponse;
pub use request_id::RequestIdLayer;
pub use request_limit::RequestLimitLayer;
pub use sensitive::SensitiveLayer;
