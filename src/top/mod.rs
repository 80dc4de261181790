//! `fairway top`: a terminal view of a running gateway for operators
//! without Grafana.
//!
//! [`run`] is the loop: a [`Scraper`] fetches the gateway's admin
//! `/metrics` body every interval and reads it into a [`Snapshot`]
//! together with the instant it was read; [`render`] turns the previous
//! and the current snapshot into plain text to print. Counters become rates
//! over the interval between the two scrapes, and histograms give p99s over
//! the observations made in that interval. Everything but the scrape and the
//! loop is sans-IO.
//!
//! What it reads, by the names and labels that
//! [`crate::telemetry::metrics`] exports:
//! - `fairway_requests_total{tenant,model,outcome,reason}` and
//!   `fairway_goodput_total{tenant,model}`, for request, served, goodput
//!   and refusal rates;
//! - `fairway_ttft_seconds_bucket` and `fairway_e2e_seconds_bucket`
//!   `{tenant,model,le}`, summed over models, for p99s;
//! - `fairway_queue_depth`, `fairway_tenant_in_flight`, `fairway_preemptions_total` (a rate),
//!   `fairway_tenant_slo_ttft_seconds` and `fairway_tenant_slo_e2e_seconds`
//!   `{tenant}`;
//! - `fairway_backend_{healthy,in_flight,window,kv_usage_ratio,waiting,reading_age_seconds}`
//!   `{backend,model}`;
//! - `fairway_jain_fairness_index` and `fairway_overhead_seconds_bucket{le}`.
//!
//! A counter that went down between two scrapes (the gateway restarted) is
//! read as having started again from zero, so a rate is never negative; a
//! histogram whose buckets went down is read the same way.
//!
//! Files:
//! - `run.rs`: [`run`], the loop; `scrape.rs`: [`Scraper`], the HTTP side.
//! - `snapshot.rs`: [`Snapshot`], a scrape read into per-tenant and
//!   per-backend figures.
//! - `rates.rs`: counter increases and windowed p99s between two snapshots.
//! - `render.rs`: [`render`], the view as text; `table.rs` lays out its
//!   tables, `format.rs` its cells.

mod format;
mod rates;
mod render;
mod run;
mod scrape;
mod snapshot;
mod table;

#[cfg(test)]
mod fixtures;

pub use render::render;
pub use run::{TopError, run};
pub use scrape::{SCRAPE_TIMEOUT, ScrapeError, Scraper};
pub use snapshot::Snapshot;
