//! One invocation's sends, coalesced into one SendMessageBatch request per destination
//! queue instead of one SendMessage request per message.
//!
//! An invocation handles its messages concurrently ([`run_batch`](super::run_batch), a
//! supervisor's page of recoveries): a *round*. Each handler sends one message at a time
//! and needs that message's result (a failed required send retries the message, a failed
//! status update is only logged). [`SendCoalescer`] parks every send made inside a round
//! and flushes what is parked, grouped by queue, once every handler of the round still
//! running is waiting on a send or has finished; each caller then gets its own messages'
//! results. With instant handlers all of one round's sends go out together.
//!
//! A handler still busy (an agent waiting on its remote service until complete-by) would
//! hold the others' sends for as long as it takes, and a reply that arrives after its
//! complete-by is dropped as stale. So a send waits at most the coalescer's max hold,
//! after which whatever is parked goes out.
//!
//! Outside a round a send goes straight through, so a handler called directly behaves
//! as before.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{Notify, oneshot};

use crate::ports::{Clock, Outgoing, QueueError, QueueUrl, Queues};

/// Long enough for the handlers of one Lambda invocation to reach their sends (a few
/// DynamoDB calls each), short against any step's complete-by.
pub const DEFAULT_MAX_HOLD: Duration = Duration::from_millis(20);

tokio::task_local! {
    static ROUND: Arc<Round>;
}

type Results = Vec<Result<(), QueueError>>;

/// How long a parked send may wait, on which timer.
enum Hold {
    /// Real time, whatever the handlers' clock: a manual clock's sleep returns at once,
    /// which would send every message alone.
    Real(Duration),
    /// A clock whose sleeps take its own time, as a simulated world's do.
    Clock(Arc<dyn Clock>, u64),
}

impl Hold {
    async fn elapse(&self) {
        match self {
            Hold::Real(d) => tokio::time::sleep(*d).await,
            Hold::Clock(clock, ms) => clock.sleep_until(clock.now().plus_ms(*ms)).await,
        }
    }
}

/// A `Queues` decorator that coalesces the sends of each round (see the module).
pub struct SendCoalescer {
    inner: Arc<dyn Queues>,
    hold: Hold,
}

impl SendCoalescer {
    /// Holds sends at most `max_hold` of real time (a tokio timer).
    pub fn new(inner: Arc<dyn Queues>, max_hold: Duration) -> SendCoalescer {
        SendCoalescer { inner, hold: Hold::Real(max_hold) }
    }

    /// Holds sends at most `max_hold_ms` of `clock`'s time: for a simulation whose clock is
    /// the only time there is.
    pub fn on_clock(inner: Arc<dyn Queues>, max_hold_ms: u64, clock: Arc<dyn Clock>) -> SendCoalescer {
        SendCoalescer { inner, hold: Hold::Clock(clock, max_hold_ms) }
    }

    /// The messages' results once their round flushes them, or the messages back if no
    /// round is open.
    async fn park(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Result<Results, Vec<Outgoing>> {
        let Ok(round) = ROUND.try_with(Arc::clone) else {
            return Err(messages);
        };
        if messages.is_empty() {
            return Err(messages);
        }
        let n = messages.len();
        let (reply, mut answer) = oneshot::channel();
        let (id, oldest) = {
            let mut s = round.lock();
            if s.closed {
                return Err(messages);
            }
            s.next_id += 1;
            let id = s.next_id;
            let oldest = s.parked.is_empty();
            s.parked.push(Parked { id, inner: self.inner.clone(), queue: queue.clone(), messages, reply });
            (id, oldest)
        };
        round.changed.notify_one();
        if oldest {
            // A flush takes everything parked, so the oldest send's hold bounds every other's.
            tokio::select! {
                biased;
                got = &mut answer => return Ok(results(got, n, queue)),
                () = self.hold.elapse() => {}
            }
            let mut s = round.lock();
            if s.parked.first().is_some_and(|p| p.id == id) {
                s.expired = true;
                drop(s);
                round.changed.notify_one();
            }
        }
        Ok(results(answer.await, n, queue))
    }
}

fn results(got: Result<Results, oneshot::error::RecvError>, n: usize, queue: &QueueUrl) -> Results {
    got.unwrap_or_else(|_| {
        let abandoned =
            QueueError::Unavailable { queue: queue.0.clone(), reason: "send abandoned unflushed".into() };
        vec![Err(abandoned); n]
    })
}

#[async_trait]
impl Queues for SendCoalescer {
    async fn send_batch(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Result<(), QueueError> {
        match self.park(queue, messages).await {
            Ok(results) => results.into_iter().find_map(Result::err).map_or(Ok(()), Err),
            Err(messages) => self.inner.send_batch(queue, messages).await,
        }
    }

    async fn send_each(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Results {
        match self.park(queue, messages).await {
            Ok(results) => results,
            Err(messages) => self.inner.send_each(queue, messages).await,
        }
    }
}

/// Runs `handlers` concurrently as one round of sends; their outputs in order.
pub async fn join_round<F: Future>(handlers: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let handlers: Vec<F> = handlers.into_iter().collect();
    // Every handler counts from the start, so the first to send does not find itself alone.
    let round = Arc::new(Round::new(handlers.len()));
    let guarded = handlers.into_iter().map(|handler| {
        let finished = Finished(round.clone());
        async move {
            let out = handler.await;
            drop(finished);
            out
        }
    });
    let all = futures::future::join(futures::future::join_all(guarded), round.drive());
    ROUND.scope(round.clone(), all).await.0
}

struct Parked {
    id: u64,
    inner: Arc<dyn Queues>,
    queue: QueueUrl,
    messages: Vec<Outgoing>,
    reply: oneshot::Sender<Results>,
}

#[derive(Default)]
struct RoundState {
    /// Handlers not finished yet.
    live: usize,
    /// Sends waiting for the next flush, oldest first.
    parked: Vec<Parked>,
    /// The oldest parked send has waited its max hold.
    expired: bool,
    /// Every handler finished: a send now (there should be none) goes straight through.
    closed: bool,
    next_id: u64,
}

struct Round {
    state: Mutex<RoundState>,
    /// Wakes the flusher: a send parked, a handler finished, a hold ran out.
    changed: Notify,
}

enum Next {
    Flush(Vec<Parked>),
    Wait,
    Done,
}

impl Round {
    fn new(handlers: usize) -> Round {
        Round {
            state: Mutex::new(RoundState { live: handlers, ..RoundState::default() }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, RoundState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn next(&self, idle: bool) -> Next {
        let mut s = self.lock();
        // Parked sends counted against live handlers: a handler whose send is in flight is
        // neither, and its next send (or its end) is what the others wait for.
        if !s.parked.is_empty() && (s.expired || s.parked.len() >= s.live) {
            s.expired = false;
            return Next::Flush(std::mem::take(&mut s.parked));
        }
        if idle && s.live == 0 && s.parked.is_empty() {
            s.closed = true;
            return Next::Done;
        }
        Next::Wait
    }

    /// Flushes what is parked whenever it is ready, until every handler has finished.
    /// Flushes overlap: a send parked while another flush is in flight does not wait for it.
    async fn drive(&self) {
        let mut flights = FuturesUnordered::new();
        loop {
            match self.next(flights.is_empty()) {
                Next::Flush(parked) => {
                    flights.push(flush(parked));
                    continue;
                }
                Next::Done => return,
                Next::Wait => {}
            }
            if flights.is_empty() {
                self.changed.notified().await;
            } else {
                tokio::select! {
                    biased;
                    _ = flights.next() => {}
                    () = self.changed.notified() => {}
                }
            }
        }
    }
}

/// Marks its handler finished however it ends (returned, panicked, dropped).
struct Finished(Arc<Round>);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.lock().live -= 1;
        self.0.changed.notify_one();
    }
}

/// One request's worth of parked sends: one adapter, one queue.
struct Group {
    inner: Arc<dyn Queues>,
    queue: QueueUrl,
    messages: Vec<Outgoing>,
    /// Each parked send's reply and how many of the messages are its.
    replies: Vec<(oneshot::Sender<Results>, usize)>,
}

async fn flush(parked: Vec<Parked>) {
    let mut groups: Vec<Group> = Vec::new();
    for p in parked {
        let n = p.messages.len();
        match groups.iter_mut().find(|g| g.queue == p.queue && Arc::ptr_eq(&g.inner, &p.inner)) {
            Some(g) => {
                g.messages.extend(p.messages);
                g.replies.push((p.reply, n));
            }
            None => groups.push(Group {
                inner: p.inner,
                queue: p.queue,
                messages: p.messages,
                replies: vec![(p.reply, n)],
            }),
        }
    }
    // One queue down (a wrong reply_to) fails only the sends to it.
    futures::future::join_all(groups.into_iter().map(send_group)).await;
}

async fn send_group(g: Group) {
    let n = g.messages.len();
    let sent = AssertUnwindSafe(g.inner.send_each(&g.queue, g.messages)).catch_unwind().await;
    let failed = |reason: String| vec![Err(QueueError::Unavailable { queue: g.queue.0.clone(), reason }); n];
    let results = match sent {
        Ok(results) if results.len() == n => results,
        Ok(results) => failed(format!("the adapter answered {} of {n} messages", results.len())),
        // The handlers would have caught it as their message's failure; so does the flush.
        Err(_) => failed("the queue adapter panicked".into()),
    };
    let mut results = results.into_iter();
    for (reply, k) in g.replies {
        // A handler that stopped waiting (its invocation dropped) needs no answer.
        let _ = reply.send(results.by_ref().take(k).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handlers::{DeadLetters, HandlerError, Inbound, run_batch};
    use tokio::time::Instant;

    /// One request as the adapter under the coalescer saw it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Request {
        queue: String,
        bodies: Vec<String>,
        at: Duration,
    }

    /// Records each request; the queue "down" is unreachable and a body starting with
    /// "bad" is refused on its own, as SQS refuses single entries of a batch.
    struct Recording {
        start: Instant,
        requests: Mutex<Vec<Request>>,
    }

    impl Recording {
        fn new() -> Arc<Recording> {
            Arc::new(Recording { start: Instant::now(), requests: Mutex::default() })
        }
        fn requests(&self) -> Vec<Request> {
            self.requests.lock().unwrap().clone()
        }
        fn shape(&self) -> Vec<(String, usize)> {
            self.requests().into_iter().map(|r| (r.queue, r.bodies.len())).collect()
        }
    }

    #[async_trait]
    impl Queues for Recording {
        async fn send_batch(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Result<(), QueueError> {
            self.send_each(queue, messages).await.into_iter().find_map(Result::err).map_or(Ok(()), Err)
        }
        async fn send_each(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Results {
            let bodies: Vec<String> = messages.iter().map(|m| m.body.clone()).collect();
            let at = self.start.elapsed();
            self.requests.lock().unwrap().push(Request {
                queue: queue.0.clone(),
                bodies: bodies.clone(),
                at,
            });
            let err =
                |reason: &str| Err(QueueError::Unavailable { queue: queue.0.clone(), reason: reason.into() });
            bodies
                .iter()
                .map(|b| match (queue.0.as_str(), b.starts_with("bad")) {
                    ("down", _) => err("unreachable"),
                    (_, true) => err("entry refused"),
                    _ => Ok(()),
                })
                .collect()
        }
    }

    /// A round that never ends fails the test (after two hours of paused time) rather
    /// than hanging it.
    async fn within<F: Future>(f: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(7200), f).await.expect("the round never ended")
    }

    fn q(name: &str) -> QueueUrl {
        QueueUrl(name.into())
    }

    fn coalescer(inner: &Arc<Recording>, max_hold: Duration) -> Arc<SendCoalescer> {
        Arc::new(SendCoalescer::new(inner.clone(), max_hold))
    }

    #[tokio::test(start_paused = true)]
    async fn the_sends_of_concurrent_handlers_become_one_request_per_queue() {
        let inner = Recording::new();
        let queues = coalescer(&inner, Duration::from_secs(3600));
        let results = within(join_round((0..10).map(|i| {
            let queues = queues.clone();
            async move {
                // Handlers reach their sends at different polls, as with real I/O.
                for _ in 0..i % 3 {
                    tokio::task::yield_now().await;
                }
                queues.send(&q("scheduler"), Outgoing::new(format!("s{i}"))).await?;
                queues.send(&q("status"), Outgoing::new(format!("r{i}"))).await
            }
        })))
        .await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let requests = inner.requests();
        assert_eq!(inner.shape(), [("scheduler".to_owned(), 10), ("status".to_owned(), 10)]);
        assert!(requests.iter().all(|r| r.at == Duration::ZERO), "nothing waited for the hold: {requests:?}");
        let want: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
        let mut got = requests[0].bodies.clone();
        got.sort();
        let mut want = want;
        want.sort();
        assert_eq!(got, want);
    }

    #[tokio::test(start_paused = true)]
    async fn each_send_gets_its_own_result() {
        let inner = Recording::new();
        let queues = coalescer(&inner, Duration::from_secs(3600));
        let sends =
            [("work", "ok-1"), ("work", "bad-2"), ("down", "ok-3"), ("work", "ok-4"), ("work", "bad-5")];
        let results = within(join_round(sends.iter().map(|(queue, body)| {
            let queues = queues.clone();
            async move { queues.send(&q(queue), Outgoing::new((*body).to_owned())).await }
        })))
        .await;
        let ok: Vec<bool> = results.iter().map(Result::is_ok).collect();
        assert_eq!(ok, [true, false, false, true, false]);
        assert!(results[2].as_ref().unwrap_err().to_string().contains("unreachable"));
        assert!(results[1].as_ref().unwrap_err().to_string().contains("entry refused"));
        assert_eq!(inner.shape(), [("work".to_owned(), 4), ("down".to_owned(), 1)]);

        // A send_batch of several messages fails if any of its own fails, and only then.
        let results = within(join_round([
            queues.send_batch(&q("work"), vec![Outgoing::new("ok-6".into()), Outgoing::new("bad-7".into())]),
            queues.send_batch(&q("work"), vec![Outgoing::new("ok-8".into()), Outgoing::new("ok-9".into())]),
        ]))
        .await;
        assert!(results[0].is_err() && results[1].is_ok(), "{results:?}");
        let pair = vec![Outgoing::new("bad-10".into()), Outgoing::new("ok-11".into())];
        let each = within(join_round([queues.send_each(&q("work"), pair)])).await;
        assert_eq!(each[0].iter().map(Result::is_ok).collect::<Vec<_>>(), [false, true]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_that_never_sends_does_not_hold_the_others() {
        let inner = Recording::new();
        let queues = coalescer(&inner, Duration::from_secs(3600));
        let results = within(join_round((0..4).map(|i| {
            let queues = queues.clone();
            async move {
                if i == 0 {
                    // Busy for a few polls, then done without sending.
                    for _ in 0..5 {
                        tokio::task::yield_now().await;
                    }
                    return Ok(());
                }
                queues.send(&q("work"), Outgoing::new(format!("m{i}"))).await
            }
        })))
        .await;
        assert!(results.iter().all(Result::is_ok));
        let requests = inner.requests();
        assert_eq!(inner.shape(), [("work".to_owned(), 3)]);
        assert_eq!(requests[0].at, Duration::ZERO, "sent when the silent handler ended, not after a hold");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_handler_holds_the_others_at_most_the_max_hold() {
        let inner = Recording::new();
        let hold = Duration::from_millis(20);
        let queues = coalescer(&inner, hold);
        let start = Instant::now();
        let answered = within(join_round((0..3).map(|i| {
            let queues = queues.clone();
            async move {
                if i == 0 {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                queues.send(&q("scheduler"), Outgoing::new(format!("reply-{i}"))).await.unwrap();
                start.elapsed()
            }
        })))
        .await;
        assert_eq!(answered, [Duration::from_secs(5), hold, hold]);
        let requests = inner.requests();
        assert_eq!(inner.shape(), [("scheduler".to_owned(), 2), ("scheduler".to_owned(), 1)]);
        assert_eq!((requests[0].at, requests[1].at), (hold, Duration::from_secs(5)));
    }

    #[tokio::test(start_paused = true)]
    async fn outside_a_round_a_send_goes_straight_through() {
        let inner = Recording::new();
        let queues = coalescer(&inner, Duration::from_secs(3600));
        queues.send(&q("work"), Outgoing::new("alone".into())).await.unwrap();
        assert!(queues.send(&q("work"), Outgoing::new("bad".into())).await.is_err());
        assert_eq!(inner.shape(), [("work".to_owned(), 1), ("work".to_owned(), 1)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_handler_does_not_leave_the_others_parked() {
        let inner = Recording::new();
        let queues = coalescer(&inner, Duration::from_secs(3600));
        // Kept messages bypass the coalescer here, so the panicking handler ends without a
        // send of its own: only its end can release the others.
        let dead_letters = DeadLetters {
            queues: Recording::new(),
            source: q("work"),
            dead_letter_queue: q("dlq"),
            metrics: Arc::new(crate::adapters::embedded::CountingMetrics::default()),
        };
        let messages: Vec<Inbound> = ["a", "boom", "b"]
            .iter()
            .map(|id| Inbound { message_id: (*id).into(), body: (*id).into(), receive_count: 1 })
            .collect();
        let report = within(run_batch(messages, &dead_letters, |m| {
            let queues = queues.clone();
            async move {
                if m.body == "boom" {
                    tokio::task::yield_now().await;
                    panic!("handler bug");
                }
                queues.send(&q("out"), Outgoing::new(m.body)).await.map_err(HandlerError::from)
            }
        }))
        .await;
        assert_eq!((report.failures.len(), report.kept), (0, 1));
        let requests = inner.requests();
        assert_eq!(inner.shape(), [("out".to_owned(), 2)]);
        assert_eq!(requests[0].at, Duration::ZERO, "released by the panic, not by the hold");
    }
}
