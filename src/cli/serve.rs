//! `fairway serve`: the gateway on the policy file's listeners, with its
//! start-up banner, until SIGTERM or Ctrl-C (SIGHUP reloads).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::config::load_policy;
use crate::telemetry::LogFormat;
use crate::{Listeners, PolicySource, ServeOptions};

/// Serves the policy file `config` until SIGTERM or Ctrl-C, watching it
/// every `watch_interval` (zero: never).
pub async fn serve(
    config: PathBuf,
    watch_interval: Duration,
    log: LogFormat,
) -> anyhow::Result<()> {
    let (policy, text) = load_policy(&config).map_err(|errors| {
        let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
        anyhow::anyhow!("invalid policy file:\n{}", lines.join("\n"))
    })?;
    let example_key = policy.tenants.first().and_then(|_| demo_key(&text));
    let model = policy
        .pools
        .first()
        .map(|p| p.model.clone())
        .unwrap_or_default();
    let listeners = Listeners::bind(&policy)
        .await
        .with_context(|| format!("binding the listeners of {}", config.display()))?;
    // Install the handlers before announcing the address: a SIGHUP that
    // arrives after the listen line must reload, never kill the process.
    let signals = Signals::install().context("installing signal handlers")?;
    let addr = listeners.api.local_addr()?;
    println!(
        "fairway listening on http://{addr} (admin on http://{})",
        listeners.admin.local_addr()?
    );
    // (Double quotes, so that a `$API_KEY` placeholder expands.)
    let auth = example_key
        .map(|k| format!(" -H \"Authorization: Bearer {k}\""))
        .unwrap_or_default();
    println!(
        "try: curl -s http://{addr}/v1/chat/completions{auth} -H 'Content-Type: application/json' -d '{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}],\"max_tokens\":16}}'"
    );
    println!("each tenant's own usage page: http://{addr}/fairway/ (sign in with its API key)");
    let options = ServeOptions {
        source: PolicySource {
            path: Some(config.clone()),
            text,
        },
        watch: (!watch_interval.is_zero()).then_some(watch_interval),
        reload_signal: Some(signals.hup),
        log: Some(log),
    };
    let stop = async move {
        let (mut term, mut int) = (signals.term, signals.int);
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("shutdown signal received");
    };
    crate::serve(listeners, policy, options, stop)
        .await
        .with_context(|| format!("serving {}", config.display()))?;
    tracing::info!("fairway stopped");
    Ok(())
}

/// The key for the start-up curl example: the file's first clear-text key
/// if it is one of the public demo keys (`sk-demo-…`), else a `$API_KEY`
/// placeholder. Any other key is a secret and never printed.
fn demo_key(text: &str) -> Option<String> {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("api_keys"))?;
    let start = line.find('"')? + 1;
    let len = line[start..].find('"')?;
    let key = &line[start..start + len];
    Some(if key.starts_with(DEMO_KEY_PREFIX) {
        key.to_owned()
    } else {
        "$API_KEY".to_owned()
    })
}

/// Keys that are public by design: those of the demo policy.
const DEMO_KEY_PREFIX: &str = "sk-demo-";

/// SIGTERM and Ctrl-C drain; SIGHUP reloads the policy.
struct Signals {
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            int: signal(SignalKind::interrupt())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::demo_key;

    #[test]
    fn the_banner_prints_only_demo_keys() {
        let demo = "[[tenants]]\nname = \"a\"\napi_keys = [\"sk-demo-api\"]\n";
        assert_eq!(demo_key(demo).as_deref(), Some("sk-demo-api"));
        let real = "[[tenants]]\nname = \"a\"\napi_keys = [\"sk-live-9f8e7d\"]\n";
        assert_eq!(demo_key(real).as_deref(), Some("$API_KEY"));
        assert_eq!(demo_key("[[tenants]]\nname = \"a\"\n"), None);
    }
}
