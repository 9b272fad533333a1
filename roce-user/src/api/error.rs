//! Why a device call failed.

use roce_common::maps::MAX_QPS;

use crate::{
    loader::LoadError,
    netinfo::NetInfoError,
    transport::{self, LKey, PostError},
    xsk::XskError,
};

/// Why a device call failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Loading, pinning or a map operation failed.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// An AF_XDP socket could not be opened.
    #[error("AF_XDP: {0}")]
    Xsk(#[from] XskError),
    /// Interface facts could not be read.
    #[error(transparent)]
    NetInfo(#[from] NetInfoError),
    /// The transport refused.
    #[error(transparent)]
    Device(#[from] transport::DeviceError),
    /// A post was refused.
    #[error(transparent)]
    Post(#[from] PostError),
    /// A memory region call failed.
    #[error(transparent)]
    Mr(#[from] transport::MrError),
    /// No QPN below the XDP map's capacity is free.
    #[error("no free QP number below {MAX_QPS} on {0}")]
    NoQpn(String),
    /// The path MTU does not fit the frames.
    #[error(
        "path MTU {asked} does not fit this device: at most {max} (AF_XDP frames of {frame} bytes, link MTU {link})"
    )]
    Mtu {
        /// Asked for.
        asked: u32,
        /// Largest possible.
        max: u32,
        /// UMEM frame size.
        frame: u32,
        /// Link MTU.
        link: u32,
    },
    /// A memory region access out of bounds.
    #[error("memory region {lkey:?}: bytes {offset}..{end} are outside its {len} bytes")]
    OutOfBounds {
        /// Region.
        lkey: LKey,
        /// Start.
        offset: usize,
        /// End.
        end: usize,
        /// Region length.
        len: usize,
    },
    /// [`Device::with_mr`](crate::api::Device::with_mr) on a region of memory the application
    /// keeps ([`RawMem`](transport::RawMem)): it reads that memory itself.
    #[error(
        "memory region {0:?} is the application's own memory (registered by address): read it directly or with mr_read"
    )]
    NotOwned(LKey),
    /// Something else the OS refused.
    #[error("{what}: {source}")]
    Os {
        /// What.
        what: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// An engine thread failed.
    #[error("engine thread: {0}")]
    Engine(String),
    /// A sharded device was asked for more queues than QP numbers and keys can be split into.
    #[error("{queues} RX queues: a sharded device splits into at most {max}")]
    TooManyQueues {
        /// RX queues of the interface.
        queues: u32,
        /// [`transport::Shard::MAX_COUNT`].
        max: u32,
    },
    /// A queue number beyond the device's shards ([`Device::alloc_pd_on`](crate::api::Device::alloc_pd_on)).
    #[error("queue {queue}: this device has {shards} transport(s) (sharded: one per RX queue)")]
    NoSuchQueue {
        /// Asked for.
        queue: u32,
        /// [`Device::shards`](crate::api::Device::shards).
        shards: u32,
    },
    /// A QP's PD and CQs were made on different queues of a sharded device.
    #[error(
        "the QP's protection domain is on queue {pd} but its {which} CQ on queue {cq}: a sharded device keeps a QP's PD, CQs and regions on one queue"
    )]
    OtherQueue {
        /// The PD's queue.
        pd: u32,
        /// `send` or `recv`.
        which: &'static str,
        /// The CQ's queue.
        cq: u32,
    },
}

pub(crate) fn os(what: &'static str) -> impl FnOnce(std::io::Error) -> ApiError {
    move |source| ApiError::Os { what, source }
}
