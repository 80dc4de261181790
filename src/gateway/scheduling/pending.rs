//! A request's decisions as it receives them: the one made at once, and
//! the channel the later ones come on, registered under the scheduler's
//! lock.

use tokio::sync::{mpsc, oneshot};

use crate::core::scheduler::Decision;

/// A request's decision channel.
#[derive(Debug)]
pub(super) enum Waiter {
    /// A queued request that cannot be preempted waits for one decision.
    Once(oneshot::Sender<Decision>),
    /// A preemptible (batch) request's channel lives as long as it does:
    /// dispatch, preemption, dispatch again, or shed.
    Many(mpsc::UnboundedSender<Decision>),
}

/// The channel for a request's later decisions, and the request's end of
/// it: none for one that cannot be preempted and was dispatched at once.
pub(super) fn channel(ready: Option<Decision>, preemptible: bool) -> (Option<Waiter>, Pending) {
    let (waiter, rx) = if preemptible {
        let (tx, rx) = mpsc::unbounded_channel();
        (Some(Waiter::Many(tx)), Rx::Many(rx))
    } else if ready.is_none() {
        let (tx, rx) = oneshot::channel();
        (Some(Waiter::Once(tx)), Rx::Once(rx))
    } else {
        (None, Rx::Done)
    };
    (waiter, Pending { ready, rx })
}

/// A request's decisions: one already made, then those still to come.
#[derive(Debug)]
pub struct Pending {
    pub ready: Option<Decision>,
    rx: Rx,
}

#[derive(Debug)]
enum Rx {
    Done,
    Once(oneshot::Receiver<Decision>),
    Many(mpsc::UnboundedReceiver<Decision>),
}

impl Pending {
    /// Whether a `Preempt` has been sent and not yet read. Decisions are
    /// sent under the core lock, so under it this sees every one so far. A
    /// dispatch that came after the preemption is kept for `next`.
    pub fn preempted_already(&mut self) -> bool {
        let mut preempted = false;
        if let Rx::Many(rx) = &mut self.rx {
            while let Ok(d) = rx.try_recv() {
                match d {
                    Decision::Preempt { .. } => preempted = true,
                    other => self.ready = Some(other),
                }
            }
        }
        preempted
    }

    /// The next decision for the request; `None` when none can come (the
    /// scheduler dropped it, which would be a bug, or it had its one).
    pub async fn next(&mut self) -> Option<Decision> {
        if let Some(d) = self.ready.take() {
            return Some(d);
        }
        match &mut self.rx {
            Rx::Done => None,
            Rx::Once(rx) => {
                let d = rx.await.ok();
                self.rx = Rx::Done;
                d
            }
            Rx::Many(rx) => rx.recv().await,
        }
    }

    /// Ready once a `Preempt` arrives (other decisions are dropped: none
    /// but a `Preempt` comes to a request in flight); never when its
    /// channel closed or cannot carry one.
    pub fn poll_preempted(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if matches!(self.ready.take(), Some(Decision::Preempt { .. })) {
            return std::task::Poll::Ready(());
        }
        let Rx::Many(rx) = &mut self.rx else {
            return std::task::Poll::Pending;
        };
        while let std::task::Poll::Ready(d) = rx.poll_recv(cx) {
            match d {
                Some(Decision::Preempt { .. }) => return std::task::Poll::Ready(()),
                Some(_) => {}
                None => {
                    self.rx = Rx::Done;
                    return std::task::Poll::Pending;
                }
            }
        }
        std::task::Poll::Pending
    }

    /// Whether `next` may still wait for a decision.
    pub fn is_waiting(&self) -> bool {
        self.ready.is_none() && !matches!(self.rx, Rx::Done)
    }
}
