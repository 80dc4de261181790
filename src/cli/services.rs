//! The services beside the gateway, each run until a signal: `fairway
//! sim-backend`, `fairway placement` and `fairway agent`.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::ValueEnum;

use crate::agent::{AgentConfig, serve as serve_agent};
use crate::config::policy::MetricsDialect;
use crate::sim::backend::{SimBackendConfig, serve as serve_sim};

/// Runs a simulated backend on `listen` until Ctrl-C.
pub async fn sim_backend(listen: SocketAddr, cfg: SimBackendConfig) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    println!(
        "fairway sim-backend for model {} listening on http://{}",
        cfg.model,
        listener.local_addr()?
    );
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    serve_sim(listener, cfg, shutdown).await?;
    Ok(())
}

/// The metrics dialects an engine speaks (`agent` and `none` are not).
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum EngineDialect {
    Vllm,
    Triton,
    Trtllm,
    Sglang,
    Llamacpp,
}

impl From<EngineDialect> for MetricsDialect {
    fn from(d: EngineDialect) -> Self {
        match d {
            EngineDialect::Vllm => MetricsDialect::Vllm,
            EngineDialect::Triton => MetricsDialect::Triton,
            EngineDialect::Trtllm => MetricsDialect::Trtllm,
            EngineDialect::Sglang => MetricsDialect::Sglang,
            EngineDialect::Llamacpp => MetricsDialect::Llamacpp,
        }
    }
}

/// Runs the placement service until SIGTERM or Ctrl-C.
pub async fn placement(config: PathBuf) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let policy = crate::placement::load(&config)?;
    let listener = tokio::net::TcpListener::bind(policy.listen)
        .await
        .with_context(|| format!("binding {}", policy.listen))?;
    let mut term = signal(SignalKind::terminate()).context("installing signal handlers")?;
    let mut int = signal(SignalKind::interrupt()).context("installing signal handlers")?;
    println!(
        "fairway placement listening on https://{} ({} agents, {} agent names)",
        listener.local_addr()?,
        policy.agents.len(),
        policy.agents_dns.len()
    );
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("shutdown signal received");
    };
    crate::placement::serve(listener, config, shutdown).await?;
    tracing::info!("fairway placement stopped");
    Ok(())
}

/// Runs the agent until SIGTERM or Ctrl-C.
pub async fn agent(listen: SocketAddr, cfg: AgentConfig) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    cfg.validate()?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    // Installed before the listen line, so a signal after it always drains.
    let mut term = signal(SignalKind::terminate()).context("installing signal handlers")?;
    let mut int = signal(SignalKind::interrupt()).context("installing signal handlers")?;
    println!(
        "fairway agent listening on http://{} (node {}, {})",
        listener.local_addr()?,
        cfg.node,
        cfg.engine_metrics.as_deref().unwrap_or("no engine")
    );
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("shutdown signal received");
    };
    serve_agent(listener, cfg, shutdown).await?;
    tracing::info!("fairway agent stopped");
    Ok(())
}
