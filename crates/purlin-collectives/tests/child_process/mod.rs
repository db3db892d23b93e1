//! Real processes for tests: a test re-runs its own executable as a child, selected by
//! `--exact <test name>` and told its role through environment variables.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// The role variable: unset in the parent, set in children.
pub const ROLE: &str = "PURLIN_TEST_ROLE";

/// What torchrun gives rank `rank` of `world` on this machine, plus [`ROLE`] = "torchrun"
/// (a child that is one of its ranks).
pub fn torchrun_env(rank: usize, world: usize, port: &str, run_id: &str) -> Vec<(&'static str, String)> {
    vec![
        (ROLE, "torchrun".to_string()),
        ("RANK", rank.to_string()),
        ("LOCAL_RANK", rank.to_string()),
        ("WORLD_SIZE", world.to_string()),
        ("LOCAL_WORLD_SIZE", world.to_string()),
        ("MASTER_ADDR", "127.0.0.1".to_string()),
        ("MASTER_PORT", port.to_string()),
        ("TORCHELASTIC_RUN_ID", run_id.to_string()),
    ]
}

/// This process's role, if it is a child.
pub fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// A child running `test` (an exact test name) of this executable with `env`.
pub struct Kid {
    pub child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    pub name: String,
}

impl Kid {
    pub fn spawn(test: &str, ignored: bool, env: &[(&str, String)]) -> Kid {
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = Command::new(exe);
        cmd.args([test, "--exact", "--nocapture", "--test-threads=1"]);
        if ignored {
            cmd.arg("--ignored");
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("spawn child test process");
        let stdout: ChildStdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        let name = env.iter().map(|(k, v)| format!("{k}={v:.12}")).collect::<Vec<_>>().join(" ");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                println!("    [child] {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Kid { child, lines: rx, name }
    }

    /// Waits (bounded) for a stdout line containing `prefix` (the harness may print `test name ... ` before it on the same line); returns it.
    pub fn expect_line(&self, prefix: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(prefix) => return l,
                Ok(_) => {}
                Err(_) => panic!("child {} did not print {prefix:?} within {within:?}", self.name),
            }
        }
    }

    /// Waits (bounded) for the child to exit; kills it on overrun. Returns its success.
    pub fn finish(mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return status.success(),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    panic!("child {} did not exit within {within:?}", self.name);
                }
            }
        }
    }

    /// SIGKILL.
    pub fn kill(mut self) {
        self.child.kill().expect("kill child");
        let _ = self.child.wait();
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
