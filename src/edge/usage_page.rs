//! The tenant usage API and page, on the client listener.
//!
//! - `GET /fairway/usage`: the caller's own numbers, authenticated with its
//!   API key as any call is; with the admin token (`[server]
//!   admin_token_env`), every tenant, sorted by SLO attainment over the
//!   last hour, worst first.
//! - `GET /fairway/usage/{tenant}`: one tenant; a tenant's key reads only
//!   its own name (any other is 404, whether it exists or not), the admin
//!   token any.
//! - `GET /fairway/` (and `/fairway`): the page, one self-contained HTML
//!   document (`usage_page.html`, compiled in) that signs in with a key kept in
//!   the browser's session storage and calls the API.
//!
//! The numbers come from memory: each tenant's usage windows
//! (`telemetry::usage`), its limits from the policy and its buckets from
//! the scheduler; in a `[cluster]`, with every other replica's published
//! windows and live numbers added (`gateway::usage_share`), so that every
//! replica answers the same. Field names are stable; docs/usage.md lists
//! them.

use std::collections::HashMap;
use std::sync::Arc;

use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use serde_json::{Value, json};

use crate::batch::{Batches, Scope};
use crate::protocol::batch::Batch;

use crate::core::admission::LimitKind;
use crate::core::ids::TenantId;
use crate::edge::admin::bears_token;
use crate::gateway::live_policy::Live;
use crate::gateway::state::Gateway;
use crate::gateway::tenant::authenticate;
use crate::gateway::usage_share::LiveNumbers;
use crate::net::body::{self, BoxBody};
use crate::outcome::Outcome;
use crate::protocol::error::ApiError;
use crate::telemetry::usage::TenantWindows;

mod source;
mod view;

use source::{Shares, Source, read_everyone};
use view::Page;

/// The page.
const PAGE: &str = include_str!("usage_page.html");

/// The windows the API reports, by name and length in seconds.
const WINDOWS: [(&str, u64); 3] = [("5m", 300), ("1h", 3600), ("24h", 86_400)];

/// Whether `path` is one of this module's.
pub fn owns(path: &str) -> bool {
    path == "/fairway" || path.starts_with("/fairway/")
}

/// Answers a request for one of this module's paths.
pub async fn route<B>(
    gw: &Arc<Gateway>,
    batches: Option<&Arc<Batches>>,
    req: &Request<B>,
) -> Response<BoxBody> {
    let path = req.uri().path();
    if req.method() != Method::GET {
        let mut resp = ApiError::InvalidRequest(format!("{path} takes GET")).into_response();
        *resp.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET"));
        return resp;
    }
    match path {
        "/fairway" | "/fairway/" => page(),
        "/fairway/usage" => usage(gw, batches, req, None).await,
        _ => match path.strip_prefix("/fairway/usage/") {
            Some(name) if !name.is_empty() && !name.contains('/') => {
                usage(gw, batches, req, Some(name)).await
            }
            _ => ApiError::NotFound.into_response(),
        },
    }
}

fn page() -> Response<BoxBody> {
    let mut resp = Response::new(body::full(PAGE));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // Everything the page needs is in it: no other origin, no inline
    // handlers from data, no framing.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'; \
             connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; \
             form-action 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// Who is asking: the operator (the admin token) or a tenant (its key).
pub(crate) enum Caller {
    Operator,
    Tenant(TenantId),
}

pub(crate) fn caller(live: &Live, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let operator = live.policy.server.admin_token;
    if operator.is_some_and(|want| bears_token(headers, &want)) {
        return Ok(Caller::Operator);
    }
    authenticate(live, headers).map(Caller::Tenant)
}

/// A tenant the report covers: its index in `live.usage` (the policy's
/// tenants, then "default").
#[derive(Clone, Copy)]
struct Subject {
    pub(super) index: usize,
}

fn subject_named(live: &Live, name: &str) -> Option<Subject> {
    let index = live.policy.tenants.iter().position(|t| t.name == name);
    match index {
        Some(index) => Some(Subject { index }),
        None if name == "default" && live.policy.tenants.is_empty() => Some(Subject { index: 0 }),
        None => None,
    }
}

/// Whether the query asks for this replica's own numbers
/// (`scope=replica`; the operator's only).
fn replica_scope(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|kv| kv == "scope=replica"))
}

async fn usage<B>(
    gw: &Arc<Gateway>,
    batches: Option<&Arc<Batches>>,
    req: &Request<B>,
    name: Option<&str>,
) -> Response<BoxBody> {
    let headers = req.headers();
    let live = gw.live();
    let caller = match caller(&live, headers) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let now = crate::clock::unix_seconds_f64();
    let everyone: Vec<Subject> = if live.policy.tenants.is_empty() {
        subject_named(&live, "default").into_iter().collect()
    } else {
        let tenants = live.policy.tenants.iter().enumerate();
        tenants.map(|(index, _)| Subject { index }).collect()
    };
    let operator = matches!(caller, Caller::Operator);
    let page = match (operator, name) {
        (true, None) => match Page::parse(req.uri().query()) {
            Ok(p) => Some(p),
            Err(e) => return e.into_response(),
        },
        _ => None,
    };
    // Who is reported: one tenant, or a page of every tenant (the
    // operator's), chosen below from everyone's numbers.
    let one: Option<Subject> = match (&caller, name) {
        (Caller::Operator, None) => None,
        (Caller::Operator, Some(name)) => match subject_named(&live, name) {
            Some(s) => Some(s),
            None => return ApiError::NotFound.into_response(),
        },
        (Caller::Tenant(id), name) => {
            let own = live
                .tenant_policy
                .get(id)
                .map(|&i| live.policy.tenants[i].name.as_str())
                .unwrap_or("default");
            // Another tenant's name, real or not, is not found: a key
            // learns nothing about the tenants it is not.
            if name.is_some_and(|n| n != own) {
                return ApiError::NotFound.into_response();
            }
            match subject_named(&live, own) {
                Some(s) => Some(s),
                None => return ApiError::NotFound.into_response(),
            }
        }
    };
    let cluster = !(operator && replica_scope(req.uri().query()));
    let _turn = match page {
        Some(_) => gw.everyone().page_turn().await,
        None => None,
    };
    let all = gw
        .everyone()
        .get(&live, cluster, || read_everyone(gw, &live, cluster, now))
        .await;
    let reported: Vec<Subject> = match (one, &page) {
        (Some(s), _) => vec![s],
        (None, Some(page)) => page.select(&live, &everyone, &all),
        (None, None) => Vec::new(),
    };
    let indexes: Vec<usize> = reported.iter().map(|s| s.index).collect();
    let source = Source::read(gw, &live, &indexes, all, now).await;
    let shares = Shares::of(&live, &everyone, &source);
    let mut reports: Vec<Value> = reported
        .iter()
        .map(|s| report(&live, *s, &shares, &source, now))
        .collect();
    let mut body = match &page {
        Some(page) => {
            let total = everyone.len();
            let next = page.offset.saturating_add(page.limit);
            json!({
                "generated_unix": now,
                "sort": page.sort.as_str(),
                "offset": page.offset,
                "limit": page.limit,
                "total": total,
                "next_offset": (next < total).then_some(next),
                "tenants": reports,
            })
        }
        None => reports.pop().unwrap_or(Value::Null),
    };
    scope_fields(gw, &source, &mut body);
    if let Some(b) = batches {
        match body.get_mut("tenants").and_then(Value::as_array_mut) {
            // One read of the store for the page.
            Some(all) => {
                let list = b.batches_by_owner().await.unwrap_or_default();
                let mut by_owner: HashMap<&str, Vec<&Batch>> = HashMap::new();
                for (owner, batch) in &list {
                    by_owner.entry(owner).or_default().push(batch);
                }
                for t in all {
                    let name = t["tenant"].as_str().unwrap_or_default();
                    let shown = by_owner.get(name).map_or(&[][..], Vec::as_slice);
                    attach_batches(shown, t);
                }
            }
            None => {
                let tenant = body["tenant"].as_str().map(str::to_owned);
                let list = match tenant {
                    Some(t) => b.batches(&Scope::Tenant(t)).await.unwrap_or_default(),
                    None => Vec::new(),
                };
                attach_batches(&list.iter().collect::<Vec<_>>(), &mut body);
            }
        }
    }
    let mut resp = Response::new(body::full(body.to_string()));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// The batches shown a tenant: its newest, each with its progress and
/// whether it will make its window.
const BATCHES_SHOWN: usize = 10;

/// Adds a tenant report's `batches` (with the Batch API on): the
/// tenant's [`BATCHES_SHOWN`] newest of `list` (newest first); empty
/// when its store cannot be read.
fn attach_batches(list: &[&Batch], report: &mut Value) {
    let shown: Vec<Value> = list
        .iter()
        .take(BATCHES_SHOWN)
        .map(|x| {
            json!({
                "id": x.id,
                "status": x.status,
                "endpoint": x.endpoint,
                "request_counts": x.request_counts,
                "created_at": x.created_at,
                "expires_at": x.expires_at,
                "projected_completion_at": x.projected_completion_at,
                "deadline_at_risk": x.deadline_at_risk,
            })
        })
        .collect();
    report["batches"] = Value::Array(shown);
}

fn refusals_in(windows: &crate::telemetry::usage::WindowStats, kind: LimitKind) -> u64 {
    windows.refusals.get(kind.as_str()).copied().unwrap_or(0)
}

/// The report's `scope` (`cluster`: every replica's numbers added;
/// `replica`: this one's), the replicas behind it, this replica's name,
/// and why the cluster's could not be read.
fn scope_fields(gw: &Gateway, source: &Source, body: &mut Value) {
    let Some(obj) = body.as_object_mut() else {
        return;
    };
    let reporting = source.windows.values().map(|(_, n)| *n).max().unwrap_or(1);
    obj.insert("scope".into(), json!(source.scope));
    obj.insert("replicas".into(), json!(reporting));
    if let Some(m) = gw.cluster() {
        obj.insert("replica".into(), json!(m.replica));
        obj.insert("cluster_replicas".into(), json!(m.replicas()));
    }
    if let Some(e) = &source.error {
        obj.insert("cluster_error".into(), json!(e));
    }
}

/// One tenant's numbers.
fn report(live: &Live, s: Subject, shares: &Shares, source: &Source, now: f64) -> Value {
    let policy = live.policy.tenants.get(s.index);
    let name = policy.map_or("default", |t| t.name.as_str());
    let empty = TenantWindows::default();
    let windows = source.windows.get(&s.index).map_or(&empty, |(w, _)| w);
    // Live numbers, over the replicas publishing them now (not those
    // that stopped within the hour): what is in flight and queued, and
    // what their buckets hold.
    let numbers: Vec<&LiveNumbers> = source
        .numbers(s.index)
        .filter(|n| now - n.at <= source.fresh())
        .collect();
    let sum = |f: fn(&LiveNumbers) -> Option<f64>| -> Option<f64> {
        numbers.iter().copied().filter_map(f).reduce(|a, b| a + b)
    };
    let in_flight: u32 = numbers.iter().map(|n| n.in_flight).sum();
    let queued: u32 = numbers.iter().map(|n| n.queued).sum();
    // With the store's part: what the whole cluster may still admit.
    let (store_rate, store_gpu) = source.store.get(&s.index).copied().unwrap_or_default();
    let plus = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    };
    let rate_level = plus(sum(|n| n.rate_level), store_rate);
    let gpu_level = plus(sum(|n| n.gpu_seconds_level), store_gpu);
    let preempted_total: u64 = numbers.iter().map(|n| n.preempted_total).sum();
    let stats: Vec<(&str, crate::telemetry::usage::WindowStats)> = WINDOWS
        .iter()
        .map(|(label, secs)| (*label, windows.window(now, *secs)))
        .collect();
    let hour = &stats[1].1;
    let minutes = windows.minutes(now);
    let events: Vec<Value> = Outcome::ALL
        .iter()
        .filter(|o| matches!(o, Outcome::Refused(_) | Outcome::Shed))
        .filter_map(|o| {
            let last = windows.last(*o)?;
            let reason = if *o == Outcome::Shed {
                "shed"
            } else {
                o.reason()
            };
            let count_1h = if *o == Outcome::Shed {
                hour.outcomes.get("shed").copied().unwrap_or(0)
            } else {
                hour.refusals.get(reason).copied().unwrap_or(0)
            };
            Some(json!({"reason": reason, "last_unix": last, "count_1h": count_1h}))
        })
        .collect();

    let rate = policy.and_then(|t| t.rate);
    let max_concurrency = policy.and_then(|t| t.max_concurrency);
    let gpu_per_hour = policy.and_then(|t| t.gpu_seconds_per_hour);
    // The GPU-seconds bucket holds an hour's budget and refills it evenly
    // over the hour.
    let (available_at, full_at) = match (gpu_per_hour, gpu_level) {
        (Some(per_hour), Some(level)) if per_hour > 0.0 => {
            let per_second = per_hour / 3600.0;
            (
                Some(now + (-level).max(0.0) / per_second),
                Some(now + (per_hour - level).max(0.0) / per_second),
            )
        }
        _ => (None, None),
    };
    let (weight_share, service_share) = shares.of_tenant(s.index);
    json!({
        "tenant": name,
        "weight": policy.map_or(1.0, |t| t.weight),
        "priority": policy.map(|t| t.priority.as_str()),
        "slo": policy.map(|t| json!({
            "ttft_seconds": t.slo.ttft.as_secs_f64(),
            "e2e_seconds": t.slo.e2e.as_secs_f64(),
        })),
        "windows": stats.iter().map(|(l, w)| (l.to_string(), json!(w))).collect::<serde_json::Map<_, _>>(),
        "limits": {
            "rate": {
                "requests_per_second": rate,
                "burst": policy.and_then(|t| t.burst),
                "available": rate_level,
                "refused_1h": refusals_in(hour, LimitKind::Rate),
            },
            "concurrency": {
                "max": max_concurrency,
                "in_flight": in_flight,
                "queued": queued,
                "use_ratio": max_concurrency.map(|m| f64::from(in_flight + queued) / f64::from(m.max(1))),
                "refused_1h": refusals_in(hour, LimitKind::Concurrency),
            },
            "gpu_seconds": {
                "per_hour": gpu_per_hour,
                "available": gpu_level,
                "used_1h": hour.gpu_seconds,
                "available_again_unix": available_at,
                "full_unix": full_at,
                "refused_1h": refusals_in(hour, LimitKind::GpuSeconds),
            },
            "queue": {
                "refused_1h": refusals_in(hour, LimitKind::QueueFull),
            },
        },
        "share": {
            "weight_share": weight_share,
            "gpu_seconds_share_1h": service_share,
        },
        "preempted_total": preempted_total,
        "refusal_events": events,
        "minutes": minutes,
    })
}
