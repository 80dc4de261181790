//! One try of a batch item through the gateway's request path, and its
//! resumption when live work preempts it mid-answer.
//!
//! An item that can resume exactly ([`resume::resumable`]) is sent
//! streamed with token ids, in the pool's resumable lane: the scheduler
//! may preempt it while it answers (within the migration threshold), and
//! the runner sends its continuation from the tokens it had, as many times
//! as it is preempted; the stitched answer is its result. A continuation
//! refused by the backend (no token-id prompts), or a stream that cannot
//! resume (no token ids, reasoning), starts the item again as it was
//! asked: a restart, counted. Any other item is sent as asked, in the
//! batch lane: preempted only before its answer starts, then sent again
//! from zero by the request path.
//!
//! A resumable item's progress is kept in the batch store at each
//! preemption and every `checkpoint_tokens` it generates, until its
//! result is recorded: a gateway killed mid-item, or the replica that
//! takes its batch over, continues it from there rather than from zero.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::Value;

use super::Batches;
use super::store::ItemResult;
use crate::gateway::request::{BatchItem, Call};
use crate::net::body::{BoxBody, RequestBody};
use crate::protocol::batch::{Item, answer_usage, output_line};
use crate::protocol::resume::{self, Ended, Kind, Progress};

/// Tries of an item that got a 5xx or no whole answer.
pub(super) const TRIES: u32 = 3;
/// The longest answer kept for one item.
const MAX_ANSWER_BYTES: usize = 64 << 20;

/// What one try of an item came to.
pub(super) enum Tried {
    Done(ItemResult),
    Again(Duration),
}

/// Whose item, where, under which id, until when.
pub(super) struct Target<'a> {
    pub batch: &'a str,
    /// The item's line in its batch's input.
    pub line: u32,
    pub owner: &'a str,
    pub endpoint: &'a str,
    pub rid: &'a str,
    pub deadline: Duration,
    /// Its batch cannot meet its window at the rate it runs: the item
    /// goes in its owner's live lane.
    pub promoted: bool,
}

/// Preemptions of items and what became of them, per tenant.
#[derive(Clone, Copy, Debug, Default)]
pub struct Resumes {
    /// Resumable items cut by a preemption.
    pub preempted: u64,
    /// Continuations sent from the tokens generated before a cut.
    pub resumed: u64,
    /// Cut items started again from zero instead.
    pub restarted: u64,
    /// Generated tokens a continuation kept (not generated again).
    pub tokens_saved: u64,
    /// Items sent again after an answer that asked for it (a 429 or 503
    /// with its `retry-after`, a 5xx, a broken answer).
    pub retried: u64,
}

/// What came back from one request.
struct Answer {
    status: StatusCode,
    retry_after: Duration,
    /// The whole body; `Err` when it broke off or was too large.
    body: Result<Vec<u8>, ()>,
}

/// One request's answer, its body not yet read.
struct Reply {
    status: StatusCode,
    retry_after: Duration,
    body: BoxBody,
}

pub(super) async fn try_item(b: &Arc<Batches>, t: &Target<'_>, item: &Item, tries: u32) -> Tried {
    let parsed = (b.limits.resume)
        .then(|| serde_json::from_slice::<Value>(&item.body).ok())
        .flatten();
    if let Some(body) = parsed
        && let Ok(kind) = resume::resumable(t.endpoint, &body)
    {
        return resumable(b, t, item, (kind, &body), tries).await;
    }
    let a = send(b, t, t.endpoint, item.body.clone(), false).await;
    judge(t, item, a, tries)
}

/// An item sent as it was asked: its answer, or a try again.
fn judge(t: &Target<'_>, item: &Item, a: Answer, tries: u32) -> Tried {
    if matches!(a.status.as_u16(), 429 | 503) {
        return Tried::Again(a.retry_after);
    }
    let again = a.status.is_server_error() || a.body.is_err();
    if again && tries < TRIES {
        return Tried::Again(Duration::from_secs(u64::from(tries)));
    }
    let body = a.body.unwrap_or_default();
    done(t, item, a.status, &body)
}

fn done(t: &Target<'_>, item: &Item, status: StatusCode, body: &[u8]) -> Tried {
    Tried::Done(ItemResult {
        ok: status.is_success(),
        line: output_line(t.rid, &item.custom_id, status.as_u16(), t.rid, body),
        usage: if status.is_success() {
            answer_usage(body)
        } else {
            (0, 0, 0, 0)
        },
    })
}

/// A resumable item: streamed, resumed after each preemption, its
/// stitched answer the result; from the progress the store keeps for it,
/// if any.
async fn resumable(
    b: &Arc<Batches>,
    t: &Target<'_>,
    item: &Item,
    (kind, body): (Kind, &Value),
    tries: u32,
) -> Tried {
    let first = Bytes::from(resume::streamed(body));
    let mut p = kept_progress(b, t).await;
    let mut next = (t.endpoint, first.clone());
    if p.generated() > 0 {
        // Cut by a kill, or run on another replica: continued.
        if p.finished() || p.at_limit(body) {
            return done(t, item, StatusCode::OK, &p.answer(kind, body));
        }
        next = after_cut(b, t, &mut p, body, &first);
    }
    loop {
        let continuing = p.generated() > 0;
        let r = request(b, t, next.0, next.1.clone(), true).await;
        if matches!(r.status.as_u16(), 429 | 503) {
            // Not admitted or not dispatched in time: the same request
            // again after its wait, the progress kept.
            tokio::time::sleep(r.retry_after).await;
            continue;
        }
        if !r.status.is_success() {
            if continuing {
                // The backend takes no token-id prompt: start again.
                b.runner.note(t, |r| r.restarted += 1);
                p.restart();
                next = (t.endpoint, first.clone());
                continue;
            }
            // Not asked to stream (or refused what Fairway added): the
            // item as it was asked decides.
            let a = send(b, t, t.endpoint, item.body.clone(), false).await;
            return judge(t, item, a, tries);
        }
        match follow(b, t, r.body, &mut p).await {
            Ended::Done => return done(t, item, StatusCode::OK, &p.answer(kind, body)),
            Ended::Broken(cause) => {
                static LOG: crate::clock::Throttled =
                    crate::clock::Throttled::new(crate::clock::REMOTE_LOG_EVERY);
                if let Some(left_out) = LOG.allow() {
                    tracing::warn!(item = t.rid, %cause, left_out, "batch item's stream broke");
                }
                if tries < TRIES {
                    // Tried again from the progress last kept.
                    return Tried::Again(Duration::from_secs(u64::from(tries)));
                }
                let body = crate::protocol::openai::stream_broken(&cause).to_string();
                return done(t, item, StatusCode::BAD_GATEWAY, body.as_bytes());
            }
            Ended::Preempted => {
                b.runner.note(t, |r| r.preempted += 1);
                if p.at_limit(body) {
                    return done(t, item, StatusCode::OK, &p.answer(kind, body));
                }
                checkpoint(b, t, &p).await;
                next = after_cut(b, t, &mut p, body, &first);
            }
        }
    }
}

/// The request after a cut (a preemption, a kill): the continuation from
/// `p`'s tokens, or, when it cannot resume, the item's `first` request
/// again from zero; counted either way.
fn after_cut<'t>(
    b: &Batches,
    t: &Target<'t>,
    p: &mut Progress,
    body: &Value,
    first: &Bytes,
) -> (&'t str, Bytes) {
    match p.continuation(body) {
        Some(c) => {
            let k = p.generated();
            b.runner.note(t, |r| {
                r.resumed += 1;
                r.tokens_saved += k;
            });
            ("/v1/completions", Bytes::from(c))
        }
        None => {
            b.runner.note(t, |r| r.restarted += 1);
            p.restart();
            (t.endpoint, first.clone())
        }
    }
}

/// Reads one attempt's stream into `p` as it comes, keeping `p` in the
/// store every `checkpoint_tokens` generated tokens: how it ended.
async fn follow(b: &Batches, t: &Target<'_>, mut body: BoxBody, p: &mut Progress) -> Ended {
    let every = b.limits.checkpoint_tokens;
    let mut kept = p.generated();
    let mut buf = Vec::new();
    let mut read = 0;
    p.begin();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Ended::Broken("the answer broke off".into());
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        read += data.len();
        if read > MAX_ANSWER_BYTES {
            return Ended::Broken("the answer is larger than the gateway keeps".into());
        }
        buf.extend_from_slice(&data);
        match p.feed(&buf) {
            Ok(n) => drop(buf.drain(..n)),
            Err(ended) => return ended,
        }
        if every > 0 && p.generated() >= kept + every && !p.finished() {
            kept = p.generated();
            checkpoint(b, t, p).await;
        }
    }
    p.end(&buf)
}

/// The progress the store keeps for the item (a gateway before this one,
/// or another replica, ran it); none when it keeps none or cannot say.
async fn kept_progress(b: &Batches, t: &Target<'_>) -> Progress {
    let kept = match b.store.progress(t.batch, t.line).await {
        Ok(kept) => kept,
        Err(e) => {
            b.runner.store_failed(&e);
            None
        }
    };
    kept.and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// Keeps `p` in the store as the item's progress (a failure is counted
/// with the store's others: the item goes on, and a kill would cost it
/// more tokens).
async fn checkpoint(b: &Batches, t: &Target<'_>, p: &Progress) {
    let Ok(bytes) = serde_json::to_vec(p) else {
        return;
    };
    if let Err(e) = b.store.save_progress(t.batch, t.line, bytes).await {
        b.runner.store_failed(&e);
    }
}

/// The request path's route for a batch endpoint.
fn call_of(endpoint: &str) -> Call {
    match endpoint {
        "/v1/responses" => Call::Responses,
        "/v1/embeddings" => Call::Pooling,
        "/v1/messages" => Call::Messages,
        _ => Call::Completions,
    }
}

/// Sends `body` to `path` as the item's request and reads the answer.
async fn send(
    b: &Arc<Batches>,
    t: &Target<'_>,
    path: &str,
    body: Bytes,
    resumable: bool,
) -> Answer {
    let r = request(b, t, path, body, resumable).await;
    Answer {
        status: r.status,
        retry_after: r.retry_after,
        body: read_answer(r.body).await,
    }
}

/// `body` with vLLM's `priority` set to `priority` (`[batch]
/// engine_priority`), over any the item names, on the chat and
/// completions calls; as it is with 0, on other calls, or when it is not
/// a JSON object.
fn with_priority(body: Bytes, path: &str, priority: u64) -> Bytes {
    if priority == 0 || !matches!(path, "/v1/chat/completions" | "/v1/completions") {
        return body;
    }
    let Ok(mut v) = serde_json::from_slice::<Value>(&body) else {
        return body;
    };
    let Some(o) = v.as_object_mut() else {
        return body;
    };
    o.insert("priority".to_owned(), priority.into());
    serde_json::to_vec(&v).map_or(body, Bytes::from)
}

/// Sends `body` to `path` as the item's request.
async fn request(
    b: &Arc<Batches>,
    t: &Target<'_>,
    path: &str,
    body: Bytes,
    resumable: bool,
) -> Reply {
    let body = with_priority(body, path, b.limits.engine_priority);
    let mut req = Request::new(RequestBody::local(body));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = http::Uri::from_maybe_shared(Bytes::from(path.to_owned())).unwrap_or_default();
    let h = req.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    if let Ok(v) = http::HeaderValue::from_str(t.rid) {
        h.insert("x-request-id", v);
    }
    req.extensions_mut().insert(BatchItem {
        tenant: t.owner.to_owned(),
        deadline: t.deadline,
        resumable,
        promoted: t.promoted,
    });
    let resp = crate::gateway::request::handle(b.gw.clone(), req, call_of(path)).await;
    let status = resp.status();
    let retry_after = resp
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .map_or(Duration::from_secs(1), |s| {
            Duration::from_secs(s.clamp(1, 60))
        });
    Reply {
        status,
        retry_after,
        body: resp.into_body(),
    }
}

/// An answer's body, whole and within [`MAX_ANSWER_BYTES`]; `Err` when
/// it broke off or is larger.
async fn read_answer(mut body: BoxBody) -> Result<Vec<u8>, ()> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(drop)?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > MAX_ANSWER_BYTES {
                return Err(());
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_priority_is_set_on_chat_and_completions_items_only() {
        let body = Bytes::from_static(br#"{"model":"m","priority":-5,"messages":[]}"#);
        let out = with_priority(body.clone(), "/v1/chat/completions", 3);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["priority"], 3);
        assert_eq!(v["model"], "m");
        assert_eq!(with_priority(body.clone(), "/v1/chat/completions", 0), body);
        assert_eq!(with_priority(body.clone(), "/v1/embeddings", 3), body);
        let not_json = Bytes::from_static(b"[1");
        assert_eq!(
            with_priority(not_json.clone(), "/v1/completions", 3),
            not_json
        );
    }
}
