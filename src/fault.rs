//! Whose fault a failure is, the log level that follows from it, and an
//! error written with its sources on one line.
//!
//! Errors say what failed in our words and keep what caused it as their
//! `source` (never flattened into their message); [`Chain`] writes the
//! whole story, `outer: inner: innermost`, where a person reads it.

use std::error::Error;
use std::fmt;

/// Whose fault a failure is: who has to act for it not to happen again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Blame {
    /// The caller: what it sent is wrong, or it asked for more than it may
    /// have, or it went away.
    Client,
    /// This gateway: its policy, its capacity, its store, or a bug.
    Gateway,
    /// A backend (or the store behind a shared feature): it refused, broke
    /// off or answered badly.
    Backend,
}

impl Blame {
    /// The level a failure of this blame is logged at: one of ours or a
    /// backend's is worth an operator's look (`WARN`); a client's is the
    /// client's business (`DEBUG`).
    pub fn level(self) -> tracing::Level {
        match self {
            Blame::Client => tracing::Level::DEBUG,
            Blame::Gateway | Blame::Backend => tracing::Level::WARN,
        }
    }

    /// The word for it in logs: `client`, `gateway` or `backend`.
    pub fn as_str(self) -> &'static str {
        match self {
            Blame::Client => "client",
            Blame::Gateway => "gateway",
            Blame::Backend => "backend",
        }
    }
}

impl fmt::Display for Blame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error and its sources on one line, `outer: inner: innermost`.
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

impl fmt::Debug for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn a_chain_writes_every_source() {
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(Chain(&e).to_string(), "outer: inner");
        let alone = std::io::Error::other("alone");
        assert_eq!(Chain(&alone).to_string(), "alone");
    }

    #[test]
    fn only_a_clients_fault_is_logged_below_warn() {
        assert_eq!(Blame::Client.level(), tracing::Level::DEBUG);
        assert_eq!(Blame::Gateway.level(), tracing::Level::WARN);
        assert_eq!(Blame::Backend.level(), tracing::Level::WARN);
    }
}
