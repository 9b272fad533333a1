//! [`EngineDevice`]: a device reached through `roce engine`, as [`RdmaDevice`] wants it, so
//! that `roce perf --engine` runs its server and client as two programs on one interface
//! (docs/multiprocess.md). Every verb is a round trip on the engine's socket (step 1's
//! control path); registered memory is buffers of this process that the engine reaches
//! through this process's `/proc/PID/mem` ([`super::memory`]).

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Mutex, MutexGuard},
};

use super::{
    EngineClient, RemoteError,
    memory::{AddressSpace, ProcessMem},
    proto::{self, WireOp, WireSendWr, WireSge},
};
use crate::{
    api::{
        CqId, LKey, MrInfo, Path, PdId, QpCounters, QpInit, Qpn, RecvWr, SendFlags, SendOp, SendWr,
        Sge, Wc,
        rdma_device::{RcTarget, RdmaDevice},
    },
    cc::CcSnapshot,
    netinfo::{Gid, IfInfo},
    transport::{Access, ExternalMem as _, QpState, RKey},
};

/// A region this process registered with the engine: the buffer, kept here until the engine
/// has let go of it, and this process's own view of it through the kernel.
#[derive(Debug)]
struct Region {
    /// The bytes the engine reads and writes, as u64s so that the region starts 8-byte
    /// aligned (atomics need it, IBA 9.4.5). Never read or written through a Rust reference
    /// after registration (the engine changes them behind the compiler's back): only through
    /// `view`, which copies through `/proc/self/mem` as the engine does through this
    /// process's file.
    _buf: Box<[u64]>,
    /// The same bytes, reached through the kernel.
    view: ProcessMem,
    /// The region's description.
    info: MrInfo,
}

/// A device in `roce engine`: the engine owns the interface and runs the transport, this
/// process owns its buffers. Made by [`EngineDevice::connect`]; dropping it deregisters every
/// region before freeing its buffer (the engine no longer touches a region once
/// `DeregMr` answered), and the engine releases the rest when the connection closes.
#[derive(Debug)]
pub struct EngineDevice {
    client: Mutex<EngineClient>,
    /// The interface as this process sees it (same namespace as the engine): its GID order
    /// and MTU, checked against the engine's GIDs in [`RdmaDevice::gid`].
    info: IfInfo,
    regions: Mutex<HashMap<u32, Region>>,
    /// This process's memory, through which it reads and writes its regions.
    own: AddressSpace,
}

/// The errno a verb fails with when the engine cannot carry what was asked.
fn unsupported(verb: &'static str) -> RemoteError {
    RemoteError::Errno {
        verb,
        errno: libc::EOPNOTSUPP,
    }
}

fn invalid(verb: &'static str) -> RemoteError {
    RemoteError::Errno {
        verb,
        errno: libc::EINVAL,
    }
}

impl EngineDevice {
    /// Connects to the engine of `ifname` in this thread's network namespace.
    ///
    /// # Errors
    /// No engine runs there, it refused this process, or the interface is unknown here.
    pub fn connect(ifname: &str) -> Result<Self, RemoteError> {
        let client = EngineClient::connect(ifname)?;
        let info = IfInfo::query(ifname).map_err(|e| RemoteError::Local(e.to_string()))?;
        let own =
            AddressSpace::own().map_err(|e| RemoteError::Local(format!("/proc/self/mem: {e}")))?;
        Ok(Self {
            client: Mutex::new(client),
            info,
            regions: Mutex::new(HashMap::new()),
            own,
        })
    }

    /// The engine's process id.
    #[must_use]
    pub fn engine_pid(&self) -> u32 {
        self.client().engine_pid()
    }

    fn client(&self) -> MutexGuard<'_, EngineClient> {
        self.client
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn regions(&self) -> MutexGuard<'_, HashMap<u32, Region>> {
        self.regions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The view of region `lkey`, with `offset..offset + len` checked against its length.
    fn view(
        &self,
        verb: &'static str,
        lkey: LKey,
        offset: usize,
        len: usize,
    ) -> Result<ProcessMem, RemoteError> {
        let r = self.regions();
        let reg = r.get(&lkey.value()).ok_or_else(|| invalid(verb))?;
        match offset.checked_add(len) {
            Some(end) if end as u64 <= reg.info.len => Ok(reg.view.clone()),
            _ => Err(invalid(verb)),
        }
    }

    /// A completion as the engine sent it (the fields RC SEND/WRITE/READ/atomics use).
    fn wc(w: &proto::WireWc) -> Wc {
        Wc {
            wr_id: w.wr_id,
            status: w.status,
            opcode: w.opcode,
            byte_len: w.byte_len,
            qp_num: Qpn::new(w.qp_num),
            ..Wc::default()
        }
    }

    fn wire_sges(list: &[Sge]) -> Vec<WireSge> {
        list.iter()
            .map(|g| WireSge {
                addr: g.addr,
                length: g.length,
                lkey: g.lkey.value(),
            })
            .collect()
    }
}

impl RdmaDevice for EngineDevice {
    type Error = RemoteError;

    fn shards(&self) -> u32 {
        1
    }

    fn default_gid_index(&self, v4: bool) -> usize {
        self.info.default_gid_index(v4)
    }

    /// The engine's GID `index`, which must be the one this process sees at that index
    /// (the engine read the table when it started; an address added or removed since shifts
    /// it, and a connection from the wrong GID would never be answered).
    fn gid(&self, index: usize) -> Result<Gid, RemoteError> {
        let i = u32::try_from(index).map_err(|_| invalid("query_gid"))?;
        let raw = self.client().query_gid(i)?;
        let v6 = std::net::Ipv6Addr::from(raw);
        let ip = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
        let gid = Gid::of(ip);
        if self.info.gid(index).ok().map(|g| g.raw) != Some(gid.raw) {
            return Err(RemoteError::Local(format!(
                "GID {index} of the engine is {ip}, which this process does not see at that \
                 index: the interface's addresses changed since the engine started"
            )));
        }
        Ok(gid)
    }

    /// Checks the link's MTU as this process sees it; the engine checks its own frame size
    /// again when the QP connects (`EINVAL`).
    fn check_path_mtu(&self, mtu: u32, ipv6: bool) -> Result<(), RemoteError> {
        let max = self.info.max_path_mtu(ipv6);
        if mtu > max {
            return Err(RemoteError::Local(format!(
                "path MTU {mtu} does not fit the link's MTU {} (at most {max})",
                self.info.mtu
            )));
        }
        Ok(())
    }

    fn alloc_pd_on(&self, queue: u32) -> Result<PdId, RemoteError> {
        if queue != 0 {
            return Err(invalid("alloc_pd"));
        }
        self.client().alloc_pd()
    }

    fn create_cq_on(&self, queue: u32, depth: usize) -> Result<CqId, RemoteError> {
        let depth = u32::try_from(depth).map_err(|_| invalid("create_cq"))?;
        if queue != 0 {
            return Err(invalid("create_cq"));
        }
        self.client().create_cq(depth)
    }

    fn create_qp(&self, init: QpInit) -> Result<Qpn, RemoteError> {
        self.client().create_qp(&init)
    }

    fn qp_to_init(&self, qpn: Qpn, access: Access) -> Result<(), RemoteError> {
        self.client().qp_to_init(qpn, access)
    }

    fn connect_rc(&self, qpn: Qpn, t: &RcTarget) -> Result<(), RemoteError> {
        self.client().qp_connect_to(qpn, t)
    }

    /// Allocates `len` zeroed bytes here and registers them with the engine; the region's
    /// iova is their address in this process, as `ibv_reg_mr` gives it.
    fn reg_mr(&self, pd: PdId, len: usize, access: Access) -> Result<MrInfo, RemoteError> {
        if len == 0 {
            return Err(invalid("reg_mr"));
        }
        let buf = vec![0u64; len.div_ceil(8)].into_boxed_slice();
        let addr = buf.as_ptr() as u64;
        let view =
            ProcessMem::new(self.own.clone(), addr, len as u64).ok_or_else(|| invalid("reg_mr"))?;
        let (lkey, rkey) = self.client().reg_mr(pd, addr, len as u64, access)?;
        let info = MrInfo {
            lkey,
            rkey,
            iova: addr,
            len: len as u64,
            access,
            pd,
        };
        self.regions().insert(
            lkey.value(),
            Region {
                _buf: buf,
                view,
                info,
            },
        );
        Ok(info)
    }

    fn mr_write(&self, lkey: LKey, offset: usize, data: &[u8]) -> Result<(), RemoteError> {
        let view = self.view("mr_write", lkey, offset, data.len())?;
        if view.write(offset, data) {
            Ok(())
        } else {
            Err(invalid("mr_write"))
        }
    }

    fn mr_read(&self, lkey: LKey, offset: usize, out: &mut [u8]) -> Result<(), RemoteError> {
        let view = self.view("mr_read", lkey, offset, out.len())?;
        if view.read(offset, out) {
            Ok(())
        } else {
            Err(invalid("mr_read"))
        }
    }

    /// Copies the region out (one read of all of it through `/proc/self/mem`) and calls `f` on the copy.
    fn with_mr<R>(&self, lkey: LKey, f: impl FnOnce(&[u8]) -> R) -> Result<R, RemoteError> {
        let view = self.view("with_mr", lkey, 0, 0)?;
        let mut copy = vec![0u8; view.len()];
        if !view.read(0, &mut copy) {
            return Err(invalid("with_mr"));
        }
        Ok(f(&copy))
    }

    /// Carries SEND, WRITE, READ, compare-and-swap and fetch-and-add with up to
    /// [`proto::MAX_SGE`] SGEs; other operations, inline data and UD addressing are
    /// `EOPNOTSUPP` (the protocol does not carry them yet).
    fn post_send(&self, qpn: Qpn, wr: SendWr<Path>) -> Result<(), RemoteError> {
        if wr.ud.is_some() || wr.inline_data.is_some() {
            return Err(unsupported("post_send"));
        }
        if wr.sg_list.len() > proto::MAX_SGE {
            return Err(invalid("post_send"));
        }
        let key = |k: RKey| k.value();
        let op = match wr.op {
            SendOp::Send => WireOp::Send,
            SendOp::Write { remote_addr, rkey } => WireOp::Write {
                remote_addr,
                rkey: key(rkey),
            },
            SendOp::Read { remote_addr, rkey } => WireOp::Read {
                remote_addr,
                rkey: key(rkey),
            },
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => WireOp::CompareSwap {
                remote_addr,
                rkey: key(rkey),
                compare,
                swap,
            },
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => WireOp::FetchAdd {
                remote_addr,
                rkey: key(rkey),
                add,
            },
            _ => return Err(unsupported("post_send")),
        };
        let w = WireSendWr {
            wr_id: wr.wr_id,
            op,
            signaled: wr.flags.contains(SendFlags::SIGNALED),
            sges: Self::wire_sges(&wr.sg_list),
        };
        self.client().post_send(qpn, w)
    }

    fn post_recv(&self, qpn: Qpn, wr: RecvWr) -> Result<(), RemoteError> {
        if wr.sg_list.len() > proto::MAX_SGE {
            return Err(invalid("post_recv"));
        }
        self.client()
            .post_recv(qpn, wr.wr_id, Self::wire_sges(&wr.sg_list))
    }

    /// Polls up to `out.len()` completions, [`proto::MAX_POLL`] per round trip, until the CQ
    /// has no more or `out` is full.
    fn poll_cq_into(&self, cq: CqId, out: &mut [Wc]) -> Result<usize, RemoteError> {
        let mut n = 0;
        let mut c = self.client();
        while n < out.len() {
            let want = (out.len() - n).min(proto::MAX_POLL);
            let wcs = c.poll_cq(cq, u32::try_from(want).unwrap_or(1))?;
            for w in &wcs {
                out[n] = Self::wc(w);
                n += 1;
            }
            if wcs.len() < want {
                break;
            }
        }
        Ok(n)
    }

    /// One [`EngineClient::wait_cq`] (the engine waits up to `timeout` while the CQ is
    /// empty), then plain polls while full batches keep coming.
    fn wait_cq_into(
        &self,
        cq: CqId,
        out: &mut [Wc],
        timeout: std::time::Duration,
    ) -> Result<usize, RemoteError> {
        if out.is_empty() {
            return Ok(0);
        }
        let want = out.len().min(proto::MAX_POLL);
        let wcs = self
            .client()
            .wait_cq(cq, u32::try_from(want).unwrap_or(1), timeout)?;
        for (slot, w) in out.iter_mut().zip(&wcs) {
            *slot = Self::wc(w);
        }
        if wcs.len() < want {
            return Ok(wcs.len());
        }
        Ok(wcs.len() + self.poll_cq_into(cq, &mut out[wcs.len()..])?)
    }

    fn qp_state(&self, qpn: Qpn) -> Option<QpState> {
        self.client().query_qp(qpn).ok().map(|(_, state)| state)
    }

    fn cc_snapshots(&self) -> Vec<(Qpn, CcSnapshot)> {
        Vec::new()
    }

    fn qp_counters(&self) -> Vec<(Qpn, QpCounters)> {
        Vec::new()
    }
}

impl Drop for EngineDevice {
    /// Deregisters every region before its buffer is freed: once `DeregMr` answered, the
    /// engine never touches it again. A region the engine could not be told about (the
    /// connection broke) is leaked rather than freed, since the engine may still write there
    /// until it notices the closed connection.
    fn drop(&mut self) {
        let regions = std::mem::take(
            self.regions
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let c = self
            .client
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (lkey, r) in regions {
            if c.dereg_mr(LKey::new(lkey)).is_err() {
                std::mem::forget(r);
            }
        }
    }
}
