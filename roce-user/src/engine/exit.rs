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

/// Undoes what every open device (`api::Device`) of this process set up in the kernel — its QPNs in the XDP
/// QP map, its sockets in the XSK map, and roce_xdp itself where the device loaded it — without
/// stopping its threads. Call it only right before the process exits on a signal, when the
/// devices' destructors will not run (for example while blocked in an out-of-band `accept`).
pub fn release_all_for_exit() {
    let live = std::mem::take(
        &mut *LIVE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    for d in live {
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
