//! The `fairway` command's subcommands, as `main.rs` dispatches them (it
//! parses the command line, starts the log and the runtime): `serve`,
//! `check`, the services beside the gateway (`sim-backend`, `placement`,
//! `agent`) and the commands on a workload (`replay`, `load`, `workload`).

mod check;
mod serve;
mod services;
mod workload;

pub use check::check;
pub use serve::serve;
pub use services::{EngineDialect, agent, placement, sim_backend};
pub use workload::{LoadArgs, ReplayArgs, load, replay, write_workload};
