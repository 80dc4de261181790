//! `/v1/audio/transcriptions` and `/v1/audio/translations`: multipart
//! uploads, streamed to the backend rather than buffered whole.
//!
//! The gateway reads the form only as far as it must: to its `model` field
//! (needed to route) and the first bytes of the file (a WAV header gives
//! the exact duration). What it read is held in memory while it is under
//! [`HEAD_IN_MEMORY`]; past that all of it moves to an unnamed temporary
//! file (a form whose file comes before `model`, as `curl -F file=@… -F
//! model=…` sends it), within [`SPOOL_BUDGET`] for the whole process.
//! Then the backend gets those bytes followed by the rest of the client's
//! body as it arrives. A form with `model` first, as the official Python
//! SDK sends it, costs a few hundred bytes of memory whatever the file's
//! size.
//!
//! The rest of the form is still read as it passes: a second `model`
//! field with another value fails the upload (400), since the backend
//! would serve the last one and the gateway admitted the first. The head
//! must arrive within `[server] body_read_timeout`, and the rest within as
//! long again once it is being sent (the client cannot send it while the
//! request is queued); else 408. A failure while the client is still
//! sending is not held against the backend.
//!
//! The cost is the audio's duration in encoder positions: Whisper's
//! encoder turns 30 s into 1,500, so [`TOKENS_PER_SECOND`] = 50. The
//! duration comes from the WAV header when there is one, else from the
//! file's size at [`ASSUMED_BYTES_PER_SECOND`] (128 kbit/s, a common MP3
//! and M4A rate), else (a chunked body with `model` first: the size is
//! unknown) [`UNKNOWN_SECONDS`]. The response's `usage.seconds` (vLLM
//! reports the duration) settles it.
//!
//! The form itself is read by `multipart`.

mod multipart;

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures_util::Stream;
use http::{Request, header};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::io::{AsyncSeekExt, AsyncWriteExt};
use tokio_util::io::ReaderStream;

pub use self::multipart::{Form, FormError, boundary};
use crate::net::body::{BodyError, RequestBody};
use crate::protocol::error::ApiError;

/// Encoder positions per second of audio (Whisper: 1,500 per 30 s).
pub const TOKENS_PER_SECOND: f64 = 50.0;
/// The rate assumed for a compressed file: 128 kbit/s.
const ASSUMED_BYTES_PER_SECOND: u64 = 16_000;
/// The duration assumed when the file's size is not known before it is
/// sent: one Whisper window.
const UNKNOWN_SECONDS: f64 = 30.0;
/// Bytes read before routing that stay in memory; beyond this they go to a
/// temporary file.
const HEAD_IN_MEMORY: usize = 256 << 10;
/// Bytes spooled to disk at once, over every upload in the process;
/// beyond it a file-first form is refused with 503.
pub const SPOOL_BUDGET: u64 = 1 << 30;

/// Bytes spooled now (see [`SPOOL_BUDGET`]).
static SPOOLED: AtomicU64 = AtomicU64::new(0);

/// What the gateway read of an audio form.
#[derive(Debug, Default)]
pub struct AudioInfo {
    pub model: String,
    /// The form's `stream` field is true.
    pub stream: bool,
    /// The estimated cost, in encoder positions.
    pub prompt_tokens: u32,
}

/// The routes whose bodies are uploads.
pub fn is_upload_route(path: &str) -> bool {
    matches!(path, "/v1/audio/transcriptions" | "/v1/audio/translations")
}

/// Reads an audio request's form as far as routing needs (see the module
/// docs), within `timeout`. Returns what it read and the body to send.
pub async fn read_head(
    req: Request<RequestBody>,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<(http::request::Parts, AudioInfo, Upload), ApiError> {
    let (parts, mut body) = req.into_parts();
    let boundary = boundary(&parts.headers).ok_or_else(|| {
        ApiError::InvalidRequest(
            "An audio request must be multipart/form-data with a boundary".into(),
        )
    })?;
    let mut form = Form::new(boundary);
    let mut head = Head::default();
    let read = async {
        while !form.has_enough() {
            match body.frame().await {
                None => break,
                Some(Err(e)) => return Err(crate::protocol::read::read_error(&e, limit)),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        form.feed(&data)
                            .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
                        head.hold(data).await?;
                    }
                }
            }
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, read).await {
        Err(_) => return Err(ApiError::BodyTimeout(timeout)),
        Ok(r) => r?,
    }
    let Some(model) = form.model.clone().filter(|m| !m.is_empty()) else {
        return Err(ApiError::InvalidRequest(
            "The form field `model` is required".into(),
        ));
    };
    let content_length = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let seconds = form.seconds(content_length);
    let info = AudioInfo {
        model,
        stream: form.stream,
        prompt_tokens: (seconds * TOKENS_PER_SECOND)
            .ceil()
            .clamp(1.0, f64::from(u32::MAX)) as u32,
    };
    let source = head.into_source(body).await?;
    let upload = Upload::new(source, form, timeout);
    Ok((parts, info, upload))
}

/// The bytes read before routing: in memory, then in a temporary file.
#[derive(Default)]
struct Head {
    held: VecDeque<Bytes>,
    held_bytes: usize,
    spool: Option<tokio::fs::File>,
    permit: SpoolPermit,
}

/// Bytes of [`SPOOL_BUDGET`] an upload holds, given back when it drops.
#[derive(Debug, Default)]
struct SpoolPermit(u64);

impl SpoolPermit {
    /// Takes `n` more bytes of the budget, or refuses.
    fn grow(&mut self, n: u64) -> Result<(), ApiError> {
        let taken = SPOOLED.fetch_add(n, Ordering::Relaxed);
        if taken + n > SPOOL_BUDGET {
            SPOOLED.fetch_sub(n, Ordering::Relaxed);
            return Err(ApiError::SpoolFull(SPOOL_BUDGET));
        }
        self.0 += n;
        Ok(())
    }
}

impl Drop for SpoolPermit {
    fn drop(&mut self) {
        SPOOLED.fetch_sub(self.0, Ordering::Relaxed);
    }
}

impl Head {
    async fn hold(&mut self, data: Bytes) -> Result<(), ApiError> {
        if self.spool.is_none() && self.held_bytes + data.len() <= HEAD_IN_MEMORY {
            self.held_bytes += data.len();
            self.held.push_back(data);
            return Ok(());
        }
        let spooling = if self.spool.is_none() {
            self.held_bytes + data.len()
        } else {
            data.len()
        };
        self.permit.grow(spooling as u64)?;
        let spool = match &mut self.spool {
            Some(f) => f,
            None => {
                let f = tempfile::tempfile().map_err(spool_error)?;
                let f = self.spool.insert(tokio::fs::File::from_std(f));
                for b in self.held.drain(..) {
                    f.write_all(&b).await.map_err(spool_error)?;
                }
                self.held_bytes = 0;
                f
            }
        };
        spool.write_all(&data).await.map_err(spool_error)
    }

    async fn into_source(self, rest: RequestBody) -> Result<Source, ApiError> {
        let spool = match self.spool {
            Some(mut f) => {
                f.flush().await.map_err(spool_error)?;
                f.rewind().await.map_err(spool_error)?;
                Some(ReaderStream::with_capacity(f, 64 << 10))
            }
            None => None,
        };
        Ok(Source {
            held: self.held,
            spool,
            _permit: self.permit,
            rest,
        })
    }
}

fn spool_error(e: std::io::Error) -> ApiError {
    ApiError::Internal(format!("could not spool an upload to disk: {e}"))
}

struct Source {
    held: VecDeque<Bytes>,
    spool: Option<ReaderStream<tokio::fs::File>>,
    /// Held while the spooled file is.
    _permit: SpoolPermit,
    rest: RequestBody,
}

/// How an upload ended, as far as the client's side goes.
const SENDING: u8 = 0;
const FINISHED: u8 = 1;
const TOO_LARGE: u8 = 2;
const CLIENT_GONE: u8 = 3;
const TOO_SLOW: u8 = 4;
const CONFLICTING_MODEL: u8 = 5;
const BAD_FORM: u8 = 6;

struct Shared {
    /// The body and the reader of the rest of its form, until a send
    /// takes them.
    source: parking_lot::Mutex<Option<Box<(Source, Form)>>>,
    end: AtomicU8,
    /// The rest of the body must arrive within this of the send's start
    /// (the client could not send it while the request was queued).
    timeout: std::time::Duration,
}

/// An upload's body as the backend gets it: the bytes read before routing,
/// then the rest of the client's. It can be sent once; a [`resend`] after
/// a connection that failed before taking it sends it whole.
///
/// [`resend`]: Upload::resend
pub struct Upload {
    shared: Arc<Shared>,
    /// Boxed: the request body type of every backend call holds an
    /// `Upload` in one variant.
    source: Option<Box<(Source, Form)>>,
    late: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Upload {
    fn new(source: Source, form: Form, timeout: std::time::Duration) -> Upload {
        Upload {
            shared: Arc::new(Shared {
                source: parking_lot::Mutex::new(Some(Box::new((source, form)))),
                end: AtomicU8::new(SENDING),
                timeout,
            }),
            source: None,
            late: None,
        }
    }

    /// The same upload, for another attempt: it has the body only if no
    /// earlier attempt started sending it.
    pub fn resend(&self) -> Upload {
        Upload {
            shared: self.shared.clone(),
            source: None,
            late: None,
        }
    }

    /// The client has not sent the whole body yet.
    pub fn unfinished(&self) -> bool {
        self.shared.end.load(Ordering::Acquire) == SENDING
    }

    /// The client's body was read to its end.
    pub fn finished(&self) -> bool {
        self.shared.end.load(Ordering::Acquire) == FINISHED
    }

    /// The client's side failed the upload: the body passed the limit, or
    /// the client went away.
    pub fn failure(&self, limit: usize) -> Option<ApiError> {
        match self.shared.end.load(Ordering::Acquire) {
            TOO_LARGE => Some(ApiError::BodyTooLarge(limit)),
            CLIENT_GONE => Some(ApiError::ClientGone),
            TOO_SLOW => Some(ApiError::BodyTimeout(self.shared.timeout)),
            CONFLICTING_MODEL => Some(ApiError::InvalidRequest(
                "The form gives `model` twice, with different values".into(),
            )),
            BAD_FORM => Some(ApiError::InvalidRequest(
                "The multipart form is malformed".into(),
            )),
            _ => None,
        }
    }

    /// Ends the upload from the client's side, with `end`.
    fn fail(&self, end: u8, why: &'static str) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.shared.end.store(end, Ordering::Release);
        Poll::Ready(Some(Err(why.into())))
    }
}

impl Body for Upload {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let state = match &mut this.source {
            Some(s) => s,
            None => match this.shared.source.lock().take() {
                Some(s) => this.source.insert(s),
                None => return Poll::Ready(Some(Err("the upload was already sent".into()))),
            },
        };
        let (src, form) = &mut **state;
        if let Some(b) = src.held.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        if let Some(spool) = &mut src.spool {
            match ready!(Pin::new(spool).poll_next(cx)) {
                Some(Ok(b)) => return Poll::Ready(Some(Ok(Frame::data(b)))),
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => src.spool = None,
            }
        }
        let frame = match Pin::new(&mut src.rest).poll_frame(cx) {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                let timeout = this.shared.timeout;
                let late = this
                    .late
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if late.as_mut().poll(cx).is_ready() {
                    return this.fail(TOO_SLOW, "the client's upload was too slow");
                }
                return Poll::Pending;
            }
        };
        let end = match &frame {
            None => FINISHED,
            Some(Err(e)) if e.is::<http_body_util::LengthLimitError>() => TOO_LARGE,
            Some(Err(e)) if crate::protocol::read::client_went_away(&**e) => CLIENT_GONE,
            Some(Err(_)) => SENDING,
            Some(Ok(f)) => match f.data_ref().map(|d| form.feed(d)) {
                Some(Err(_)) => return this.fail(BAD_FORM, "malformed multipart form"),
                _ if form.conflicting_model => {
                    return this.fail(CONFLICTING_MODEL, "the form names two models");
                }
                _ => SENDING,
            },
        };
        if end != SENDING {
            this.shared.end.store(end, Ordering::Release);
        }
        Poll::Ready(frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spool_budget_is_shared_and_given_back() {
        let mut a = SpoolPermit::default();
        a.grow(SPOOL_BUDGET - 10).unwrap();
        let mut b = SpoolPermit::default();
        assert!(matches!(b.grow(11), Err(ApiError::SpoolFull(_))));
        drop(a);
        b.grow(11).unwrap();
    }
}
