//! `roce engine` in a test: its socket's path, a guard that removes the socket and its folder
//! (an engine killed with SIGKILL leaves them), and a start that waits until it listens.

use std::{
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use roce::api::remote::{EngineClient, EngineStatus, RUN_DIR};

use crate::child::{Reaper, spawn};

/// Where the engine of `ifname` in namespace `ns` listens.
#[must_use]
pub fn socket_path(ns: &str, ifname: &str) -> PathBuf {
    Path::new(RUN_DIR).join(ns).join(format!("{ifname}.sock"))
}

/// Removes an engine's socket and its namespace's folder on drop.
#[derive(Debug)]
pub struct SocketGuard(pub PathBuf);

impl Drop for SocketGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        if let Some(d) = self.0.parent() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Waits until `path` exists (the engine bound its socket).
///
/// # Panics
/// When the engine exits first, or `limit` passes.
pub fn wait_listening(path: &Path, limit: Duration, engine: &mut Reaper) {
    let t0 = Instant::now();
    while !path.exists() {
        assert!(
            !engine.exited(),
            "the engine exited before binding {}",
            path.display()
        );
        assert!(
            t0.elapsed() < limit,
            "no engine socket at {} after {limit:?}",
            path.display()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `roce engine -i ifname --linger linger` in `ns` and waits (at most `limit`) until it
/// listens. Connect a client soon: an engine with none leaves after its linger.
///
/// # Panics
/// As [`wait_listening`].
pub fn start_engine(
    ns: &str,
    ifname: &str,
    linger: &str,
    limit: Duration,
) -> (Reaper, PathBuf, SocketGuard) {
    let path = socket_path(ns, ifname);
    let guard = SocketGuard(path.clone());
    let mut engine = spawn(
        ns,
        &["engine", "-i", ifname, "--linger", linger].map(String::from),
    );
    wait_listening(&path, limit, &mut engine);
    (engine, path, guard)
}

/// `roce exec --engine shared -d IF -- prog -d roce_IF ARGS`, in `ns`: the drop-in library must
/// reach the interface through the engine, and fails loudly if it cannot.
#[must_use]
pub fn exec_shared(ns: &str, ifname: &str, prog: &[&str]) -> Reaper {
    let mut args: Vec<String> = [
        "exec", "--engine", "shared", "-d", ifname, "--", prog[0], "-d",
    ]
    .map(str::to_owned)
    .to_vec();
    args.push(format!("roce_{ifname}"));
    args.extend(prog[1..].iter().map(|a| (*a).to_owned()));
    spawn(ns, &args)
}

/// The engine with nobody but the test's watcher: no object of any program left.
pub const EMPTY: EngineStatus = EngineStatus {
    clients: 1,
    qps: 0,
    pds: 0,
    cqs: 0,
    mrs: 0,
};

/// Waits until the engine's status, asked through `watch`, is `want` (the programs left and
/// it released their objects), for at most `limit`.
///
/// # Panics
/// When the status cannot be asked, or is still another after `limit`.
pub fn wait_status(watch: &mut EngineClient, want: EngineStatus, limit: Duration) {
    let t0 = Instant::now();
    loop {
        let st = watch.status().expect("status");
        if st == want {
            return;
        }
        assert!(t0.elapsed() < limit, "engine status {st:?}, want {want:?}");
        thread::sleep(Duration::from_millis(20));
    }
}
