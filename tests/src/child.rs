//! Running `roce` as a child process in a namespace, killed on drop so that a failing test
//! leaves no endpoint running.

use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

use crate::roce_bin;

/// A `roce` child process; killed (and reaped) on drop unless [`finish`]ed.
#[derive(Debug)]
pub struct Reaper(Option<Child>);

impl Reaper {
    /// The child's PID.
    ///
    /// # Panics
    /// After [`finish`].
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.0.as_ref().expect("running child").id()
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `roce -j --netns NS ARGS...` (no `--netns` when `ns` is empty) with stdout and
/// stderr captured.
///
/// # Panics
/// When the binary cannot be started.
#[must_use]
pub fn spawn(ns: &str, args: &[String]) -> Reaper {
    let mut cmd = Command::new(roce_bin());
    cmd.arg("-j");
    if !ns.is_empty() {
        cmd.args(["--netns", ns]);
    }
    let c = cmd
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn roce");
    Reaper(Some(c))
}

/// Waits for the child to exit and returns what it printed.
///
/// # Panics
/// When waiting fails.
#[must_use]
pub fn finish(mut r: Reaper) -> Output {
    r.0.take()
        .expect("running child")
        .wait_with_output()
        .expect("wait for roce")
}

/// The JSON a successful run printed.
///
/// # Panics
/// When the run failed or its output is not JSON (the message shows both streams).
#[track_caller]
#[must_use]
pub fn json_ok(o: &Output, what: &str) -> Value {
    assert!(
        o.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{what}: bad JSON ({e}): {}",
            String::from_utf8_lossy(&o.stdout)
        )
    })
}

/// Splits a command line on whitespace.
#[must_use]
pub fn args(line: &str) -> Vec<String> {
    line.split_whitespace().map(String::from).collect()
}
