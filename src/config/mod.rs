//! The policy file: `file` parses TOML with spans, `validate` turns it into
//! a [`Policy`] (reporting every problem with file:line:column), `reload`
//! swaps it at run time.

pub mod engine;
pub mod file;
pub mod load;
pub mod policy;
pub mod resources;
pub mod validate;

pub use engine::EngineParams;
pub use file::ConfigError;
pub use load::{load_policy, load_policy_with_env, read_source};
pub use policy::*;
pub use validate::{parse_policy, parse_policy_with_env, summary};
