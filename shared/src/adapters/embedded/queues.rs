use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::domain::Timestamp;
use crate::ports::{Clock, Delivery, Outgoing, QueueConsumer, QueueError, QueueUrl, Queues};

/// One queue's behaviour, as an SQS queue's attributes and redrive policy set it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueSettings {
    pub visibility_timeout_ms: u64,
    /// Receives after which the next receive moves the message to `dead_letter` instead.
    /// 0: never (SQS without a redrive policy).
    pub max_receives: u32,
    pub dead_letter: Option<String>,
    /// Probability that a sent message is delivered twice (SQS standard is at-least-once).
    pub duplicate_rate: f64,
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            visibility_timeout_ms: 30_000,
            max_receives: 0,
            dead_letter: None,
            duplicate_rate: 0.0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage {
    pub message_id: String,
    pub body: String,
    pub attributes: BTreeMap<String, String>,
    pub receive_count: u32,
    pub sent_at: Timestamp,
    /// What SQS would give as the message's `SenderId`: set by a send through
    /// [`EmbeddedQueues::sending_as`] (an app's), absent for the pipeline's own sends.
    pub sender: Option<String>,
}

impl StoredMessage {
    /// The message as a handler receives it.
    pub fn inbound(&self) -> crate::ports::Inbound {
        crate::ports::Inbound {
            message_id: self.message_id.clone(),
            body: self.body.clone(),
            receive_count: self.receive_count,
            sender: self.sender.clone(),
        }
    }
}

/// A received message and the handle that deletes it (valid until visibility lapses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub message: StoredMessage,
    pub receipt: String,
}

#[derive(Default)]
struct Queue {
    settings: QueueSettings,
    /// Keyed by (visible at, sequence): the first entries are the next to deliver.
    waiting: BTreeMap<(Timestamp, u64), StoredMessage>,
    /// Receipt -> (message, invisible until). Ordered, so messages whose visibility
    /// lapses at the same moment come back in the same order on every run (a seed replays).
    in_flight: BTreeMap<String, (StoredMessage, Timestamp)>,
    /// The in-flight messages' visibility lapses, counted by time: the earliest is known
    /// without reading every message in flight.
    lapses: BTreeMap<Timestamp, u32>,
    fail_sends: u32,
}

impl Queue {
    fn next_visible(&self) -> Option<Timestamp> {
        let waiting = self.waiting.first_key_value().map(|((at, _), _)| *at);
        let lapsing = self.lapses.first_key_value().map(|(until, _)| *until);
        waiting.into_iter().chain(lapsing).min()
    }

    fn depth(&self) -> usize {
        self.waiting.len() + self.in_flight.len()
    }

    fn lapse_added(&mut self, until: Timestamp) {
        *self.lapses.entry(until).or_default() += 1;
    }

    fn lapse_removed(&mut self, until: Timestamp) {
        if let std::collections::btree_map::Entry::Occupied(mut n) = self.lapses.entry(until) {
            *n.get_mut() -= 1;
            if *n.get() == 0 {
                n.remove();
            }
        }
    }
}

#[derive(Default)]
struct State {
    /// In the order they were first named; a queue's place is its [`QueueId`].
    queues: Vec<Queue>,
    /// Each queue's place, by name: a few short names, looked up many times a step of a
    /// simulation, so hashed cheaply (`NameHasher`). Nothing iterates it.
    places: HashMap<String, usize, BuildHasherDefault<NameHasher>>,
    seq: u64,
}

impl State {
    fn get(&self, queue: &str) -> Option<&Queue> {
        self.places.get(queue).map(|&i| &self.queues[i])
    }

    fn get_mut(&mut self, queue: &str) -> Option<&mut Queue> {
        self.places.get(queue).map(|&i| &mut self.queues[i])
    }

    fn get_or_create(&mut self, queue: &str) -> &mut Queue {
        let i = match self.places.get(queue) {
            Some(&i) => i,
            None => {
                self.queues.push(Queue::default());
                self.places.insert(queue.to_owned(), self.queues.len() - 1);
                self.queues.len() - 1
            }
        };
        &mut self.queues[i]
    }
}

/// A queue's place in [`EmbeddedQueues`] ([`EmbeddedQueues::id`]): for a caller that asks
/// about one queue many times (the simulation's loop, at every step), without a lookup of
/// its name each time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueId(usize);

/// A fast hash of a queue's name (FxHash's mixing, eight bytes at a time): SipHash's
/// resistance to chosen keys is not needed for the deployment's own few queue names.
#[derive(Default)]
struct NameHasher(u64);

impl NameHasher {
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for NameHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            self.mix(u64::from_le_bytes(word.try_into().expect("eight bytes")));
        }
        // The last few bytes shifted into a word, not copied into one: a copy of unknown
        // length is a call to `memcpy`, a good part of a lookup's cost.
        let rest = words.remainder();
        if !rest.is_empty() {
            self.mix(rest.iter().rev().fold(0, |word, b| (word << 8) | u64::from(*b)));
        }
    }
    fn write_u8(&mut self, byte: u8) {
        self.mix(u64::from(byte));
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A message's id: `m-` and its sequence number. Made for every message sent, so without
/// `format!` (ids and receipts were 2 % of a simulation's instructions).
fn message_id(seq: u64) -> String {
    let mut id = String::with_capacity(22);
    id.push_str("m-");
    id.push_str(itoa::Buffer::new().format(seq));
    id
}

/// SQS in-process: named queues with visibility timeout, redelivery, delay, DLQ
/// redrive after max receives and optional duplicate delivery.
pub struct EmbeddedQueues {
    clock: Arc<dyn Clock>,
    rng: Mutex<fastrand::Rng>,
    state: Mutex<State>,
    sent: tokio::sync::Notify,
}

impl EmbeddedQueues {
    pub fn new(clock: Arc<dyn Clock>, seed: u64) -> EmbeddedQueues {
        EmbeddedQueues {
            clock,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            state: Mutex::default(),
            sent: tokio::sync::Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn create(&self, name: &str, settings: QueueSettings) {
        self.state().get_or_create(name).settings = settings;
    }

    /// Fault injection: the next `n` sends to `queue` fail as if SQS were unreachable.
    pub fn fail_next_sends(&self, queue: &str, n: u32) {
        if let Some(q) = self.state().get_mut(queue) {
            q.fail_sends = n;
        }
    }

    /// Up to `max` visible messages; each becomes invisible for the visibility timeout.
    /// A message past its max receives goes to the dead-letter queue instead.
    pub fn receive(&self, queue: &str, max: usize) -> Result<Vec<Received>, QueueError> {
        let now = self.clock.now();
        let mut guard = self.state();
        let state = &mut *guard;
        let mut seq = state.seq;
        let q = state.get_mut(queue).ok_or_else(|| QueueError::NoSuchQueue(queue.to_owned()))?;
        let any_lapsed = q.lapses.first_key_value().is_some_and(|(until, _)| *until <= now);
        let lapsed: Vec<String> = if any_lapsed {
            q.in_flight.iter().filter(|(_, (_, until))| *until <= now).map(|(r, _)| r.clone()).collect()
        } else {
            Vec::new()
        };
        for receipt in lapsed {
            let (message, until) = q.in_flight.remove(&receipt).expect("listed above");
            q.lapse_removed(until);
            seq += 1;
            q.waiting.insert((until, seq), message);
        }
        let mut out = Vec::new();
        let mut to_dead_letter = Vec::new();
        while out.len() < max {
            let Some(entry) = q.waiting.first_entry() else {
                break;
            };
            if entry.key().0 > now {
                break;
            }
            let mut message = entry.remove();
            if q.settings.max_receives > 0
                && message.receive_count >= q.settings.max_receives
                && q.settings.dead_letter.is_some()
            {
                to_dead_letter.push(message);
                continue;
            }
            message.receive_count += 1;
            seq += 1;
            let mut receipt = String::with_capacity(queue.len() + 21);
            receipt.push_str(queue);
            receipt.push('#');
            receipt.push_str(itoa::Buffer::new().format(seq));
            let until = now.plus_ms(q.settings.visibility_timeout_ms);
            q.in_flight.insert(receipt.clone(), (message.clone(), until));
            q.lapse_added(until);
            out.push(Received { message, receipt });
        }
        let dead_letter = q.settings.dead_letter.clone();
        state.seq = seq;
        if let Some(dlq) = dead_letter {
            for message in to_dead_letter {
                state.seq += 1;
                let key = (now, state.seq);
                state.get_or_create(&dlq).waiting.insert(key, message);
            }
        }
        Ok(out)
    }

    /// Deletes a received message; a receipt whose visibility lapsed is a no-op.
    pub fn delete(&self, queue: &str, receipt: &str) {
        if let Some(q) = self.state().get_mut(queue)
            && let Some((_, until)) = q.in_flight.remove(receipt)
        {
            q.lapse_removed(until);
        }
    }

    /// When the next message of `queue` becomes receivable: the earliest of its waiting
    /// messages' visible-at and its in-flight messages' visibility lapse. For a
    /// discrete-event driver (the simulation) that jumps time to the next event.
    pub fn next_visible(&self, queue: &str) -> Option<Timestamp> {
        self.state().get(queue)?.next_visible()
    }

    /// Messages waiting (visible or delayed) plus in flight.
    pub fn depth(&self, queue: &str) -> usize {
        self.state().get(queue).map_or(0, Queue::depth)
    }

    /// The place of the queue named `queue`, if there is one.
    pub fn id(&self, queue: &str) -> Option<QueueId> {
        self.state().places.get(queue).map(|&i| QueueId(i))
    }

    /// `next_visible` of the queue at `id`.
    pub fn next_visible_at(&self, id: QueueId) -> Option<Timestamp> {
        self.state().queues[id.0].next_visible()
    }

    /// `next_visible_at` of each queue of `ids`, read under one lock: for a loop that asks
    /// of several queues at every step.
    pub fn next_visible_each<const N: usize>(&self, ids: &[QueueId; N]) -> [Option<Timestamp>; N] {
        let state = self.state();
        ids.map(|id| state.queues[id.0].next_visible())
    }

    /// `depth` of the queue at `id`.
    pub fn depth_at(&self, id: QueueId) -> usize {
        self.state().queues[id.0].depth()
    }

    /// The bodies of every message in `queue` (waiting, delayed or in flight), left
    /// where they are: for tests that look without taking.
    pub fn bodies(&self, queue: &str) -> Vec<String> {
        let state = self.state();
        let Some(q) = state.get(queue) else {
            return Vec::new();
        };
        let waiting = q.waiting.values().map(|m| m.body.clone());
        waiting.chain(q.in_flight.values().map(|(m, _)| m.body.clone())).collect()
    }

    /// Every message in `queue`, removed: for reading status and dead-letter queues.
    pub fn drain(&self, queue: &str) -> Vec<StoredMessage> {
        let mut state = self.state();
        let Some(q) = state.get_mut(queue) else {
            return Vec::new();
        };
        let mut all: Vec<_> = std::mem::take(&mut q.waiting).into_values().collect();
        all.extend(std::mem::take(&mut q.in_flight).into_values().map(|(m, _)| m));
        q.lapses.clear();
        all
    }

    /// Wakes when something is sent (or after `max_wait_ms`), for pollers in real time.
    pub async fn wait_for_send(&self, max_wait_ms: u64) {
        let _ =
            tokio::time::timeout(std::time::Duration::from_millis(max_wait_ms), self.sent.notified()).await;
    }

    /// Sends as SQS does for a caller whose `SenderId` is `sender` (`None`: no sender
    /// known, as for the pipeline's own sends).
    fn send_from(
        &self,
        queue: &QueueUrl,
        messages: Vec<Outgoing>,
        sender: Option<&str>,
    ) -> Result<(), QueueError> {
        let now = self.clock.now();
        {
            let mut guard = self.state();
            let state = &mut *guard;
            let mut seq = state.seq;
            let q = state.get_mut(&queue.0).ok_or_else(|| QueueError::NoSuchQueue(queue.0.clone()))?;
            if q.fail_sends > 0 {
                q.fail_sends -= 1;
                return Err(QueueError::Unavailable {
                    queue: queue.0.clone(),
                    reason: "injected: unreachable".into(),
                });
            }
            let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
            for m in messages {
                seq += 1;
                let stored = StoredMessage {
                    message_id: message_id(seq),
                    body: m.body,
                    attributes: m.attributes,
                    receive_count: 0,
                    sent_at: now,
                    sender: sender.map(str::to_owned),
                };
                let visible_at = now.plus_ms(m.delay_ms);
                if q.settings.duplicate_rate > 0.0 && rng.f64() < q.settings.duplicate_rate {
                    seq += 1;
                    q.waiting.insert((visible_at, seq), stored.clone());
                }
                seq += 1;
                q.waiting.insert((visible_at, seq), stored);
            }
            state.seq = seq;
        }
        self.sent.notify_waiters();
        Ok(())
    }

    /// A handle that sends as `sender_id` would: what an app's sends are in an in-process
    /// run, so the orders queue's sender checks are exercised as on SQS.
    pub fn sending_as(self: &Arc<Self>, sender_id: &str) -> SendingAs {
        SendingAs { queues: self.clone(), sender_id: sender_id.to_owned() }
    }
}

#[async_trait]
impl Queues for EmbeddedQueues {
    async fn send_batch(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Result<(), QueueError> {
        self.send_from(queue, messages, None)
    }
}

/// Sends to the embedded queues under one sender id ([`EmbeddedQueues::sending_as`]).
#[derive(Clone)]
pub struct SendingAs {
    queues: Arc<EmbeddedQueues>,
    sender_id: String,
}

#[async_trait]
impl Queues for SendingAs {
    async fn send_batch(&self, queue: &QueueUrl, messages: Vec<Outgoing>) -> Result<(), QueueError> {
        self.queues.send_from(queue, messages, Some(&self.sender_id))
    }
}

#[async_trait]
impl QueueConsumer for EmbeddedQueues {
    async fn receive(&self, queue: &QueueUrl, max: usize, wait_ms: u64) -> Result<Vec<Delivery>, QueueError> {
        let mut got = EmbeddedQueues::receive(self, &queue.0, max)?;
        if got.is_empty() && wait_ms > 0 {
            self.wait_for_send(wait_ms).await;
            got = EmbeddedQueues::receive(self, &queue.0, max)?;
        }
        Ok(got
            .into_iter()
            .map(|r| Delivery {
                message_id: r.message.message_id,
                body: r.message.body,
                attributes: r.message.attributes,
                receive_count: r.message.receive_count,
                receipt: r.receipt,
                sender: r.message.sender,
            })
            .collect())
    }
    async fn delete(&self, queue: &QueueUrl, receipt: &str) -> Result<(), QueueError> {
        EmbeddedQueues::delete(self, &queue.0, receipt);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::embedded::ManualClock;

    fn setup() -> (Arc<ManualClock>, EmbeddedQueues) {
        let clock = Arc::new(ManualClock::at(1_000));
        let q = EmbeddedQueues::new(clock.clone(), 7);
        q.create("dlq", QueueSettings::default());
        q.create(
            "work",
            QueueSettings {
                visibility_timeout_ms: 100,
                max_receives: 2,
                dead_letter: Some("dlq".into()),
                duplicate_rate: 0.0,
            },
        );
        (clock, q)
    }

    #[tokio::test]
    async fn redelivers_after_visibility_then_dead_letters() {
        let (clock, q) = setup();
        q.send(&QueueUrl("work".into()), Outgoing::new("a".into())).await.unwrap();
        assert_eq!(q.receive("work", 10).unwrap().len(), 1);
        assert!(q.receive("work", 10).unwrap().is_empty(), "invisible");
        clock.advance(100);
        let again = q.receive("work", 10).unwrap();
        assert_eq!(again[0].message.receive_count, 2);
        clock.advance(100);
        assert!(q.receive("work", 10).unwrap().is_empty(), "third receive goes to the DLQ");
        assert_eq!(q.drain("dlq").len(), 1);
        assert_eq!(q.depth("work"), 0);
    }

    #[tokio::test]
    async fn delete_and_delay() {
        let (clock, q) = setup();
        q.send(&QueueUrl("work".into()), Outgoing::delayed("later".into(), 50)).await.unwrap();
        assert!(q.receive("work", 10).unwrap().is_empty());
        clock.advance(50);
        let r = q.receive("work", 10).unwrap();
        q.delete("work", &r[0].receipt);
        clock.advance(1_000);
        assert!(q.receive("work", 10).unwrap().is_empty());
    }

    #[tokio::test]
    async fn duplicates_when_asked() {
        let clock = Arc::new(ManualClock::at(0));
        let q = EmbeddedQueues::new(clock, 1);
        q.create("d", QueueSettings { duplicate_rate: 1.0, ..QueueSettings::default() });
        q.send(&QueueUrl("d".into()), Outgoing::new("x".into())).await.unwrap();
        assert_eq!(q.receive("d", 10).unwrap().len(), 2);
        assert!(q.send(&QueueUrl("nope".into()), Outgoing::new("x".into())).await.is_err());
    }
}
