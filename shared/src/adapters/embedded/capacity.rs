//! DynamoDB's per-item capacity, for the embedded store (opt-in:
//! `EmbeddedStore::with_capacity`; without it the store bills and throttles nothing).
//!
//! What it models, by DynamoDB's documented rules:
//! - a write bills 1 write unit per 1 KB of the item, rounded up (at least 1), on the larger
//!   of the item before and after; a write refused on its condition bills the same;
//! - a strongly consistent read bills 1 read unit per 4 KB of the item (at least 1, an
//!   absent item included), an eventually consistent one half of that;
//! - one item takes at most 1,000 write units and 3,000 read units a second (a partition's
//!   limits: an item never spans partitions, so no item gets more, whatever the table's
//!   capacity). A request that would go over, counted over the last 1,000 ms of the store's
//!   clock (a sliding window), is refused as DynamoDB refuses it
//!   (`ProvisionedThroughputExceededException` / `ThrottlingException`): it bills nothing,
//!   changes nothing, and is counted. The store answers it with
//!   `StoreError::Throttled`, the error the DynamoDB adapter gives the SDK's throttling
//!   errors too, so the handlers treat both backends' throttles alike.
//!
//! Not modelled: burst and adaptive capacity (DynamoDB may lend a hot partition unused
//! capacity for a while; never more than the per-item limits above), the SDK's own
//! retries of a throttled request, and the indexes' partitions (the due and error indexes'
//! writes, and the sweep's and listings' queries, are not billed here; `bench cost`'s
//! counting store bills them).
//!
//! An item's size ([`item_bytes`]) follows DynamoDB's rule (each attribute's name plus its
//! value: a string's UTF-8 bytes, a number's significant digits two to a byte plus one, 1
//! for a boolean or null, 3 for a list or map plus 1 per element and each element's name
//! and value) over the record's serde form, which is what the DynamoDB adapter stores
//! (`serde_dynamo` of the same `Serialize`), top-level nulls left out as the adapter leaves
//! them out, plus the attributes the adapter adds: the item key `order_id` for a gate or a
//! waiter note, and a task's index keys and expiry ([`task_item_bytes`]). A task's size is
//! within a few bytes of the adapter's item (1 to 3 over, the due shard's digits; `sasctl`'s
//! `dynamodb_item_bytes` measures the adapter's own item, and its bench smoke test holds
//! the two to 4 bytes, from a 322-byte record to the largest, 105,676 bytes).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::domain::gate::Gate;
use crate::domain::{OrderId, ProcessState, TaskRecord, Timestamp};
use crate::ports::{Clock, StoreError};

/// What one item (one partition's share) takes in a second, by DynamoDB's limits.
pub const ITEM_WRITE_UNITS_PER_SECOND: u64 = 1_000;
pub const ITEM_READ_UNITS_PER_SECOND: u64 = 3_000;
/// An expiry's value: epoch seconds, ten significant digits (two to a byte, plus one).
const EPOCH_SECONDS_BYTES: usize = 6;
/// The window a rate is counted over, in ms of the store's clock.
const WINDOW_MS: u64 = 1_000;

/// Write units of a write of an item of `bytes` (the larger of before and after).
pub fn write_units(bytes: usize) -> u64 {
    bytes.div_ceil(1_024).max(1) as u64
}

/// Read units of a read of an item of `bytes`, in halves: 2 per 4 KB strongly
/// consistent, 1 eventually consistent.
pub fn read_half_units(bytes: usize, consistent: bool) -> u64 {
    let units = bytes.div_ceil(4_096).max(1) as u64;
    if consistent { 2 * units } else { units }
}

/// The size DynamoDB gives a value (see the module).
fn value_bytes(v: &Value) -> usize {
    match v {
        Value::Null | Value::Bool(_) => 1,
        Value::String(s) => s.len(),
        Value::Number(n) => {
            let text = n.to_string();
            let digits: String =
                text.split(['e', 'E']).next().unwrap_or("").chars().filter(char::is_ascii_digit).collect();
            let significant = digits.trim_start_matches('0').trim_end_matches('0').len().max(1);
            significant.div_ceil(2) + 1
        }
        Value::Array(items) => 3 + items.iter().map(|i| 1 + value_bytes(i)).sum::<usize>(),
        Value::Object(fields) => 3 + fields.iter().map(|(k, v)| 1 + k.len() + value_bytes(v)).sum::<usize>(),
    }
}

/// An item's size as DynamoDB bills it and counts it against its 400 KB: the record's
/// top-level attributes (names and values; nulls left out, as the DynamoDB adapter leaves
/// them out).
pub fn item_bytes<T: Serialize>(record: &T) -> usize {
    match serde_json::to_value(record) {
        Ok(Value::Object(fields)) => {
            fields.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| k.len() + value_bytes(v)).sum()
        }
        Ok(other) => value_bytes(&other),
        Err(_) => 0,
    }
}

/// `order_id` (the table's key) and a value: the key of a gate or a waiter item, which the
/// DynamoDB adapter adds to the record's attributes.
fn key_bytes(key: &str) -> usize {
    "order_id".len() + key.len()
}

/// What the DynamoDB adapter adds to a task's attributes: its due index's shard while it
/// has a deadline (`due_shard`, one or two digits), its error index's key in Error
/// (`error_shard`: "0"), and its expiry once finished (`expires_at`, epoch seconds).
fn task_extra_bytes(task: &TaskRecord) -> usize {
    let mut extra = 0;
    if task.deadline().is_some() {
        extra += "due_shard".len() + 2;
    }
    if task.state() == ProcessState::Error {
        extra += "error_shard".len() + 1;
    }
    if task.state().is_terminal() {
        extra += "expires_at".len() + EPOCH_SECONDS_BYTES;
    }
    extra
}

/// A task's item size.
pub fn task_item_bytes(task: &TaskRecord) -> usize {
    item_bytes(task) + task_extra_bytes(task)
}

/// The DynamoDB item key of an agent's gate, as the adapter writes it.
pub fn gate_key(agent: &str) -> String {
    format!("gate#{agent}")
}

/// The DynamoDB item key of a ticket's waiter note, as the adapter writes it.
pub fn waiter_key(agent: &str, ticket: u64) -> String {
    format!("gate#{agent}#{ticket}")
}

/// A gate's item size: its attributes and its key.
pub fn gate_item_bytes(gate: &Gate) -> usize {
    item_bytes(gate) + key_bytes(&gate_key(&gate.agent))
}

/// A waiter note's item size: its key, the order it names, and its expiry.
pub fn waiter_item_bytes(agent: &str, ticket: u64, order: &OrderId) -> usize {
    key_bytes(&waiter_key(agent, ticket))
        + "waiter_order".len()
        + order.as_str().len()
        + "expires_at".len()
        + EPOCH_SECONDS_BYTES
}

/// One item's use of capacity so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ItemUsage {
    pub writes: u64,
    pub reads: u64,
    /// Billed units (requests that were throttled bill nothing).
    pub write_units: u64,
    pub read_units: f64,
    /// Requests refused for going over the item's rate.
    pub throttles: u64,
    /// The most write and read units it took in any 1,000 ms.
    pub peak_write_units_per_second: u64,
    pub peak_read_units_per_second: f64,
    /// Its largest size written, in bytes.
    pub largest_bytes: usize,
}

impl ItemUsage {
    fn add(&mut self, other: &ItemUsage) {
        self.writes += other.writes;
        self.reads += other.reads;
        self.write_units += other.write_units;
        self.read_units += other.read_units;
        self.throttles += other.throttles;
        self.peak_write_units_per_second =
            self.peak_write_units_per_second.max(other.peak_write_units_per_second);
        self.peak_read_units_per_second =
            self.peak_read_units_per_second.max(other.peak_read_units_per_second);
        self.largest_bytes = self.largest_bytes.max(other.largest_bytes);
    }
}

/// The whole store's use: the sum over its items, with the peaks of the hottest.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CapacityReport {
    pub items: usize,
    pub total: ItemUsage,
    /// The item that took the most write units in one second, if any wrote.
    pub hottest_item: Option<String>,
}

/// Units in the last window: (when, units) of each request still counted, and their sum.
#[derive(Debug, Default)]
struct Window {
    entries: VecDeque<(Timestamp, u64)>,
    sum: u64,
}

impl Window {
    fn slide(&mut self, now: Timestamp) {
        while let Some(&(at, units)) = self.entries.front() {
            if at.plus_ms(WINDOW_MS) > now {
                break;
            }
            self.entries.pop_front();
            self.sum -= units;
        }
    }
    fn take(&mut self, now: Timestamp, units: u64) -> u64 {
        self.entries.push_back((now, units));
        self.sum += units;
        self.sum
    }
}

#[derive(Debug, Default)]
struct Meter {
    /// The item's size as last written (0 while it does not exist).
    bytes: usize,
    writes: Window,
    /// In half units.
    reads: Window,
    usage: ItemUsage,
}

/// A read or a write of one item, as billed.
#[derive(Debug, Clone, Copy)]
pub enum Access {
    /// A write; `bytes`: the item's size after it (billed on the larger of before and after).
    Write { bytes: usize },
    /// A read, strongly consistent or not, of the item as stored.
    Read { consistent: bool },
}

/// Every item's meter, on the store's clock.
pub struct Capacity {
    clock: Arc<dyn Clock>,
    meters: HashMap<String, Meter>,
}

impl Capacity {
    pub fn new(clock: Arc<dyn Clock>) -> Capacity {
        Capacity { clock, meters: HashMap::new() }
    }

    /// Bills `access` to the item `key`, or refuses it (throttled) when the item's units
    /// in the last second would go over its limit.
    pub fn charge(&mut self, key: &str, access: Access) -> Result<(), StoreError> {
        let now = self.clock.now();
        let meter = self.meters.entry(key.to_owned()).or_default();
        let (window, units, limit) = match access {
            Access::Write { bytes } => {
                (&mut meter.writes, write_units(bytes.max(meter.bytes)), ITEM_WRITE_UNITS_PER_SECOND)
            }
            Access::Read { consistent } => {
                (&mut meter.reads, read_half_units(meter.bytes, consistent), 2 * ITEM_READ_UNITS_PER_SECOND)
            }
        };
        window.slide(now);
        if window.sum + units > limit {
            meter.usage.throttles += 1;
            let what = if matches!(access, Access::Write { .. }) { "write" } else { "read" };
            return Err(StoreError::Throttled(format!(
                "throttled (ProvisionedThroughputExceededException): item {key} is at its {what} units a second"
            )));
        }
        let in_window = window.take(now, units);
        let u = &mut meter.usage;
        match access {
            Access::Write { .. } => {
                u.writes += 1;
                u.write_units += units;
                u.peak_write_units_per_second = u.peak_write_units_per_second.max(in_window);
            }
            Access::Read { .. } => {
                u.reads += 1;
                u.read_units += units as f64 / 2.0;
                u.peak_read_units_per_second = u.peak_read_units_per_second.max(in_window as f64 / 2.0);
            }
        }
        Ok(())
    }

    /// Notes the item's size after a write that landed.
    pub fn stored(&mut self, key: &str, bytes: usize) {
        let meter = self.meters.entry(key.to_owned()).or_default();
        meter.bytes = bytes;
        meter.usage.largest_bytes = meter.usage.largest_bytes.max(bytes);
    }

    pub fn item(&self, key: &str) -> Option<ItemUsage> {
        self.meters.get(key).map(|m| m.usage.clone())
    }

    /// The items `keep` keeps, summed; the hottest is theirs.
    pub fn report_where(&self, keep: impl Fn(&str) -> bool) -> CapacityReport {
        let mut report = CapacityReport::default();
        let mut hottest = 0;
        for (key, meter) in self.meters.iter().filter(|(k, _)| keep(k)) {
            report.items += 1;
            report.total.add(&meter.usage);
            let peak = meter.usage.peak_write_units_per_second;
            if peak > hottest || (peak == hottest && peak > 0 && report.hottest_item.as_deref() > Some(key)) {
                hottest = peak;
                report.hottest_item = Some(key.clone());
            }
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::embedded::ManualClock;

    fn capacity() -> (Arc<ManualClock>, Capacity) {
        let clock = Arc::new(ManualClock::at(1_000_000));
        (clock.clone(), Capacity::new(clock))
    }

    #[test]
    fn a_write_bills_a_unit_per_kb_rounded_up_on_the_larger_item() {
        assert_eq!(write_units(3_584), 4, "3.5 KB");
        assert_eq!(write_units(1_024), 1);
        assert_eq!(write_units(1_025), 2);
        assert_eq!(write_units(0), 1, "an empty or absent item bills a unit");
        let (_, mut c) = capacity();
        c.charge("a", Access::Write { bytes: 3_584 }).unwrap();
        c.stored("a", 3_584);
        // Smaller after than before: billed on before.
        c.charge("a", Access::Write { bytes: 100 }).unwrap();
        c.stored("a", 100);
        assert_eq!(c.item("a").unwrap().write_units, 8);
        assert_eq!(c.item("a").unwrap().largest_bytes, 3_584);
    }

    #[test]
    fn a_read_bills_a_unit_per_4_kb_half_when_eventually_consistent() {
        assert_eq!(read_half_units(3_584, true), 2);
        assert_eq!(read_half_units(4_097, true), 4);
        assert_eq!(read_half_units(4_097, false), 2);
        let (_, mut c) = capacity();
        c.stored("a", 5_000);
        c.charge("a", Access::Read { consistent: true }).unwrap();
        c.charge("a", Access::Read { consistent: false }).unwrap();
        assert_eq!(c.item("a").unwrap().read_units, 3.0);
    }

    #[test]
    fn the_1001st_unit_in_a_second_on_one_item_is_throttled_not_on_another() {
        let (clock, mut c) = capacity();
        for _ in 0..1_000 {
            c.charge("hot", Access::Write { bytes: 100 }).unwrap();
        }
        let refused = c.charge("hot", Access::Write { bytes: 100 });
        assert!(
            matches!(refused, Err(StoreError::Throttled(ref m)) if m.contains("throttled")),
            "{refused:?}"
        );
        c.charge("cold", Access::Write { bytes: 100 }).unwrap();
        let hot = c.item("hot").unwrap();
        assert_eq!((hot.write_units, hot.throttles, hot.peak_write_units_per_second), (1_000, 1, 1_000));
        // Reads have their own 3,000 a second.
        c.charge("hot", Access::Read { consistent: true }).unwrap();
        // The window moves with the clock: 999 ms on, still full; a second on, room again.
        clock.advance(999);
        assert!(c.charge("hot", Access::Write { bytes: 100 }).is_err());
        clock.advance(1);
        c.charge("hot", Access::Write { bytes: 100 }).unwrap();
        let report = c.report_where(|_| true);
        assert_eq!(report.total.throttles, 2);
        assert_eq!(report.total.peak_write_units_per_second, 1_000);
        assert_eq!(report.hottest_item.as_deref(), Some("hot"));
        assert_eq!(report.items, 2);
    }

    #[test]
    fn a_sliding_window_counts_the_last_1000_ms_not_a_calendar_second() {
        let (clock, mut c) = capacity();
        clock.advance(900);
        for _ in 0..600 {
            c.charge("hot", Access::Write { bytes: 1 }).unwrap();
        }
        clock.advance(200); // a new calendar second, the same window
        for _ in 0..400 {
            c.charge("hot", Access::Write { bytes: 1 }).unwrap();
        }
        assert!(c.charge("hot", Access::Write { bytes: 1 }).is_err());
        clock.advance(800); // the first 600 leave the window
        for _ in 0..600 {
            c.charge("hot", Access::Write { bytes: 1 }).unwrap();
        }
        assert!(c.charge("hot", Access::Write { bytes: 1 }).is_err());
    }

    #[test]
    fn reads_are_throttled_at_3000_units_a_second() {
        let (_, mut c) = capacity();
        c.stored("g", 4_096);
        for _ in 0..3_000 {
            c.charge("g", Access::Read { consistent: true }).unwrap();
        }
        assert!(c.charge("g", Access::Read { consistent: false }).is_err());
        assert_eq!(c.item("g").unwrap().peak_read_units_per_second, 3_000.0);
    }

    #[test]
    fn sizes_follow_dynamodbs_rule() {
        assert_eq!(
            item_bytes(&serde_json::json!({"ab": "xyz", "n": 12345, "t": true, "z": null})),
            2 + 3 + 1 + 4 + 1 + 1
        );
        assert_eq!(
            item_bytes(&serde_json::json!({"l": [1, "ab"], "m": {"k": 1}})),
            1 + (3 + 2 + 1 + 3) + 1 + (3 + 1 + 1 + 2)
        );
        let gate = Gate::new("payment");
        assert_eq!(gate_item_bytes(&gate), item_bytes(&gate) + 8 + 12);
        let order = OrderId::parse("order-1").unwrap();
        assert_eq!(waiter_item_bytes("p", 7, &order), 8 + 8 + 12 + 7 + 10 + 6);
    }

    /// Through the port: a throttled write is the retryable error and changes nothing;
    /// without a capacity model the same writes all land.
    #[tokio::test]
    async fn the_store_refuses_a_throttled_write_with_a_retryable_error_only_when_modelled() {
        use crate::adapters::embedded::EmbeddedStore;
        use crate::ports::{StateStore, Written};
        let clock = Arc::new(ManualClock::at(1_000_000));
        let modelled = EmbeddedStore::with_capacity(clock.clone());
        let plain = EmbeddedStore::new();
        let mut gate = Gate::new("hot");
        for revision in 0..1_000 {
            let next = Gate { revision: revision + 1, ..gate.clone() };
            assert_eq!(modelled.replace_gate(&next, revision).await, Ok(Written::Applied));
            assert_eq!(plain.replace_gate(&next, revision).await, Ok(Written::Applied));
            gate = next;
        }
        let next = Gate { revision: 1_001, ..gate.clone() };
        assert!(matches!(modelled.replace_gate(&next, 1_000).await, Err(StoreError::Throttled(_))));
        assert_eq!(modelled.gate("hot").await.unwrap().map(|g| g.revision), Some(1_000));
        assert_eq!(plain.replace_gate(&next, 1_000).await, Ok(Written::Applied));
        assert!(plain.capacity().is_none());
        let report = modelled.capacity().unwrap();
        assert_eq!((report.total.throttles, report.total.peak_write_units_per_second), (1, 1_000));
        assert_eq!(report.hottest_item.as_deref(), Some("gate#hot"));
        // A read of the gate is billed to the same item.
        assert_eq!(modelled.item_capacity("gate#hot").unwrap().reads, 1);
        clock.advance(1_000);
        assert_eq!(modelled.replace_gate(&next, 1_000).await, Ok(Written::Applied));
    }
}
