//! The policy file: `file` parses TOML with spans, `validate` turns it into
//! a [`Policy`] (reporting every problem with file:line:column), `reload`
//! swaps it at run time.

pub mod policy;

pub use policy::*;
