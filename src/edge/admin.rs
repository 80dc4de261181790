//! The admin listener: liveness, readiness, metrics, the running policy and
//! reload. Also `/v1/models`, which is answered from the policy.

use std::sync::Arc;

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use sha2::{Digest, Sha256};

use crate::edge::reload::{Reloaded, reload};
use crate::edge::services::Services;
use crate::gateway::state::Gateway;
use crate::gateway::tenant::constant_time_eq;
use crate::net::body::{self, BoxBody};
use crate::protocol::error::ApiError;
use crate::telemetry::metrics::{BackendGauges, PrefixGauges, Snapshot, TenantGauges};

/// Whether `req` may use `path`: `/healthz` and `/readyz` are always open;
/// `/admin/*` (and `/metrics` with `admin_token_for_metrics`) need
/// `Authorization: Bearer TOKEN` when `[server] admin_token_env` is set.
fn authorized(gw: &Gateway, req: &Request<Incoming>) -> bool {
    let live = gw.live();
    let server = &live.policy.server;
    let Some(want) = server.admin_token else {
        return true;
    };
    let path = req.uri().path();
    let guarded =
        path.starts_with("/admin/") || (path == "/metrics" && server.admin_token_for_metrics);
    !guarded || bears_token(req.headers(), &want)
}

/// Whether `headers` carry `Authorization: Bearer TOKEN` for the admin
/// token whose SHA-256 is `want` (compared in constant time).
pub(crate) fn bears_token(headers: &http::HeaderMap, want: &[u8; 32]) -> bool {
    let given = crate::net::headers::bearer(headers);
    given.is_some_and(|t| {
        let digest: [u8; 32] = Sha256::digest(t.as_bytes()).into();
        constant_time_eq(&digest, want)
    })
}

/// Routes an admin request.
pub async fn route(services: Arc<Services>, req: Request<Incoming>) -> Response<BoxBody> {
    let gw = &services.gateway;
    if !authorized(gw, &req) {
        let mut resp = json(
            StatusCode::UNAUTHORIZED,
            &serde_json::json!({"error": "this admin endpoint needs `Authorization: Bearer <admin token>`"}),
        );
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return resp;
    }
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/readyz") => {
            let unready = gw.sched().unready_models();
            if gw.is_draining() {
                text(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
            } else if unready.is_empty() {
                text(StatusCode::OK, "ready\n")
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!("no healthy backend for: {}\n", unready.join(", ")),
                )
            }
        }
        (&Method::GET, "/metrics") => {
            let mut body = gw.metrics().encode(&snapshot(&services));
            if let Some(b) = &services.batches {
                b.encode_metrics(&mut body);
            }
            let mut resp = text(StatusCode::OK, &body);
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            resp
        }
        (&Method::GET, "/admin/policy") => {
            let live = gw.live();
            let v = serde_json::json!({
                "policy": &*live.policy,
                "source_sha256": live.source_hash,
                "loaded_at_unix": live.loaded_at_unix,
                "cluster": gw.cluster().map(|c| c.view(gw.sched().leases())),
            });
            json(StatusCode::OK, &v)
        }
        (&Method::POST, "/admin/reload") => match reload(&services).await {
            Ok(Reloaded::Unchanged) => {
                json(StatusCode::OK, &serde_json::json!({"result": "unchanged"}))
            }
            Ok(Reloaded::Applied { hash }) => json(
                StatusCode::OK,
                &serde_json::json!({"result": "ok", "source_sha256": hash}),
            ),
            Err(e) => json(
                StatusCode::UNPROCESSABLE_ENTITY,
                &serde_json::json!({"result": "failed", "error": e.to_string()}),
            ),
        },
        _ => ApiError::NotFound.into_response(),
    }
}

/// `GET /v1/models`: the models with OpenAI-compatible backends, OpenAI
/// list format; with a tenant's key, also the LoRA adapters it may call
/// (those the policy lists and those the backends list), each with its
/// base model as `parent` (as vLLM lists them).
pub fn models(gw: &Gateway, headers: &http::HeaderMap) -> Response<BoxBody> {
    let live = gw.live();
    let tenant = crate::gateway::tenant::authenticate(&live, headers)
        .ok()
        .map(|t| live.tenant_policy.get(&t).map(|&i| &live.policy.tenants[i]));
    let discovered = gw.adapters().all();
    let mut data = Vec::new();
    let openai = live.policy.pools.iter().filter(|p| {
        p.backends
            .iter()
            .any(|b| b.protocol == crate::core::spec::Api::OpenAi)
    });
    for p in openai {
        data.push(serde_json::json!({"id": p.model, "object": "model", "created": 0, "owned_by": "fairway"}));
        let Some(tenant) = tenant else {
            continue;
        };
        let mut adapters: Vec<&String> = p.adapters.iter().collect();
        let mut listed: Vec<&String> = discovered
            .iter()
            .filter(|(a, base)| **base == p.model && !p.adapters.contains(a))
            .map(|(a, _)| a)
            .collect();
        listed.sort();
        adapters.extend(listed);
        for a in adapters {
            if tenant.is_none_or(|t| t.may_use_adapter(a)) {
                data.push(serde_json::json!({"id": a, "object": "model", "created": 0, "owned_by": "fairway", "parent": p.model}));
            }
        }
    }
    json(
        StatusCode::OK,
        &serde_json::json!({"object": "list", "data": data}),
    )
}

/// Scheduler state for the metrics scrape.
pub fn snapshot(services: &Services) -> Snapshot {
    let gw = &services.gateway;
    let now = gw.now();
    let live = gw.live();
    let pollers = services.pollers.lock();
    let template_fallbacks = live
        .policy
        .pools
        .iter()
        .filter_map(|p| {
            let (failed, over) = p.tokenizer.as_ref()?.loaded.fallbacks();
            Some((p.model.clone(), failed, over))
        })
        .collect();
    // With the histograms by model (many tenants), the per-tenant gauges
    // list only the tenants with work queued or in flight now.
    let every_tenant = live.policy.histograms_by_tenant();
    let view = gw.sched().view(now, every_tenant);
    let tenants = view
        .tenants
        .into_iter()
        .map(|(t, v)| {
            let slo = live
                .tenant_policy
                .get(&t)
                .map(|&i| &live.policy.tenants[i].slo);
            TenantGauges {
                slo_ttft: slo.map(|s| s.ttft.as_secs_f64()),
                slo_e2e: slo.map(|s| s.e2e.as_secs_f64()),
                tenant: v.name,
                queued: v.queued,
                in_flight: v.in_flight,
                preempted: v.preempted_total,
                rate_bucket: v.rate_level,
                gpu_seconds_bucket: v.gpu_seconds_level,
            }
        })
        .collect();
    let backends = view
        .backends
        .into_iter()
        .map(|(v, model, indexed)| {
            let fresh = v
                .reading
                .as_ref()
                .filter(|(_, fresh)| *fresh)
                .map(|(r, _)| r);
            BackendGauges {
                predicted_cached_tokens: indexed.then_some(v.predicted_cached_tokens),
                reported_cached_tokens: v.reported_cached_tokens,
                reported_prompt_tokens: v.reported_prompt_tokens,
                model,
                scrape_errors: pollers.scrape_errors(&v.name),
                kv_events: pollers.kv_events(&v.name),
                sources: pollers.sources(&v.name).pairs().collect(),
                backend: v.name,
                in_flight: v.in_flight,
                window: v.window,
                healthy: v.healthy,
                kv_usage: fresh.and_then(|r| r.kv_usage),
                running: fresh.and_then(|r| r.running),
                waiting: fresh.and_then(|r| r.waiting),
                ttft_p99: fresh.and_then(|r| r.ttft_p99).map(|d| d.as_secs_f64()),
                batch_limit: v.batch_limit,
                reading_age: v
                    .reading
                    .as_ref()
                    .map(|(r, _)| now.saturating_since(r.at).as_secs_f64()),
            }
        })
        .collect();
    let prefix = view
        .prefix
        .into_iter()
        .map(|(model, v)| PrefixGauges {
            model,
            entries: v.index.entries,
            capacity: v.index.cap,
            evictions: v.index.evictions,
            placements: v.placements,
            local: v.local,
        })
        .collect();
    Snapshot {
        tenants,
        backends,
        queued_by_model: view.queued_by_model,
        prefix,
        template_fallbacks,
        jain_index: view.jain_index,
        cluster: gw.cluster().map(|c| c.view(view.leases)),
    }
}

fn text(status: StatusCode, s: &str) -> Response<BoxBody> {
    let mut r = Response::new(body::full(s.to_owned()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn json(status: StatusCode, v: &serde_json::Value) -> Response<BoxBody> {
    let mut r = Response::new(body::json(v));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}
