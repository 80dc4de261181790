//! Playing a workload against a live gateway (`fairway load`): every
//! request sent at its `t` over real HTTP, timed as a client sees it.
//!
//! Each request is a `/v1/completions` call whose prompt is exactly
//! `prompt_tokens` by the shared token estimate (four bytes a token; the
//! text of its token ids, so that what it shares with other requests, and
//! only that, an engine's prefix cache can find), with
//! `max_tokens` and the simulated backends' `sim_output_tokens` extension
//! set to the workload's `output_tokens`, so a `fairway sim-backend`
//! generates exactly what the replay's engine does. (A real engine ignores
//! the extension and generates what it generates.) TTFT is the first body
//! frame of a streamed response, e2e the end of the body. The results
//! become a [`Trace`], so the live run is summarised by the same code as a
//! replay and the two compare line by line.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::clock::Clock;
use crate::config::Policy;
use crate::replay::sim::{Outcome, RequestResult, Trace};
use crate::replay::workload::WorkRequest;

/// Where and as whom to send.
#[derive(Clone, Debug)]
pub struct Target {
    /// `host:port` of the gateway's client listener.
    pub authority: String,
    /// API key per tenant name; a tenant without one is sent without a key.
    pub keys: HashMap<String, String>,
    /// Longest a request may take, headers to end of body; past it, it
    /// counts as failed.
    pub timeout: Duration,
}

/// Sends every request of `workload` at its time and waits for all of
/// them; `policy` gives the tenants (order and SLOs) for the trace.
pub async fn play(policy: &Policy, workload: &[WorkRequest], target: &Target) -> Trace {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build_http();
    let clock = Arc::new(Clock::new());
    let start = clock.now();
    let mut tasks = Vec::with_capacity(workload.len());
    for (i, w) in workload.iter().enumerate() {
        let at = start + Duration::from_secs_f64(w.t);
        let client = client.clone();
        let clock = clock.clone();
        let key = target.keys.get(&w.tenant).cloned();
        let uri = format!("http://{}/v1/completions", target.authority);
        let body = serde_json::json!({
            "model": w.model,
            "prompt": w.prompt_text(i as u64),
            "max_tokens": w.max_tokens.unwrap_or(w.output_tokens).max(w.output_tokens),
            "sim_output_tokens": w.output_tokens,
            "stream": w.stream,
        })
        .to_string();
        let stream = w.stream;
        let timeout = target.timeout;
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(clock.to_std(at).into()).await;
            let sent = clock.now();
            let exchange = async {
                let mut req = Request::post(uri).header(header::CONTENT_TYPE, "application/json");
                if let Some(k) = key {
                    req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
                }
                let Ok(req) = req.body(Full::new(Bytes::from(body))) else {
                    return (None, None, 0u16);
                };
                let Ok(resp) = client.request(req).await else {
                    return (None, None, 0);
                };
                let status = resp.status().as_u16();
                let mut body = resp.into_body();
                let mut first = None;
                while let Some(frame) = body.frame().await {
                    match frame {
                        Ok(f) if f.is_data() && first.is_none() => first = Some(clock.now()),
                        Ok(_) => {}
                        Err(_) => return (first, None, status),
                    }
                }
                (first.filter(|_| stream), Some(clock.now()), status)
            };
            match tokio::time::timeout(timeout, exchange).await {
                Ok((first, end, status)) => (sent, first, end, status),
                Err(_) => (sent, None, None, 0),
            }
        }));
    }
    let slo: HashMap<&str, _> = policy
        .tenants
        .iter()
        .map(|t| (t.name.as_str(), &t.slo))
        .collect();
    let tenants: Vec<String> = policy.tenants.iter().map(|t| t.name.clone()).collect();
    let mut requests = Vec::with_capacity(workload.len());
    let mut last = start;
    for (w, task) in workload.iter().zip(tasks) {
        let (sent, first, end, status) = task.await.unwrap_or((start, None, None, 0));
        let arrived = (sent - start).as_secs_f64();
        let served = status == 200 && end.is_some();
        let e2e = end.filter(|_| served).map(|e| (e - sent).as_secs_f64());
        let ttft = e2e.map(|e| first.map_or(e, |f| (f - sent).as_secs_f64()));
        let good = match (slo.get(w.tenant.as_str()), ttft, e2e) {
            (Some(s), Some(t), Some(e)) => t <= s.ttft.as_secs_f64() && e <= s.e2e.as_secs_f64(),
            (None, Some(_), Some(_)) => true,
            _ => false,
        };
        if let Some(e) = end {
            last = last.max(e);
        }
        let outcome = match status {
            200 if served => Outcome::Served,
            401 | 404 | 429 => Outcome::Refused("status"),
            503 => Outcome::Shed,
            _ => Outcome::FailedUpstream,
        };
        requests.push((
            tenants
                .iter()
                .position(|t| *t == w.tenant)
                .unwrap_or(usize::MAX),
            RequestResult {
                outcome,
                arrived,
                queue_wait: None,
                ttft,
                e2e,
                good,
            },
        ));
    }
    Trace {
        bound_ratio: None,
        slo_ttft: super::sim::slo_ttft(policy, &tenants),
        tenants,
        requests,
        queue: Vec::new(),
        jain: None,
        shares: Vec::new(),
        utilisation: 0.0,
        makespan: (last - start).as_secs_f64().max(1e-9),
        output_tokens: 0,
        // Counted by the gateway (`fairway_preemptions_total`), not here.
        preempted: None,
        lost_tokens: None,
        resumed: None,
        // Loaded inside the engines, not seen here.
        adapter_loads: None,
        // Charged and settled inside the gateway, not seen here.
        estimates: Vec::new(),
        // Inside the engines, not seen here.
        prefix: None,
    }
}
