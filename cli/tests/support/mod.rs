//! What this crate's emulator-backed tests share.

/// Set by infra/with-moto.sh to the moto server it started.
pub const ENDPOINT_VAR: &str = "SAS_TEST_ENDPOINT";

/// The endpoint to test against, or `None` after a loud SKIPPED line. Panics under
/// `CI=true` when there is none: CI must never go green by skipping. The rule of
/// tests/src/lib.rs, which this crate cannot depend on (it depends on this one).
pub fn endpoint(test: &str) -> Option<String> {
    if let Some(e) = std::env::var(ENDPOINT_VAR).ok().filter(|e| !e.trim().is_empty()) {
        return Some(e);
    }
    let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    assert!(
        !ci,
        "{test}: CI=true but {ENDPOINT_VAR} is not set. Emulator-backed tests must run in CI: \
         run them under infra/with-moto.sh (it installs and starts moto and sets {ENDPOINT_VAR})."
    );
    // Straight to stderr, past libtest's capture: a skip must be seen.
    let line = format!(
        "*** SKIPPED: moto not running: {test} needs {ENDPOINT_VAR} (run under infra/with-moto.sh) ***\n"
    );
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    None
}
