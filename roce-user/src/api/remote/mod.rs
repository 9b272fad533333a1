//! Reaching a device through `roce engine` instead of opening it in this process
//! (docs/multiprocess.md): the engine owns the interface's AF_XDP sockets and transport, and
//! programs speak the control protocol of [`proto`] to it over a Unix socket at
//! [`socket_path`]. Opt-in: [`crate::api::Device::open`] stays the in-process device, whose
//! data path this changes nothing of.
//!
//! Step 1 as built: the control verbs (PD, MR, CQ, QP create/destroy, RESET → INIT, queries)
//! with each connection's objects its own and released when it closes; registered memory is
//! reached through the program's `/proc/PID/mem` ([`memory`]); RC connection, SEND/WRITE/READ
//! posts and polls go over the same socket (correct, slow: the shared-ring data path of the
//! design is not here yet).

pub mod device;
pub mod memory;
pub mod proto;
pub mod server;
pub mod verbs;

use std::{
    io::{Read as _, Write as _},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
};

use self::proto::{ProtoError, QpSpec, REJECT, Reply, Request, Value};
pub use self::{device::EngineDevice, verbs::SharedDevice};
use crate::transport::{Access, CqId, LKey, PdId, QpInit, QpState, QpType, Qpn, RKey};

/// The directory of engine sockets: one folder per network namespace below it.
pub const RUN_DIR: &str = "/run/roce";

/// How the calling thread's network namespace is named in [`socket_path`]: its name from
/// `ip netns add` when it has one, else `net-<inode>` of `/proc/thread-self/ns/net` (unique
/// while the namespace lives), so that engines of two namespaces never share a socket.
///
/// # Errors
/// `/proc/thread-self/ns/net` cannot be read.
pub fn netns_tag() -> std::io::Result<String> {
    use std::os::unix::fs::MetadataExt as _;
    if let Some(name) = crate::netns::identify() {
        return Ok(name);
    }
    let m = std::fs::metadata("/proc/thread-self/ns/net")?;
    Ok(format!("net-{}", m.ino()))
}

/// Where the engine of `ifname` in the calling thread's namespace listens:
/// `/run/roce/<netns>/<ifname>.sock` ([`netns_tag`]).
///
/// # Errors
/// As [`netns_tag`].
pub fn socket_path(ifname: &str) -> std::io::Result<PathBuf> {
    Ok(Path::new(RUN_DIR)
        .join(netns_tag()?)
        .join(format!("{ifname}.sock")))
}

/// Why a call to the engine failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The socket could not be reached or broke.
    #[error("engine socket {path}: {source}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The engine answered the verb with an errno.
    #[error("{verb}: {}", nix::errno::Errno::from_raw(*.errno).desc())]
    Errno {
        /// The verb, for the message.
        verb: &'static str,
        /// The errno, as libibverbs would return it.
        errno: i32,
    },
    /// The engine refused the connection or a frame ([`proto::REJECT`]): `EACCES` for a
    /// program not run by root, [`server::FULL_ERRNO`] when it serves as many programs as its
    /// `--max-clients`, the frame's fault otherwise.
    #[error("engine refused the connection: {}{}", nix::errno::Errno::from_raw(*.0).desc(),
        if *.0 == server::FULL_ERRNO {
            " (it serves as many programs as its --max-clients allows; try again when one has left)"
        } else { "" })]
    Refused(i32),
    /// The engine's bytes did not decode, or answered another request.
    #[error("engine protocol: {0}")]
    Proto(#[from] ProtoError),
    /// A reply of another kind or sequence number than the request's.
    #[error("engine answered kind {kind:#04x} seq {seq} to kind {want_kind:#04x} seq {want_seq}")]
    Mismatch {
        /// Kind received.
        kind: u8,
        /// Sequence received.
        seq: u32,
        /// Kind sent.
        want_kind: u8,
        /// Sequence sent.
        want_seq: u32,
    },
    /// The engine closed the connection.
    #[error("engine closed the connection")]
    Closed,
    /// This side refused the call before asking the engine ([`EngineDevice`]: the interface
    /// as this process sees it disagrees with the call or with the engine).
    #[error("{0}")]
    Local(String),
}

impl RemoteError {
    /// The errno a libibverbs call returns for this failure: the engine's own for verbs it
    /// refused, `EACCES` and the like for a refused connection, `EPROTO` for protocol trouble,
    /// the socket's errno (or `EIO`) otherwise.
    #[must_use]
    pub fn errno(&self) -> i32 {
        match self {
            Self::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Self::Errno { errno, .. } | Self::Refused(errno) => *errno,
            Self::Proto(_) | Self::Mismatch { .. } => libc::EPROTO,
            Self::Closed => libc::ECONNRESET,
            Self::Local(_) => libc::EINVAL,
        }
    }
}

/// What the engine reports to [`EngineClient::status`] (`roce engine --status`): its
/// connections and the objects alive in its device, whoever made them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStatus {
    /// Connected programs, the asking one included.
    pub clients: u32,
    /// QPs (QP 1 not counted).
    pub qps: u32,
    /// Protection domains.
    pub pds: u32,
    /// Completion queues.
    pub cqs: u32,
    /// Memory regions.
    pub mrs: u32,
}

impl EngineStatus {
    /// (clients, QPs), the two counts that say who is there.
    #[must_use]
    pub const fn clients_qps(&self) -> (u32, u32) {
        (self.clients, self.qps)
    }
}

/// A connection to `roce engine`: the objects made through it belong to it, and the engine
/// releases them when it is dropped (or the process dies). One verb at a time.
#[derive(Debug)]
pub struct EngineClient {
    stream: UnixStream,
    path: PathBuf,
    seq: u32,
    buf: Vec<u8>,
    engine_pid: u32,
}

impl EngineClient {
    /// Connects to the engine of `ifname` in this namespace ([`socket_path`]) and greets it.
    ///
    /// # Errors
    /// No engine runs ([`RemoteError::Io`] with `ENOENT` or `ECONNREFUSED`), it refused this
    /// process ([`RemoteError::Refused`], `EACCES` without root), or another version.
    pub fn connect(ifname: &str) -> Result<Self, RemoteError> {
        let path = socket_path(ifname).map_err(|source| RemoteError::Io {
            path: PathBuf::from(RUN_DIR),
            source,
        })?;
        Self::connect_at(&path)
    }

    /// [`EngineClient::connect`] to the socket at `path`.
    ///
    /// # Errors
    /// As [`EngineClient::connect`].
    pub fn connect_at(path: &Path) -> Result<Self, RemoteError> {
        let stream = UnixStream::connect(path).map_err(|source| RemoteError::Io {
            path: path.to_owned(),
            source,
        })?;
        let mut c = Self {
            stream,
            path: path.to_owned(),
            seq: 0,
            buf: Vec::new(),
            engine_pid: 0,
        };
        match c.call("hello", &Request::Hello)? {
            Value::Hello { version, pid } if version == proto::VERSION => c.engine_pid = pid,
            Value::Hello { version, .. } => return Err(ProtoError::Version(version).into()),
            _ => return Err(c.unexpected()),
        }
        Ok(c)
    }

    /// The engine's process id, as its Hello said.
    #[must_use]
    pub const fn engine_pid(&self) -> u32 {
        self.engine_pid
    }

    /// The connection's socket, for a connection that carries nothing but what the engine
    /// sends ([`verbs::VerbCall::Doorbell`]).
    #[must_use]
    pub fn into_stream(self) -> UnixStream {
        self.stream
    }

    fn unexpected(&self) -> RemoteError {
        RemoteError::Proto(ProtoError::Kind(0))
    }

    fn io(&self, source: std::io::Error) -> RemoteError {
        RemoteError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Sends `req` and waits for its reply.
    fn call(&mut self, verb: &'static str, req: &Request) -> Result<Value, RemoteError> {
        self.seq = self.seq.wrapping_add(1);
        let mut out = Vec::with_capacity(proto::HEADER + 32);
        proto::encode_request(&mut out, self.seq, req);
        if let Err(e) = self.stream.write_all(&out) {
            let gone = matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            );
            let refused = if gone { self.refused_before() } else { None };
            return Err(refused.unwrap_or_else(|| self.io(e)));
        }
        loop {
            if let Some((f, used)) = proto::decode_reply(&self.buf)? {
                self.buf.drain(..used);
                if f.kind == REJECT {
                    return Err(match f.msg {
                        Reply::Err(e) => RemoteError::Refused(e),
                        Reply::Ok(_) => self.unexpected(),
                    });
                }
                if f.seq != self.seq || f.kind != req.kind() | proto::REPLY_BIT {
                    return Err(RemoteError::Mismatch {
                        kind: f.kind,
                        seq: f.seq,
                        want_kind: req.kind() | proto::REPLY_BIT,
                        want_seq: self.seq,
                    });
                }
                return match f.msg {
                    Reply::Ok(v) => Ok(v),
                    Reply::Err(errno) => Err(RemoteError::Errno { verb, errno }),
                };
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = self.stream.read(&mut chunk).map_err(|e| self.io(e))?;
            if n == 0 {
                return Err(RemoteError::Closed);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The [`REJECT`] an engine sent before it closed the connection, when a write to it
    /// failed (a refused program's Hello may meet a socket already closed). Call it only
    /// after a write failed because the peer is gone, so that the read does not wait.
    fn refused_before(&mut self) -> Option<RemoteError> {
        let mut chunk = [0u8; 64];
        let n = self.stream.read(&mut chunk).ok()?;
        self.buf.extend_from_slice(&chunk[..n]);
        match proto::decode_reply(&self.buf) {
            Ok(Some((f, _))) if f.kind == REJECT => match f.msg {
                Reply::Err(e) => Some(RemoteError::Refused(e)),
                Reply::Ok(_) => None,
            },
            _ => None,
        }
    }

    fn created(&mut self, verb: &'static str, req: &Request) -> Result<u32, RemoteError> {
        match self.call(verb, req)? {
            Value::Created(h) => Ok(h),
            _ => Err(self.unexpected()),
        }
    }

    fn done(&mut self, verb: &'static str, req: &Request) -> Result<(), RemoteError> {
        match self.call(verb, req)? {
            Value::Done => Ok(()),
            _ => Err(self.unexpected()),
        }
    }

    /// Programs connected to the engine (this one included) and the objects alive in its
    /// device across them.
    ///
    /// # Errors
    /// The connection broke.
    pub fn status(&mut self) -> Result<EngineStatus, RemoteError> {
        match self.call("status", &Request::Status)? {
            Value::Status(s) => Ok(s),
            _ => Err(self.unexpected()),
        }
    }

    /// The 16 bytes of GID `index` (`ibv_query_gid`).
    ///
    /// # Errors
    /// No such index (`EINVAL`), or the connection broke.
    pub fn query_gid(&mut self, index: u32) -> Result<[u8; 16], RemoteError> {
        match self.call("query_gid", &Request::QueryGid { index })? {
            Value::Gid(g) => Ok(g),
            _ => Err(self.unexpected()),
        }
    }

    /// `ibv_alloc_pd` in the engine.
    ///
    /// # Errors
    /// Too many PDs (`ENOMEM`), or the connection broke.
    pub fn alloc_pd(&mut self) -> Result<PdId, RemoteError> {
        self.created("alloc_pd", &Request::AllocPd).map(PdId)
    }

    /// `ibv_dealloc_pd`: `EBUSY` while a QP uses it, `EINVAL` for a PD not of this connection.
    ///
    /// # Errors
    /// As said.
    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<(), RemoteError> {
        self.done("dealloc_pd", &Request::DeallocPd { pd: pd.0 })
    }

    /// `ibv_create_cq` of `depth` entries.
    ///
    /// # Errors
    /// Too many or too deep (`EINVAL`, `ENOMEM`).
    pub fn create_cq(&mut self, depth: u32) -> Result<CqId, RemoteError> {
        self.created("create_cq", &Request::CreateCq { depth })
            .map(CqId)
    }

    /// `ibv_destroy_cq`: `EBUSY` while a QP completes on it.
    ///
    /// # Errors
    /// As said; `EINVAL` for a CQ not of this connection.
    pub fn destroy_cq(&mut self, cq: CqId) -> Result<(), RemoteError> {
        self.done("destroy_cq", &Request::DestroyCq { cq: cq.0 })
    }

    /// `ibv_create_qp`: the QP is made in the engine, in RESET, its QPN claimed in roce_xdp's
    /// QP map as [`crate::api::Device::create_qp`] does.
    ///
    /// # Errors
    /// Limits, no free QPN, or a PD or CQ not of this connection (`EINVAL`).
    pub fn create_qp(&mut self, init: &QpInit) -> Result<Qpn, RemoteError> {
        let spec = QpSpec {
            pd: init.pd.0,
            qp_type: init.qp_type,
            send_cq: init.send_cq.0,
            recv_cq: init.recv_cq.0,
            max_send_wr: init.cap.max_send_wr,
            max_recv_wr: init.cap.max_recv_wr,
            max_sge: init.cap.max_sge,
            max_inline_data: init.cap.max_inline_data,
            sq_sig_all: init.sq_sig_all,
        };
        self.created("create_qp", &Request::CreateQp(spec))
            .map(Qpn::new)
    }

    /// `ibv_destroy_qp`.
    ///
    /// # Errors
    /// A QP not of this connection (`EINVAL`).
    pub fn destroy_qp(&mut self, qpn: Qpn) -> Result<(), RemoteError> {
        self.done("destroy_qp", &Request::DestroyQp { qpn: qpn.value() })
    }

    /// RESET → INIT with `access` (as [`crate::api::Device::qp_to_init`]).
    ///
    /// # Errors
    /// An illegal transition (`EINVAL`), or a QP not of this connection.
    pub fn qp_to_init(&mut self, qpn: Qpn, access: Access) -> Result<(), RemoteError> {
        self.done(
            "qp_to_init",
            &Request::QpToInit {
                qpn: qpn.value(),
                access,
            },
        )
    }

    /// `ibv_reg_mr` of `len` bytes at `addr` of this process: the engine reads and writes
    /// them through this process's `/proc/PID/mem` from now until [`EngineClient::dereg_mr`] or the
    /// connection closes, as a NIC's DMA would. Keep the range mapped that long; what the
    /// engine writes there appears without this process doing anything, so read it as device
    /// memory (volatile, or after a completion), not through a Rust reference held across.
    /// Returns (lkey, rkey).
    ///
    /// # Errors
    /// `EFAULT` when the range's first or last byte is not mapped, `EINVAL` for a PD not of
    /// this connection or a range that wraps, the device's limits.
    pub fn reg_mr(
        &mut self,
        pd: PdId,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(LKey, RKey), RemoteError> {
        match self.call(
            "reg_mr",
            &Request::RegMr {
                pd: pd.0,
                addr,
                len,
                access,
            },
        )? {
            Value::Mr { lkey, rkey } => Ok((LKey::new(lkey), RKey::new(rkey))),
            _ => Err(self.unexpected()),
        }
    }

    /// `ibv_dereg_mr`: the engine no longer touches the region when this returns.
    ///
    /// # Errors
    /// A region not of this connection (`EINVAL`).
    pub fn dereg_mr(&mut self, lkey: LKey) -> Result<(), RemoteError> {
        self.done("dereg_mr", &Request::DeregMr { lkey: lkey.value() })
    }

    /// INIT → RTR → RTS of an RC QP to the peer's `dest_qpn` at `dgid`, from local GID
    /// `gid_index` (ibv_rc_pingpong's attributes, [`crate::api::RcConnect::new`]).
    ///
    /// # Errors
    /// No route to `dgid`, a bad GID index or MTU, an illegal transition.
    #[allow(clippy::too_many_arguments)]
    pub fn qp_connect(
        &mut self,
        qpn: Qpn,
        gid_index: u32,
        dgid: [u8; 16],
        dest_qpn: Qpn,
        rq_psn: u32,
        sq_psn: u32,
        mtu: crate::transport::Mtu,
    ) -> Result<(), RemoteError> {
        self.qp_connect_to(
            qpn,
            &crate::api::RcTarget {
                gid_index: gid_index as usize,
                remote_gid: dgid,
                dest_qpn,
                path_mtu: mtu,
                rq_psn: crate::transport::Psn::new(rq_psn),
                sq_psn: crate::transport::Psn::new(sq_psn),
                attrs: proto::RcAttrs::PINGPONG,
            },
        )
    }

    /// INIT → RTR → RTS of an RC QP to `t`: [`EngineClient::qp_connect`] with the reliability
    /// attributes of `t` (responder resources, READ/atomic depth, timeouts and retries, as
    /// perftest sets them).
    ///
    /// # Errors
    /// As [`EngineClient::qp_connect`]; depths beyond the engine's limits (`EINVAL`).
    pub fn qp_connect_to(&mut self, qpn: Qpn, t: &crate::api::RcTarget) -> Result<(), RemoteError> {
        let gid_index = u32::try_from(t.gid_index).map_err(|_| RemoteError::Errno {
            verb: "qp_connect",
            errno: libc::EINVAL,
        })?;
        self.done(
            "qp_connect",
            &Request::QpConnect {
                qpn: qpn.value(),
                gid_index,
                dgid: t.remote_gid,
                dest_qpn: t.dest_qpn.value(),
                rq_psn: t.rq_psn.value(),
                sq_psn: t.sq_psn.value(),
                mtu: t.path_mtu,
                attrs: t.attrs,
            },
        )
    }

    /// `ibv_post_send` of one WR (through the socket: correct, not fast; the shared rings
    /// replace this).
    ///
    /// # Errors
    /// As `ibv_post_send`: a full queue (`ENOMEM`), a bad WR (`EINVAL`).
    pub fn post_send(&mut self, qpn: Qpn, wr: proto::WireSendWr) -> Result<(), RemoteError> {
        self.done(
            "post_send",
            &Request::PostSend {
                qpn: qpn.value(),
                wr,
            },
        )
    }

    /// `ibv_post_recv` of one WR.
    ///
    /// # Errors
    /// As `ibv_post_recv`.
    pub fn post_recv(
        &mut self,
        qpn: Qpn,
        wr_id: u64,
        sges: Vec<proto::WireSge>,
    ) -> Result<(), RemoteError> {
        self.done(
            "post_recv",
            &Request::PostRecv {
                qpn: qpn.value(),
                wr_id,
                sges,
            },
        )
    }

    /// `ibv_poll_cq` of at most `max` (1..=[`proto::MAX_POLL`]) completions.
    ///
    /// # Errors
    /// A CQ not of this connection (`EINVAL`).
    pub fn poll_cq(&mut self, cq: CqId, max: u32) -> Result<Vec<proto::WireWc>, RemoteError> {
        match self.call("poll_cq", &Request::PollCq { cq: cq.0, max })? {
            Value::Wcs(w) => Ok(w),
            _ => Err(self.unexpected()),
        }
    }

    /// [`EngineClient::poll_cq`] that, when the CQ is empty, waits in the engine up to
    /// `timeout` (at most [`proto::MAX_WAIT_US`] µs, at least 1 µs) for a completion: one round
    /// trip in place of a busy loop of polls.
    ///
    /// # Errors
    /// As [`EngineClient::poll_cq`].
    pub fn wait_cq(
        &mut self,
        cq: CqId,
        max: u32,
        timeout: std::time::Duration,
    ) -> Result<Vec<proto::WireWc>, RemoteError> {
        let timeout_us = u32::try_from(timeout.as_micros())
            .unwrap_or(proto::MAX_WAIT_US)
            .clamp(1, proto::MAX_WAIT_US);
        match self.call(
            "wait_cq",
            &Request::WaitCq {
                cq: cq.0,
                max,
                timeout_us,
            },
        )? {
            Value::Wcs(w) => Ok(w),
            _ => Err(self.unexpected()),
        }
    }

    /// A QP's type and state (`ibv_query_qp`).
    ///
    /// # Errors
    /// A QP not of this connection (`EINVAL`).
    pub fn query_qp(&mut self, qpn: Qpn) -> Result<(QpType, QpState), RemoteError> {
        match self.call("query_qp", &Request::QueryQp { qpn: qpn.value() })? {
            Value::QpInfo { qp_type, state } => Ok((qp_type, state)),
            _ => Err(self.unexpected()),
        }
    }
}
