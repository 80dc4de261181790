//! The gateway's edge: listeners and connections (`server`, `conn`), the
//! tower layers every request passes (`layers`), the admin listener,
//! policy reload, the tenant usage page and the Files and Batch routes.

pub mod admin;
pub mod batch_api;
mod clients;
pub mod conn;
pub mod layers;
pub mod listeners;
pub mod message_batches;
pub mod reload;
pub mod server;
pub mod services;
pub mod stack;
pub mod usage_page;
