//! Policy reload: SIGHUP, a change to the file, or `POST /admin/reload`.
//!
//! The new file is validated off the request path. If it is invalid, or
//! changes a restart-only field, the running policy stays and the failure is
//! logged once and counted. If it is valid, new simulated backends are
//! started, the scheduler is reconciled by name (state of unchanged tenants
//! and backends survives) and the derived view is swapped in one store.
//! Requests in flight keep the `Arc<Live>` they started with.

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::clock::unix_seconds;
use crate::config::{ConfigError, Policy, load_policy};
use crate::edge::services::{Services, start_sims};
use crate::gateway::live_policy::derive_live;
use crate::hex::hex;

/// Why a reload was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("the gateway was started from an in-memory policy; there is no file to reload")]
    NoFile,
    #[error("invalid policy:\n{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<ConfigError>),
    #[error("these changes need a restart and were not applied: {}", .0.join(", "))]
    RestartRequired(Vec<String>),
    #[error("could not start simulated backend: {0}")]
    Sim(std::io::Error),
    #[error(transparent)]
    Tls(#[from] crate::net::tls::TlsError),
}

/// What a successful reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reloaded {
    /// The file is unchanged since the last load.
    Unchanged,
    /// The new policy is in force.
    Applied { hash: String },
}

/// Fields that cannot change without a restart, by key path.
pub fn restart_only_changes(old: &Policy, new: &Policy) -> Vec<String> {
    let mut out = Vec::new();
    if old.server.listen != new.server.listen {
        out.push("server.listen".to_owned());
    }
    if old.server.admin_listen != new.server.admin_listen {
        out.push("server.admin_listen".to_owned());
    }
    if old.server.tls.is_some() != new.server.tls.is_some() {
        out.push("server.tls".to_owned());
    }
    if old.server.trust_tenant_header != new.server.trust_tenant_header {
        out.push("server.trust_tenant_header".to_owned());
    }
    if old.server.max_connections != new.server.max_connections {
        out.push("server.max_connections".to_owned());
    }
    if old.server.max_requests != new.server.max_requests {
        out.push("server.max_requests".to_owned());
    }
    if old.server.header_read_timeout != new.server.header_read_timeout {
        out.push("server.header_read_timeout".to_owned());
    }
    if old.server.max_connections_per_client != new.server.max_connections_per_client {
        out.push("server.max_connections_per_client".to_owned());
    }
    if old.server.workers != new.server.workers {
        out.push("server.workers".to_owned());
    }
    if old.server.idle_timeout != new.server.idle_timeout {
        out.push("server.idle_timeout".to_owned());
    }
    if old.cluster != new.cluster {
        out.push("cluster".to_owned());
    }
    out
}

/// Re-reads the policy file and applies it if valid. Counts the result.
pub async fn reload(services: &Services) -> Result<Reloaded, ReloadError> {
    let gw = &services.gateway;
    let _serial = services.reload_lock.lock().await;
    let result = reload_inner(services).await;
    match &result {
        Ok(Reloaded::Unchanged) => {}
        Ok(Reloaded::Applied { hash }) => {
            gw.metrics().record_reload(true);
            tracing::info!(%hash, "policy reloaded");
        }
        Err(e) => {
            gw.metrics().record_reload(false);
            tracing::error!(error = %e, "policy reload refused; the running policy stays");
        }
    }
    result
}

async fn reload_inner(services: &Services) -> Result<Reloaded, ReloadError> {
    let gw = &services.gateway;
    let path = services
        .source
        .lock()
        .path
        .clone()
        .ok_or(ReloadError::NoFile)?;
    let path2 = path.clone();
    let loaded = tokio::task::spawn_blocking(move || load_policy(&path2))
        .await
        .map_err(|e| ReloadError::Sim(std::io::Error::other(e)))?;
    let (policy, text) = loaded.map_err(ReloadError::Invalid)?;
    let hash = hex(&Sha256::digest(text.as_bytes()));
    let old = gw.live();
    let changes = restart_only_changes(&old.policy, &policy);
    if !changes.is_empty() {
        return Err(ReloadError::RestartRequired(changes));
    }
    // Certificates are re-read on every reload, even of an unchanged policy
    // file, so that replacing the PEM files and reloading rotates them.
    if let Some(t) = &policy.server.tls {
        let config = crate::net::tls::load(&t.cert, &t.key, "server.tls")?;
        services.tls.store(Some(config));
    }
    if hash == old.source_hash && *old.policy == policy {
        return Ok(Reloaded::Unchanged);
    }
    let running = services.sim_authorities.lock().clone();
    let started = start_sims(&policy, &running)
        .await
        .map_err(ReloadError::Sim)?;
    let sims = {
        let mut auth = services.sim_authorities.lock();
        for (name, h) in &started {
            auth.insert(name.clone(), h.addr().to_string());
        }
        auth.clone()
    };
    services.sims.lock().extend(started);
    let policy = Arc::new(policy);
    let spec = gw.replica_spec(&policy);
    // The new live view is put in force in the same critical section as
    // the spec, so no request sees one without the other.
    gw.sched().reload(gw.now(), &spec, |sched| {
        let live = derive_live(
            policy.clone(),
            sched,
            gw.metrics(),
            &sims,
            &text,
            unix_seconds(),
        );
        gw.set_live(Arc::new(live));
    });
    let kv = services.sim_kv_events();
    services.pollers.lock().reconcile(gw, &policy, &sims, &kv);
    services.source.lock().text = text;
    Ok(Reloaded::Applied { hash })
}

/// Watches the policy file by content: every `period` it re-reads the file
/// (and the tenant resource files it names) and reloads when their hash
/// changed. Polling the content (rather than
/// inotify on the file) sees atomic-rename saves, editors that replace the
/// inode, and Kubernetes ConfigMap symlink swaps alike, with no extra
/// dependency; the cost is one small read per period.
pub async fn watch(
    services: Arc<Services>,
    period: Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    let gw = &services.gateway;
    let Some(path) = services.source.lock().path.clone() else {
        return;
    };
    let mut last = gw.live().source_hash.clone();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        // The file and the tenant resources it names.
        let read = tokio::task::spawn_blocking({
            let path = path.clone();
            move || crate::config::read_source(&path)
        });
        let Ok(Ok(source)) = read.await else {
            continue;
        };
        let hash = hex(&Sha256::digest(source.text.as_bytes()));
        if hash != last && hash != gw.live().source_hash {
            tracing::info!(path = %path.display(), "policy file changed");
            let _ = reload(&services).await;
        }
        last = hash;
    }
}
