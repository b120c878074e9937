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
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::Notify;

use crate::domain::Timestamp;
use crate::ports::{Clock, Outgoing, QueueError, QueueUrl, Queues};

/// Long enough for the handlers of one Lambda invocation to reach their sends (a few
/// DynamoDB calls each), short against any step's complete-by.
pub const DEFAULT_MAX_HOLD: Duration = Duration::from_millis(crate::config::DEFAULT_AGENT_SEND_MAX_HOLD_MS);

/// Sends of one kind a round usually makes: one per message of a Lambda SQS batch (10).
/// Only sizes the first allocation of a group.
const ROUND_HINT: usize = 10;

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
    fn deadline(&self) -> Deadline {
        match self {
            Hold::Real(d) => Deadline::Real(tokio::time::Instant::now() + *d),
            Hold::Clock(clock, ms) => Deadline::Clock(clock.clone(), clock.now().plus_ms(*ms)),
        }
    }
}

/// When the oldest parked send of a round has waited its max hold.
#[derive(Clone)]
enum Deadline {
    Real(tokio::time::Instant),
    Clock(Arc<dyn Clock>, Timestamp),
}

type Timer = Pin<Box<dyn Future<Output = ()> + Send>>;

impl Deadline {
    fn timer(self) -> Timer {
        match self {
            Deadline::Real(at) => Box::pin(tokio::time::sleep_until(at)),
            Deadline::Clock(clock, at) => Box::pin(async move { clock.sleep_until(at).await }),
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

    /// Parks the messages in the running round and waits for the flush that sends them;
    /// the messages back if no round is open.
    async fn park(&self, queue: &QueueUrl, parcel: Parcel, fold: bool) -> Result<Answer, Parcel> {
        let Ok(round) = ROUND.try_with(Arc::clone) else {
            return Err(parcel);
        };
        let n = parcel.len();
        if n == 0 {
            return Err(parcel);
        }
        let ticket = {
            let mut s = round.lock();
            if s.closed {
                return Err(parcel);
            }
            if s.parked == 0 {
                // A flush takes everything parked, so the oldest send's hold bounds every other's.
                s.deadline = Some(self.hold.deadline());
                // Every earlier answer taken: their slots can be used again.
                if s.slots.iter().all(|slot| matches!(slot, Slot::Taken)) {
                    s.slots.clear();
                }
            }
            s.parked += 1;
            let ticket = s.slots.len();
            s.slots.push(Slot::Waiting(None));
            let reply = Reply { ticket, n, fold };
            let inner = &self.inner;
            let at = match s.groups.iter().position(|g| g.queue == *queue && Arc::ptr_eq(&g.inner, inner)) {
                Some(at) => at,
                None => {
                    s.groups.push(Group {
                        inner: inner.clone(),
                        queue: queue.clone(),
                        messages: Vec::with_capacity(ROUND_HINT.max(n)),
                        replies: Vec::with_capacity(ROUND_HINT),
                    });
                    s.groups.len() - 1
                }
            };
            let group = &mut s.groups[at];
            match parcel {
                Parcel::One(m) => group.messages.push(m),
                Parcel::Many(ms) => group.messages.extend(ms),
            }
            group.replies.push(reply);
            ticket
        };
        round.changed.notify_one();
        Ok(std::future::poll_fn(|cx| round.answer(ticket, cx)).await)
    }
}

#[async_trait]
impl Queues for SendCoalescer {
    // `send` directly, not through `send_batch`: one boxed future and no vector per message.
    async fn send(&self, queue: &QueueUrl, message: Outgoing) -> Result<(), QueueError> {
        match self.park(queue, Parcel::One(message), true).await {
            Ok(answer) => answer.folded(),
            Err(parcel) => self.inner.send_batch(queue, parcel.into_vec()).await,
        }
    }

    async fn send_batch(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Result<(), QueueError> {
        match self.park(queue, Parcel::Many(messages), true).await {
            Ok(answer) => answer.folded(),
            Err(parcel) => self.inner.send_batch(queue, parcel.into_vec()).await,
        }
    }

    async fn send_each(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Results {
        let n = messages.len();
        match self.park(queue, Parcel::Many(messages), false).await {
            Ok(Answer::Each(results)) => results,
            Ok(Answer::Folded(result)) => vec![result; n],
            Err(parcel) => self.inner.send_each(queue, parcel.into_vec()).await,
        }
    }
}

/// What one call parks.
enum Parcel {
    One(Outgoing),
    Many(Vec<Outgoing>),
}

impl Parcel {
    fn len(&self) -> usize {
        match self {
            Parcel::One(_) => 1,
            Parcel::Many(ms) => ms.len(),
        }
    }
    fn into_vec(self) -> Vec<Outgoing> {
        match self {
            Parcel::One(m) => vec![m],
            Parcel::Many(ms) => ms,
        }
    }
}

/// A parked send's results: folded into one for `send_batch` (no vector to allocate for
/// the one message of a `send`), one per message for `send_each`.
enum Answer {
    Folded(Result<(), QueueError>),
    Each(Results),
}

impl Answer {
    fn folded(self) -> Result<(), QueueError> {
        match self {
            Answer::Folded(result) => result,
            Answer::Each(results) => results.into_iter().find_map(Result::err).map_or(Ok(()), Err),
        }
    }
}

enum Slot {
    Waiting(Option<Waker>),
    Answered(Answer),
    Taken,
}

/// Where a parked send's answer goes: its slot, its number of messages, whether folded.
struct Reply {
    ticket: usize,
    n: usize,
    fold: bool,
}

/// Runs `handlers` concurrently as one round of sends; their outputs in order.
pub async fn join_round<F: Future>(handlers: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let round = Arc::new(Round::default());
    // Each handler counts from when `join_all` collects it, before any is polled, so the
    // first to send does not find itself alone.
    let handlers = futures::future::join_all(
        handlers.into_iter().map(|handler| Guarded { handler, finished: Some(Finished::new(&round)) }),
    );
    ROUND.scope(round.clone(), round.run(handlers)).await
}

pin_project_lite::pin_project! {
    /// A handler and the mark that it has not finished yet. A struct rather than an async
    /// block around the handler, so the handler's (large) future is polled where it lies
    /// instead of being moved into another one.
    struct Guarded<F> {
        #[pin]
        handler: F,
        finished: Option<Finished>,
    }
}

impl<F: Future> Future for Guarded<F> {
    type Output = F::Output;
    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let out = std::task::ready!(this.handler.poll(cx));
        // Dropped here, or with the future if it never finishes.
        this.finished.take();
        Poll::Ready(out)
    }
}

/// One request's worth of parked sends: one adapter, one queue.
struct Group {
    inner: Arc<dyn Queues>,
    queue: QueueUrl,
    messages: Vec<Outgoing>,
    replies: Vec<Reply>,
}

#[derive(Default)]
struct RoundState {
    /// Handlers not finished yet.
    live: usize,
    /// Sends parked since the last flush, grouped by adapter and queue, first parked first.
    groups: Vec<Group>,
    /// How many sends are parked.
    parked: usize,
    /// When the oldest parked send has waited its max hold.
    deadline: Option<Deadline>,
    /// Counts flushes: names the parked sends a timer was set for.
    flushes: u64,
    /// Every handler finished: a send now (there should be none) goes straight through.
    closed: bool,
    /// Each parked send's answer, by its ticket; one allocation per round, not per send.
    slots: Vec<Slot>,
}

impl RoundState {
    fn take(&mut self) -> Vec<Group> {
        self.parked = 0;
        self.deadline = None;
        self.flushes += 1;
        std::mem::take(&mut self.groups)
    }
}

#[derive(Default)]
struct Round {
    state: Mutex<RoundState>,
    /// Wakes the flusher: a send parked, a handler finished.
    changed: Notify,
    /// Flushes whose senders have their answers.
    answered: AtomicU64,
}

enum Next {
    Flush(Vec<Group>),
    /// Nothing to send yet; the parked sends' deadline, for a timer that is not set yet.
    Wait(Option<(u64, Deadline)>),
    Done,
}

impl Round {
    fn lock(&self) -> MutexGuard<'_, RoundState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn next(&self, idle: bool, timer_for: Option<u64>) -> Next {
        let mut s = self.lock();
        // Parked sends counted against live handlers: a handler whose send is in flight is
        // neither, and its next send (or its end) is what the others wait for.
        if s.parked > 0 && s.parked >= s.live {
            return Next::Flush(s.take());
        }
        if idle && s.live == 0 && s.parked == 0 {
            s.closed = true;
            return Next::Done;
        }
        match &s.deadline {
            Some(d) if timer_for != Some(s.flushes) => Next::Wait(Some((s.flushes, d.clone()))),
            _ => Next::Wait(None),
        }
    }

    /// The parked sends of `window` if they are still parked: their hold ran out.
    fn expire(&self, window: u64) -> Option<Vec<Group>> {
        let mut s = self.lock();
        (s.flushes == window && s.parked > 0).then(|| s.take())
    }

    /// Polls the handlers and the flusher together until both are done. Once a flush has
    /// answered its senders the handlers are polled again at once, not after a trip through
    /// the executor (a wake of the task itself): with instant I/O a batch runs in one poll.
    async fn run<H: Future>(&self, handlers: H) -> H::Output {
        let mut handlers = std::pin::pin!(handlers);
        let mut driver = std::pin::pin!(self.drive());
        let mut outputs = None;
        let mut driven = false;
        std::future::poll_fn(|cx| {
            loop {
                if outputs.is_none()
                    && let Poll::Ready(out) = handlers.as_mut().poll(cx)
                {
                    outputs = Some(out);
                }
                if driven {
                    // The flusher ends only once every handler has.
                    return outputs.take().map_or(Poll::Pending, Poll::Ready);
                }
                let answered = self.answered.load(Ordering::Relaxed);
                driven = driver.as_mut().poll(cx).is_ready();
                if !driven && self.answered.load(Ordering::Relaxed) == answered {
                    return Poll::Pending;
                }
            }
        })
        .await
    }

    /// Flushes what is parked whenever it is ready, until every handler has finished.
    /// Flushes overlap: a send parked while another flush is in flight does not wait for it.
    /// The hold timer is set only when a round has to wait, so instant handlers never set one.
    async fn drive(&self) {
        let mut flights = FuturesUnordered::new();
        let mut timer: Option<(u64, Timer)> = None;
        loop {
            match self.next(flights.is_empty(), timer.as_ref().map(|(w, _)| *w)) {
                Next::Flush(groups) => {
                    flights.push(self.flush(groups));
                    timer = None;
                    continue;
                }
                Next::Done => return,
                Next::Wait(Some((window, deadline))) => timer = Some((window, deadline.timer())),
                Next::Wait(None) => {}
            }
            tokio::select! {
                biased;
                Some(()) = flights.next(), if !flights.is_empty() => {}
                () = self.changed.notified() => {}
                () = async { timer.as_mut().expect("guarded").1.as_mut().await }, if timer.is_some() => {
                    let (window, _) = timer.take().expect("just fired");
                    if let Some(groups) = self.expire(window) {
                        flights.push(self.flush(groups));
                    }
                }
            }
        }
    }
}

/// Marks its handler finished however it ends (returned, panicked, dropped).
struct Finished(Arc<Round>);

impl Finished {
    fn new(round: &Arc<Round>) -> Finished {
        round.lock().live += 1;
        Finished(round.clone())
    }
}

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.lock().live -= 1;
        self.0.changed.notify_one();
    }
}

impl Round {
    async fn flush(&self, groups: Vec<Group>) {
        // One queue down (a wrong reply_to) fails only the sends to it.
        let answered = futures::future::join_all(groups.into_iter().map(send_group)).await;
        let wakers: Vec<Waker> = {
            let mut s = self.lock();
            let mut wakers = Vec::new();
            for (reply, answer) in answered.into_iter().flatten() {
                let slot = std::mem::replace(&mut s.slots[reply.ticket], Slot::Answered(answer));
                if let Slot::Waiting(Some(waker)) = slot {
                    wakers.push(waker);
                }
            }
            wakers
        };
        self.answered.fetch_add(1, Ordering::Relaxed);
        for waker in wakers {
            waker.wake();
        }
    }

    fn answer(&self, ticket: usize, cx: &mut std::task::Context<'_>) -> Poll<Answer> {
        let mut s = self.lock();
        match std::mem::replace(&mut s.slots[ticket], Slot::Taken) {
            Slot::Answered(answer) => Poll::Ready(answer),
            Slot::Waiting(waker) => {
                let waker = match waker {
                    Some(w) if w.will_wake(cx.waker()) => w,
                    _ => cx.waker().clone(),
                };
                s.slots[ticket] = Slot::Waiting(Some(waker));
                Poll::Pending
            }
            Slot::Taken => unreachable!("a send's answer is taken once, by that send"),
        }
    }
}

/// Sends one group and splits the results among its senders.
async fn send_group(g: Group) -> Vec<(Reply, Answer)> {
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
    g.replies
        .into_iter()
        .map(|reply| {
            let mine = results.by_ref().take(reply.n);
            let answer = if reply.fold {
                // Every one of its results is consumed, even past the first error: the next
                // sender's results start where this one's end.
                let mut folded = Ok(());
                for result in mine {
                    if folded.is_ok() {
                        folded = result;
                    }
                }
                Answer::Folded(folded)
            } else {
                Answer::Each(mine.collect())
            };
            (reply, answer)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handlers::{BatchOrder, DeadLetters, HandlerError, Inbound, run_batch, run_batch_in};
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

    /// Dead letters kept on a queue of their own, outside any coalescer.
    fn kept_apart() -> DeadLetters {
        DeadLetters {
            queues: Recording::new(),
            source: q("work"),
            dead_letter_queue: q("dlq"),
            metrics: Arc::new(crate::adapters::embedded::CountingMetrics::default()),
        }
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
        let batch =
            |bodies: &[&str]| bodies.iter().map(|b| Outgoing::new((*b).to_owned())).collect::<Vec<_>>();
        let results = within(join_round([
            queues.send_batch(&q("work"), batch(&["bad-6", "ok-7"])),
            queues.send_batch(&q("work"), batch(&["ok-8", "bad-9"])),
            queues.send_batch(&q("work"), batch(&["ok-10"])),
        ]))
        .await;
        let ok: Vec<bool> = results.iter().map(Result::is_ok).collect();
        assert_eq!(ok, [false, false, true], "{results:?}");
        let pair = vec![Outgoing::new("bad-11".into()), Outgoing::new("ok-12".into())];
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
        let dead_letters = kept_apart();
        let messages: Vec<Inbound> = ["a", "boom", "b"]
            .iter()
            .map(|id| Inbound {
                message_id: (*id).into(),
                body: (*id).into(),
                receive_count: 1,
                sender: None,
            })
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

    /// The scheduler's batches: one order's messages one after another, in the batch's
    /// order, beside the other orders'; a run waiting on its send releases the round like
    /// any handler, so the second message of an order does not wait out the hold.
    #[tokio::test(start_paused = true)]
    async fn by_order_runs_one_orders_messages_one_after_another_and_waits_out_no_hold() {
        let inner = Recording::new();
        let queues = coalescer(&inner, Duration::from_secs(3600));
        let dead_letters = kept_apart();
        let schedule = |order: &str| format!(r#"{{"type":"schedule","order_id":"{order}"}}"#);
        let bodies =
            [schedule("o-1"), schedule("o-2"), schedule("o-1"), r#"{"type":"gate","agent":"a"}"#.to_owned()];
        let messages: Vec<Inbound> = bodies
            .iter()
            .enumerate()
            .map(|(i, body)| Inbound {
                message_id: i.to_string(),
                body: body.clone(),
                receive_count: 1,
                sender: None,
            })
            .collect();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let report = within(run_batch_in(BatchOrder::ByOrder, messages, &dead_letters, |m| {
            let (queues, seen) = (queues.clone(), seen.clone());
            async move {
                seen.lock().unwrap().push(format!("start {}", m.message_id));
                let sent = queues.send(&q("out"), Outgoing::new(m.message_id.clone())).await;
                seen.lock().unwrap().push(format!("end {}", m.message_id));
                sent.map_err(HandlerError::from)
            }
        }))
        .await;
        assert_eq!(report, crate::handlers::BatchReport::default());
        let seen = seen.lock().unwrap().clone();
        let at = |what: &str| seen.iter().position(|s| s == what).unwrap();
        assert!(at("end 0") < at("start 2"), "o-1's second message after its first: {seen:?}");
        assert!(at("start 1") < at("end 0") && at("start 3") < at("end 0"), "the others beside it: {seen:?}");
        let requests = inner.requests();
        let bodies: Vec<Vec<String>> = requests.iter().map(|r| r.bodies.clone()).collect();
        assert_eq!(bodies, [vec!["0", "1", "3"], vec!["2"]]);
        assert!(requests.iter().all(|r| r.at == Duration::ZERO), "no send waited out the hold");

        // Every message at once otherwise.
        let messages = (0..2)
            .map(|i| Inbound {
                message_id: i.to_string(),
                body: schedule("o-1"),
                receive_count: 1,
                sender: None,
            })
            .collect();
        let inner = Recording::new();
        let queues = coalescer(&inner, Duration::from_secs(3600));
        within(run_batch(messages, &dead_letters, |m| {
            let queues = queues.clone();
            async move { queues.send(&q("out"), Outgoing::new(m.message_id)).await.map_err(HandlerError::from) }
        }))
        .await;
        assert_eq!(inner.shape(), [("out".to_owned(), 2)]);
    }
}
