//! The one edge error type: every failure that becomes a response is an
//! [`ApiError`], and one exhaustive `match` gives its status, OpenAI `type`
//! and `code`, the outcome it is counted under, whose fault it is and
//! whether trying again can help. A new variant cannot compile without
//! those choices.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode};

use crate::core::admission::{LimitKind, RateLimits, Refusal};
use crate::fault::{Blame, Chain};
use crate::net::body::{self, BoxBody};
use crate::outcome::{Outcome, RefusedBy};
use crate::protocol::upstream::UpstreamError;

/// A failure that becomes an OpenAI-style error response. Its message is
/// the client's, whole: an upstream failure's reads its cause's sources
/// already, so log it with `%`, not [`Chain`].
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    Auth(&'static str),
    #[error("The model `{0}` does not exist.")]
    UnknownModel(String),
    /// The model exists, but no backend of it speaks the call's protocol.
    #[error("The model `{0}` is not served over the {1} API here.")]
    NotServedOver(String, crate::core::spec::Api),
    #[error("Request body exceeds the limit of {0} bytes.")]
    BodyTooLarge(usize),
    #[error("The request body did not arrive within {0:?}.")]
    BodyTimeout(Duration),
    #[error("The client closed the connection before sending the whole body.")]
    ClientGone,
    #[error("Rate limit exceeded for tenant `{tenant}`: {}", refusal_text(.refusal))]
    Refused { tenant: String, refusal: Refusal },
    #[error("The request could not be scheduled before its deadline; the cluster is overloaded.")]
    Shed { retry_after: Duration },
    #[error("No healthy backend serves model `{0}`.")]
    NoBackend(String),
    /// A backend could not be reached, or broke off before its answer.
    #[error("Backend `{backend}` failed: {}", Chain(.cause))]
    Upstream {
        backend: String,
        #[source]
        cause: UpstreamError,
    },
    #[error("Backend `{backend}` sent no response headers within {timeout:?}.")]
    UpstreamTimeout { backend: String, timeout: Duration },
    #[error("The gateway is shutting down.")]
    Draining,
    #[error("The gateway is at its limit of {0} requests in flight; retry shortly.")]
    Overloaded(usize),
    /// The uploads spooled to disk (audio forms with their file before
    /// `model`) are at their budget, in bytes.
    #[error(
        "The gateway's space for uploads read ahead of their `model` field ({0} bytes) is in use; retry shortly, or put `model` before the file in the form."
    )]
    SpoolFull(u64),
    #[error("Not found.")]
    NotFound,
    /// A stored response this gateway did not create for the caller, or
    /// no longer remembers.
    #[error(
        "No response with id `{0}` was created for this API key through this gateway in the last hour."
    )]
    UnknownResponse(String),
    #[error(
        "The gateway cannot reach its cluster store to enforce tenant `{0}`'s limits; retry shortly."
    )]
    StoreUnavailable(String, Duration),
    #[error("Internal error: {0}")]
    Internal(String),
}

/// One row of [`ApiError`]'s table.
struct Parts {
    status: StatusCode,
    /// OpenAI's `type`.
    kind: &'static str,
    code: Option<&'static str>,
    outcome: Outcome,
    blame: Blame,
    retry: bool,
}

fn refusal_text(r: &Refusal) -> String {
    match r.limit {
        LimitKind::Concurrency => "too many concurrent requests (max_concurrency)".into(),
        LimitKind::Rate => "request rate limit reached (rate / burst)".into(),
        LimitKind::GpuSeconds => "GPU-seconds budget spent (gpu_seconds_per_hour)".into(),
        LimitKind::QueueFull => "tenant queue is full (max_queued_per_tenant)".into(),
        LimitKind::Slo => format!(
            "predicted to miss the tenant's time-to-first-token SLO: the tenant is over its \
             share of a busy pool; retry after {} s",
            r.retry_after.as_secs()
        ),
    }
}

impl ApiError {
    /// Status, OpenAI `type`, `code`, outcome, whose fault, and whether
    /// the client trying again (after `retry-after`, when given) can
    /// succeed: the one exhaustive table.
    fn parts(&self) -> Parts {
        use Blame::{Backend, Client, Gateway};
        use Outcome as O;
        use RefusedBy as R;
        let (status, kind, code, outcome, blame, retry) = match self {
            ApiError::InvalidRequest(_) => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                None,
                O::Refused(R::InvalidRequest),
                Client,
                false,
            ),
            ApiError::Auth(_) => (
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                Some("invalid_api_key"),
                O::Refused(R::Auth),
                Client,
                false,
            ),
            ApiError::UnknownModel(_) | ApiError::NotServedOver(..) => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("model_not_found"),
                O::Refused(R::UnknownModel),
                Client,
                false,
            ),
            ApiError::BodyTooLarge(_) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                None,
                O::Refused(R::BodyTooLarge),
                Client,
                false,
            ),
            ApiError::BodyTimeout(_) => (
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                Some("request_timeout"),
                O::Refused(R::BodyTimeout),
                Client,
                true,
            ),
            // Nobody reads this answer; the outcome is what counts.
            ApiError::ClientGone => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                None,
                O::Cancelled,
                Client,
                false,
            ),
            ApiError::Refused { refusal, .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "requests",
                Some("rate_limit_exceeded"),
                O::Refused(R::Limit(refusal.limit)),
                Client,
                true,
            ),
            ApiError::Shed { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("overloaded"),
                O::Shed,
                Gateway,
                true,
            ),
            ApiError::NoBackend(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("no_healthy_backend"),
                O::FailedUpstream,
                Backend,
                true,
            ),
            ApiError::Upstream { cause, .. } => (
                StatusCode::BAD_GATEWAY,
                "server_error",
                None,
                O::FailedUpstream,
                cause.blame(),
                true,
            ),
            ApiError::UpstreamTimeout { .. } => (
                StatusCode::GATEWAY_TIMEOUT,
                "server_error",
                None,
                O::FailedUpstream,
                Backend,
                true,
            ),
            ApiError::Draining => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                None,
                O::Shed,
                Gateway,
                true,
            ),
            ApiError::Overloaded(_) | ApiError::SpoolFull(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("overloaded"),
                O::Shed,
                Gateway,
                true,
            ),
            ApiError::StoreUnavailable(..) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("store_unavailable"),
                O::Refused(R::StoreUnavailable),
                Gateway,
                true,
            ),
            ApiError::NotFound => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                None,
                O::Refused(R::InvalidRequest),
                Client,
                false,
            ),
            ApiError::UnknownResponse(_) => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("response_not_found"),
                O::Refused(R::InvalidRequest),
                Client,
                false,
            ),
            ApiError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                None,
                O::Error,
                Gateway,
                false,
            ),
        };
        Parts {
            status,
            kind,
            code,
            outcome,
            blame,
            retry,
        }
    }

    /// The outcome this error is counted under.
    pub fn outcome(&self) -> Outcome {
        self.parts().outcome
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.parts().status
    }

    /// Whose fault it is; the level it is logged at follows from it
    /// ([`Blame::level`]).
    pub fn blame(&self) -> Blame {
        self.parts().blame
    }

    /// Whether the client sending the same request again (after
    /// `retry-after`, when the answer has one) can succeed.
    pub fn retryable(&self) -> bool {
        self.parts().retry
    }

    /// The error in the shape of the route `path` belongs to, for a
    /// refusal made before the route is known (at the edge): Anthropic's
    /// on `/v1/messages`, Triton's on its `/v2/models` and `/v2/health`
    /// routes, OpenAI's elsewhere.
    pub fn into_response_for(self, path: &str) -> Response<BoxBody> {
        if path.starts_with("/v1/messages") {
            self.into_anthropic_response()
        } else if path.starts_with("/v2/models") || path.starts_with("/v2/health") {
            self.into_triton_response()
        } else {
            self.into_response()
        }
    }

    /// The response: OpenAI error body plus `retry-after` / `x-ratelimit-*`.
    pub fn into_response(self) -> Response<BoxBody> {
        let Parts {
            status, kind, code, ..
        } = self.parts();
        let param = match &self {
            ApiError::UnknownModel(_) => Some("model"),
            _ => None,
        };
        let body = serde_json::json!({
            "error": { "message": self.to_string(), "type": kind, "param": param, "code": code }
        });
        let mut resp = Response::new(body::full(Bytes::from(body.to_string())));
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let retry_after = match &self {
            ApiError::Refused { refusal, .. } => Some(refusal.retry_after),
            ApiError::Shed { retry_after } => Some(*retry_after),
            ApiError::StoreUnavailable(_, retry_after) => Some(*retry_after),
            ApiError::Draining
            | ApiError::NoBackend(_)
            | ApiError::Overloaded(_)
            | ApiError::SpoolFull(_) => Some(Duration::from_secs(1)),
            _ => None,
        };
        if let Some(d) = retry_after {
            // Whole seconds, rounded up, at least 1 (clients sleep then retry).
            let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
            h.insert(http::header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
            h.insert(
                RETRY_AFTER_MS,
                HeaderValue::from(d.as_millis().max(1) as u64),
            );
        }
        if let ApiError::Refused { refusal, .. } = &self {
            rate_limit_headers(h, &refusal.limits);
            if refusal.limit == LimitKind::GpuSeconds {
                h.insert(SHOULD_RETRY, HeaderValue::from_static("true"));
            }
        }
        resp
    }
}

/// Marks an answer given before the request body was read as the
/// connection's last (HTTP/1.x): hyper closes a connection whose request
/// body was left unread, and without this header a keep-alive client would
/// send its next request into a closed socket. (HTTP/2 resets only the
/// stream; it needs nothing.)
pub fn close_if_body_unread(resp: &mut Response<BoxBody>, version: http::Version, unread: bool) {
    if unread && version <= http::Version::HTTP_11 {
        resp.headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
}

/// The `x-ratelimit-*` headers of a tenant's buckets, on every answer to
/// it (success or refusal): `-requests` for its request rate (whole
/// requests, the OpenAI convention) and `-gpu-seconds` for its
/// GPU-seconds budget. The latter are not OpenAI's `-tokens`: Fairway has
/// no token budget, and a client pacing itself by tokens would read
/// GPU-seconds as tokens.
///
/// Most answers carry them, so they cost no more than they must: the names
/// are constants (a name given as a string is parsed, and a custom one
/// copied, at every insert), the values are formatted on the stack, and a
/// value equal to the one this thread last gave the same header (a limit
/// always, a reset often) is that value again, with no formatting and no
/// allocation.
pub fn rate_limit_headers(h: &mut http::HeaderMap, limits: &RateLimits) {
    // Room for them and the `x-request-id` the edge adds after, at once:
    // a map grown one header at a time reallocates and rehashes at each
    // doubling.
    let buckets =
        usize::from(limits.requests.is_some()) + usize::from(limits.gpu_seconds.is_some());
    if buckets > 0 {
        h.reserve(3 * buckets + 1);
    }
    LAST_VALUES.with_borrow_mut(|last| {
        let mut set = |slot: Slot, key: u64, make: &dyn Fn() -> Option<HeaderValue>| {
            let cached = &mut last[slot as usize];
            let value = match cached {
                Some((k, v)) if *k == key => Some(v.clone()),
                _ => make().inspect(|v| *cached = Some((key, v.clone()))),
            };
            if let Some(v) = value {
                h.insert(slot.name(), v);
            }
        };
        if let Some(b) = &limits.requests {
            let (limit, remaining) = (b.limit as u64, b.remaining.floor() as u64);
            set(Slot::LimitRequests, limit, &|| Some(limit.into()));
            set(Slot::RemainingRequests, remaining, &|| {
                Some(remaining.into())
            });
            let reset = Reset::of(b.reset);
            set(Slot::ResetRequests, reset.key(), &|| reset.value());
        }
        if let Some(b) = &limits.gpu_seconds {
            let (limit, remaining) = (b.limit, b.remaining);
            set(Slot::LimitGpuSeconds, limit.to_bits(), &|| {
                amount_value(limit)
            });
            set(Slot::RemainingGpuSeconds, remaining.to_bits(), &|| {
                amount_value(remaining)
            });
            let reset = Reset::of(b.reset);
            set(Slot::ResetGpuSeconds, reset.key(), &|| reset.value());
        }
    });
}

/// The headers [`rate_limit_headers`] remembers a value of.
#[derive(Clone, Copy)]
enum Slot {
    LimitRequests,
    RemainingRequests,
    ResetRequests,
    LimitGpuSeconds,
    RemainingGpuSeconds,
    ResetGpuSeconds,
}

impl Slot {
    fn name(self) -> HeaderName {
        match self {
            Slot::LimitRequests => LIMIT_REQUESTS,
            Slot::RemainingRequests => REMAINING_REQUESTS,
            Slot::ResetRequests => RESET_REQUESTS,
            Slot::LimitGpuSeconds => LIMIT_GPU_SECONDS,
            Slot::RemainingGpuSeconds => REMAINING_GPU_SECONDS,
            Slot::ResetGpuSeconds => RESET_GPU_SECONDS,
        }
    }
}

thread_local! {
    /// Each header's last value on this thread, with the number it was
    /// made from.
    static LAST_VALUES: std::cell::RefCell<[Option<(u64, HeaderValue)>; 6]> =
        const { std::cell::RefCell::new([const { None }; 6]) };
}

const RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");
const SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");
const LIMIT_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-limit-requests");
const REMAINING_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-remaining-requests");
const RESET_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-reset-requests");
const LIMIT_GPU_SECONDS: HeaderName = HeaderName::from_static("x-ratelimit-limit-gpu-seconds");
const REMAINING_GPU_SECONDS: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining-gpu-seconds");
const RESET_GPU_SECONDS: HeaderName = HeaderName::from_static("x-ratelimit-reset-gpu-seconds");

/// A header value formatted on the stack (at most 48 bytes), then cut to
/// what `cut` keeps of it.
fn header_value(args: std::fmt::Arguments<'_>, cut: fn(&[u8]) -> &[u8]) -> Option<HeaderValue> {
    let mut buf = [0u8; 48];
    let mut rest = &mut buf[..];
    std::io::Write::write_fmt(&mut rest, args).ok()?;
    let len = 48 - rest.len();
    HeaderValue::from_bytes(cut(&buf[..len])).ok()
}

/// A non-negative amount with at most three decimals, trailing zeros cut.
/// (In whole thousandths: formatting a float to three decimals exactly
/// costs more than the rest of these headers together.)
fn amount_value(x: f64) -> Option<HeaderValue> {
    let milli = (x.max(0.0) * 1000.0).round();
    if milli >= 1e18 {
        return HeaderValue::from_str(&format!("{:.0}", x)).ok();
    }
    let milli = milli as u64;
    let (whole, frac) = (milli / 1000, milli % 1000);
    if frac == 0 {
        return Some(HeaderValue::from(whole));
    }
    // `frac` is not 0: cutting the trailing zeros stops after the point.
    header_value(format_args!("{whole}.{frac:03}"), |s| {
        let end = s.iter().rposition(|&b| b != b'0').map_or(0, |i| i + 1);
        &s[..end]
    })
}

/// A time to reset as OpenAI's headers give it: `20ms` under a second
/// (at least `1ms`), else whole seconds rounded up, `2s` or `6m0s`.
#[derive(Clone, Copy)]
enum Reset {
    Millis(u64),
    /// Under a minute.
    Secs(u64),
    /// A minute or more.
    Minutes(u64),
}

impl Reset {
    fn of(d: Duration) -> Reset {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        if ms < 1000 {
            Reset::Millis(ms.max(1))
        } else if ms < 60_000 {
            Reset::Secs(ms.div_ceil(1000))
        } else {
            Reset::Minutes(ms.div_ceil(1000))
        }
    }

    /// A number that two resets share only when they are written alike.
    fn key(self) -> u64 {
        match self {
            Reset::Millis(ms) => ms,
            Reset::Secs(s) => s.saturating_mul(1000),
            Reset::Minutes(s) => s.saturating_mul(1000).saturating_add(1),
        }
    }

    fn value(self) -> Option<HeaderValue> {
        let whole: fn(&[u8]) -> &[u8] = |s| s;
        match self {
            Reset::Millis(ms) => header_value(format_args!("{ms}ms"), whole),
            Reset::Secs(s) => header_value(format_args!("{s}s"), whole),
            Reset::Minutes(s) => header_value(format_args!("{}m{}s", s / 60, s % 60), whole),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_format_matches_openai() {
        let reset = |d| Reset::of(d).value().unwrap();
        assert_eq!(reset(Duration::from_millis(0)), "1ms");
        assert_eq!(reset(Duration::from_millis(20)), "20ms");
        assert_eq!(reset(Duration::from_millis(1500)), "2s");
        assert_eq!(reset(Duration::from_secs(360)), "6m0s");
        assert_eq!(reset(Duration::from_millis(59_500)), "60s");
        assert_eq!(reset(Duration::from_millis(60_000)), "1m0s");
    }

    #[test]
    fn remembered_values_are_given_only_to_equal_numbers() {
        use crate::core::admission::BucketState;
        let limits = |limit: f64, remaining: f64, reset_ms: u64| {
            let b = BucketState {
                limit,
                remaining,
                reset: Duration::from_millis(reset_ms),
            };
            RateLimits {
                requests: Some(b),
                gpu_seconds: Some(b),
            }
        };
        let headers = |l: &RateLimits| {
            let mut h = http::HeaderMap::new();
            rate_limit_headers(&mut h, l);
            let mut v: Vec<_> = h
                .iter()
                .map(|(k, v)| format!("{k}={}", v.to_str().unwrap()))
                .collect();
            v.sort();
            v.join(" ")
        };
        let a = limits(100.0, 99.5, 20);
        let b = limits(3600.0, 12.25, 59_500);
        let c = limits(3600.0, 12.25, 60_000);
        let expect_a = "x-ratelimit-limit-gpu-seconds=100 x-ratelimit-limit-requests=100 \
            x-ratelimit-remaining-gpu-seconds=99.5 x-ratelimit-remaining-requests=99 \
            x-ratelimit-reset-gpu-seconds=20ms x-ratelimit-reset-requests=20ms";
        let expect_b = "x-ratelimit-limit-gpu-seconds=3600 x-ratelimit-limit-requests=3600 \
            x-ratelimit-remaining-gpu-seconds=12.25 x-ratelimit-remaining-requests=12 \
            x-ratelimit-reset-gpu-seconds=60s x-ratelimit-reset-requests=60s";
        let normal = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        for _ in 0..2 {
            assert_eq!(headers(&a), normal(expect_a));
            assert_eq!(headers(&b), normal(expect_b));
            assert_eq!(headers(&c), normal(&expect_b.replace("=60s", "=1m0s")));
        }
    }

    #[test]
    fn amounts_have_at_most_three_decimals_and_no_trailing_zeros() {
        let amount = |x| amount_value(x).unwrap();
        assert_eq!(amount(3600.0), "3600");
        assert_eq!(amount(100.0), "100");
        assert_eq!(amount(0.0), "0");
        assert_eq!(amount(-2.0), "0");
        assert_eq!(amount(12.5), "12.5");
        assert_eq!(amount(0.1234), "0.123");
        assert_eq!(amount(1e9), "1000000000");
        assert_eq!(amount(0.0005), "0.001");
        assert_eq!(amount(2.1), "2.1");
        assert_eq!(amount(1e30), "1000000000000000019884624838656");
    }

    #[test]
    fn every_outcome_has_its_own_index() {
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(o.index(), i, "{o:?}");
        }
        for l in LimitKind::ALL {
            let o = Outcome::Refused(RefusedBy::Limit(l));
            assert_eq!(Outcome::ALL[o.index()], o);
        }
    }
}
