//! Running `roce` as a child process in a namespace, killed on drop so that a failing test
//! leaves no endpoint running.

use std::{
    io::Read,
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::roce_bin;

/// A `roce` child process; killed (and reaped) on drop unless [`finish`]ed.
#[derive(Debug)]
pub struct Reaper(Option<Child>);

impl From<Child> for Reaper {
    /// Owns a child started elsewhere (a benchmark's own `roce` binary), so that it is killed
    /// and reaped on drop like one from [`spawn`].
    fn from(c: Child) -> Self {
        Self(Some(c))
    }
}

impl Reaper {
    /// The child's PID.
    ///
    /// # Panics
    /// After [`finish`].
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.0.as_ref().expect("running child").id()
    }

    /// Takes the child's standard output, to read what it prints while it runs (a server's
    /// first line saying where it listens); [`finish`] then returns an empty stdout.
    ///
    /// # Panics
    /// After [`finish`].
    pub fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.0.as_mut().expect("running child").stdout.take()
    }

    /// Takes the child's standard error, to read what it reports while it runs (progress
    /// lines); [`finish`] then returns an empty stderr.
    ///
    /// # Panics
    /// After [`finish`].
    pub fn take_stderr(&mut self) -> Option<std::process::ChildStderr> {
        self.0.as_mut().expect("running child").stderr.take()
    }

    /// Whether the child has exited (it stays reapable by [`finish`], which then returns its
    /// status); `false` while it runs.
    ///
    /// # Panics
    /// After [`finish`].
    pub fn exited(&mut self) -> bool {
        matches!(
            self.0.as_mut().expect("running child").try_wait(),
            Ok(Some(_))
        )
    }

    /// Kills the child now (SIGKILL) and reaps it; a later [`finish`] is not possible.
    ///
    /// # Errors
    /// When the signal or the wait fails.
    pub fn kill(&mut self) -> std::io::Result<()> {
        if let Some(mut c) = self.0.take() {
            c.kill()?;
            c.wait()?;
        }
        Ok(())
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

/// Starts `program ARGS...` inside network namespace `ns` (through `nsenter --net`, which execs
/// it: the child's PID is the program's), with stdout and stderr captured. The mount namespace
/// stays the caller's, so the pinned BPF objects under /sys/fs/bpf are visible.
///
/// # Panics
/// When `nsenter` cannot be started.
#[must_use]
pub fn spawn_in(ns: &str, program: &std::path::Path, args: &[String]) -> Reaper {
    let c = Command::new("nsenter")
        .arg(format!("--net=/var/run/netns/{ns}"))
        .arg("--")
        .arg(program)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nsenter");
    Reaper(Some(c))
}

/// Spawns `cmd` (any program) with its output piped, killed on drop like a `roce` child.
///
/// # Panics
/// When it cannot be started.
#[must_use]
pub fn spawn_command(mut cmd: Command) -> Reaper {
    let c = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    Reaper(Some(c))
}

/// Spawns `cmd` with the standard streams it was given (a log file for a long-running server
/// that prints more than a pipe holds), killed on drop like a `roce` child.
///
/// # Panics
/// When it cannot be started.
#[must_use]
pub fn spawn_as_is(mut cmd: Command) -> Reaper {
    Reaper(Some(cmd.spawn().expect("spawn")))
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

/// Waits at most `limit` for the child to exit and returns what it printed; kills it and
/// panics (with what it printed so far) when it runs longer, so a stuck endpoint fails the test
/// in bounded time.
///
/// # Panics
/// When waiting fails or the child outlives `limit`.
#[must_use]
pub fn finish_within(mut r: Reaper, limit: Duration, what: &str) -> Output {
    let mut child = r.0.take().expect("running child");
    let drain = |s: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut s) = s {
                let _ = s.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for roce") {
            break st;
        }
        if Instant::now() >= deadline {
            let stacks = stacks_of(child.id());
            let _ = child.kill();
            let _ = child.wait();
            let (o, e) = (
                out.join().unwrap_or_default(),
                err.join().unwrap_or_default(),
            );
            panic!(
                "{what} still running after {limit:?}, killed: {}{}\n{stacks}",
                String::from_utf8_lossy(&o),
                String::from_utf8_lossy(&e)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// Where every thread of a hung process is, for the panic message of [`finish_within`]: each
/// thread's name, state and kernel wait channel from /proc, then gdb's backtrace of every
/// thread (`gdb` is installed by `cargo xtask setup`). Bounded: gdb gets 30 s.
fn stacks_of(pid: u32) -> String {
    let mut out = String::from("threads (name, state, wchan):\n");
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let p = t.path();
            let read = |f: &str| {
                std::fs::read_to_string(p.join(f))
                    .unwrap_or_default()
                    .trim()
                    .to_owned()
            };
            let stat = read("stat");
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, r)| r.split(' ').next())
                .unwrap_or("?")
                .to_owned();
            out += &format!(
                "  {} {} {} {}\n",
                t.file_name().to_string_lossy(),
                read("comm"),
                state,
                read("wchan")
            );
        }
    }
    let gdb = Command::new("timeout")
        .args(["30", "gdb", "-p", &pid.to_string(), "-batch", "-nx"])
        .args(["-ex", "set pagination off", "-ex", "thread apply all bt 30"])
        .stdin(Stdio::null())
        .output();
    match gdb {
        Ok(o) => out += &String::from_utf8_lossy(&o.stdout),
        Err(e) => out += &format!("gdb: {e}\n"),
    }
    out
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
