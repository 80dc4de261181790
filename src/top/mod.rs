//! `fairway top`: a terminal view of a running gateway for operators
//! without Grafana.
//!
//! [`run`] is the loop: a [`Scraper`] fetches the gateway's admin
//! `/metrics` body every interval and reads it into a [`Snapshot`]
//! together with the instant it was read; [`render`] turns the previous
//! and the current snapshot into plain text to print. Counters become rates
//! over the interval between the two scrapes, and histograms give p99s over
//! the observations made in that interval. Everything but the scrape, the
//! terminal and the loop is sans-IO.
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
//!   `{backend,model}`, and `fairway_backend_cached_prompt_tokens_total`
//!   over `fairway_backend_reported_prompt_tokens_total` (counters) for the
//!   share of prompt tokens each engine found in its prefix cache;
//! - `fairway_jain_fairness_index` and `fairway_overhead_seconds_bucket{le}`;
//! - the batch lane (`batches.rs`): `fairway_batch_items{tenant,state}`,
//!   the resume counters and `fairway_batch_deadline_slack_seconds`.
//!
//! A counter that went down between two scrapes (the gateway restarted) is
//! read as having started again from zero, so a rate is never negative; a
//! histogram whose buckets went down is read the same way.
//!
//! On a terminal [`run`] takes the screen (raw mode, alternate screen,
//! through crossterm): it draws the first scrape at once, redraws in place
//! after each scrape and at once on a resize (lines cut to the width by
//! whole columns, to the height with a note), and leaves on `q`, Esc,
//! Ctrl-C or SIGTERM with the terminal restored. Rows that do not fit the
//! height are not scrollable. With `--once`, or when stdout is not a
//! terminal, frames are printed as plain text.
//!
//! Why not ratatui: the view is already a pure text function whose tests
//! assert on its cells, and its tables drop whole columns with a note where
//! ratatui's `Table` would squeeze and cut cells, so ratatui would only
//! wrap that text in a `Paragraph`. For that it costs 37 more crates and
//! about 34 s of compile CPU time in a clean release build (ratatui 0.30;
//! 29 crates and 20 s with default features off), against 7 crates and
//! about 3 s for crossterm 0.29 alone, which is all the terminal handling
//! needs (measured on 2 cores).
//!
//! Files:
//! - `run.rs`: [`run`], the loop; `scrape.rs`: [`Scraper`], the HTTP side.
//! - `view.rs`: the interactive view's state, keys and resizes;
//!   `terminal.rs`: raw mode and drawing a frame in place.
//! - `snapshot.rs`: [`Snapshot`], a scrape read into per-tenant and
//!   per-backend figures.
//! - `rates.rs`: counter increases and windowed p99s between two snapshots.
//! - `render.rs`: [`render`], the view as text; `table.rs` lays out its
//!   tables, `format.rs` its cells.

mod batches;
mod format;
mod rates;
mod render;
mod run;
mod scrape;
mod snapshot;
mod table;
mod terminal;
mod view;

#[cfg(test)]
mod fixtures;

pub use render::render;
pub use run::{TopError, run};
pub use scrape::{SCRAPE_TIMEOUT, Scraper};
pub use snapshot::Snapshot;
