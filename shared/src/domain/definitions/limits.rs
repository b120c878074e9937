//! The bounds a definition file is held to: step timeouts, steps and branches per
//! workflow, failures, and names.

/// The shortest and longest complete-by a step may have, as for the deployment's own
/// `STEP_TIMEOUT_MS`: Lambda's 15-minute limit is far off, but a step's attempt must end
/// well inside the agent function's timeout.
pub const MIN_STEP_TIMEOUT_MS: u64 = 1_000;
pub const MAX_STEP_TIMEOUT_MS: u64 = 50_000;
/// Steps per workflow: every step's key and status fit in one task item many times over.
pub const MAX_STEPS: usize = 20;
/// Branches of one parallel stage. They count as steps towards `MAX_STEPS`, which bounds
/// the outputs a record keeps; this bounds the branch replies that race on one record
/// (each round of conflicting writes lands one) and the dispatches of one claim.
pub const MAX_BRANCHES: usize = 10;
pub const MAX_FAILURES: u32 = 100;
/// A step's throttle budget (`max_throttled_ms`, `workflow::DEFAULT_MAX_THROTTLED_MS` when
/// absent): at least a second (the shortest pause a Retry-After gets), at most a week.
pub const MIN_MAX_THROTTLED_MS: u64 = 1_000;
pub const MAX_MAX_THROTTLED_MS: u64 = 7 * 24 * 3_600_000;
pub const MAX_NAME_LEN: usize = 64;

/// A name of the file's own (an agent, workflow, stage or step): 1 to `MAX_NAME_LEN` of
/// A-Z a-z 0-9 - _.
pub(super) fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}
