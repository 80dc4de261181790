//! The gateway's edge: listeners and connections (`server`, `conn`), the
//! tower layers every request passes (`layers`), the admin listener,
//! policy reload and the tenant usage page.

pub mod admin;
mod clients;
pub mod conn;
pub mod layers;
pub mod listeners;
pub mod reload;
pub mod server;
pub mod services;
pub mod stack;
pub mod usage_page;
