use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::capacity::{self, Access, Capacity, CapacityReport, ItemUsage};
use crate::domain::gate::{CallMark, CallStart, Gate};
use crate::domain::{OrderId, ProcessState, TaskRecord, Timestamp};
use crate::ports::{
    CallStarts, Clock, Inserted, Listing, NOT_INDEXED, Noted, StateStore, StoreError, TaskListing, Written,
};

/// One landed write of a task record, for history and invariant checks. Its records are
/// shared with the table (and with the next write's `before`): a write copies its record
/// once, however many places keep it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteRecord {
    pub before: Option<Arc<TaskRecord>>,
    pub after: Arc<TaskRecord>,
}

#[derive(Default)]
struct Tables {
    tasks: HashMap<OrderId, Arc<TaskRecord>>,
    /// The sparse due index: (deadline, order id) of every task that has a deadline.
    due: BTreeSet<(Timestamp, OrderId)>,
    /// The sparse error index: (updated_at, order id) of every task in Error.
    errors: BTreeSet<(Timestamp, OrderId)>,
    /// The sparse finished index, for a store that keeps one (`with_finished_index`):
    /// (updated_at, order id) of every Processed or Compensated task.
    finished: Option<BTreeSet<(Timestamp, OrderId)>>,
    log: Vec<WriteRecord>,
    gates: HashMap<String, Gate>,
    waiters: HashMap<(String, u64), OrderId>,
    /// Limited agents' call marks (`CallStarts`), by key, with their expiry. Kept past
    /// it, as DynamoDB may keep an expired item a while and its conditions still see it.
    calls: HashMap<String, Timestamp>,
    /// Index entries read by `due`, as a sweep-cost measure.
    due_items_read: u64,
    /// Index entries read by `list`, likewise.
    list_items_read: u64,
}

/// The state table and its due index behind one lock, so every conditional write is atomic
/// exactly as DynamoDB's are. With a capacity model (`with_capacity`), each item's reads
/// and writes are billed and throttled as DynamoDB's (`capacity`); without one, nothing is.
#[derive(Default)]
pub struct EmbeddedStore {
    tables: Mutex<Tables>,
    /// Taken only under `tables`' lock, so a request is billed and applied at once.
    capacity: Option<Mutex<Capacity>>,
}

impl EmbeddedStore {
    pub fn new() -> EmbeddedStore {
        EmbeddedStore::default()
    }
    /// A store that bills each item's reads and writes by size and throttles an item
    /// above DynamoDB's per-item rates, counted on `clock` (`capacity`).
    pub fn with_capacity(clock: Arc<dyn Clock>) -> EmbeddedStore {
        EmbeddedStore { tables: Mutex::default(), capacity: Some(Mutex::new(Capacity::new(clock))) }
    }
    /// The same store, keeping the finished index too (`Listing::Finished`), as a
    /// deployment does with `LIST_FINISHED=true`.
    pub fn with_finished_index(self) -> EmbeddedStore {
        self.tables().finished.get_or_insert_with(BTreeSet::new);
        self
    }
    fn tables(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn meter(&self) -> Option<std::sync::MutexGuard<'_, Capacity>> {
        self.capacity.as_ref().map(|c| c.lock().unwrap_or_else(|p| p.into_inner()))
    }
    /// Bills `access` to `key` (throttled: the error), when capacity is modelled.
    fn charge(&self, key: &str, access: Access) -> Result<(), StoreError> {
        self.meter().map_or(Ok(()), |mut c| c.charge(key, access))
    }
    /// Notes an item's size after a write that landed, when capacity is modelled.
    fn stored(&self, key: &str, bytes: Option<usize>) {
        if let (Some(mut c), Some(bytes)) = (self.meter(), bytes) {
            c.stored(key, bytes);
        }
    }
    /// Every item's billed units and throttles, summed, with the hottest item's peak
    /// rates; `None` without a capacity model.
    pub fn capacity(&self) -> Option<CapacityReport> {
        self.meter().map(|c| c.report_where(|_| true))
    }
    /// The same over the items whose DynamoDB key `keep` keeps (`gate#<agent>` for a
    /// gate, `gate#<agent>#<ticket>` for a waiter note, the order id for a task).
    pub fn capacity_where(&self, keep: impl Fn(&str) -> bool) -> Option<CapacityReport> {
        self.meter().map(|c| c.report_where(keep))
    }
    /// One item's use, by its DynamoDB key.
    pub fn item_capacity(&self, key: &str) -> Option<ItemUsage> {
        self.meter().and_then(|c| c.item(key))
    }
    /// Every landed task write so far, in order.
    pub fn writes(&self) -> Vec<WriteRecord> {
        self.tables().log.clone()
    }
    /// Every landed task write so far, in order, taken out of the log (which is left
    /// empty): for a run that is over, without copying every record.
    pub fn take_writes(&self) -> Vec<WriteRecord> {
        std::mem::take(&mut self.tables().log)
    }
    /// One task's writes, in order.
    pub fn history(&self, id: &OrderId) -> Vec<TaskRecord> {
        self.tables()
            .log
            .iter()
            .filter(|w| &w.after.order_id == id)
            .map(|w| TaskRecord::clone(&w.after))
            .collect()
    }
    pub fn tasks(&self) -> Vec<TaskRecord> {
        let mut all: Vec<_> = self.tables().tasks.values().map(|t| TaskRecord::clone(t)).collect();
        all.sort_by(|a, b| a.order_id.cmp(&b.order_id));
        all
    }
    /// The tasks `keep` keeps, as `tasks` orders them, copying no other record.
    pub fn tasks_where(&self, keep: impl Fn(&TaskRecord) -> bool) -> Vec<TaskRecord> {
        let mut all: Vec<_> =
            self.tables().tasks.values().filter(|t| keep(t)).map(|t| TaskRecord::clone(t)).collect();
        all.sort_by(|a, b| a.order_id.cmp(&b.order_id));
        all
    }
    /// One task as stored, outside the port (no injected faults), for checkers.
    pub fn peek(&self, id: &OrderId) -> Option<TaskRecord> {
        self.tables().tasks.get(id).map(|t| TaskRecord::clone(t))
    }
    /// One task's revision as stored, outside the port, without copying the record.
    pub fn peek_revision(&self, id: &OrderId) -> Option<u64> {
        self.tables().tasks.get(id).map(|t| t.revision)
    }
    /// Tasks per state, without copying records (cheap enough to poll for progress).
    pub fn state_counts(&self) -> std::collections::BTreeMap<crate::domain::ProcessState, usize> {
        let mut counts = std::collections::BTreeMap::new();
        for task in self.tables().tasks.values() {
            *counts.entry(task.state()).or_default() += 1;
        }
        counts
    }
    /// An agent's gate as stored, outside the port, for checkers and reports.
    pub fn peek_gate(&self, agent: &str) -> Option<Gate> {
        self.tables().gates.get(agent).cloned()
    }
    /// The keys of every call mark written (`CallStarts`), in order, for checkers.
    pub fn call_marks(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.tables().calls.keys().cloned().collect();
        keys.sort();
        keys
    }
    pub fn due_items_read(&self) -> u64 {
        self.tables().due_items_read
    }
    /// Index entries read by `list` so far.
    pub fn list_items_read(&self) -> u64 {
        self.tables().list_items_read
    }
    fn index(t: &mut Tables, before: Option<&TaskRecord>, after: &TaskRecord) {
        let id = &after.order_id;
        let error_key = |task: &TaskRecord| (task.state() == ProcessState::Error).then_some(task.updated_at);
        if let Some(updated) = before.and_then(error_key) {
            t.errors.remove(&(updated, id.clone()));
        }
        if let Some(updated) = error_key(after) {
            t.errors.insert((updated, id.clone()));
        }
        // Processed and Compensated are never left: a task enters this index once.
        if let Some(finished) = &mut t.finished
            && matches!(after.state(), ProcessState::Processed | ProcessState::Compensated)
            && before.is_none_or(|b| b.state() != after.state())
        {
            finished.insert((after.updated_at, id.clone()));
        }
        if before.map(|b| b.deadline()) == Some(after.deadline()) {
            return;
        }
        if let Some(deadline) = before.and_then(|b| b.deadline()) {
            t.due.remove(&(deadline, id.clone()));
        }
        if let Some(deadline) = after.deadline() {
            t.due.insert((deadline, id.clone()));
        }
    }
}

#[async_trait]
impl StateStore for EmbeddedStore {
    async fn insert(&self, task: &TaskRecord) -> Result<Inserted, StoreError> {
        let bytes = self.capacity.as_ref().map(|_| capacity::task_item_bytes(task));
        let mut t = self.tables();
        // A conditional PutItem: billed, refused condition or not.
        self.charge(task.order_id.as_str(), Access::Write { bytes: bytes.unwrap_or(0) })?;
        if let Some(existing) = t.tasks.get(&task.order_id) {
            return Ok(Inserted::Exists(Box::new(TaskRecord::clone(existing))));
        }
        self.stored(task.order_id.as_str(), bytes);
        let task = Arc::new(task.clone());
        t.tasks.insert(task.order_id.clone(), task.clone());
        Self::index(&mut t, None, &task);
        t.log.push(WriteRecord { before: None, after: task });
        Ok(Inserted::New)
    }

    async fn task(&self, id: &OrderId) -> Result<Option<TaskRecord>, StoreError> {
        let t = self.tables();
        self.charge(id.as_str(), Access::Read { consistent: true })?;
        Ok(t.tasks.get(id).map(|t| TaskRecord::clone(t)))
    }

    async fn replace(&self, next: &TaskRecord, expected_revision: u64) -> Result<Written, StoreError> {
        let bytes = self.capacity.as_ref().map(|_| capacity::task_item_bytes(next));
        let mut t = self.tables();
        self.charge(next.order_id.as_str(), Access::Write { bytes: bytes.unwrap_or(0) })?;
        let Some(current) = t.tasks.get_mut(&next.order_id) else { return Ok(Written::RevisionMoved) };
        let lands = current.revision == expected_revision
            // The planted bug of `Mutation::UnconditionalClaim`: claims skip the condition.
            || (crate::mutations::claim_unconditional()
                && matches!(next.last_cause, crate::domain::Cause::Claimed { .. }))
            // The planted bug of `Mutation::OperatorBlindWrite`: operators' writes too.
            || (crate::mutations::operator_blind_write()
                && matches!(next.last_cause, crate::domain::Cause::Operator { .. }));
        if !lands {
            return Ok(Written::RevisionMoved);
        }
        // The record it replaces is the write's `before`: moved out, not copied.
        self.stored(next.order_id.as_str(), bytes);
        let next = Arc::new(next.clone());
        let before = std::mem::replace(current, next.clone());
        Self::index(&mut t, Some(&before), &next);
        t.log.push(WriteRecord { before: Some(before), after: next });
        Ok(Written::Applied)
    }

    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<OrderId>, StoreError> {
        let mut t = self.tables();
        let ids: Vec<OrderId> =
            t.due.iter().take_while(|(d, _)| *d <= now).take(limit).map(|(_, id)| id.clone()).collect();
        t.due_items_read += ids.len() as u64;
        Ok(ids)
    }

    async fn gate(&self, agent: &str) -> Result<Option<Gate>, StoreError> {
        let t = self.tables();
        if self.capacity.is_some() {
            self.charge(&capacity::gate_key(agent), Access::Read { consistent: true })?;
        }
        Ok(t.gates.get(agent).cloned())
    }

    async fn replace_gate(&self, next: &Gate, expected_revision: u64) -> Result<Written, StoreError> {
        let bytes = self.capacity.as_ref().map(|_| capacity::gate_item_bytes(next));
        let mut t = self.tables();
        let key = bytes.map(|_| capacity::gate_key(&next.agent));
        if let (Some(key), Some(bytes)) = (&key, bytes) {
            self.charge(key, Access::Write { bytes })?;
        }
        let stored = t.gates.get(&next.agent).map_or(0, |g| g.revision);
        // The planted bug of `Mutation::GateBlindWrite`: the gate is written whatever moved.
        if stored != expected_revision && !crate::mutations::gate_blind_write() {
            return Ok(Written::RevisionMoved);
        }
        if let Some(key) = &key {
            self.stored(key, bytes);
        }
        t.gates.insert(next.agent.clone(), next.clone());
        Ok(Written::Applied)
    }

    async fn put_waiter(
        &self,
        agent: &str,
        ticket: u64,
        order_id: &OrderId,
        _now: Timestamp,
    ) -> Result<Noted, StoreError> {
        let mut t = self.tables();
        if self.capacity.is_some() {
            let (key, bytes) =
                (capacity::waiter_key(agent, ticket), capacity::waiter_item_bytes(agent, ticket, order_id));
            self.charge(&key, Access::Write { bytes })?;
            if t.waiters.get(&(agent.to_owned(), ticket)).is_none_or(|noted| noted == order_id) {
                self.stored(&key, Some(bytes));
            }
        }
        match t.waiters.entry((agent.to_owned(), ticket)) {
            Entry::Occupied(noted) if noted.get() != order_id => Ok(Noted::HeldByAnother),
            Entry::Occupied(_) => Ok(Noted::Applied),
            Entry::Vacant(free) => {
                free.insert(order_id.clone());
                Ok(Noted::Applied)
            }
        }
    }

    async fn waiter(&self, agent: &str, ticket: u64) -> Result<Option<OrderId>, StoreError> {
        let t = self.tables();
        if self.capacity.is_some() {
            self.charge(&capacity::waiter_key(agent, ticket), Access::Read { consistent: true })?;
        }
        Ok(t.waiters.get(&(agent.to_owned(), ticket)).cloned())
    }
}

#[async_trait]
impl CallStarts for EmbeddedStore {
    async fn start_call(&self, mark: &CallMark) -> Result<CallStart, StoreError> {
        match self.tables().calls.entry(mark.key.clone()) {
            Entry::Occupied(_) => Ok(CallStart::AlreadyStarted),
            Entry::Vacant(free) => {
                free.insert(mark.until);
                Ok(CallStart::Started)
            }
        }
    }
}

/// The newest `limit` of a sparse index keyed (updated_at, order id), from `since` on.
fn newest(index: &BTreeSet<(Timestamp, OrderId)>, since: Option<Timestamp>, limit: usize) -> Vec<OrderId> {
    index
        .iter()
        .rev()
        .take_while(|(updated, _)| since.is_none_or(|s| *updated >= s))
        .take(limit)
        .map(|(_, id)| id.clone())
        .collect()
}

#[async_trait]
impl TaskListing for EmbeddedStore {
    async fn list(&self, listing: &Listing, limit: usize) -> Result<Vec<TaskRecord>, StoreError> {
        let mut t = self.tables();
        let keys: Vec<OrderId> = match listing {
            Listing::Errors { since } => newest(&t.errors, *since, limit),
            Listing::Live => t.due.iter().take(limit).map(|(_, id)| id.clone()).collect(),
            Listing::Finished { since } => match &t.finished {
                Some(finished) => newest(finished, *since, limit),
                None => return Err(StoreError::NotIndexed(NOT_INDEXED.to_owned())),
            },
        };
        t.list_items_read += keys.len() as u64;
        Ok(keys.iter().filter_map(|id| t.tasks.get(id).map(|t| TaskRecord::clone(t))).collect())
    }
}
