//! AF_XDP packet I/O: one UMEM and one socket per (interface, RX queue), with batched, typed
//! access to the fill, RX, TX and completion rings. The ring code is xdpilone's; this module adds
//! frame ownership, backpressure counters and the bind policy.
//!
//! # Frame ownership
//! Every UMEM frame is in exactly one place at a time (see [`FrameLoc`]): the free pool, lent to
//! the kernel for receive (fill or RX ring), held by the application, or lent to the kernel for
//! transmit (TX or completion ring). [`XskQueue::accounting`] counts them; the four always add up
//! to the frame count. Frames move only through:
//! - [`XskQueue::refill`]: pool → fill ring;
//! - [`RxBatch`]: RX ring → application; the handler's [`RxVerdict`] then sends the frame back to
//!   the pool ([`RxVerdict::Recycle`]) or queues it for transmit ([`RxVerdict::Transmit`]);
//! - [`TxSink::send`]: pool → application (queued for transmit);
//! - [`XskQueue::flush_tx`] / [`TxBatch`]: queued → TX ring;
//! - [`XskQueue::reap_completions`]: completion ring → pool.
//!
//! The packet bytes are only ever lent as `&mut [u8]` for the duration of a callback, so no
//! reference to a frame can outlive its stay with the application.
//!
//! # Batches
//! [`RxBatch`] and [`TxBatch`] are `#[must_use]` guards over a reserved stretch of a ring.
//! Committing publishes it to the kernel; dropping a `TxBatch` without committing rolls the
//! reservation back and returns its frames to the pool. An `RxBatch` always releases the
//! descriptors it has handed out (their frames belong to the application then) and rolls back
//! the ones it has not read, which stay on the RX ring for the next batch.
//!
//! # Use
//! Load `roce_xdp` on the interface ([`crate::loader::load`]), open one [`XskQueue`] per RX
//! queue, register each in `ROCE_XSKS`, and run one [`crate::engine::Engine`] per queue with
//! the transport as its [`crate::engine::Handler`]:
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::{Arc, atomic::AtomicBool};
//! use roce::{engine::{EchoHandler, EngineConfig, spawn_engines}, loader::Pins, xsk::*};
//!
//! let queues = XskQueue::open_all("eth0", &XskConfig::default())?;
//! let pins = Pins::new("eth0");
//! for q in &queues {
//!     q.register(&pins)?; // ROCE_XSKS[q] = this socket
//!     println!("queue {} bound in {} mode", q.queue_id(), q.bind_mode());
//! }
//! let stop = Arc::new(AtomicBool::new(false));
//! let threads = spawn_engines(queues, |_| EchoHandler::default(), EngineConfig::default(), &stop)?;
//! # Ok(()) }
//! ```
//!
//! # Multi-buffer packets
//! A socket opened with [`XskConfig::multi_buffer`] is bound with `XDP_USE_SG`, for links that
//! carry frames longer than a UMEM frame holds (RoCE path MTU 4096 on a 9000-byte link). The
//! kernel then hands a long packet over as several RX descriptors, all but the last flagged
//! `XDP_PKT_CONTD`; [`RxBatch`] copies them into one buffer, pools their frames, and gives the
//! handler the joined packet once (`rx_multi_buffer`; longer than [`MULTI_BUFFER_MAX_LEN`]:
//! dropped, `rx_oversize`). [`TxSink::send`] lets the handler write up to
//! [`MULTI_BUFFER_MAX_LEN`] bytes into a staging buffer and queues them as one descriptor per
//! frame's worth, flagged the same way (`tx_multi_buffer`). A packet that fits one frame still
//! takes one descriptor, and receiving it costs no copy.
//!
//! # Wakeups
//! Sockets are bound with `XDP_USE_NEED_WAKEUP`; the TX ring is kicked with `sendto()` only when
//! the kernel sets the need-wakeup flag (copy mode always does; it then sends about 32 frames per
//! kick, so a flush kicks until the ring is drained or the kernel stops making progress).

pub mod capture;
mod socket;
mod stats;
mod umem;

use std::{io, num::NonZeroU32};

pub use socket::{
    RxBatch, RxVerdict, RxWaiter, TxBatch, TxError, TxSink, Woken, XskQueue, rx_queue_count,
};
pub use stats::XskStats;
pub use umem::{FrameAccounting, FrameIdx, FrameLoc};

/// CLOCK_MONOTONIC in nanoseconds: the clock of the arrival stamps `roce_xdp` writes
/// (`bpf_ktime_get_ns`, see [`roce_common::stamp`]) and of the engine's
/// [`crate::engine::Clock`]. Call wherever a reading must compare with a stamp.
#[must_use]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call; CLOCK_MONOTONIC
    // is always available on Linux, so the call cannot fail with a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    debug_assert_eq!(rc, 0);
    u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0))
}

/// How a socket ended up bound to its queue: the loader and `roce status` report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BindMode {
    /// `XDP_ZEROCOPY`: the driver DMAs straight into the UMEM.
    ZeroCopy,
    /// `XDP_COPY`: the kernel copies frames between the skb/xdp_buff and the UMEM (veth, generic
    /// XDP, drivers without AF_XDP zero-copy support).
    Copy,
}

impl BindMode {
    /// The name shown by `roce status`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ZeroCopy => "zerocopy",
            Self::Copy => "copy",
        }
    }
}

impl core::fmt::Display for BindMode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which bind mode to ask for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BindRequest {
    /// Zero-copy first; copy mode if the driver refuses it.
    #[default]
    Auto,
    /// Zero-copy or fail.
    ZeroCopy,
    /// Copy mode only.
    Copy,
}

/// Sizes of one queue's UMEM and rings. Ring sizes must be powers of two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XskConfig {
    /// Bytes per frame: 2048 or 4096.
    pub frame_size: u32,
    /// Frames in the UMEM. Must hold a full fill ring plus the TX ring.
    pub frame_count: u32,
    /// Fill ring entries; also the most frames lent to the kernel for receive at once.
    pub fill_size: u32,
    /// Completion ring entries.
    pub comp_size: u32,
    /// RX ring entries.
    pub rx_size: u32,
    /// TX ring entries.
    pub tx_size: u32,
    /// Bind mode policy.
    pub bind: BindRequest,
    /// Bind with `XDP_USE_SG` (AF_XDP multi-buffer, Linux 6.6+): a packet longer than a frame
    /// holds (a receive frame holds `frame_size` - 256 bytes, the kernel's
    /// `XDP_PACKET_HEADROOM`) comes in several RX descriptors, all but the last flagged
    /// `XDP_PKT_CONTD`, and is joined into one buffer before the handler sees it; a frame the
    /// handler writes may be up to [`MULTI_BUFFER_MAX_LEN`] bytes and goes out split over
    /// several TX descriptors the same way. That lets a link whose MTU is larger than a frame
    /// (a 9000-byte link carrying RoCE path MTU 4096) be served at all. It costs one copy per
    /// transmitted frame (the handler writes into a staging buffer, then the bytes are copied
    /// into as many frames as they need) and one per received multi-buffer packet, so leave
    /// it off (the default) on links whose packets fit a frame.
    pub multi_buffer: bool,
}

/// The longest packet a multi-buffer socket ([`XskConfig::multi_buffer`]) joins on receive or
/// splits on transmit: a 9000-byte MTU frame with two VLAN tags, rounded up.
pub const MULTI_BUFFER_MAX_LEN: usize = 9216 + 1024;

/// `XDP_USE_SG` (linux/if_xdp.h): the bind flag for multi-buffer sockets.
pub(crate) const XDP_USE_SG: u16 = 1 << 4;

/// `XDP_PKT_CONTD` (linux/if_xdp.h): descriptor option bit, "more of this packet follows".
pub(crate) const XDP_PKT_CONTD: u32 = 1;

impl Default for XskConfig {
    /// 4096-byte frames, 2048-entry rings and 8192 frames: a 2048-frame fill ring ran empty at
    /// ~0.9 Mpps on veth (toolchain.md), so the fill ring is kept full from a larger pool.
    fn default() -> Self {
        Self {
            frame_size: 4096,
            frame_count: 8192,
            fill_size: 4096,
            comp_size: 4096,
            rx_size: 4096,
            tx_size: 2048,
            bind: BindRequest::Auto,
            multi_buffer: false,
        }
    }
}

impl XskConfig {
    /// Checks the sizes; called by [`XskQueue::open`].
    pub fn validate(&self) -> Result<(), XskError> {
        if self.frame_size != 2048 && self.frame_size != 4096 {
            return Err(XskError::Config("frame_size must be 2048 or 4096"));
        }
        for (v, what) in [
            (self.fill_size, "fill_size must be a power of two"),
            (self.comp_size, "comp_size must be a power of two"),
            (self.rx_size, "rx_size must be a power of two"),
            (self.tx_size, "tx_size must be a power of two"),
        ] {
            if !v.is_power_of_two() {
                return Err(XskError::Config(what));
            }
        }
        if u64::from(self.frame_count) < u64::from(self.fill_size) + u64::from(self.tx_size) {
            return Err(XskError::Config(
                "frame_count must be at least fill_size + tx_size",
            ));
        }
        if u64::from(self.frame_count) * u64::from(self.frame_size) > 1 << 40 {
            return Err(XskError::Config("UMEM larger than 1 TiB"));
        }
        Ok(())
    }

    pub(crate) fn rx_nz(&self) -> Option<NonZeroU32> {
        NonZeroU32::new(self.rx_size)
    }

    pub(crate) fn tx_nz(&self) -> Option<NonZeroU32> {
        NonZeroU32::new(self.tx_size)
    }
}

/// Errors of the AF_XDP module.
#[derive(Debug, thiserror::Error)]
pub enum XskError {
    /// A configuration value is out of range.
    #[error("invalid AF_XDP configuration: {0}")]
    Config(&'static str),
    /// The interface name is not valid or does not exist.
    #[error("failed to find interface {name}: {source}")]
    Interface {
        /// The name given.
        name: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Mapping the UMEM area failed.
    #[error("failed to map the UMEM: {0}")]
    Mmap(#[source] io::Error),
    /// A socket setup step failed.
    #[error("failed to {step} for {ifname} queue {queue}: {source}")]
    Setup {
        /// The step, e.g. "bind the socket".
        step: &'static str,
        /// The interface.
        ifname: String,
        /// The queue.
        queue: u32,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// poll(2) failed.
    #[error("failed to poll the AF_XDP socket: {0}")]
    Poll(#[source] io::Error),
    /// The interface's `roce_xdp` was loaded by an older build whose frames this one cannot
    /// read (`roce_common::maps::FLAG_STAMP_PUSHED`).
    #[error(
        "roce_xdp on {0} was loaded by an older roce-xdp, which pushes the arrival stamp in \
         front of each frame; load it again with this build (`roce unload -i {0}`, then \
         `roce load -i {0}`)"
    )]
    StaleProgram(String),
}

pub(crate) fn errno_to_io(e: &xdpilone::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.get_raw().abs())
}
