//! The per-interface lock file that serialises QPN claims and counter folding between
//! processes.

use std::{
    fs::{self, File},
    os::unix::fs::MetadataExt as _,
};

use super::error::{ApiError, os};

/// The held per-interface lock ([`lock_file`]). Dropping it removes the file, then unlocks
/// (`Drop::drop` runs before the fields are dropped), so no file is left in `/run/roce` once no
/// process holds or waits for the lock.
#[derive(Debug)]
pub(crate) struct InterfaceLock {
    _lock: nix::fcntl::Flock<File>,
    path: std::path::PathBuf,
}

impl Drop for InterfaceLock {
    fn drop(&mut self) {
        // While still locked: a process that opened this file before the unlink finds, once
        // it gets the lock, that the path no longer names it, and starts again.
        let _ = fs::remove_file(&self.path);
    }
}

/// Takes the per-interface lock (`/run/roce/<ifname>.lock`) that serialises QPN claims and the
/// folding of counters between processes; hold the result for the critical section.
///
/// The file exists only while someone holds the lock: the holder removes it before unlocking,
/// and a process that locked a file already removed (it opened the path just before the
/// previous holder's unlink) sees that the path no longer names its file and tries again.
pub(crate) fn lock_file(ifname: &str) -> Result<InterfaceLock, ApiError> {
    lock_file_in(std::path::Path::new("/run/roce"), ifname)
}

/// [`lock_file`] in `dir`.
fn lock_file_in(dir: &std::path::Path, ifname: &str) -> Result<InterfaceLock, ApiError> {
    fs::create_dir_all(dir).map_err(os("creating /run/roce"))?;
    let path = dir.join(format!("{ifname}.lock"));
    loop {
        let f = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(os("opening the QPN lock file"))?;
        let lock =
            nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| {
                ApiError::Os {
                    what: "locking the QPN lock file",
                    source: e.into(),
                }
            })?;
        let ours = lock.metadata().map_err(os("reading the QPN lock file"))?;
        match fs::metadata(&path) {
            Ok(m) if m.ino() == ours.ino() && m.dev() == ours.dev() => {
                return Ok(InterfaceLock { _lock: lock, path });
            }
            // Removed (or replaced) by the previous holder after we opened it.
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(os("reading the QPN lock file")(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Many threads taking the lock in turn: never two holders at once, and no file left.
    #[test]
    fn the_lock_excludes_and_leaves_no_file() {
        let dir = std::env::temp_dir().join(format!("roce-claims-{}", std::process::id()));
        let name = "veth0";
        let inside = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (dir, inside) = (dir.clone(), inside.clone());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let _l = lock_file_in(&dir, name).unwrap();
                        assert_eq!(inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0);
                        std::thread::yield_now();
                        inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(!dir.join("veth0.lock").exists());
        fs::remove_dir(&dir).unwrap();
    }
}
