//! `up`'s web console: `sasctl console` started beside the functions as a child process
//! of the same binary, with exactly the environment `up` prints for later commands
//! (`UpOptions::exports`), so it finds this run's resources as `sasctl tasks` would. It
//! ends with `up` (killed when `up` drops it, or when `up` itself dies).

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncBufReadExt as _;

/// How long the console has to connect (find the table, the caller) and print its URL.
const START_WAIT: Duration = Duration::from_secs(60);

/// The console while it runs: its URL, with the token.
pub struct Console {
    pub url: String,
    _child: tokio::process::Child,
}

/// Starts `sasctl console --json` with `exports` set, and reads its URL.
pub async fn start(exports: &[(&'static str, String)]) -> Result<Console, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding sasctl itself: {e}"))?;
    let mut command = tokio::process::Command::new(exe);
    command
        .args(["console", "--json"])
        // Only what `up` exports names the deployment.
        .env_remove(crate::deployment::STACK_VAR)
        .env_remove(crate::tasks::WORKFLOWS_VAR)
        .envs(exports.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe; it only asks for SIGTERM when `up` dies.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(|e| format!("starting sasctl console: {e}"))?;
    let stdout = child.stdout.take().ok_or("sasctl console: no stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = match tokio::time::timeout(START_WAIT, lines.next_line()).await {
        Ok(Ok(Some(line))) => line,
        Ok(_) => return Err("sasctl console stopped before printing its URL (its reason is above)".into()),
        Err(_) => return Err(format!("sasctl console printed no URL within {} s", START_WAIT.as_secs())),
    };
    let url = serde_json::from_str::<serde_json::Value>(&line)
        .ok()
        .and_then(|v| v["url"].as_str().map(str::to_owned))
        .ok_or_else(|| format!("sasctl console printed {line:?}, not its URL"))?;
    Ok(Console { url, _child: child })
}
