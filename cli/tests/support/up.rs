//! A running `sasctl up` as a test drives it: the built binary as a child process, its
//! output collected line by line, waited on, interrupted as Ctrl-C does. Shared by
//! up.rs and console_browser.rs.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running `sasctl up`, its output collected as it comes. Start one with
/// [`Up::start`], wait for what it prints, stop it with [`Up::interrupt`] and
/// [`Up::finish`]. Tests that run other commands against the same resources while
/// it runs (or between two runs) take the prefix and endpoint from here.
pub struct Up {
    child: Child,
    pub endpoint: String,
    pub prefix: String,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
}

pub fn collect(stream: impl std::io::Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let kept = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            kept.lock().unwrap().push(line);
        }
    });
    lines
}

impl Up {
    /// Starts `sasctl up` on `prefix` with `workflows`, and waits (bounded) until it says
    /// it is running.
    pub async fn start(endpoint: &str, prefix: &str, workflows: &Path) -> Up {
        Up::start_with(endpoint, prefix, workflows, &[]).await
    }

    /// [`Up::start`] with these variables set (the functions' tuning, e.g. STEP_TIMEOUT_MS).
    pub async fn start_with(endpoint: &str, prefix: &str, workflows: &Path, vars: &[(&str, &str)]) -> Up {
        let workflows = workflows.to_str().expect("a UTF-8 path");
        Up::start_args(endpoint, prefix, &["--workflows", workflows], vars).await
    }

    /// `sasctl up` on `prefix` with more arguments `args` and variables `vars`, waited for
    /// (bounded) until it says it is running.
    pub async fn start_args(endpoint: &str, prefix: &str, args: &[&str], vars: &[(&str, &str)]) -> Up {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sasctl"))
            .envs(vars.iter().copied())
            .args(["up", "--endpoint-url", endpoint, "--prefix", prefix, "--supervisor-period-ms", "1000"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sasctl runs");
        let stdout = collect(child.stdout.take().unwrap());
        let stderr = collect(child.stderr.take().unwrap());
        let up = Up { child, endpoint: endpoint.to_owned(), prefix: prefix.to_owned(), stdout, stderr };
        up.wait_for_line(|l| l.starts_with("running; Ctrl-C stops"), Duration::from_secs(90)).await;
        up
    }

    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().join("\n")
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    /// The first line of stdout that `matches`, waiting for it up to `within`.
    pub async fn wait_for_line(&self, matches: impl Fn(&str) -> bool, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            if let Some(line) = self.stdout.lock().unwrap().iter().find(|l| matches(l)) {
                return line.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no such line within {within:?}.\nstdout:\n{}\nstderr:\n{}",
                self.stdout(),
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends SIGINT, as Ctrl-C does.
    pub fn interrupt(&self) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: a plain kill(2) of our own child, which has not been reaped yet.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0, "SIGINT sent");
    }

    /// Waits (bounded) for the process to exit; its status, stdout and stderr.
    pub async fn finish(mut self, within: Duration) -> (ExitStatus, String, String) {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The reader threads see end of file once the process is gone.
                let drained = Instant::now() + Duration::from_secs(5);
                while Instant::now() < drained && !self.stdout().contains("\nstopped: ") {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                return (status, self.stdout(), self.stderr());
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!(
                    "sasctl up still running {within:?} after SIGINT.\nstdout:\n{}\nstderr:\n{}",
                    self.stdout(),
                    self.stderr()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
