//! Workflow definitions: N ordered steps, each naming the agent that performs it and,
//! optionally, the compensating action that undoes it.
//!
//! Saga terms: a step with a compensation is *compensable*; a step without one is a
//! *pivot* (once it has taken effect the task can only go forward), unless it declares
//! that it has no side effect (`effect: none`, a read), which needs no undoing at all.

use serde::{Deserialize, Serialize};

use super::callback::Callback;
use super::ids::{IdempotencyKey, OrderId};
use super::map::MapStep;
use super::wait::Wait;

/// Which way a step runs: its forward action or its compensation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Do,
    Undo,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Do => "do",
            Action::Undo => "undo",
        }
    }
}

/// The same for every retry and every attempt of one action of one step. It lives with
/// `Action` rather than in `ids.rs` because an action is part of what it names.
pub fn idempotency_key(order_id: &OrderId, step: u32, action: Action) -> IdempotencyKey {
    // `format!("{order_id}:{step}:{action}")`, put together by hand: keys are made for
    // every call and every check of one, and `format!` cost several times the text.
    let mut key = String::with_capacity(order_id.as_str().len() + 17);
    key.push_str(order_id.as_str());
    key.push(':');
    key.push_str(itoa::Buffer::new().format(step));
    key.push(':');
    key.push_str(action.as_str());
    IdempotencyKey(key)
}

/// Whether `key` is exactly `idempotency_key(order_id, step, action)`, without building it:
/// the agent asks this of every request it handles.
pub fn is_idempotency_key(key: &IdempotencyKey, order_id: &OrderId, step: u32, action: Action) -> bool {
    let Some((step_text, action_text)) = key
        .0
        .strip_prefix(order_id.as_str())
        .and_then(|r| r.strip_prefix(':'))
        .and_then(|r| r.split_once(':'))
    else {
        return false;
    };
    // One spelling per step: "7", never "07" or "+7", so the key compares as text.
    let canonical = !step_text.is_empty()
        && step_text.bytes().all(|b| b.is_ascii_digit())
        && (step_text == "0" || !step_text.starts_with('0'));
    canonical && step_text.parse::<u32>() == Ok(step) && action_text == action.as_str()
}

/// Whether a step's forward action changes anything at the remote side.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepEffect {
    /// It changes something (the default): undone by its compensation, or a pivot.
    #[default]
    Writes,
    /// Read-only: running it leaves nothing to undo.
    None,
}

impl StepEffect {
    fn is_writes(&self) -> bool {
        *self == StepEffect::Writes
    }
}

/// A step's place in the saga, from its compensation and its declared effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// Has a compensation that undoes it.
    Compensable,
    /// Changes something and cannot be undone: once it may have taken effect, giving up
    /// must not claim the task was undone.
    Pivot,
    /// Changes nothing.
    ReadOnly,
}

/// A step's throttle budget when it sets none (`Step::max_throttled_ms`): an hour, long
/// past any real rate limit's window, short enough that an order stuck behind a remote
/// that keeps saying "later" is given up and an operator told the same day.
pub const DEFAULT_MAX_THROTTLED_MS: u64 = 3_600_000;

#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// The step's name, e.g. `charge-payment`.
    pub name: String,
    /// The remote service (agent) that performs it, e.g. `payment`. Absent (empty) exactly
    /// for a timer step, which calls nothing.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub agent: String,
    /// A timer step: instead of calling an agent, the task waits (`wait.rs`). A timer has
    /// no agent and no compensation, and nothing to undo.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<Wait>,
    /// A callback step: its agent starts the work and answers at once, and the step ends
    /// when the outside completes it with the step's token (`callback.rs`), or fails when
    /// the callback's timeout or a heartbeat is missed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<Callback>,
    /// The compensating action's name, e.g. `refund-payment`; `None` when the step
    /// has nothing to undo (read-only) or cannot be undone (a pivot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensation: Option<String>,
    #[serde(default, skip_serializing_if = "StepEffect::is_writes")]
    pub effect: StepEffect,
    /// Lapses this step (and, separately, its compensation) may take before the task
    /// gives up; the deployment's failure threshold when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_failures: Option<u32>,
    /// Complete-by of one attempt of this step (and of its compensation), after its
    /// claim; the deployment's step timeout when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The step's throttle budget: how long in all its remote may ask it (and, separately,
    /// its compensation) to wait with 429 or 503 and Retry-After before the task gives up
    /// as for its failure budget; an hour when absent (`DEFAULT_MAX_THROTTLED_MS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_throttled_ms: Option<u64>,
}

impl Step {
    /// A step undone by `compensation`.
    pub fn compensable(name: &str, agent: &str, compensation: &str) -> Step {
        Step {
            name: name.into(),
            agent: agent.into(),
            wait: None,
            callback: None,
            compensation: Some(compensation.into()),
            effect: StepEffect::Writes,
            max_failures: None,
            timeout_ms: None,
            max_throttled_ms: None,
        }
    }
    /// A step that changes something and cannot be undone.
    pub fn pivot(name: &str, agent: &str) -> Step {
        Step {
            name: name.into(),
            agent: agent.into(),
            wait: None,
            callback: None,
            compensation: None,
            effect: StepEffect::Writes,
            max_failures: None,
            timeout_ms: None,
            max_throttled_ms: None,
        }
    }
    /// A step that only reads.
    pub fn read_only(name: &str, agent: &str) -> Step {
        Step { effect: StepEffect::None, ..Step::pivot(name, agent) }
    }
    /// A timer step: it waits, and calls nothing.
    pub fn timer(name: &str, wait: Wait) -> Step {
        Step { wait: Some(wait), ..Step::pivot(name, "") }
    }
    /// This step, waiting for the outside to complete it after its agent answers.
    pub fn with_callback(self, callback: Callback) -> Step {
        Step { callback: Some(callback), ..self }
    }
    pub fn with_max_failures(self, max_failures: u32) -> Step {
        Step { max_failures: Some(max_failures), ..self }
    }
    pub fn with_max_throttled_ms(self, max_throttled_ms: u64) -> Step {
        Step { max_throttled_ms: Some(max_throttled_ms), ..self }
    }

    pub fn kind(&self) -> StepKind {
        // A timer changes nothing anywhere: it is never undone and never stands in the way.
        if self.wait.is_some() {
            return StepKind::ReadOnly;
        }
        match (&self.compensation, self.effect) {
            (Some(_), _) => StepKind::Compensable,
            (None, StepEffect::Writes) => StepKind::Pivot,
            (None, StepEffect::None) => StepKind::ReadOnly,
        }
    }
    pub fn is_pivot(&self) -> bool {
        self.kind() == StepKind::Pivot
    }
    pub fn is_timer(&self) -> bool {
        self.wait.is_some()
    }
    pub fn is_callback(&self) -> bool {
        self.callback.is_some()
    }
}

/// What giving up means for a workflow whose steps can be undone.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnGiveUp {
    /// Undo what may have taken effect, newest first (pivots permitting): Compensated.
    #[default]
    Compensate,
    /// Stop in Error with an alert and undo nothing: an operator decides.
    Fail,
}

impl OnGiveUp {
    fn is_compensate(&self) -> bool {
        *self == OnGiveUp::Compensate
    }
}

pub(crate) fn first_version() -> u32 {
    1
}

fn is_first_version(v: &u32) -> bool {
    *v == 1
}

/// A workflow as the definition file writes it: its steps, some of them parallel stages.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowText {
    pub name: String,
    #[serde(default = "first_version", skip_serializing_if = "is_first_version")]
    pub version: u32,
    #[serde(default, skip_serializing_if = "OnGiveUp::is_compensate")]
    pub on_give_up: OnGiveUp,
    /// Run in this order; a parallel stage runs its steps at once and joins before the next.
    pub steps: Vec<Entry>,
}

/// One entry of a workflow's steps: a step, a parallel stage of steps, or a map step.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Entry {
    Parallel { parallel: StageText },
    Map { map: MapText },
    Step(Step),
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A map step as written: one step run over every item of a list, `max_concurrency` at a
/// time (`map.rs`).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MapText {
    /// The map's name, e.g. `reserve-lines`: its items' outputs are kept as one array
    /// under it, `$.steps.<name>.output`.
    pub name: String,
    /// Where the items come from: `$.order.items`, or `$.steps.<step>.output` and field
    /// names (an array in an earlier step's output); at most 1,000 items.
    pub items: String,
    /// Items in flight at once: 1 to 50.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 50)))]
    pub max_concurrency: u32,
    /// Items that may be refused without the map giving up (0 when absent, at most 1,000);
    /// one more gives up. A refused item's output is `null`.
    #[cfg_attr(feature = "schema", schemars(range(max = 1000)))]
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tolerated_failures: u32,
    /// The step each item runs: an agent step (no timer, no callback), with its own
    /// name, failure budget, timeout and compensation.
    pub step: Step,
}

/// A parallel stage as written: its name and its branches, one step each.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageText {
    /// The stage's name, e.g. `reserve-all`.
    pub name: String,
    /// Its branches, dispatched together: 2 to 10 agent steps (no timers, no callbacks),
    /// each with its own name, attempt, failure budget and compensation.
    #[cfg_attr(feature = "schema", schemars(length(min = 2, max = 10)))]
    pub steps: Vec<Step>,
}

impl<'de> Deserialize<'de> for Entry {
    /// By its one distinguishing key, so a step's typo is reported as the step's own
    /// error (an untagged enum would only say that nothing matched).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Entry, D::Error> {
        use serde::de::Error;
        let value = serde_json::Value::deserialize(d)?;
        if value.get("map").is_some() {
            #[derive(Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Map {
                map: MapText,
            }
            let m: Map = serde_json::from_value(value).map_err(D::Error::custom)?;
            return Ok(Entry::Map { map: m.map });
        }
        match value.get("parallel") {
            Some(_) => {
                #[derive(Deserialize)]
                #[serde(deny_unknown_fields)]
                struct Parallel {
                    parallel: StageText,
                }
                let p: Parallel = serde_json::from_value(value).map_err(D::Error::custom)?;
                Ok(Entry::Parallel { parallel: p.parallel })
            }
            None => serde_json::from_value(value).map(Entry::Step).map_err(D::Error::custom),
        }
    }
}

/// A parallel stage's place among the workflow's steps: its branches are the steps
/// `start..start + len`, so every branch keeps a step index of its own (its idempotency
/// key, its reply's fence) and undoing walks them like any other steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    pub name: String,
    pub start: u32,
    pub len: u32,
}

impl Stage {
    pub fn end(&self) -> u32 {
        self.start + self.len
    }
    pub fn contains(&self, step: u32) -> bool {
        (self.start..self.end()).contains(&step)
    }
    pub fn branches(&self) -> std::ops::Range<u32> {
        self.start..self.end()
    }
}

/// A workflow as sas runs it: its steps in one list, a parallel stage's branches next to
/// each other, and where the stages are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "WorkflowText", into = "WorkflowText")]
pub struct Workflow {
    pub name: String,
    pub version: u32,
    pub on_give_up: OnGiveUp,
    pub steps: Vec<Step>,
    pub stages: Vec<Stage>,
    /// Its map steps (`definitions` allows one per workflow).
    pub maps: Vec<MapStep>,
}

/// The definition file's shape is the schema's: a workflow is written as its text.
#[cfg(feature = "schema")]
impl schemars::JsonSchema for Workflow {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Workflow".into()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        WorkflowText::json_schema(generator)
    }
}

impl From<WorkflowText> for Workflow {
    fn from(text: WorkflowText) -> Workflow {
        let mut steps = Vec::new();
        let mut stages = Vec::new();
        let mut maps = Vec::new();
        for entry in text.steps {
            match entry {
                Entry::Step(step) => steps.push(step),
                Entry::Map { map } => {
                    maps.push(MapStep {
                        name: map.name,
                        at: steps.len() as u32,
                        items: map.items,
                        max_concurrency: map.max_concurrency,
                        tolerated_failures: map.tolerated_failures,
                        gated: false,
                    });
                    steps.push(map.step);
                }
                Entry::Parallel { parallel } => {
                    let start = steps.len() as u32;
                    stages.push(Stage { name: parallel.name, start, len: parallel.steps.len() as u32 });
                    steps.extend(parallel.steps);
                }
            }
        }
        Workflow { name: text.name, version: text.version, on_give_up: text.on_give_up, steps, stages, maps }
    }
}

impl From<Workflow> for WorkflowText {
    fn from(wf: Workflow) -> WorkflowText {
        let mut entries = Vec::new();
        let mut at = 0u32;
        let mut steps = wf.steps.into_iter();
        let mut stages = wf.stages.iter().peekable();
        let empty =
            |s: &Stage| Entry::Parallel { parallel: StageText { name: s.name.clone(), steps: Vec::new() } };
        while let Some(step) = steps.next() {
            while let Some(stage) = stages.next_if(|s| s.start == at && s.len == 0) {
                entries.push(empty(stage));
            }
            if let Some(stage) = stages.next_if(|s| s.start == at) {
                let branches: Vec<Step> =
                    std::iter::once(step).chain(steps.by_ref().take(stage.len as usize - 1)).collect();
                at += stage.len;
                entries.push(Entry::Parallel {
                    parallel: StageText { name: stage.name.clone(), steps: branches },
                });
                continue;
            }
            match wf.maps.iter().find(|m| m.at == at) {
                Some(m) => entries.push(Entry::Map {
                    map: MapText {
                        name: m.name.clone(),
                        items: m.items.clone(),
                        max_concurrency: m.max_concurrency,
                        tolerated_failures: m.tolerated_failures,
                        step,
                    },
                }),
                None => entries.push(Entry::Step(step)),
            }
            at += 1;
        }
        entries.extend(stages.map(empty));
        WorkflowText { name: wf.name, version: wf.version, on_give_up: wf.on_give_up, steps: entries }
    }
}

impl Workflow {
    /// Version 1, compensating on give-up.
    pub fn new(name: &str, steps: Vec<Step>) -> Workflow {
        Workflow {
            name: name.into(),
            version: 1,
            on_give_up: OnGiveUp::Compensate,
            steps,
            stages: Vec::new(),
            maps: Vec::new(),
        }
    }
    /// Version 1 of steps and parallel stages as a definition file writes them.
    pub fn of_entries(name: &str, entries: Vec<Entry>) -> Workflow {
        Workflow::from(WorkflowText {
            name: name.into(),
            version: 1,
            on_give_up: OnGiveUp::Compensate,
            steps: entries,
        })
    }
    /// The map step at `step`, if it is one.
    pub fn map_at(&self, step: u32) -> Option<&MapStep> {
        self.maps.iter().find(|m| m.at == step)
    }
    /// Marks the maps whose step's agent has limits (`limited`) as gated (`MapStep::gated`).
    pub fn gate_maps(&mut self, limited: impl Fn(&str) -> bool) {
        for map in &mut self.maps {
            map.gated = self.steps.get(map.at as usize).is_some_and(|s| limited(&s.agent));
        }
    }
    /// The parallel stage that `step` is a branch of.
    pub fn stage_of(&self, step: u32) -> Option<&Stage> {
        self.stages.iter().find(|s| s.contains(step))
    }
    /// The parallel stage that starts at `step`: what a task at `step` runs, going forward.
    pub fn stage_at(&self, step: u32) -> Option<&Stage> {
        self.stages.iter().find(|s| s.start == step && s.len > 0)
    }
    /// Where a task goes forward after `step`: past the whole stage it belongs to.
    pub fn after(&self, step: u32) -> u32 {
        self.stage_of(step).map_or(step + 1, Stage::end)
    }
    /// The steps that run together at `step`: a stage's branches, or the step alone.
    pub fn together(&self, step: u32) -> std::ops::Range<u32> {
        self.stage_of(step).map_or(step..step + 1, Stage::branches)
    }
    pub fn len(&self) -> u32 {
        self.steps.len() as u32
    }
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
    pub fn step(&self, index: u32) -> Option<&Step> {
        self.steps.get(index as usize)
    }
    /// The index of the step named `name` (names are unique in a workflow: `validate`).
    pub fn step_named(&self, name: &str) -> Option<u32> {
        self.steps.iter().position(|s| s.name == name).map(|i| i as u32)
    }
    /// Whether giving up on this workflow means undoing rather than stopping for an operator.
    pub fn compensates(&self) -> bool {
        self.on_give_up == OnGiveUp::Compensate && self.steps.iter().any(|s| s.compensation.is_some())
    }
    /// The highest step at or below `from` that has a compensation: where undoing starts,
    /// and (with `from = done - 1`) where it goes next. Reverse order by construction.
    pub fn compensable_at_or_below(&self, from: Option<u32>) -> Option<u32> {
        let from = from?;
        (0..=from.min(self.len().saturating_sub(1)))
            .rev()
            .find(|&i| self.steps[i as usize].compensation.is_some())
    }
    /// The last pivot before `step`: when the task is at `step`, every step before it
    /// succeeded, so that pivot's effect stands and the task can only go forward.
    pub fn pivot_before(&self, step: u32) -> Option<u32> {
        (0..step.min(self.len())).rev().find(|&i| self.steps[i as usize].is_pivot())
    }
    /// Lapses step `index` (or its compensation) may take before the task gives up.
    pub fn max_failures(&self, index: u32, default: u32) -> u32 {
        self.step(index).and_then(|s| s.max_failures).unwrap_or(default)
    }
    /// How long in all step `index`'s remote (or its compensation's) may ask it to wait.
    pub fn max_throttled_ms(&self, index: u32) -> u64 {
        self.step(index).and_then(|s| s.max_throttled_ms).unwrap_or(DEFAULT_MAX_THROTTLED_MS)
    }
    /// How long one attempt of step `index` (or its compensation) has after its claim.
    pub fn timeout_ms(&self, index: u32, default: u64) -> u64 {
        self.step(index).and_then(|s| s.timeout_ms).unwrap_or(default)
    }
}

/// The workflows a deployment knows, by name; the first is the default for orders
/// that name none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workflows {
    /// Shared: every handler's settings hold the deployment's workflows, and a clone of
    /// them (a container's, the simulation's each invocation) copies nothing.
    all: std::sync::Arc<[Workflow]>,
}

impl Workflows {
    pub fn new(all: Vec<Workflow>) -> Workflows {
        assert!(!all.is_empty(), "at least one workflow");
        assert!(all.iter().all(|w| !w.is_empty()), "workflows need steps");
        assert!(
            all.iter().flat_map(|w| &w.steps).all(|s| s.max_failures != Some(0)),
            "a step's failure budget is at least one"
        );
        assert!(
            all.iter()
                .flat_map(|w| &w.steps)
                .all(|s| !s.is_timer() || (s.agent.is_empty() && s.compensation.is_none())),
            "a timer step calls no agent and has no compensation"
        );
        assert!(
            all.iter().all(|w| w.stages.iter().all(|st| st.len >= 2
                && w.steps[st.start as usize..st.end() as usize]
                    .iter()
                    .all(|s| !s.is_timer() && !s.is_callback()))),
            "a parallel stage has at least two branches, each an agent step without a timer or callback"
        );
        assert!(
            all.iter().all(|w| w
                .maps
                .iter()
                .all(|m| m.max_concurrency >= 1
                    && w.step(m.at).is_some_and(|s| !s.is_timer() && !s.is_callback()))),
            "a map's step is an agent step without a timer or callback, and its cap is at least one"
        );
        Workflows { all: all.into() }
    }
    /// These workflows with each map gated by whether its agent is `limited`
    /// (`Workflow::gate_maps`); copied only if that changes one.
    pub fn with_gated_maps(self, limited: impl Fn(&str) -> bool) -> Workflows {
        let gated = |w: &Workflow| {
            let mut g = w.clone();
            g.gate_maps(&limited);
            g
        };
        if self.all.iter().all(|w| w.maps.is_empty() || gated(w) == *w) {
            return self;
        }
        Workflows { all: self.all.iter().map(gated).collect() }
    }
    /// The latest version of the first workflow named.
    pub fn default_workflow(&self) -> &Workflow {
        self.get(&self.all[0].name).expect("the first workflow exists")
    }
    /// The latest version of `name`: what a new order runs.
    pub fn get(&self, name: &str) -> Option<&Workflow> {
        self.all.iter().filter(|w| w.name == name).max_by_key(|w| w.version)
    }
    /// The version a task was accepted under: what it runs to the end.
    pub fn get_version(&self, name: &str, version: u32) -> Option<&Workflow> {
        self.all.iter().find(|w| w.name == name && w.version == version)
    }
    /// The versions defined of `name`, in increasing order.
    pub fn versions(&self, name: &str) -> Vec<u32> {
        self.all.iter().filter(|w| w.name == name).map(|w| w.version).collect()
    }
    /// Whether `version` of `name` is newer than any held: published after these
    /// definitions were loaded, as opposed to one removed or never defined.
    pub fn is_newer(&self, name: &str, version: u32) -> bool {
        self.get(name).is_some_and(|latest| version > latest.version)
    }
    /// What an order is accepted under: the version it names, else the latest.
    pub fn for_order(&self, name: &str, version: Option<u32>) -> Option<&Workflow> {
        match version {
            Some(v) => self.get_version(name, v),
            None => self.get(name),
        }
    }
    /// Each name once, in the order first defined.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for w in self.all.iter() {
            if !names.contains(&w.name.as_str()) {
                names.push(&w.name);
            }
        }
        names
    }
    /// Every version of every workflow.
    pub fn all(&self) -> &[Workflow] {
        &self.all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compensation_walks_down_skipping_steps_without_one() {
        let w = Workflow::three_step();
        assert_eq!(w.compensable_at_or_below(Some(2)), Some(1));
        assert_eq!(w.compensable_at_or_below(Some(1)), Some(1));
        assert_eq!(w.compensable_at_or_below(Some(0)), Some(0));
        assert_eq!(w.compensable_at_or_below(None), None);
        assert_eq!(w.compensable_at_or_below(Some(99)), Some(1));
        assert!(!Workflow::single_step().compensates());
        assert_eq!(Workflow::single_step().compensable_at_or_below(Some(0)), None);
    }

    #[test]
    fn a_step_is_compensable_a_pivot_or_read_only() {
        let w = Workflow::three_step();
        let kinds: Vec<StepKind> = w.steps.iter().map(Step::kind).collect();
        assert_eq!(kinds, [StepKind::Compensable, StepKind::Compensable, StepKind::Pivot]);
        assert_eq!(Step::read_only("check", "a").kind(), StepKind::ReadOnly);
        // A compensation makes a step compensable whatever effect it declares.
        let odd = Step { effect: StepEffect::None, ..Step::compensable("a", "a", "undo-a") };
        assert_eq!(odd.kind(), StepKind::Compensable);
    }

    #[test]
    fn the_last_pivot_before_a_step_is_found_and_reads_are_not_pivots() {
        let w = Workflow::new(
            "w",
            vec![
                Step::read_only("check", "a"),
                Step::pivot("ship", "a"),
                Step::compensable("invoice", "a", "void"),
                Step::pivot("notify", "a"),
            ],
        );
        assert_eq!(w.pivot_before(0), None);
        assert_eq!(w.pivot_before(1), None, "the check before it only read");
        assert_eq!(w.pivot_before(2), Some(1));
        assert_eq!(w.pivot_before(3), Some(1));
        assert_eq!(w.pivot_before(4), Some(3));
        assert_eq!(w.pivot_before(99), Some(3));
        assert_eq!(Workflow::three_step().pivot_before(2), None);
    }

    #[test]
    fn each_step_has_its_own_failure_budget_defaulting_to_the_deployments() {
        let w = Workflow::new("w", vec![Step::pivot("a", "a").with_max_failures(7), Step::pivot("b", "a")]);
        assert_eq!((w.max_failures(0, 3), w.max_failures(1, 3), w.max_failures(9, 3)), (7, 3, 3));
    }

    #[test]
    fn a_step_reads_from_json_with_its_defaults() {
        let s: Step =
            serde_json::from_str(r#"{"name":"ship","agent":"shipping","compensation":null}"#).unwrap();
        assert_eq!(s, Step::pivot("ship", "shipping"));
        let s: Step = serde_json::from_str(
            r#"{"name":"check","agent":"a","compensation":null,"effect":"none","max_failures":2}"#,
        )
        .unwrap();
        assert_eq!(s, Step::read_only("check", "a").with_max_failures(2));
        assert_eq!(serde_json::to_string(&Step::pivot("p", "a")).unwrap(), r#"{"name":"p","agent":"a"}"#);
    }

    #[test]
    fn a_timer_step_reads_from_json_without_an_agent_and_is_never_undone() {
        let s: Step = serde_json::from_str(r#"{"name":"cool-off","wait":{"for_ms":86400000}}"#).unwrap();
        assert_eq!(s, Step::timer("cool-off", Wait::for_ms(86_400_000)));
        assert_eq!(s.kind(), StepKind::ReadOnly);
        assert_eq!(serde_json::to_string(&s).unwrap(), r#"{"name":"cool-off","wait":{"for_ms":86400000}}"#);
        let w = Workflow::new(
            "w",
            vec![Step::compensable("charge", "pay", "refund"), s, Step::pivot("ship", "ship")],
        );
        assert_eq!(w.compensable_at_or_below(Some(1)), Some(0), "undoing walks past the timer");
        assert_eq!(w.pivot_before(2), None, "a timer is no pivot");
    }

    #[test]
    fn a_key_is_recognised_exactly_as_it_is_made() {
        let id = OrderId::parse("o-1").unwrap();
        for (step, action) in [(0, Action::Do), (7, Action::Undo), (19, Action::Do), (u32::MAX, Action::Undo)]
        {
            assert!(is_idempotency_key(&idempotency_key(&id, step, action), &id, step, action));
        }
        let key = |s: &str| IdempotencyKey(s.into());
        for wrong in [
            "o-1:1:do",
            "o-1:0:undo",
            "o-1:00:do",
            "o-1:+0:do",
            "o-1::do",
            "o-10:0:do",
            "o-1:0:do:",
            "o-1:0",
            "o-1-0-do",
            "",
        ] {
            assert!(!is_idempotency_key(&key(wrong), &id, 0, Action::Do), "{wrong:?}");
        }
    }
}
