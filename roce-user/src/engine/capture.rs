//! The endpoint's side of `roce dump`: whether someone captures this interface, and the
//! process's capture ring ([`crate::xsk::capture`]) the engines copy frames into while they do.
//!
//! A running `roce dump -i IFACE` announces itself with a file `dump-<pid>` in
//! [`capture_dir`]`(IFACE)`. The device looks for live announcements when it opens and then on
//! its stats thread every [`super::publish::PUBLISH_EVERY`]; while one exists it keeps a ring
//! `<pid>-<n>.ring` in the same folder and sets its `active` flag, which the engines read
//! once per receive batch and once per transmit pass (a relaxed load: nothing else is paid
//! while no one captures). When the last dump goes away the ring is removed. When the device
//! closes, its ring is marked closed and left for the dump to drain and remove.

use std::{
    path::{Path, PathBuf},
    sync::{
        Mutex,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
};

use crate::xsk::capture::{CaptureRing, DEFAULT_CAPACITY, RecordMeta};

/// Where the capture rings and dump announcements of `ifname` live.
#[must_use]
pub fn capture_dir(ifname: &str) -> PathBuf {
    Path::new("/run/roce/capture").join(ifname)
}

/// The live `roce dump` processes announced in `dir` (their `dump-<pid>` files), oldest
/// announcement first is not promised.
#[must_use]
pub fn live_dumps(dir: &Path) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.filter_map(Result::ok)
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("dump-")?
                .parse::<u32>()
                .ok()
        })
        .filter(|pid| crate::loader::process_alive(*pid))
        .collect()
}

/// Tells rings of several devices in one process apart.
static NEXT_RING: AtomicU32 = AtomicU32::new(0);

/// One device's capture state, shared by its engines and its stats thread.
#[derive(Debug)]
pub(crate) struct Capture {
    dir: PathBuf,
    active: AtomicBool,
    ring: Mutex<Option<CaptureRing>>,
    name: String,
}

impl Capture {
    pub(crate) fn new(ifname: &str) -> Self {
        Self {
            dir: capture_dir(ifname),
            active: AtomicBool::new(false),
            ring: Mutex::new(None),
            name: format!(
                "{}-{}.ring",
                std::process::id(),
                NEXT_RING.fetch_add(1, Ordering::Relaxed)
            ),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<CaptureRing>> {
        self.ring
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a dump is capturing. Read once per batch: the only cost of capture support
    /// while no one captures.
    pub(crate) fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Looks for live dumps and makes or removes the ring to match. Call when the device opens
    /// and then periodically (the stats thread).
    pub(crate) fn refresh(&self) {
        let dumps = live_dumps(&self.dir);
        let mut ring = self.lock();
        if dumps.is_empty() {
            self.active.store(false, Ordering::Relaxed);
            if let Some(r) = ring.take() {
                let _ = std::fs::remove_file(r.path());
                let _ = std::fs::remove_dir(&self.dir);
            }
            return;
        }
        if ring.is_none() {
            let path = self.dir.join(&self.name);
            // The folder exists: a live dump's announcement is in it.
            match CaptureRing::create(&path, std::process::id(), DEFAULT_CAPACITY) {
                Ok(r) => *ring = Some(r),
                Err(e) => {
                    log::warn!("capture ring {}: {e}", path.display());
                    return;
                }
            }
        }
        self.active.store(true, Ordering::Relaxed);
    }

    /// Copies one frame into the ring, or counts it lost there when the ring is full. Never
    /// waits for the dump. Call only after [`Capture::active`] said yes.
    pub(crate) fn record(&self, queue: u32, dir: u8, qpn: u32, reason: u8, frame: &[u8]) {
        let ts_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let meta = RecordMeta {
            ts_ns,
            qpn,
            queue: u16::try_from(queue).unwrap_or(u16::MAX),
            dir,
            reason,
        };
        if let Some(r) = self.lock().as_mut() {
            r.push(&meta, frame);
        }
    }

    /// Stops capturing for good: the ring is marked closed and left for a live dump to drain
    /// and remove, or removed now if no dump is left. Call after the engines stopped.
    pub(crate) fn close(&self) {
        self.active.store(false, Ordering::Relaxed);
        if let Some(r) = self.lock().take() {
            r.close();
            if live_dumps(&self.dir).is_empty() {
                let _ = std::fs::remove_file(r.path());
                let _ = std::fs::remove_dir(&self.dir);
            }
        }
    }
}
