//! Forward: wait for the scheduler's dispatch, send the request to the
//! backend it picked, and judge what comes back. A connection that fails
//! before the request was written is retried once, on another backend (the
//! failed one is ejected, and the request goes back to the head of its
//! queue: nothing reached a backend or the client, so this is safe for
//! streaming requests too). A preemptible (batch) request may be preempted
//! until its response starts; it then waits for its next dispatch.

use std::sync::Arc;

use bytes::Bytes;
use http::Response;

use crate::core::ids::BackendId;
use crate::core::scheduler::Decision;
use crate::fault::Chain;
use crate::gateway::connections;
use crate::gateway::live_policy::Live;
use crate::gateway::scheduling::Pending;
use crate::gateway::state::Gateway;
use crate::gateway::ticket::{Ticket, backend_fault};
use crate::gateway::triton_stop::StopCall;
use crate::gateway::upstream::{self, Address};
use crate::protocol::audio;
use crate::protocol::error::ApiError;
use crate::protocol::triton::ModelPath;

/// A request's body: read whole, or an upload streamed as it arrives.
pub enum Payload {
    Whole(Bytes),
    Upload(audio::Upload),
}

impl Payload {
    /// The body for one attempt to send the request.
    fn to_send(&self) -> upstream::UpBody {
        match self {
            Payload::Whole(b) => upstream::whole(b.clone()),
            Payload::Upload(u) => http_body_util::Either::Right(u.resend()),
        }
    }
}

/// What is sent, on every attempt.
pub struct Outgoing<'a> {
    /// The client request's head.
    pub parts: &'a http::request::Parts,
    /// Its path (a Triton call's is rewritten per backend).
    pub path: &'a str,
    pub triton: Option<&'a ModelPath<'a>>,
    pub payload: Payload,
    /// The model the client named.
    pub model: &'a str,
    /// The pool's index in the policy.
    pub pool_index: usize,
}

/// Sends the request as the scheduler dispatches it, until a backend
/// answers (any status) or it fails for good; returns the answer and the
/// request's channel of decisions.
pub async fn forward(
    gw: &Arc<Gateway>,
    live: &Live,
    out: Outgoing<'_>,
    mut pending: Pending,
    preemptible: bool,
    ticket: &mut Ticket,
) -> Result<(Response<connections::Body>, Pending), ApiError> {
    let server = &live.policy.server;
    let pool_policy = &live.policy.pools[out.pool_index];
    // An upload's backend answers once it has the whole body, which the
    // client has `body_read_timeout` to send.
    let allowed = match &out.payload {
        Payload::Upload(_) => pool_policy.timeout + server.body_read_timeout,
        Payload::Whole(_) => pool_policy.timeout,
    };
    let mut retried = false;
    loop {
        let backend = await_dispatch(gw, ticket, &mut pending).await?;
        ticket.dispatched(gw.now());
        if preemptible
            && matches!(out.payload, Payload::Upload(_))
            && let Some(id) = ticket.id()
            && !gw.sched().response_started(id, &mut pending)
        {
            // An upload cannot be sent twice, so it is never preempted
            // once sent; this one was preempted just before.
            ticket.preempted();
            continue;
        }
        let (up, address) = prepare(gw, live, &out, backend, ticket)?;
        let sent = tokio::time::timeout(allowed, connections::send(&address.authority, up));
        let result = if preemptible {
            // Batch work: until its response starts, the scheduler may
            // take its slot back. Dropping the upstream call closes the
            // connection, which aborts the request in the engine.
            tokio::select! {
                r = sent => Some(r),
                () = preempted(&mut pending) => None,
            }
        } else {
            Some(sent.await)
        };
        if let Payload::Upload(u) = &out.payload {
            ticket.body_was_read(u.finished());
            // The client's fault, not the backend's.
            if !matches!(result, Some(Ok(Ok(_))))
                && let Some(e) = u.failure(server.max_upload_bytes)
            {
                return Err(e);
            }
        }
        let Some(result) = result else {
            tracing::info!(backend = %ticket.backend_name(), "preempted; queued again");
            ticket.preempted();
            continue;
        };
        // A failure while the client was still uploading may be the
        // client's: it is not held against the backend (a refused
        // connection still is).
        let uploading = matches!(&out.payload, Payload::Upload(u) if u.unfinished())
            && !matches!(&result, Ok(Err(e)) if e.is_connect());
        if !uploading
            && !result
                .as_ref()
                .is_ok_and(|r| r.as_ref().is_ok_and(|r| !backend_fault(r.status())))
        {
            gw.backend_failed(backend);
        }
        match result {
            Err(_) => {
                return Err(ApiError::UpstreamTimeout {
                    backend: ticket.backend_name().to_string(),
                    timeout: allowed,
                });
            }
            Ok(Err(cause)) => {
                if !cause.retryable() {
                    return Err(ApiError::Upstream {
                        backend: ticket.backend_name().to_string(),
                        cause,
                    });
                }
                static LOG: crate::clock::Throttled =
                    crate::clock::Throttled::new(crate::clock::REMOTE_LOG_EVERY);
                if let Some(left_out) = LOG.allow() {
                    tracing::warn!(backend = %ticket.backend_name(), cause = %Chain(&cause), retried, left_out, "connection to backend failed; ejecting it");
                }
                let Some(id) = ticket.id() else {
                    return Err(ApiError::Internal("request left the scheduler".into()));
                };
                let requeued = gw
                    .sched()
                    .requeue(gw.now(), id, backend, retried, preemptible);
                let Some(requeued) = requeued else {
                    // Retried already, or no other healthy backend.
                    return Err(ApiError::Upstream {
                        backend: ticket.backend_name().to_string(),
                        cause,
                    });
                };
                retried = true;
                pending = requeued;
            }
            Ok(Ok(r)) => {
                if preemptible
                    && let Some(id) = ticket.id()
                    && !gw.sched().response_started(id, &mut pending)
                {
                    // Preempted just before its response started: drop
                    // the response and wait for the next dispatch.
                    ticket.preempted();
                    continue;
                }
                // A resumable item's preemptions still come here.
                return Ok((r, pending));
            }
        }
    }
}

/// The backend request for one attempt on `backend`, and where it goes;
/// the ticket notes the send.
fn prepare(
    gw: &Gateway,
    live: &Live,
    out: &Outgoing<'_>,
    backend: BackendId,
    ticket: &mut Ticket,
) -> Result<(http::Request<upstream::UpBody>, Address), ApiError> {
    let address = live.addresses.get(&backend).cloned().or_else(|| {
        // A backend added by a reload after this request took its policy.
        gw.live().addresses.get(&backend).cloned()
    });
    let Some(address) = address else {
        return Err(ApiError::NoBackend(out.model.to_owned()));
    };
    let up_path = match out.triton {
        // The backend may know the model by another name.
        Some(p) => p.upstream(
            live.served_models
                .get(&backend)
                .map_or(p.model, String::as_str),
        ),
        None => out.path.to_owned(),
    };
    let mut up = upstream::request(
        &live.policy.server,
        out.parts,
        &up_path,
        &address,
        out.payload.to_send(),
    )?;
    if let Some(p) = out.triton
        && p.action != "infer"
        && let Some(id) = out.parts.headers.get("triton-request-id")
    {
        ticket.stop_with(StopCall {
            address: address.clone(),
            path: up_path.clone(),
            request_id: id.clone(),
        });
    }
    let name = match live.backend_names.get(&backend) {
        Some(name) => name.clone(),
        // A backend added by a reload after this request took its policy.
        None => Arc::from(gw.sched().backend_name(backend)),
    };
    ticket.sent(gw.now(), backend, name, up.headers_mut());
    Ok((up, address))
}

/// Waits for the scheduler to dispatch (or shed) the ticket's request.
async fn await_dispatch(
    gw: &Arc<Gateway>,
    ticket: &mut Ticket,
    pending: &mut Pending,
) -> Result<BackendId, ApiError> {
    if pending.is_waiting() {
        // The deadline task re-reads the earliest deadline.
        gw.wake();
    }
    loop {
        match pending.next().await {
            Some(Decision::Dispatch { backend, .. }) => return Ok(backend),
            Some(Decision::Shed { retry_after, .. }) => {
                ticket.shed();
                return Err(ApiError::Shed { retry_after });
            }
            // Already acted on: the response it was for was dropped.
            Some(Decision::Preempt { .. }) => {}
            None => {
                return Err(ApiError::Internal(
                    "scheduler dropped a queued request".into(),
                ));
            }
        }
    }
}

/// Resolves when the scheduler preempts the in-flight request.
async fn preempted(pending: &mut Pending) {
    std::future::poll_fn(|cx| pending.poll_preempted(cx)).await;
}
