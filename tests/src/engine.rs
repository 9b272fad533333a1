//! `roce engine` in a test: its socket's path, a guard that removes the socket and its folder
//! (an engine killed with SIGKILL leaves them), and a start that waits until it listens.

use std::{
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use roce::api::remote::RUN_DIR;

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
