//! Why a device call failed.

use roce_common::maps::MAX_QPS;

use crate::{
    loader::LoadError,
    netinfo::NetInfoError,
    transport::{self, CqId, DeviceError, LKey, MrError, PdId, PostError},
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
    /// Another AF_XDP socket already serves an RX queue of the interface (bind gave `EBUSY`):
    /// roce-xdp serves one process per interface queue.
    #[error(
        "queue {queue} of {ifname} is already served by another program's AF_XDP socket{}; \
         roce-xdp serves one program per interface queue: end that program, or run this one \
         on another interface",
        holders_text(holders)
    )]
    QueueTaken {
        /// The interface.
        ifname: String,
        /// The queue.
        queue: u32,
        /// PIDs of live roce-xdp processes on the interface, where they can be told.
        holders: Vec<u32>,
    },
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
    /// A device reached through `roce engine` ([`crate::api::remote::SharedDevice`]): the
    /// engine refused the verb with an errno, or could not be reached.
    #[error(transparent)]
    Remote(#[from] crate::api::remote::RemoteError),
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
    /// A protection domain still has memory regions or QPs
    /// ([`Device::dealloc_pd`](crate::api::Device::dealloc_pd); `ibv_dealloc_pd` returns
    /// `EBUSY`). Destroy them first.
    #[error("protection domain {0:?} still has memory regions or queue pairs")]
    PdBusy(PdId),
    /// A QP still completes on the CQ ([`Device::destroy_cq`](crate::api::Device::destroy_cq);
    /// `ibv_destroy_cq` returns `EBUSY`). Destroy the QP first.
    #[error("completion queue {0:?} is still used by a queue pair")]
    CqBusy(CqId),
    /// A handle of another [`Device`](crate::api::Device) was passed (a CQ of one device to
    /// [`Pd::create_qp`](crate::api::Pd::create_qp) of another).
    #[error("the {0} belongs to another device")]
    ForeignHandle(&'static str),
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
    /// A QP's PD and its SRQ were made on different queues of a sharded device.
    #[error(
        "the QP's protection domain is on queue {pd} but its shared receive queue on queue {srq}: a sharded device keeps a QP's PD and SRQ on one queue"
    )]
    SrqOtherQueue {
        /// The PD's queue.
        pd: u32,
        /// The SRQ's queue.
        srq: u32,
    },
    /// The communication manager refused a call (unknown connection, wrong state, a service
    /// ID already listened on, a full connection table, private data too long).
    #[error(transparent)]
    Cm(#[from] crate::ibcm::CmError),
    /// Another live process runs the CM on this interface (it owns QP 1 in the XDP QP map):
    /// one CM agent serves an interface, as one kernel CM serves a port.
    #[error("QP 1 (the CM) of {ifname} is owned by roce-xdp process {owner}")]
    CmTaken {
        /// The interface.
        ifname: String,
        /// The owning process.
        owner: u32,
    },
}

fn holders_text(pids: &[u32]) -> String {
    match pids {
        [] => String::new(),
        [one] => format!(" (roce-xdp process {one})"),
        _ => format!(
            " (roce-xdp processes {})",
            pids.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

impl ApiError {
    /// The `errno` value a libibverbs call returns for this failure, for a C layer over this
    /// API: `EBUSY` for an object still in use ([`ApiError::PdBusy`], [`ApiError::CqBusy`]),
    /// `ENOMEM` for an exhausted table or a full work queue (rxe's `post_send`), the OS error
    /// itself for a failed system call, `EIO` for a device that could not be set up or run, and
    /// `EINVAL` for every other refused argument (unknown handle, bad state, size, right or
    /// MTU).
    #[must_use]
    pub fn errno(&self) -> i32 {
        match self {
            Self::PdBusy(_)
            | Self::CqBusy(_)
            | Self::QueueTaken { .. }
            | Self::CmTaken { .. }
            | Self::Device(
                DeviceError::PdInUse(_) | DeviceError::CqInUse(_) | DeviceError::SrqInUse(_),
            ) => libc::EBUSY,
            Self::Device(
                DeviceError::TooManyQps(_)
                | DeviceError::TooManyCqs(_)
                | DeviceError::TooManyPds(_)
                | DeviceError::TooManySrqs(_)
                | DeviceError::Mr(MrError::TableFull(_) | MrError::WindowTableFull(_)),
            )
            | Self::Mr(MrError::TableFull(_) | MrError::WindowTableFull(_))
            | Self::Post(PostError::QueueFull(_))
            | Self::NoQpn(_)
            | Self::Cm(crate::ibcm::CmError::TooManyConnections(_)) => libc::ENOMEM,
            // rdma_listen on a port taken (cma.c `cma_alloc_port`).
            Self::Cm(crate::ibcm::CmError::AlreadyListening(_)) => libc::EADDRINUSE,
            Self::Os { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Self::Remote(e) => e.errno(),
            // As the kernel's address resolution answers ibv_create_ah and ibv_modify_qp
            // for rxe (core/addr.c): no route, or no neighbour reply in time.
            Self::NetInfo(NetInfoError::NoRoute { .. }) => libc::ENETUNREACH,
            Self::NetInfo(NetInfoError::Unresolved { .. }) => libc::ETIMEDOUT,
            Self::NetInfo(NetInfoError::NoGid { .. }) => libc::EINVAL,
            Self::Load(_)
            | Self::Xsk(_)
            | Self::NetInfo(_)
            | Self::Engine(_)
            | Self::TooManyQueues { .. } => libc::EIO,
            _ => libc::EINVAL,
        }
    }
}

pub(crate) fn os(what: &'static str) -> impl FnOnce(std::io::Error) -> ApiError {
    move |source| ApiError::Os { what, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_is_ebusy_for_objects_in_use_and_what_libibverbs_returns_otherwise() {
        assert_eq!(ApiError::PdBusy(PdId(3)).errno(), libc::EBUSY);
        assert_eq!(ApiError::CqBusy(CqId(1)).errno(), libc::EBUSY);
        assert_eq!(
            ApiError::Device(DeviceError::CqInUse(CqId(1))).errno(),
            libc::EBUSY
        );
        assert_eq!(
            ApiError::Post(PostError::QueueFull(4)).errno(),
            libc::ENOMEM
        );
        assert_eq!(
            ApiError::Device(DeviceError::TooManyPds(2)).errno(),
            libc::ENOMEM
        );
        assert_eq!(
            ApiError::Device(DeviceError::NoSuchCq(CqId(9))).errno(),
            libc::EINVAL
        );
        let os = ApiError::Os {
            what: "test",
            source: std::io::Error::from_raw_os_error(libc::EPERM),
        };
        assert_eq!(os.errno(), libc::EPERM);
    }
}
