//! The simulated engine's KV events, published as vLLM publishes them:
//! a ZMQ PUB socket sending `[topic, seq (8 bytes, big-endian, from 0),
//! msgpack batch]` per engine step that changed the prefix cache, and a
//! ROUTER replay socket that answers `[b"", start_seq]` with every
//! buffered batch from `start_seq` on, then `seq = -1` and an empty
//! payload (vLLM's `replay_endpoint`, `buffer_steps` batches kept).
//!
//! Token ids are the prompt's approximate ids (`crate::tokens`, four
//! bytes of its text per id): the simulated engine's tokenizer. A gateway
//! that keys prompts the same way (no tokenizer configured) matches them.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::poller::kv_events::{EventBatch, encode_batch};
use crate::sim::engine::{CacheChange, StoredPrompt, kv_events};

/// Batches kept for replay (vLLM's `buffer_steps` default).
const BUFFER_STEPS: usize = 10_000;

/// What a sequence's prompt looks like to the events: its token ids, its
/// adapter and its `cache_salt`.
#[derive(Debug)]
pub(super) struct SeqPrompt {
    pub ids: Vec<u32>,
    pub lora: Option<String>,
    pub salt: Option<String>,
}

/// Where the events go, and the addresses they can be read at.
#[derive(Debug)]
pub(super) struct KvLink {
    tx: mpsc::UnboundedSender<EventBatch>,
    pub endpoint: String,
    pub replay: String,
    /// Batches still to be numbered but not sent (a test's lost messages).
    pub drop_next: Arc<AtomicU64>,
    pub stop: CancellationToken,
}

impl KvLink {
    /// Binds the PUB socket at `publish` and the replay socket at
    /// `replay`, and starts the publishing task.
    pub(super) async fn bind(publish: SocketAddr, replay: SocketAddr) -> std::io::Result<Self> {
        let err = |e: zeromq::ZmqError| std::io::Error::other(e.to_string());
        let mut pub_sock = PubSocket::new();
        let endpoint = pub_sock
            .bind(&format!("tcp://{publish}"))
            .await
            .map_err(err)?;
        let mut router = RouterSocket::new();
        let replay_at = router.bind(&format!("tcp://{replay}")).await.map_err(err)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let drop_next = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        tokio::spawn(publish_loop(
            pub_sock,
            router,
            rx,
            Arc::clone(&drop_next),
            stop.clone(),
        ));
        Ok(KvLink {
            tx,
            endpoint: endpoint.to_string(),
            replay: replay_at.to_string(),
            drop_next,
            stop,
        })
    }

    /// Publishes the cache's `changes` of one step; `prompt` finds a
    /// stored sequence's prompt by its id.
    pub(super) fn publish<'p>(
        &self,
        changes: Vec<CacheChange>,
        block_size: u32,
        prompt: impl Fn(u64) -> Option<&'p SeqPrompt>,
    ) {
        let events = kv_events(changes, block_size, |id| {
            let p = prompt(id)?;
            Some(StoredPrompt {
                ids: Cow::Borrowed(&p.ids),
                lora: p.lora.as_deref(),
                salt: p.salt.as_deref(),
            })
        });
        if events.is_empty() {
            return;
        }
        let ts = crate::clock::unix_seconds_f64();
        let _ = self.tx.send(EventBatch {
            ts,
            events,
            data_parallel_rank: None,
            skipped: 0,
        });
    }
}

impl Drop for KvLink {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn message(frames: Vec<Bytes>) -> Option<ZmqMessage> {
    ZmqMessage::try_from(frames).ok()
}

async fn publish_loop(
    mut pub_sock: PubSocket,
    mut router: RouterSocket,
    mut rx: mpsc::UnboundedReceiver<EventBatch>,
    drop_next: Arc<AtomicU64>,
    stop: CancellationToken,
) {
    let mut seq: u64 = 0;
    let mut buffer: VecDeque<(u64, Bytes)> = VecDeque::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            batch = rx.recv() => {
                let Some(batch) = batch else { break };
                let payload = Bytes::from(encode_batch(&batch));
                let s = seq;
                seq += 1;
                if buffer.len() == BUFFER_STEPS {
                    buffer.pop_front();
                }
                buffer.push_back((s, payload.clone()));
                let lost = drop_next
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok();
                if lost {
                    continue;
                }
                let frames = vec![Bytes::new(), Bytes::copy_from_slice(&s.to_be_bytes()), payload];
                if let Some(m) = message(frames) {
                    let _ = pub_sock.send(m).await;
                }
            }
            ask = router.recv() => {
                let Ok(ask) = ask else { continue };
                // [identity, b"", start_seq]
                let (Some(id), Some(start)) = (ask.get(0), ask.get(ask.len() - 1)) else { continue };
                let Ok(start) = <[u8; 8]>::try_from(start.as_ref()).map(u64::from_be_bytes) else {
                    continue;
                };
                for (s, payload) in buffer.iter().filter(|(s, _)| *s >= start) {
                    let frames = vec![
                        id.clone(),
                        Bytes::new(),
                        Bytes::copy_from_slice(&s.to_be_bytes()),
                        payload.clone(),
                    ];
                    if let Some(m) = message(frames) {
                        let _ = router.send(m).await;
                    }
                }
                let end = vec![id.clone(), Bytes::new(), Bytes::copy_from_slice(&(-1i64).to_be_bytes()), Bytes::new()];
                if let Some(m) = message(end) {
                    let _ = router.send(m).await;
                }
            }
        }
    }
}
