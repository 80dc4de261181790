//! The I/O half of precise prefix routing: one task per backend with
//! `kv_events`, subscribed (ZMQ SUB) to its engine's KV-event publisher,
//! feeding the scheduler's prefix index through a [`Feed`].
//!
//! - **Sequence gaps** (the PUB socket drops messages when a subscriber
//!   falls behind, or while it reconnects): the missed batches are asked
//!   of the engine's replay socket (`replay`, vLLM's `replay_endpoint`,
//!   a ROUTER answering `[b"", start_seq]` with each buffered `[b"", seq,
//!   payload]` and an end marker of seq -1) within [`REPLAY_TIMEOUT`];
//!   when there is none, it does not answer, or it no longer has them,
//!   the backend's entries are dropped and relearned (a clean reset).
//! - **A restart** of the engine restarts its sequence at 0: a sequence
//!   number below the last applied resets the backend the same way.
//! - **The watchdog**: an engine publishes only when its cache changes,
//!   so silence is normal when idle, but a connection that died without
//!   a word is silent too. After [`WATCHDOG`] without a message the
//!   socket is replaced; what was missed meanwhile shows as a gap on the
//!   next message.
//! - While the publisher cannot be reached the backend is marked
//!   unfollowed and routing falls back to the approximate index for it.
//!
//! Counters per backend ([`KvStats`]) go to `/metrics`.

use std::sync::Weak;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use super::Sink;
use crate::config::KvEventsSource;
use crate::core::scheduler::PrefixEvent;
use crate::fault::Chain;
use crate::poller::kv_events::{EventBatch, Feed, Sequence, decode_batch, decode_seq};

/// How long a connection (to the publisher or the replay socket) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a replay may take, all of it.
pub const REPLAY_TIMEOUT: Duration = Duration::from_secs(5);
/// Silence after which the subscription is replaced.
pub const WATCHDOG: Duration = Duration::from_secs(30);
/// The longest wait between attempts to reach an unreachable publisher.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Replayed batches taken at most (vLLM buffers 10,000 by default).
const MAX_REPLAY: usize = 20_000;

/// What one backend's subscriber did, read at scrape time.
#[derive(Debug, Default)]
pub struct KvStats {
    /// 1 while subscribed and followed.
    pub connected: AtomicU64,
    pub batches: AtomicU64,
    pub events: AtomicU64,
    /// Sequence gaps seen, and those filled by a replay.
    pub gaps: AtomicU64,
    pub replayed: AtomicU64,
    /// Times the backend's entries were dropped: an engine restart, or a
    /// gap that could not be replayed.
    pub resets: AtomicU64,
    /// Messages that were not a batch (counted, skipped).
    pub decode_errors: AtomicU64,
    /// `BlockStored` chains whose parent was unknown.
    pub unanchored: AtomicU64,
    /// Subscriptions replaced after [`WATCHDOG`] of silence.
    pub watchdog: AtomicU64,
    /// Milliseconds from the engine's timestamp of the last batch to its
    /// arrival here.
    pub lag_ms: AtomicU64,
}

/// A snapshot of [`KvStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvEventCounts {
    pub connected: bool,
    pub batches: u64,
    pub events: u64,
    pub gaps: u64,
    pub replayed: u64,
    pub resets: u64,
    pub decode_errors: u64,
    pub unanchored: u64,
    pub watchdog: u64,
    pub lag_ms: u64,
}

impl KvStats {
    pub fn counts(&self) -> KvEventCounts {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        KvEventCounts {
            connected: g(&self.connected) == 1,
            batches: g(&self.batches),
            events: g(&self.events),
            gaps: g(&self.gaps),
            replayed: g(&self.replayed),
            resets: g(&self.resets),
            decode_errors: g(&self.decode_errors),
            unanchored: g(&self.unanchored),
            watchdog: g(&self.watchdog),
            lag_ms: g(&self.lag_ms),
        }
    }
}

fn add(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

/// What one subscriber follows: the publisher and the pool's keying.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvTarget {
    pub source: KvEventsSource,
    pub model: String,
    pub block_tokens: u32,
    /// Engine blocks its feed remembers at most.
    pub cap: usize,
}

/// A message's sequence number and payload: the last two frames (vLLM
/// sends `[topic, seq, payload]`, its replay `[b"", seq, payload]`,
/// TensorRT-LLM's replay `[b"", topic, seq, payload]`).
fn frames(msg: &ZmqMessage) -> Option<(&Bytes, &Bytes)> {
    let n = msg.len();
    if n < 2 {
        return None;
    }
    Some((msg.get(n - 2)?, msg.get(n - 1)?))
}

/// One backend's subscription loop; ends when cancelled or the gateway
/// is gone.
pub(super) async fn follow(
    sink: Weak<dyn Sink>,
    name: String,
    target: KvTarget,
    stats: std::sync::Arc<KvStats>,
    stop: CancellationToken,
) {
    let mut feed = Feed::new(&target.model, target.block_tokens, target.cap);
    let mut backoff = Duration::from_millis(200);
    let mut followed = false;
    let mut out: Vec<PrefixEvent> = Vec::new();
    loop {
        let sub = tokio::select! {
            () = stop.cancelled() => return,
            s = subscribe(&target.source) => s,
        };
        let mut sub = match sub {
            Ok(s) => s,
            Err(why) => {
                if followed {
                    tracing::warn!(backend = %name, endpoint = %target.source.endpoint, error = %Chain(&why), "KV events: publisher unreachable; routing on approximate prefixes");
                    followed = false;
                    feed.reset();
                    stats.connected.store(0, Ordering::Relaxed);
                    if !report(&sink, &name, false, &[]) {
                        return;
                    }
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        backoff = Duration::from_millis(200);
        if !followed {
            tracing::info!(backend = %name, endpoint = %target.source.endpoint, "KV events: following the engine's prefix cache");
            followed = true;
            stats.connected.store(1, Ordering::Relaxed);
            // A new subscription: what the index held for it was guessed.
            if !report(&sink, &name, true, &[]) {
                return;
            }
        }
        loop {
            let msg = tokio::select! {
                () = stop.cancelled() => return,
                m = tokio::time::timeout(WATCHDOG, sub.recv()) => m,
            };
            let msg = match msg {
                Err(_) => {
                    add(&stats.watchdog, 1);
                    break;
                }
                Ok(Err(e)) => {
                    tracing::debug!(backend = %name, error = %e, "KV events: subscription ended");
                    break;
                }
                Ok(Ok(m)) => m,
            };
            let Some((seq, batch)) = decode(&msg, &stats) else {
                continue;
            };
            out.clear();
            let before = feed.stats;
            match feed.sequence(seq) {
                Sequence::First | Sequence::Next => {}
                // A publisher sends each number once on its live stream
                // (replays come through the replay socket): a number seen
                // already is a new process counting from 0 again, even
                // when the old one had sent only that many.
                Sequence::Old | Sequence::Restart => {
                    // A feed can send these at will: logged at most every
                    // 10 s (the counters have them all).
                    static LOG: crate::clock::Throttled =
                        crate::clock::Throttled::new(crate::clock::REMOTE_LOG_EVERY);
                    if let Some(left_out) = LOG.allow() {
                        tracing::info!(backend = %name, seq, left_out, "KV events: the engine restarted; relearning its cache");
                    }
                    add(&stats.resets, 1);
                    feed.reset();
                    out.push(PrefixEvent::Cleared);
                }
                Sequence::Gap { missing } => {
                    add(&stats.gaps, 1);
                    match replay(target.source.replay.as_deref(), missing, seq, &stats).await {
                        Some(batches) => {
                            add(&stats.replayed, 1);
                            for (s, b) in &batches {
                                feed.apply(*s, b, &mut out);
                            }
                        }
                        None => {
                            static LOG: crate::clock::Throttled =
                                crate::clock::Throttled::new(crate::clock::REMOTE_LOG_EVERY);
                            if let Some(left_out) = LOG.allow() {
                                tracing::info!(backend = %name, missing, seq, left_out, "KV events: batches lost and not replayed; relearning its cache");
                            }
                            add(&stats.resets, 1);
                            feed.reset();
                            out.push(PrefixEvent::Cleared);
                        }
                    }
                }
            }
            feed.apply(seq, &batch, &mut out);
            add(&stats.batches, 1);
            add(&stats.events, batch.events.len() as u64);
            add(&stats.unanchored, feed.stats.unanchored - before.unanchored);
            if batch.ts > 0.0 {
                let now = crate::clock::unix_seconds_f64();
                let lag = ((now - batch.ts).max(0.0) * 1000.0) as u64;
                stats.lag_ms.store(lag, Ordering::Relaxed);
            }
            if !out.is_empty() && !report(&sink, &name, true, &out) {
                return;
            }
        }
    }
}

/// Hands `events` to the gateway; false when it is gone.
fn report(sink: &Weak<dyn Sink>, name: &str, followed: bool, events: &[PrefixEvent]) -> bool {
    match sink.upgrade() {
        Some(s) => {
            s.on_kv_events(name, followed, events);
            true
        }
        None => false,
    }
}

fn decode(msg: &ZmqMessage, stats: &KvStats) -> Option<(u64, EventBatch)> {
    let decoded = frames(msg)
        .and_then(|(seq, payload)| Some((decode_seq(seq).ok()?, decode_batch(payload).ok()?)));
    if decoded.is_none() {
        add(&stats.decode_errors, 1);
    }
    decoded
}

/// Why the engine's publisher could not be followed: the engine's side
/// (not up, or not publishing), so the backend's fault; the task tries
/// again, backing off.
#[derive(Debug, thiserror::Error)]
enum SubscribeError {
    #[error("connect timed out")]
    ConnectTimeout,
    #[error("connecting")]
    Connect(#[source] zeromq::ZmqError),
    #[error("subscribing")]
    Subscribe(#[source] zeromq::ZmqError),
}

async fn subscribe(source: &KvEventsSource) -> Result<SubSocket, SubscribeError> {
    let mut sub = SubSocket::new();
    match tokio::time::timeout(CONNECT_TIMEOUT, sub.connect(&source.endpoint)).await {
        Err(_) => return Err(SubscribeError::ConnectTimeout),
        Ok(Err(e)) => return Err(SubscribeError::Connect(e)),
        Ok(Ok(())) => {}
    }
    sub.subscribe(&source.topic)
        .await
        .map_err(SubscribeError::Subscribe)?;
    Ok(sub)
}

/// Batches `missing..upto` from the replay socket, in order; `None` when
/// there is no replay socket or it cannot give all of them in time.
async fn replay(
    endpoint: Option<&str>,
    missing: u64,
    upto: u64,
    stats: &KvStats,
) -> Option<Vec<(u64, EventBatch)>> {
    let endpoint = endpoint?;
    tokio::time::timeout(REPLAY_TIMEOUT, async {
        let mut dealer = DealerSocket::new();
        dealer.connect(endpoint).await.ok()?;
        let ask = ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&missing.to_be_bytes()),
        ])
        .ok()?;
        dealer.send(ask).await.ok()?;
        let mut got = Vec::new();
        let mut next = missing;
        while next < upto && got.len() < MAX_REPLAY {
            let msg = dealer.recv().await.ok()?;
            let (seq, payload) = frames(&msg)?;
            let seq = decode_seq(seq).ok()?;
            if seq == u64::MAX {
                break; // the end marker: it has no more
            }
            if seq < next {
                continue;
            }
            if seq > next {
                return None; // it no longer has `next`
            }
            let Ok(batch) = decode_batch(payload) else {
                add(&stats.decode_errors, 1);
                return None;
            };
            got.push((seq, batch));
            next += 1;
        }
        (next == upto).then_some(got)
    })
    .await
    .ok()
    .flatten()
}
