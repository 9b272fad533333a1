//! The process-exit registry: what every open device set up in the kernel, so that it can be
//! undone when the process exits on a signal without running destructors.

use std::sync::{Arc, Mutex, atomic::Ordering};

use crate::loader::{self, Pins};

/// What must be undone for a device if the process has to exit without running destructors.
#[derive(Debug)]
pub(crate) struct LiveDevice {
    pub(crate) id: u64,
    pub(crate) ifname: String,
    pub(crate) loaded_here: bool,
    pub(crate) queues: Vec<u32>,
    pub(crate) qpns: Arc<Mutex<Vec<u32>>>,
    /// What the device still has to say before its sockets close: see [`LastWords`].
    pub(crate) last_words: Option<LastWords>,
}

/// A device's last words at process exit, as the kernel speaks them for a process that exits
/// with connections open (ucma's close destroys every CM ID, cm.c `cm_destroy_id`): its CM
/// connections are ended towards their peers (DREQ, REJ), and what its transports already
/// owe the wire (a DREP or an ACK generated just before a thread of the program saw the event
/// or completion it answered, and exited) is put on it, within the engines' drain timeout.
pub(crate) struct LastWords(pub(crate) Box<dyn Fn() + Send>);

impl std::fmt::Debug for LastWords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LastWords")
    }
}

static LIVE: Mutex<Vec<LiveDevice>> = Mutex::new(Vec::new());
static NEXT_LIVE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

pub(crate) fn register_live(mut d: LiveDevice) -> u64 {
    d.id = NEXT_LIVE_ID.fetch_add(1, Ordering::Relaxed);
    let id = d.id;
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(d);
    id
}

pub(crate) fn unregister_live(id: u64) {
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .retain(|d| d.id != id);
}

/// Undoes what every open device (`api::Device`) of this process set up in the kernel (its
/// QPNs in the XDP QP map, its sockets in the XSK map, and roce_xdp itself where the device
/// loaded it) after its last words: its CM connections are ended towards their peers and what
/// its transports owe the wire is sent, within the engines' drain timeout, and its engines
/// stop. Call it only right before the process exits without running the devices'
/// destructors: at `exit(3)` in the drop-in library, or on a signal (for example while
/// blocked in an out-of-band `accept`).
pub fn release_all_for_exit() {
    let live = std::mem::take(
        &mut *LIVE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    for d in live {
        // Sent while the sockets still serve the QPs.
        if let Some(LastWords(speak)) = &d.last_words {
            speak();
        }
        let pins = Pins::new(&d.ifname);
        if let Ok(mut xsks) = pins.xsks() {
            for q in &d.queues {
                let _ = xsks.unset(*q);
            }
        }
        for n in d
            .qpns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain(..)
        {
            let _ = pins.remove_qp(n);
        }
        if d.loaded_here {
            let _ = loader::unload(&d.ifname);
        }
    }
}
