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

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinHandle;

pub use super::handover::Target;
use super::handover::{self, BatchAs, HttpClient};
use crate::clock::Clock;
use crate::config::{Policy, Slo};
use crate::core::time::Instant;
use crate::replay::sim::{Outcome, RequestResult, Trace};
use crate::replay::workload::WorkRequest;

/// One request as the client saw it: sent, first body frame, end of body,
/// status (0: no answer).
type Exchange = (Instant, Option<Instant>, Option<Instant>, u16);

/// Status of a batch request never sent (`concurrency=N` ran out of time):
/// shed, as the gateway's 503 is.
const NOT_SENT: u16 = 503;

/// Sends one request and times it.
async fn exchange(
    client: &HttpClient,
    clock: &Clock,
    target: &Target,
    key: Option<&str>,
    body: String,
    stream: bool,
) -> (Option<Instant>, Option<Instant>, u16) {
    let uri = format!("http://{}/v1/completions", target.authority);
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
    tokio::time::timeout(target.timeout, exchange)
        .await
        .unwrap_or((None, None, 0))
}

/// Sends every request of `workload` at its time (its batch requests as
/// `target.batch_as` says) and waits for all of them; `policy` gives the
/// tenants (order and SLOs) for the trace.
pub async fn play(policy: &Policy, workload: &[WorkRequest], target: &Target) -> Trace {
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build_http();
    let clock = Arc::new(Clock::new());
    let start = clock.now();
    let live_done = tokio_util::sync::CancellationToken::new();
    let sends = spawn_sends(&client, &clock, start, workload, target, &live_done);
    let handed = spawn_handovers(&client, &clock, start, sends.lane, target);
    let mut done: Vec<Exchange> = vec![(start, None, None, 0); workload.len()];
    for (i, task) in sends.live {
        done[i] = task.await.unwrap_or((start, None, None, 0));
    }
    // Gated batch requests still waiting for a place are not sent.
    live_done.cancel();
    for (i, task) in sends.batch {
        done[i] = task.await.unwrap_or((start, None, None, 0));
    }
    for task in handed {
        for (i, ex) in task.await.unwrap_or_default() {
            done[i] = ex;
        }
    }
    trace(policy, workload, start, done)
}

/// The requests sent one by one, by their index in the workload, and the
/// batch requests left to hand over through `/v1/batches`, by tenant.
struct Sends<'w> {
    live: Vec<(usize, JoinHandle<Exchange>)>,
    batch: Vec<(usize, JoinHandle<Exchange>)>,
    lane: BTreeMap<&'w str, Vec<(usize, &'w WorkRequest)>>,
}

/// Spawns a task per request sent on its own, each waiting for its time;
/// with `BatchAs::Concurrency` the batch requests wait for a place too,
/// given up once `live_done` is cancelled.
fn spawn_sends<'w>(
    client: &HttpClient,
    clock: &Arc<Clock>,
    start: Instant,
    workload: &'w [WorkRequest],
    target: &Target,
    live_done: &tokio_util::sync::CancellationToken,
) -> Sends<'w> {
    let gate = match target.batch_as {
        BatchAs::Concurrency(n) => Some(Arc::new(tokio::sync::Semaphore::new(n))),
        _ => None,
    };
    let mut sends = Sends {
        live: Vec::new(),
        batch: Vec::new(),
        lane: BTreeMap::new(),
    };
    for (i, w) in workload.iter().enumerate() {
        if w.batch && target.batch_as == BatchAs::Lane {
            sends
                .lane
                .entry(w.tenant.as_str())
                .or_default()
                .push((i, w));
            continue;
        }
        let (client, clock, target) = (client.clone(), clock.clone(), target.clone());
        let gate = gate.clone().filter(|_| w.batch);
        let live_done = live_done.clone();
        let key = target.keys.get(&w.tenant).cloned();
        let (at, stream) = (start + Duration::from_secs_f64(w.t), w.stream);
        let body = handover::body(w, i, stream).to_string();
        let task = tokio::spawn(async move {
            tokio::time::sleep_until(clock.to_std(at).into()).await;
            // Gated: the client's wait for a free place counts in its time.
            let (sent, _permit) = match gate {
                Some(g) => tokio::select! {
                    p = g.acquire_owned() => (at, p.ok()),
                    () = live_done.cancelled() => return (at, None, None, NOT_SENT),
                },
                None => (clock.now(), None),
            };
            let (first, end, status) =
                exchange(&client, &clock, &target, key.as_deref(), body, stream).await;
            (sent, first, end, status)
        });
        if w.batch {
            &mut sends.batch
        } else {
            &mut sends.live
        }
        .push((i, task));
    }
    sends
}

/// Spawns a task per tenant of `lane` that hands its batch requests over
/// as one batch at the first one's time; each request's answer is the
/// batch's end, 200 or 500 by its item's result (none: no answer).
fn spawn_handovers(
    client: &HttpClient,
    clock: &Arc<Clock>,
    start: Instant,
    lane: BTreeMap<&str, Vec<(usize, &WorkRequest)>>,
    target: &Target,
) -> Vec<JoinHandle<Vec<(usize, Exchange)>>> {
    let at = |w: &WorkRequest| start + Duration::from_secs_f64(w.t);
    let mut handed = Vec::new();
    for (tenant, items) in lane {
        let (client, clock, target) = (client.clone(), clock.clone(), target.clone());
        let key = target.keys.get(tenant).cloned();
        let first = items.iter().map(|(_, w)| at(w)).min().unwrap_or(start);
        let owned: Vec<(usize, WorkRequest)> =
            items.iter().map(|(i, w)| (*i, (*w).clone())).collect();
        handed.push(tokio::spawn(async move {
            tokio::time::sleep_until(clock.to_std(first).into()).await;
            let refs: Vec<(usize, &WorkRequest)> = owned.iter().map(|(i, w)| (*i, w)).collect();
            let answered = handover::hand_over(&client, &target, key.as_deref(), &refs).await;
            let end = clock.now();
            if let Err(e) = &answered {
                eprintln!("batch handover failed: {}", crate::fault::Chain(e));
            }
            let answered = answered.unwrap_or_default();
            owned
                .iter()
                .map(|(i, w)| {
                    let sent = start + Duration::from_secs_f64(w.t);
                    let ex: Exchange = match answered.get(i) {
                        Some(true) => (sent, None, Some(end), 200),
                        Some(false) => (sent, None, Some(end), 500),
                        None => (sent, None, None, 0),
                    };
                    (*i, ex)
                })
                .collect::<Vec<_>>()
        }));
    }
    handed
}

/// The trace of `done`, the exchange of each request of `workload` in
/// order, timed from `start`.
fn trace(policy: &Policy, workload: &[WorkRequest], start: Instant, done: Vec<Exchange>) -> Trace {
    let slo: HashMap<&str, _> = policy
        .tenants
        .iter()
        .map(|t| (t.name.as_str(), &t.slo))
        .collect();
    let tenants: Vec<String> = policy.tenants.iter().map(|t| t.name.clone()).collect();
    let mut requests = Vec::with_capacity(workload.len());
    let mut last = start;
    for (w, ex) in workload.iter().zip(done) {
        if let Some(e) = ex.2 {
            last = last.max(e);
        }
        let tenant = tenants
            .iter()
            .position(|t| *t == w.tenant)
            .unwrap_or(usize::MAX);
        requests.push((
            tenant,
            result(ex, start, slo.get(w.tenant.as_str()).copied()),
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

/// One request's result as the client saw it: served on a 200 with its
/// whole body, good when within `slo` (its tenant's; none: any served
/// request is good).
fn result(
    (sent, first, end, status): Exchange,
    start: Instant,
    slo: Option<&Slo>,
) -> RequestResult {
    let arrived = (sent - start).as_secs_f64();
    let served = status == 200 && end.is_some();
    let e2e = end.filter(|_| served).map(|e| (e - sent).as_secs_f64());
    let ttft = e2e.map(|e| first.map_or(e, |f| (f - sent).as_secs_f64()));
    let good = match (slo, ttft, e2e) {
        (Some(s), Some(t), Some(e)) => t <= s.ttft.as_secs_f64() && e <= s.e2e.as_secs_f64(),
        (None, Some(_), Some(_)) => true,
        _ => false,
    };
    let outcome = match status {
        200 if served => Outcome::Served,
        401 | 404 | 429 => Outcome::Refused("status"),
        503 => Outcome::Shed,
        _ => Outcome::FailedUpstream,
    };
    RequestResult {
        outcome,
        arrived,
        queue_wait: None,
        ttft,
        e2e,
        good,
    }
}
