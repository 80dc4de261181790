//! The wire under everything: the one accept loop, the body types every
//! listener serves, TLS configuration, the HTTP client of the pollers,
//! the exporter and placement, and the scrape helper. Knows nothing of
//! policies, tenants or the scheduler.

pub mod accept;
pub mod body;
pub mod client;
pub mod headers;
pub mod scrape;
pub mod tls;
