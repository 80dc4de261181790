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
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use serde_json::{Value, json};

use crate::batch::{Batches, Scope};
use crate::protocol::batch::Batch;

use crate::core::admission::LimitKind;
use crate::core::ids::TenantId;
use crate::edge::admin::bears_token;
use crate::gateway::handle::Gateway;
use crate::gateway::live::Live;
use crate::gateway::tenant::authenticate;
use crate::gateway::usage_share::{Everyone, LiveNumbers, UsageSource};
use crate::net::body::{self, BoxBody};
use crate::outcome::Outcome;
use crate::protocol::error::ApiError;
use crate::telemetry::usage::TenantWindows;

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
    index: usize,
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

/// The windows and live numbers a report is made of: this replica's, or
/// the cluster's (every replica's published, added).
struct Source {
    /// By usage index, for the tenants reported.
    windows: HashMap<usize, (TenantWindows, usize)>,
    /// Every tenant's live numbers (read at most once a second for any
    /// number of views).
    everyone: Arc<Everyone>,
    /// By usage index, the reported tenants' own numbers here, as of now.
    own: HashMap<usize, LiveNumbers>,
    /// By usage index, reported tenants: what the cluster's store holds of
    /// the tenant's request and GPU-seconds buckets beside the replicas.
    store: HashMap<usize, (Option<f64>, Option<f64>)>,
    /// `cluster` or `replica`.
    scope: &'static str,
    /// Why the cluster's numbers could not be read, if they could not.
    error: Option<String>,
}

/// Every tenant's live numbers: the cluster's (each replica's as
/// published) or this replica's alone. This replica's are read on the
/// blocking pool: ten thousand tenants' take the scheduler's lock ten
/// thousand times, briefly, and none of the request path's threads.
async fn read_everyone(gw: &Arc<Gateway>, live: &Arc<Live>, cluster: bool, now: f64) -> Everyone {
    let (g, l) = (gw.clone(), live.clone());
    let own: Vec<LiveNumbers> = tokio::task::spawn_blocking(move || {
        (0..l.usage.len())
            .map(|i| UsageSource::numbers(&*g, &l, i, now))
            .collect()
    })
    .await
    .unwrap_or_default();
    let mut error = None;
    if let Some(shared) = gw.shared_usage().filter(|_| cluster) {
        match tokio::time::timeout(READ_TIMEOUT, shared.read_numbers(live, now, own.clone())).await
        {
            Ok(Ok(numbers)) => {
                return Everyone {
                    numbers,
                    scope: "cluster",
                    fresh: shared.fresh(),
                    error: None,
                };
            }
            Ok(Err(e)) => error = Some(format!("cluster store: {e}")),
            Err(_) => error = Some("cluster store: no answer in time".to_owned()),
        }
    }
    Everyone {
        numbers: own.into_iter().map(|n| vec![n]).collect(),
        scope: "replica",
        fresh: f64::INFINITY,
        error,
    }
}

impl Source {
    async fn read(
        gw: &Gateway,
        live: &Live,
        reported: &[usize],
        everyone: Arc<Everyone>,
        now: f64,
    ) -> Source {
        let own = reported
            .iter()
            .map(|&i| (i, UsageSource::numbers(gw, live, i, now)))
            .collect();
        let mut error = everyone.error.clone();
        if let Some(shared) = gw.shared_usage().filter(|_| everyone.scope == "cluster") {
            let read = tokio::time::timeout(READ_TIMEOUT, shared.read_windows(live, reported));
            match read.await {
                Ok(Ok(windows)) => {
                    return Source {
                        store: reported
                            .iter()
                            .zip(&windows)
                            .map(|(i, w)| (*i, (w.store_rate, w.store_gpu_seconds)))
                            .collect(),
                        windows: reported
                            .iter()
                            .zip(windows)
                            .map(|(i, w)| (*i, (w.windows, w.replicas)))
                            .collect(),
                        everyone,
                        own,
                        scope: "cluster",
                        error: None,
                    };
                }
                Ok(Err(e)) => error = Some(format!("cluster store: {e}")),
                Err(_) => error = Some("cluster store: no answer in time".to_owned()),
            }
        }
        Source {
            windows: reported
                .iter()
                .map(|&i| (i, (live.usage[i].lock().clone(), 1)))
                .collect(),
            everyone,
            own,
            store: HashMap::new(),
            scope: "replica",
            error,
        }
    }

    /// Tenant `index`'s live numbers: its own here (as of now when it is
    /// reported), then, in the cluster's scope, the other replicas'.
    fn numbers(&self, index: usize) -> impl Iterator<Item = &LiveNumbers> {
        let all = self
            .everyone
            .numbers
            .get(index)
            .map_or(&[][..], Vec::as_slice);
        let (first, others) = all
            .split_first()
            .map_or((None, &[][..]), |(f, o)| (Some(f), o));
        let others = if self.scope == "cluster" {
            others
        } else {
            &[][..]
        };
        self.own.get(&index).or(first).into_iter().chain(others)
    }

    /// How old live numbers may be to count as current (seconds).
    fn fresh(&self) -> f64 {
        if self.scope == "cluster" {
            self.everyone.fresh
        } else {
            f64::INFINITY
        }
    }
}

/// How long a report waits for the cluster's numbers before it answers
/// with this replica's.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// How the operator's view of every tenant is ordered.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sort {
    /// Worst SLO attainment over the hour first; nothing served last.
    Slo,
    /// Most requests refused over the hour first.
    Refused,
    /// Most GPU-seconds over the hour first.
    GpuSeconds,
    /// By name.
    Name,
}

impl Sort {
    fn as_str(self) -> &'static str {
        match self {
            Sort::Slo => "slo",
            Sort::Refused => "refused",
            Sort::GpuSeconds => "gpu_seconds",
            Sort::Name => "name",
        }
    }
}

/// A page of the operator's view: `sort`, `limit` (1 to [`MAX_PAGE`],
/// [`PAGE_SIZE`] unless given) and `offset`.
struct Page {
    sort: Sort,
    limit: usize,
    offset: usize,
}

/// Tenants in a page of the operator's view, unless asked for fewer, and
/// at most.
const PAGE_SIZE: usize = 100;
const MAX_PAGE: usize = 1000;

impl Page {
    fn parse(query: Option<&str>) -> Result<Page, ApiError> {
        let mut page = Page {
            sort: Sort::Slo,
            limit: PAGE_SIZE,
            offset: 0,
        };
        for kv in query
            .unwrap_or_default()
            .split('&')
            .filter(|kv| !kv.is_empty())
        {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let number = |max: usize| {
                v.parse::<usize>()
                    .ok()
                    .filter(|n| *n <= max)
                    .ok_or_else(|| {
                        ApiError::InvalidRequest(format!("`{k}` takes a whole number up to {max}"))
                    })
            };
            match k {
                "sort" => {
                    page.sort = match v {
                        "slo" => Sort::Slo,
                        "refused" => Sort::Refused,
                        "gpu_seconds" => Sort::GpuSeconds,
                        "name" => Sort::Name,
                        _ => {
                            return Err(ApiError::InvalidRequest(
                                "`sort` is one of slo, refused, gpu_seconds, name".into(),
                            ));
                        }
                    }
                }
                "limit" => page.limit = number(MAX_PAGE)?.max(1),
                "offset" => page.offset = number(usize::MAX)?,
                _ => {}
            }
        }
        Ok(page)
    }

    /// The tenants of this page, in its order, from every tenant's live
    /// numbers over the hour (each replica's, added).
    fn select(&self, live: &Live, everyone: &[Subject], source: &Source) -> Vec<Subject> {
        struct Key {
            s: Subject,
            attainment: Option<f64>,
            refused: u64,
            gpu: f64,
        }
        let mut keys: Vec<Key> = everyone
            .iter()
            .map(|&s| {
                let (mut served, mut goodput, mut refused, mut gpu) = (0, 0, 0, 0.0);
                for n in source.numbers(s.index) {
                    served += n.served_1h;
                    goodput += n.goodput_1h;
                    refused += n.refused_1h;
                    gpu += n.gpu_seconds_1h;
                }
                let attainment = (served > 0).then(|| goodput as f64 / served as f64);
                Key {
                    s,
                    attainment,
                    refused,
                    gpu,
                }
            })
            .collect();
        let name = |s: Subject| {
            live.policy
                .tenants
                .get(s.index)
                .map_or("default", |t| t.name.as_str())
        };
        keys.sort_by(|a, b| {
            let first = match self.sort {
                Sort::Slo => a
                    .attainment
                    .unwrap_or(f64::INFINITY)
                    .total_cmp(&b.attainment.unwrap_or(f64::INFINITY)),
                Sort::Refused => b.refused.cmp(&a.refused),
                Sort::GpuSeconds => b.gpu.total_cmp(&a.gpu),
                Sort::Name => std::cmp::Ordering::Equal,
            };
            first.then_with(|| name(a.s).cmp(name(b.s)))
        });
        keys.into_iter()
            .skip(self.offset)
            .take(self.limit)
            .map(|k| k.s)
            .collect()
    }
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
        (None, Some(page)) => {
            let ordered = Source {
                windows: HashMap::new(),
                everyone: all.clone(),
                own: HashMap::new(),
                store: HashMap::new(),
                scope: all.scope,
                error: None,
            };
            page.select(&live, &everyone, &ordered)
        }
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

/// Each tenant's weight and GPU-seconds over the last hour, for shares.
struct Shares {
    /// (weight, GPU-seconds in the hour, had a request in the hour).
    by_index: Vec<(f64, f64, bool)>,
    /// The weights and GPU-seconds of the tenants active in the hour.
    active: (f64, f64),
}

impl Shares {
    /// From every replica's last hour of each tenant (as published; this
    /// replica's own now).
    fn of(live: &Live, everyone: &[Subject], source: &Source) -> Self {
        let mut by_index = vec![(0.0, 0.0, false); live.usage.len()];
        let mut active = (0.0, 0.0);
        for s in everyone {
            let (mut gpu, mut requests) = (0.0, 0);
            for n in source.numbers(s.index) {
                gpu += n.gpu_seconds_1h;
                requests += n.requests_1h;
            }
            let weight = live.policy.tenants.get(s.index).map_or(1.0, |t| t.weight);
            by_index[s.index] = (weight, gpu, requests > 0);
            if requests > 0 {
                active.0 += weight;
                active.1 += gpu;
            }
        }
        Shares { by_index, active }
    }

    /// `index`'s share of the weights of the tenants active in the hour
    /// (itself counted), and of the GPU-seconds they were served.
    fn of_tenant(&self, index: usize) -> (Option<f64>, Option<f64>) {
        let (weight, gpu, was_active) = self.by_index.get(index).copied().unwrap_or_default();
        let (mut weights, mut gpus) = self.active;
        if !was_active {
            weights += weight;
            gpus += gpu;
        }
        (
            (weights > 0.0).then(|| weight / weights),
            (gpus > 0.0).then(|| gpu / gpus),
        )
    }
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
