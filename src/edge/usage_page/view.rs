//! The operator's view of every tenant: a page at a time, in the order
//! asked for.

use crate::gateway::live_policy::Live;
use crate::protocol::error::ApiError;

use crate::gateway::usage_share::Everyone;

use super::Subject;

/// How the operator's view of every tenant is ordered.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Sort {
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
    pub(super) fn as_str(self) -> &'static str {
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
pub(super) struct Page {
    pub(super) sort: Sort,
    pub(super) limit: usize,
    pub(super) offset: usize,
}

/// Tenants in a page of the operator's view, unless asked for fewer, and
/// at most.
const PAGE_SIZE: usize = 100;
const MAX_PAGE: usize = 1000;

impl Page {
    pub(super) fn parse(query: Option<&str>) -> Result<Page, ApiError> {
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
    pub(super) fn select(&self, live: &Live, everyone: &[Subject], all: &Everyone) -> Vec<Subject> {
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
                for n in all.numbers.get(s.index).into_iter().flatten() {
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
