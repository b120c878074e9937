//! The web console in a real browser: `sasctl up` over moto (infra/with-moto.sh sets
//! SAS_TEST_ENDPOINT) with a workflow whose first step waits for a callback, one order
//! sent, then scripts/console-browser.py drives headless Chromium through the URL `up`
//! printed: the order in the list, its page (graph, timeline), its callback completed from
//! the page (dry run, then confirm), the task shown Processed. Screenshots of each stage
//! go to <target dir>/console-screenshots/; a blank one fails the test.
//!
//! Ignored by `cargo test`: scripts/test.sh runs it as a step of its own
//! (`cargo test -p sasctl --test console_browser -- --ignored`), after
//! scripts/browser-deps.sh (chromium, chromium-driver) and scripts/browser-venv.sh
//! (Selenium; its python in SAS_BROWSER_PYTHON). Without them it prints a loud SKIPPED
//! line and passes, except under CI=true, where it fails.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod support;
#[allow(dead_code)]
#[path = "support/up.rs"]
mod up;
#[allow(dead_code)]
#[path = "support/waiting.rs"]
mod waiting;

/// The repository's root (cli/ is one level down).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The venv's python, chromium and chromedriver, or why not (a skip, or a failure under CI).
fn browser() -> Option<PathBuf> {
    let python = std::env::var_os("SAS_BROWSER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv-tools/browser/bin/python"));
    let chromium = std::env::var_os("SAS_CHROMIUM").map_or("/usr/bin/chromium".into(), PathBuf::from);
    let driver = std::env::var_os("SAS_CHROMEDRIVER").map_or("/usr/bin/chromedriver".into(), PathBuf::from);
    let missing: Vec<String> = [&python, &chromium, &driver]
        .iter()
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    if missing.is_empty() {
        return Some(python);
    }
    let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    assert!(
        !ci,
        "CI=true but the browser test lacks {}: scripts/test.sh installs them (scripts/browser-deps.sh, scripts/browser-venv.sh)",
        missing.join(", ")
    );
    let line = format!(
        "*** SKIPPED: the console's browser test lacks {} (run scripts/browser-deps.sh and scripts/browser-venv.sh) ***\n",
        missing.join(", ")
    );
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    None
}

#[tokio::test]
#[ignore = "scripts/test.sh runs it in a step of its own, with the browser installed"]
async fn an_operator_completes_a_callback_from_the_console_in_a_browser() {
    let Some(endpoint) = support::endpoint("an_operator_completes_a_callback_from_the_console_in_a_browser")
    else {
        return;
    };
    let Some(python) = browser() else { return };
    let prefix = format!("web-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let dir = std::env::temp_dir().join(format!("sasctl-{prefix}"));
    std::fs::create_dir_all(&dir).unwrap();
    let workflows = dir.join("definitions.json");
    std::fs::write(&workflows, waiting::DEFINITIONS).unwrap();
    let up = up::Up::start(&endpoint, &prefix, &workflows).await;
    let line = up
        .wait_for_line(
            |l| l.starts_with("  http://127.0.0.1:") && l.contains("/?token="),
            Duration::from_secs(5),
        )
        .await;
    let url = line.trim().to_owned();

    let sdk = sasctl::endpoint::sdk_config(&endpoint).await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let queue = sqs.get_queue_url().queue_name(format!("{prefix}-orders")).send().await.unwrap();
    let order = r#"{"order_id":"web-1","customer_id":"c-1","items":[{"sku":"A-1","quantity":1}],"workflow":"approve-first"}"#;
    sqs.send_message().queue_url(queue.queue_url().unwrap()).message_body(order).send().await.unwrap();

    let target = std::env::var_os("CARGO_TARGET_DIR").map_or(root().join("target"), PathBuf::from);
    let shots = target.join("console-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    let script = root().join("scripts/console-browser.py");
    let run = tokio::process::Command::new(&python).arg(&script).arg(&url).arg("web-1").arg(&shots).output();
    let out =
        tokio::time::timeout(Duration::from_secs(300), run).await.expect("the browser test ends").unwrap();
    up.interrupt();
    let (_, stdout, stderr) = up.finish(Duration::from_secs(60)).await;
    assert!(
        out.status.success(),
        "{} failed:\n{}{}\nsasctl up:\n{stdout}\n{stderr}",
        script.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let pngs = std::fs::read_dir(&shots)
        .unwrap()
        .filter(|e| e.as_ref().is_ok_and(|e| e.path().extension().is_some_and(|x| x == "png")))
        .count();
    assert_eq!(pngs, 5, "five screenshots in {}", shots.display());
    assert!(stdout.lines().any(|l| l.contains(" Processed ") && l.contains(" web-1 ")), "{stdout}");

    let clients = sas::adapters::aws::Clients::new(&sdk);
    let layout = sas::adapters::aws::provision::Layout::standard(&prefix);
    let all = sasctl::resources::existing(&clients, &layout).await.expect("listed");
    assert!(sasctl::resources::remove(&clients, &all).await.is_empty(), "tidied up after the test");
    std::fs::remove_dir_all(&dir).unwrap();
}
