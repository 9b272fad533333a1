//! An async API over [`Device`], in the spirit of datenlord's async-rdma: posting a work
//! request returns a future ([`Completion`]) that resolves with that request's work
//! completion, and completion queues can be awaited as a [`Stream`] of work completions
//! ([`AsyncCq::unclaimed`]).
//!
//! # Objects
//!
//! [`AsyncDevice`] wraps a [`Device`] in an [`Arc`]; its objects — [`AsyncPd`], [`AsyncCq`],
//! [`AsyncQp`], [`LocalMr`] — own a reference to what they were made from instead of borrowing
//! it (as [`super::Pd`] and friends do), so they can move into spawned tasks (`'static +
//! Send`). The verbs' order of destruction still holds: a QP holds its PD and CQs, a region
//! its PD, and each object releases its verbs object when the last reference goes
//! (`ibv_destroy_qp`, `ibv_dereg_mr`, `ibv_destroy_cq`, `ibv_dealloc_pd`, in that order).
//!
//! # Owned buffers and cancellation
//!
//! A work request's buffer is a [`LocalMr`] moved into the call ([`AsyncQp::send`],
//! [`AsyncQp::recv`], [`AsyncQp::write`], [`AsyncQp::read`]) and handed back by the future
//! with the result, as io_uring runtimes (tokio-uring, monoio) do: while the transport may
//! read or write the region, nothing else can reach it. A [`Completion`] dropped before its
//! work completion came (a `select!` that took another branch, a task aborted, a timeout) is
//! cancelled safely: its buffer moves into the CQ's table of abandoned requests and stays
//! registered until the completion arrives (it is then deregistered and freed), or until the QP
//! is destroyed (`ibv_destroy_qp`: the transport drops the QP's outstanding requests, so none
//! can touch the region any more). The work request itself is not withdrawn — the verbs have
//! no such call — so a dropped receive still takes the next message the peer sends, and a
//! dropped send still goes out; the completions after it reach their own futures as usual.
//! [`AsyncCq::abandoned`] says how many buffers wait that way.
//!
//! # How completions reach their futures
//!
//! Each request gets a `wr_id` with bit 63 set ([`ASYNC_WR_BIT`]) and a slot in its CQ's table.
//! Whichever future of a CQ is polled drains the whole CQ ([`Device::poll_cq_or_wake`]) and
//! moves each completion into the slot of its `wr_id`, waking that slot's task; when the CQ is
//! empty the polling task's waker is registered with the engines, which wake it after the next
//! turn that made progress. Completions of requests posted with an application's own `wr_id`
//! ([`AsyncQp::post_send`], [`AsyncQp::post_recv`], below bit 63) are kept in order for the
//! CQ's stream ([`AsyncCq::unclaimed`]) until taken (an application that posts its own
//! requests consumes the stream, or they pile up there). On an inline device
//! ([`super::DeviceOptions::inline`]) every poll also runs an engine turn, and the inline
//! helper thread's turns wake the tasks. A turn wakes every task waiting on its transport
//! (one list per queue, not per CQ); each re-polls its CQ once, which for the tens of QPs a
//! task-per-QP server has is a lock and an empty poll per wake-up. Wakers must not poll the
//! task from inside `wake` (tokio and the usual executors schedule it).
//!
//! # Why here, without a feature, and without an eventfd
//!
//! The futures use nothing but [`std::task::Waker`]: the engine threads wake tasks directly
//! (the wakers `Device::poll_cq_or_wake` registers), so there is no completion channel's
//! eventfd to wrap in tokio's `AsyncFd`, no system call per wake-up, and any executor runs
//! them (the example and the tests use tokio). The module therefore adds no dependency to the
//! crate beyond `futures-core` for the [`Stream`] trait, and needs no cargo feature to keep the
//! core lean. The packet engines do not run on tokio: they busy-poll AF_XDP rings on their own
//! threads, where a runtime's scheduling would only add latency.

use std::{
    any::Any,
    collections::{HashMap, VecDeque},
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard},
    task::{Context, Poll, Waker},
};

use futures_core::Stream;

use super::{
    Access, ApiError, AttrMask, CqId, Device, LKey, MemBuf, MrInfo, Path, PdId, QpAttr, QpCap,
    QpInit, QpState, QpType, Qpn, RKey, RcConnect, RecvWr, SendOp, SendWr, Sge, Wc, WcStatus,
};

/// The `wr_id` bit of the requests the async API posts: each one's slot in its CQ's table. The
/// application's own requests ([`AsyncQp::post_send`], [`AsyncQp::post_recv`]) keep it clear.
pub const ASYNC_WR_BIT: u64 = 1 << 63;

/// How many completions one poll step moves out of the CQ at a time.
const DRAIN_BATCH: usize = 16;

/// What can go wrong with an async work request.
#[derive(Debug, thiserror::Error)]
pub enum AsyncError {
    /// The post itself was refused (QP state, full queue, ...): nothing was queued.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The work request completed with an error status (IBTA 11.4.2.1; rxe `rxe_completer`):
    /// the whole completion is here.
    #[error("work request {:#x} on QP {} completed with {:?}", .0.wr_id, .0.qp_num.value(), .0.status)]
    Completion(Wc),
    /// `len` bytes at `offset` do not fit a region (or the remote range) of `region` bytes.
    #[error("{len} bytes at offset {offset} do not fit a {region}-byte region")]
    Range {
        /// Offset asked.
        offset: u64,
        /// Length asked.
        len: u64,
        /// Length of the region.
        region: u64,
    },
    /// An application `wr_id` with [`ASYNC_WR_BIT`] set, which the async API keeps for its
    /// own requests.
    #[error("wr_id {0:#x} has bit 63 set, which the async API keeps for its own requests")]
    ReservedWrId(u64),
}

/// What an abandoned request keeps alive until its completion: its buffer.
type Keep = Box<dyn Any + Send>;

/// One posted request of the async API, by its `wr_id`.
enum Slot {
    /// Posted; the completion has not come. The waker of the task that last polled it.
    Waiting { qpn: Qpn, waker: Option<Waker> },
    /// The completion came; its future has not taken it yet.
    Done(Wc),
    /// Its future was dropped before the completion came: what it kept alive.
    Abandoned { qpn: Qpn, keep: Keep },
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Waiting { qpn, .. } => write!(f, "Waiting({})", qpn.value()),
            Self::Done(wc) => write!(f, "Done({wc:?})"),
            Self::Abandoned { qpn, .. } => write!(f, "Abandoned({})", qpn.value()),
        }
    }
}

/// What delivering completions left to do after the table's lock is released: tasks to wake
/// and abandoned buffers to release (deregistering takes the transport's lock).
#[derive(Default)]
struct Fallout {
    wake: Vec<Waker>,
    release: Vec<Keep>,
}

impl Fallout {
    fn finish(self) {
        for w in self.wake {
            w.wake();
        }
        drop(self.release);
    }
}

/// A CQ's table of requests (sans-I/O: completions in, wakers and released buffers out).
#[derive(Debug, Default)]
struct Dispatch {
    slots: HashMap<u64, Slot>,
    next: u64,
    /// Completions of the application's own requests, for the stream, oldest first.
    unclaimed: VecDeque<Wc>,
    /// The task awaiting the stream.
    stream: Option<Waker>,
    /// Completions of async requests that have no slot (their QP was destroyed after they
    /// were queued): dropped and counted.
    stale: u64,
}

impl Dispatch {
    /// A slot for a request of `qpn` about to be posted; call it before the post, so the
    /// completion finds the slot however soon it comes.
    fn register(&mut self, qpn: Qpn) -> u64 {
        let id = loop {
            let id = ASYNC_WR_BIT | (self.next & !ASYNC_WR_BIT);
            self.next = self.next.wrapping_add(1);
            if !self.slots.contains_key(&id) {
                break id;
            }
        };
        self.slots.insert(id, Slot::Waiting { qpn, waker: None });
        id
    }

    /// Forgets the slot of a request whose post was refused.
    fn unregister(&mut self, id: u64) {
        self.slots.remove(&id);
    }

    /// Moves one completion where it belongs.
    fn deliver(&mut self, wc: Wc, out: &mut Fallout) {
        if wc.wr_id & ASYNC_WR_BIT == 0 {
            self.unclaimed.push_back(wc);
            out.wake.extend(self.stream.take());
            return;
        }
        match self.slots.remove(&wc.wr_id) {
            Some(Slot::Waiting { waker, .. }) => {
                self.slots.insert(wc.wr_id, Slot::Done(wc));
                out.wake.extend(waker);
            }
            Some(Slot::Abandoned { keep, .. }) => out.release.push(keep),
            Some(done @ Slot::Done(_)) => {
                // A second completion for one request: the transport never makes one.
                self.slots.insert(wc.wr_id, done);
                self.stale += 1;
            }
            None => self.stale += 1,
        }
    }

    /// The completion of request `id` if it came (the slot is freed); otherwise remembers
    /// `waker` for it.
    fn take(&mut self, id: u64, waker: &Waker) -> Option<Wc> {
        match self.slots.get_mut(&id) {
            Some(Slot::Done(wc)) => {
                let wc = *wc;
                self.slots.remove(&id);
                Some(wc)
            }
            Some(Slot::Waiting { waker: w, .. }) => {
                if !w.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    *w = Some(waker.clone());
                }
                None
            }
            _ => None,
        }
    }

    /// Request `id`'s future was dropped: keeps `keep` until the completion comes, or returns
    /// it to be released now if the completion already came.
    fn abandon(&mut self, id: u64, keep: Keep) -> Option<Keep> {
        match self.slots.remove(&id) {
            Some(Slot::Waiting { qpn, .. }) => {
                self.slots.insert(id, Slot::Abandoned { qpn, keep });
                None
            }
            _ => Some(keep),
        }
    }

    /// QP `qpn` was destroyed: none of its requests will complete or touch memory any more.
    /// Abandoned buffers are released; a request still awaited (not possible through this
    /// module, whose futures keep their QP alive) completes as flushed.
    fn qp_gone(&mut self, qpn: Qpn, out: &mut Fallout) {
        let ids: Vec<u64> = self
            .slots
            .iter()
            .filter(|(_, s)| {
                matches!(s, Slot::Waiting { qpn: q, .. } | Slot::Abandoned { qpn: q, .. } if *q == qpn)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            match self.slots.remove(&id) {
                Some(Slot::Abandoned { keep, .. }) => out.release.push(keep),
                Some(Slot::Waiting { waker, .. }) => {
                    let wc = Wc {
                        wr_id: id,
                        status: WcStatus::WrFlushErr,
                        qp_num: qpn,
                        ..Wc::default()
                    };
                    self.slots.insert(id, Slot::Done(wc));
                    out.wake.extend(waker);
                }
                Some(other) => {
                    self.slots.insert(id, other);
                }
                None => {}
            }
        }
    }

    fn abandoned(&self) -> usize {
        self.slots
            .values()
            .filter(|s| matches!(s, Slot::Abandoned { .. }))
            .count()
    }
}

/// Logs a release that failed in `drop`, where it cannot be returned.
fn dropped(what: &str, r: Result<(), ApiError>) {
    if let Err(e) = r {
        log::warn!("releasing {what} on drop failed: {e}");
    }
}

/// A [`Device`] for async applications: makes the objects of this module. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AsyncDevice {
    dev: Arc<Device>,
}

impl AsyncDevice {
    /// Wraps an open device ([`Device::open`]). Call it once, after opening; the device
    /// closes when the last object made from it is dropped.
    #[must_use]
    pub fn new(dev: Device) -> Self {
        Self { dev: Arc::new(dev) }
    }

    /// Wraps a device already shared, to mix this API with [`Device`]'s own calls.
    #[must_use]
    pub const fn from_arc(dev: Arc<Device>) -> Self {
        Self { dev }
    }

    /// The device, for its other calls (GIDs, counters, the id-based verbs).
    #[must_use]
    pub const fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    /// Allocates a protection domain (`ibv_alloc_pd`); freed when the last object made in it
    /// and the handle are gone. Call it first.
    ///
    /// # Errors
    /// Too many protection domains.
    pub fn pd(&self) -> Result<AsyncPd, ApiError> {
        self.pd_on(0)
    }

    /// [`AsyncDevice::pd`] on `queue`'s transport of a sharded device ([`Device::alloc_pd_on`]).
    ///
    /// # Errors
    /// No such queue, or too many protection domains.
    pub fn pd_on(&self, queue: u32) -> Result<AsyncPd, ApiError> {
        let id = self.dev.alloc_pd_on(queue)?;
        Ok(AsyncPd(Arc::new(PdInner {
            dev: Arc::clone(&self.dev),
            id,
        })))
    }

    /// Creates a completion queue of `depth` entries (`ibv_create_cq`), destroyed when the
    /// handle and the QPs that complete on it are gone. Call it before the QPs; make it deep
    /// enough for every request the QPs may have outstanding at once, or it overflows.
    ///
    /// # Errors
    /// Too many CQs, or `depth` is 0 or too deep.
    pub fn cq(&self, depth: usize) -> Result<AsyncCq, ApiError> {
        self.cq_on(0, depth)
    }

    /// [`AsyncDevice::cq`] on `queue`'s transport of a sharded device
    /// ([`Device::create_cq_on`]).
    ///
    /// # Errors
    /// No such queue, too many CQs, or `depth` is 0 or too deep.
    pub fn cq_on(&self, queue: u32, depth: usize) -> Result<AsyncCq, ApiError> {
        let id = self.dev.create_cq_on(queue, depth)?;
        Ok(AsyncCq(Arc::new(CqInner {
            dev: Arc::clone(&self.dev),
            id,
            dispatch: Mutex::new(Dispatch::default()),
        })))
    }
}

#[derive(Debug)]
struct PdInner {
    dev: Arc<Device>,
    id: PdId,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        dropped("a protection domain", self.dev.dealloc_pd(self.id));
    }
}

/// A protection domain (`struct ibv_pd`) of [`AsyncDevice::pd`]. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AsyncPd(Arc<PdInner>);

impl AsyncPd {
    /// The PD's id, for [`Device`]'s id-based calls.
    #[must_use]
    pub fn id(&self) -> PdId {
        self.0.id
    }

    /// Registers a zeroed region of `len` bytes with the rights `access` (`ibv_reg_mr`), as
    /// an owned buffer for this module's requests. Call it before posting; give a region the
    /// peer WRITEs into ([`LocalMr::remote`]) to the peer.
    ///
    /// # Errors
    /// Too many regions, or bad access flags (remote write or atomic without local write).
    pub fn reg_mr(&self, len: usize, access: Access) -> Result<LocalMr, ApiError> {
        let info = self.0.dev.reg_mr(self.0.id, len, access)?;
        Ok(LocalMr {
            pd: Arc::clone(&self.0),
            info,
        })
    }

    /// Registers a buffer the application filled (`ibv_reg_mr` over its bytes).
    ///
    /// # Errors
    /// Too many regions, or bad access flags.
    pub fn reg_buf(&self, buf: MemBuf, access: Access) -> Result<LocalMr, ApiError> {
        let info = self.0.dev.reg_mr_mem(self.0.id, buf, access)?;
        Ok(LocalMr {
            pd: Arc::clone(&self.0),
            info,
        })
    }

    /// Creates a QP in RESET whose sends complete on `send_cq` and receives on `recv_cq`
    /// (`ibv_create_qp`); the QP holds the PD and both CQs. Next: [`AsyncQp::to_init`], post
    /// the first receives, [`AsyncQp::connect`].
    ///
    /// # Errors
    /// [`ApiError::ForeignHandle`] for a CQ of another device; as [`Device::create_qp`].
    pub fn create_qp(
        &self,
        send_cq: &AsyncCq,
        recv_cq: &AsyncCq,
        qp_type: QpType,
        cap: QpCap,
    ) -> Result<AsyncQp, ApiError> {
        for cq in [send_cq, recv_cq] {
            if !Arc::ptr_eq(&cq.0.dev, &self.0.dev) {
                return Err(ApiError::ForeignHandle("completion queue"));
            }
        }
        let init = QpInit {
            send_cq: send_cq.0.id,
            recv_cq: recv_cq.0.id,
            cap,
            ..QpInit::new(qp_type, self.0.id, send_cq.0.id)
        };
        let qpn = self.0.dev.create_qp(init)?;
        Ok(AsyncQp(Arc::new(QpInner {
            pd: Arc::clone(&self.0),
            send_cq: Arc::clone(&send_cq.0),
            recv_cq: Arc::clone(&recv_cq.0),
            qpn,
        })))
    }
}

/// A registered region (`struct ibv_mr`) owned by the application and moved into the requests
/// that use it: while a request holds it, only the transport reaches its bytes. Dropping it
/// deregisters it (`ibv_dereg_mr`). The device keeps the bytes; copy in and out with
/// [`LocalMr::write`] and [`LocalMr::read`].
#[derive(Debug)]
pub struct LocalMr {
    pd: Arc<PdInner>,
    info: MrInfo,
}

/// A peer's region as this side addresses it in RDMA WRITE and READ: what the peer learned
/// from its [`LocalMr::remote`] and sent over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteMr {
    /// First address (the peer's iova).
    pub addr: u64,
    /// The peer's R_Key.
    pub rkey: RKey,
    /// Length in bytes.
    pub len: u64,
}

impl LocalMr {
    /// The local key.
    #[must_use]
    pub const fn lkey(&self) -> LKey {
        self.info.lkey
    }

    /// The remote key (valid with a remote right).
    #[must_use]
    pub const fn rkey(&self) -> RKey {
        self.info.rkey
    }

    /// The first I/O virtual address.
    #[must_use]
    pub const fn addr(&self) -> u64 {
        self.info.iova
    }

    /// Length in bytes.
    #[must_use]
    pub const fn len(&self) -> u64 {
        self.info.len
    }

    /// Whether the region has no bytes.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.info.len == 0
    }

    /// What the peer needs to WRITE into or READ from this region: send it over before it
    /// does.
    #[must_use]
    pub const fn remote(&self) -> RemoteMr {
        RemoteMr {
            addr: self.info.iova,
            rkey: self.info.rkey,
            len: self.info.len,
        }
    }

    /// Copies `data` into the region at `offset` (before a send or write).
    ///
    /// # Errors
    /// Out of bounds.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), ApiError> {
        self.pd.dev.mr_write(self.info.lkey, offset, data)
    }

    /// Copies `out.len()` bytes at `offset` into `out` (after a receive or read completed, or
    /// the peer's WRITE was announced).
    ///
    /// # Errors
    /// Out of bounds.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), ApiError> {
        self.pd.dev.mr_read(self.info.lkey, offset, out)
    }

    /// `len` bytes at `offset`, in a new vector.
    ///
    /// # Errors
    /// Out of bounds.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>, ApiError> {
        let mut v = vec![0; len];
        self.read(offset, &mut v)?;
        Ok(v)
    }

    /// The scatter/gather entry of `len` bytes at `offset`, checked against the region.
    fn sge(&self, offset: u64, len: u32) -> Result<Sge, AsyncError> {
        check_range(offset, u64::from(len), self.info.len)?;
        Ok(Sge {
            addr: self.info.iova + offset,
            length: len,
            lkey: self.info.lkey,
        })
    }
}

fn check_range(offset: u64, len: u64, region: u64) -> Result<(), AsyncError> {
    if offset.checked_add(len).is_none_or(|end| end > region) {
        return Err(AsyncError::Range {
            offset,
            len,
            region,
        });
    }
    Ok(())
}

impl Drop for LocalMr {
    fn drop(&mut self) {
        dropped(
            "a memory region",
            self.pd.dev.dereg_mr(self.info.lkey).map(drop),
        );
    }
}

#[derive(Debug)]
struct CqInner {
    dev: Arc<Device>,
    id: CqId,
    dispatch: Mutex<Dispatch>,
}

impl CqInner {
    fn lock(&self) -> MutexGuard<'_, Dispatch> {
        self.dispatch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Moves every completion in the CQ to its slot or the stream, until the CQ is empty; the
    /// last, empty, poll registers `waker` with the engines.
    fn drain(&self, d: &mut Dispatch, waker: &Waker, out: &mut Fallout) {
        let mut buf = [Wc::default(); DRAIN_BATCH];
        loop {
            let n = self.dev.poll_cq_or_wake(self.id, &mut buf, waker);
            if n == 0 {
                break;
            }
            for wc in &buf[..n] {
                d.deliver(*wc, out);
            }
        }
    }

    /// The poll step of a [`Completion`].
    fn poll_wr(&self, id: u64, cx: &Context<'_>) -> Poll<Wc> {
        let mut out = Fallout::default();
        let wc = {
            let mut d = self.lock();
            d.take(id, cx.waker()).or_else(|| {
                self.drain(&mut d, cx.waker(), &mut out);
                d.take(id, cx.waker())
            })
        };
        out.finish();
        wc.map_or(Poll::Pending, Poll::Ready)
    }

    /// The poll step of the stream.
    fn poll_unclaimed(&self, cx: &Context<'_>) -> Poll<Wc> {
        let mut out = Fallout::default();
        let wc = {
            let mut d = self.lock();
            d.unclaimed.pop_front().or_else(|| {
                d.stream = Some(cx.waker().clone());
                self.drain(&mut d, cx.waker(), &mut out);
                d.unclaimed.pop_front()
            })
        };
        out.finish();
        wc.map_or(Poll::Pending, Poll::Ready)
    }
}

impl Drop for CqInner {
    fn drop(&mut self) {
        // Its QPs are gone (each held the CQ), so no request can touch the buffers still in
        // the table; they are released with it, after the CQ.
        dropped("a completion queue", self.dev.destroy_cq(self.id));
    }
}

/// A completion queue (`struct ibv_cq`) of [`AsyncDevice::cq`]. Cheap to clone. The
/// [`Completion`]s of requests on it resolve through it; completions of the application's own
/// `wr_id`s come out of [`AsyncCq::unclaimed`].
#[derive(Clone, Debug)]
pub struct AsyncCq(Arc<CqInner>);

impl AsyncCq {
    /// The CQ's id, for [`Device`]'s id-based calls (do not poll it there while futures
    /// await it: their completions would be taken from them).
    #[must_use]
    pub fn id(&self) -> CqId {
        self.0.id
    }

    /// The stream of this CQ's completions of requests posted with the application's own
    /// `wr_id` ([`AsyncQp::post_send`], [`AsyncQp::post_recv`]), in CQ order. It never ends;
    /// one task should consume it (a second stream takes turns with the first).
    #[must_use]
    pub fn unclaimed(&self) -> WcStream {
        WcStream(Arc::clone(&self.0))
    }

    /// How many buffers of dropped futures wait for their completion (or their QP's
    /// destruction) before they are deregistered.
    #[must_use]
    pub fn abandoned(&self) -> usize {
        self.0.lock().abandoned()
    }

    /// How many completions of async requests found no slot (their QP was destroyed after
    /// they were queued) and were dropped.
    #[must_use]
    pub fn stale(&self) -> u64 {
        self.0.lock().stale
    }
}

/// The [`Stream`] of [`AsyncCq::unclaimed`]: the application's own work completions.
#[derive(Debug)]
pub struct WcStream(Arc<CqInner>);

impl WcStream {
    /// The next completion (the stream's `next()` without an extension trait).
    pub async fn next_wc(&mut self) -> Wc {
        std::future::poll_fn(|cx| self.0.poll_unclaimed(cx)).await
    }
}

impl Stream for WcStream {
    type Item = Wc;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Wc>> {
        self.0.poll_unclaimed(cx).map(Some)
    }
}

#[derive(Debug)]
struct QpInner {
    pd: Arc<PdInner>,
    send_cq: Arc<CqInner>,
    recv_cq: Arc<CqInner>,
    qpn: Qpn,
}

impl Drop for QpInner {
    fn drop(&mut self) {
        dropped("a queue pair", self.pd.dev.destroy_qp(self.qpn));
        // Destroyed, the QP's outstanding requests are gone: their buffers can go.
        let mut out = Fallout::default();
        self.send_cq.lock().qp_gone(self.qpn, &mut out);
        self.recv_cq.lock().qp_gone(self.qpn, &mut out);
        out.finish();
    }
}

/// A queue pair (`struct ibv_qp`) of [`AsyncPd::create_qp`]. Cheap to clone: tasks may share
/// it (requests are posted in the order the calls are made). Destroyed (`ibv_destroy_qp`) when
/// the last clone and the last [`Completion`] of its requests are gone.
#[derive(Clone, Debug)]
pub struct AsyncQp(Arc<QpInner>);

impl AsyncQp {
    /// The QP number.
    #[must_use]
    pub fn qpn(&self) -> Qpn {
        self.0.qpn
    }

    /// The QP's state.
    #[must_use]
    pub fn state(&self) -> Option<QpState> {
        self.0.pd.dev.qp_state(self.0.qpn)
    }

    /// `ibv_modify_qp` ([`Device::modify_qp`]). A move to ERR completes the outstanding
    /// requests as flushed ([`AsyncError::Completion`] with `WrFlushErr`).
    ///
    /// # Errors
    /// As [`Device::modify_qp`].
    pub fn modify(&self, attr: &QpAttr<Path>, mask: AttrMask) -> Result<(), ApiError> {
        self.0.pd.dev.modify_qp(self.0.qpn, attr, mask)
    }

    /// RESET → INIT granting the peer `access` ([`Device::qp_to_init`]). Call it right after
    /// creating the QP; receives may be posted from here on.
    ///
    /// # Errors
    /// As [`Device::modify_qp`].
    pub fn to_init(&self, access: Access) -> Result<(), ApiError> {
        self.0.pd.dev.qp_to_init(self.0.qpn, access)
    }

    /// The address vector to the peer's QP `remote_qpn` at `remote_gid` ([`Device::path_to`]).
    ///
    /// # Errors
    /// Bad GID index, mixed address families, or the next hop's MAC does not resolve.
    pub fn path_to(
        &self,
        gid_index: usize,
        remote_gid: &[u8; 16],
        remote_qpn: Qpn,
    ) -> Result<Path, ApiError> {
        self.0
            .pd
            .dev
            .path_to(gid_index, remote_gid, self.0.qpn, remote_qpn)
    }

    /// INIT → RTR → RTS ([`Device::qp_connect`]). Call it after exchanging QP numbers, PSNs
    /// and GIDs with the peer, and after posting the receives the peer's first SENDs need.
    ///
    /// # Errors
    /// As [`Device::modify_qp`].
    pub fn connect(&self, c: &RcConnect) -> Result<(), ApiError> {
        self.0.pd.dev.qp_connect(self.0.qpn, c)
    }

    /// Posts with a fresh slot on `cq`: the slot exists before the post, so its completion
    /// always finds it.
    fn post<T: Send + 'static>(
        &self,
        cq: &Arc<CqInner>,
        buf: T,
        post: impl FnOnce(u64, &T) -> Result<(), AsyncError>,
    ) -> Completion<T> {
        let id = cq.lock().register(self.0.qpn);
        match post(id, &buf) {
            Ok(()) => Completion {
                posted: Some(Posted {
                    _qp: Arc::clone(&self.0),
                    cq: Arc::clone(cq),
                    id,
                }),
                error: None,
                buf: Some(buf),
            },
            Err(e) => {
                cq.lock().unregister(id);
                Completion {
                    posted: None,
                    error: Some(e),
                    buf: Some(buf),
                }
            }
        }
    }

    /// SENDs the first `len` bytes of `buf` (`IBV_WR_SEND`, signalled). The future resolves
    /// when the peer acknowledged them (RC: IBTA 9.7.5.1) and hands `buf` back. Posted at
    /// once, in call order; awaiting is only for the completion.
    pub fn send(&self, buf: LocalMr, len: u32) -> Completion<LocalMr> {
        let dev = Arc::clone(&self.0.pd.dev);
        let qpn = self.0.qpn;
        self.post(&self.0.send_cq, buf, |id, b| {
            let sge = b.sge(0, len)?;
            Ok(dev.post_send(qpn, SendWr::send(id, vec![sge]))?)
        })
    }

    /// Posts a receive of the whole of `buf` (`ibv_post_recv`) for the peer's next SEND. The
    /// future resolves with the receive's completion (`byte_len` bytes now at the start of
    /// `buf`) and hands `buf` back. Post receives before the peer sends (RC: else it waits out
    /// RNR NAKs); a receive whose future is dropped still takes a message (see the module
    /// doc).
    pub fn recv(&self, buf: LocalMr) -> Completion<LocalMr> {
        let dev = Arc::clone(&self.0.pd.dev);
        let qpn = self.0.qpn;
        self.post(&self.0.recv_cq, buf, |id, b| {
            let len = u32::try_from(b.len()).unwrap_or(u32::MAX);
            let sg_list = vec![b.sge(0, len)?];
            Ok(dev.post_recv(qpn, RecvWr { wr_id: id, sg_list })?)
        })
    }

    /// RDMA WRITEs `len` bytes of `buf` at `offset` to the start of the peer's region
    /// `remote` (`IBV_WR_RDMA_WRITE`, signalled); the future resolves when the peer
    /// acknowledged them and hands `buf` back. A SEND posted after it reaches the peer after
    /// the WRITE's bytes (RC ordering, IBTA 9.5), which is how the peer learns they are there.
    pub fn write(
        &self,
        buf: LocalMr,
        offset: u64,
        len: u32,
        remote: RemoteMr,
    ) -> Completion<LocalMr> {
        self.rdma(buf, offset, len, remote, false)
    }

    /// RDMA READs `len` bytes from the start of the peer's region `remote` into `buf` at
    /// `offset` (`IBV_WR_RDMA_READ`); the future resolves when the bytes are in `buf` and
    /// hands it back.
    pub fn read(
        &self,
        buf: LocalMr,
        offset: u64,
        len: u32,
        remote: RemoteMr,
    ) -> Completion<LocalMr> {
        self.rdma(buf, offset, len, remote, true)
    }

    fn rdma(
        &self,
        buf: LocalMr,
        offset: u64,
        len: u32,
        remote: RemoteMr,
        read: bool,
    ) -> Completion<LocalMr> {
        let dev = Arc::clone(&self.0.pd.dev);
        let qpn = self.0.qpn;
        self.post(&self.0.send_cq, buf, |id, b| {
            check_range(0, u64::from(len), remote.len)?;
            let sge = b.sge(offset, len)?;
            let (remote_addr, rkey) = (remote.addr, remote.rkey);
            let op = if read {
                SendOp::Read { remote_addr, rkey }
            } else {
                SendOp::Write { remote_addr, rkey }
            };
            Ok(dev.post_send(qpn, SendWr::new(id, op, vec![sge]))?)
        })
    }

    /// Posts the application's own send work request (`ibv_post_send`), whose completion, if
    /// signalled, comes out of the send CQ's [`AsyncCq::unclaimed`] stream. The caller keeps
    /// the regions its SG list names registered until then.
    ///
    /// # Errors
    /// [`AsyncError::ReservedWrId`], or the post's errors.
    pub fn post_send(&self, wr: SendWr<Path>) -> Result<(), AsyncError> {
        if wr.wr_id & ASYNC_WR_BIT != 0 {
            return Err(AsyncError::ReservedWrId(wr.wr_id));
        }
        Ok(self.0.pd.dev.post_send(self.0.qpn, wr)?)
    }

    /// Posts the application's own receive work request (`ibv_post_recv`), whose completion
    /// comes out of the receive CQ's [`AsyncCq::unclaimed`] stream.
    ///
    /// # Errors
    /// [`AsyncError::ReservedWrId`], or the post's errors.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), AsyncError> {
        if wr.wr_id & ASYNC_WR_BIT != 0 {
            return Err(AsyncError::ReservedWrId(wr.wr_id));
        }
        Ok(self.0.pd.dev.post_recv(self.0.qpn, wr)?)
    }
}

/// A posted request: its QP (kept alive while the future lives), CQ and slot.
struct Posted {
    _qp: Arc<QpInner>,
    cq: Arc<CqInner>,
    id: u64,
}

/// The future of one work request ([`AsyncQp::send`], [`AsyncQp::recv`], [`AsyncQp::write`],
/// [`AsyncQp::read`]): resolves with the request's work completion — `Ok` for `Success`,
/// [`AsyncError::Completion`] for an error status, [`AsyncError::Api`] or
/// [`AsyncError::Range`] if the post was refused — and the buffer the request held. Await it
/// once; dropping it before it resolves is safe (see the module doc).
#[must_use = "the buffer comes back through the future; dropping it abandons the buffer until the request completes"]
pub struct Completion<T: Send + 'static> {
    posted: Option<Posted>,
    error: Option<AsyncError>,
    buf: Option<T>,
}

impl<T: Send + 'static> std::fmt::Debug for Completion<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion")
            .field("wr_id", &self.posted.as_ref().map(|p| p.id))
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static> Completion<T> {
    /// The `wr_id` the request was posted with (`None` if the post was refused).
    #[must_use]
    pub fn wr_id(&self) -> Option<u64> {
        self.posted.as_ref().map(|p| p.id)
    }
}

impl<T: Send + Unpin + 'static> Future for Completion<T> {
    type Output = (Result<Wc, AsyncError>, T);

    /// # Panics
    /// Polled again after it resolved (the `Future` contract).
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let Some(e) = this.error.take() {
            let buf = this
                .buf
                .take()
                .expect("Completion polled after it resolved");
            return Poll::Ready((Err(e), buf));
        }
        let posted = this
            .posted
            .as_ref()
            .expect("Completion polled after it resolved");
        match posted.cq.poll_wr(posted.id, cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(wc) => {
                this.posted = None;
                let buf = this
                    .buf
                    .take()
                    .expect("a posted Completion holds its buffer");
                let r = if wc.status == WcStatus::Success {
                    Ok(wc)
                } else {
                    Err(AsyncError::Completion(wc))
                };
                Poll::Ready((r, buf))
            }
        }
    }
}

impl<T: Send + 'static> Drop for Completion<T> {
    fn drop(&mut self) {
        if let Some(p) = self.posted.take() {
            let keep: Keep = Box::new(self.buf.take());
            let now = p.cq.lock().abandon(p.id, keep);
            // Completed already: released here, outside the table's lock.
            drop(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use super::*;

    /// A waker that counts its wakes.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waker() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count::default());
        (Arc::clone(&c), Waker::from(c))
    }

    /// A buffer that counts its drops: released exactly once, when it should be.
    struct Buf(Arc<AtomicUsize>);

    impl Drop for Buf {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn wc(id: u64, qpn: u32) -> Wc {
        Wc {
            wr_id: id,
            qp_num: Qpn::new(qpn),
            byte_len: 7,
            ..Wc::default()
        }
    }

    fn deliver(d: &mut Dispatch, w: Wc) -> usize {
        let mut out = Fallout::default();
        d.deliver(w, &mut out);
        let n = out.release.len();
        out.finish();
        n
    }

    #[test]
    fn completions_reach_their_own_waiters_in_any_order() {
        let mut d = Dispatch::default();
        let q = Qpn::new(17);
        let ids: Vec<u64> = (0..3).map(|_| d.register(q)).collect();
        assert!(ids.iter().all(|id| id & ASYNC_WR_BIT != 0));
        let wakers: Vec<_> = ids.iter().map(|_| waker()).collect();
        for (id, (_, w)) in ids.iter().zip(&wakers) {
            assert_eq!(d.take(*id, w), None);
        }
        // The second completes first: only its task is woken, and only it finds its WC.
        deliver(&mut d, wc(ids[1], 17));
        let woken: Vec<usize> = wakers
            .iter()
            .map(|(c, _)| c.0.load(Ordering::SeqCst))
            .collect();
        assert_eq!(woken, [0, 1, 0]);
        assert_eq!(d.take(ids[0], &wakers[0].1), None);
        assert_eq!(d.take(ids[1], &wakers[1].1).map(|w| w.wr_id), Some(ids[1]));
        // Taken once: the slot is gone.
        assert_eq!(d.take(ids[1], &wakers[1].1), None);
        deliver(&mut d, wc(ids[0], 17));
        deliver(&mut d, wc(ids[2], 17));
        assert_eq!(d.take(ids[2], &wakers[2].1).map(|w| w.wr_id), Some(ids[2]));
        assert_eq!(d.take(ids[0], &wakers[0].1).map(|w| w.wr_id), Some(ids[0]));
        assert!(d.slots.is_empty());
        assert_eq!(d.stale, 0);
    }

    #[test]
    fn a_dropped_future_keeps_its_buffer_until_its_completion_and_the_next_reach_their_waiters() {
        let mut d = Dispatch::default();
        let q = Qpn::new(20);
        let (first, second) = (d.register(q), d.register(q));
        let (count, w2) = waker();
        assert_eq!(d.take(second, &w2), None);
        // The first future is dropped before its completion: the buffer waits in the table.
        let drops = Arc::new(AtomicUsize::new(0));
        assert!(
            d.abandon(first, Box::new(Buf(Arc::clone(&drops))))
                .is_none()
        );
        assert_eq!(d.abandoned(), 1);
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        // Its completion releases the buffer (once) and wakes no one; the next completion
        // still reaches the second future.
        assert_eq!(deliver(&mut d, wc(first, 20)), 1);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        assert_eq!(d.abandoned(), 0);
        deliver(&mut d, wc(second, 20));
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(d.take(second, &w2).map(|w| w.wr_id), Some(second));
        assert!(d.slots.is_empty());
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_future_dropped_after_its_completion_came_releases_at_once() {
        let mut d = Dispatch::default();
        let id = d.register(Qpn::new(3));
        deliver(&mut d, wc(id, 3));
        let drops = Arc::new(AtomicUsize::new(0));
        let back = d.abandon(id, Box::new(Buf(Arc::clone(&drops))));
        assert!(back.is_some(), "handed back to be released now");
        drop(back);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert!(d.slots.is_empty());
    }

    #[test]
    fn a_destroyed_qp_releases_its_abandoned_buffers_and_its_late_completions_are_stale() {
        let mut d = Dispatch::default();
        let (a, b) = (Qpn::new(30), Qpn::new(31));
        let (ia, ib) = (d.register(a), d.register(b));
        let drops = Arc::new(AtomicUsize::new(0));
        assert!(d.abandon(ia, Box::new(Buf(Arc::clone(&drops)))).is_none());
        assert!(d.abandon(ib, Box::new(Buf(Arc::clone(&drops)))).is_none());
        let mut out = Fallout::default();
        d.qp_gone(a, &mut out);
        out.finish();
        // Only QP a's buffer went; b's still waits.
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(d.abandoned(), 1);
        // A completion of a's that was already queued finds no slot: dropped and counted.
        assert_eq!(deliver(&mut d, wc(ia, 30)), 0);
        assert_eq!(d.stale, 1);
        assert_eq!(deliver(&mut d, wc(ib, 31)), 1);
        assert_eq!(drops.load(Ordering::SeqCst), 2);
        assert!(d.slots.is_empty());
    }

    #[test]
    fn a_waiter_of_a_destroyed_qp_is_flushed_not_left_hanging() {
        let mut d = Dispatch::default();
        let q = Qpn::new(40);
        let id = d.register(q);
        let (count, w) = waker();
        assert_eq!(d.take(id, &w), None);
        let mut out = Fallout::default();
        d.qp_gone(q, &mut out);
        out.finish();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        let got = d.take(id, &w).expect("flushed");
        assert_eq!((got.status, got.qp_num), (WcStatus::WrFlushErr, q));
    }

    #[test]
    fn application_wr_ids_go_to_the_stream_in_order() {
        let mut d = Dispatch::default();
        let (count, w) = waker();
        d.stream = Some(w);
        let id = d.register(Qpn::new(5));
        deliver(&mut d, wc(9, 5));
        deliver(&mut d, wc(id, 5));
        deliver(&mut d, wc(10, 5));
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        let ids: Vec<u64> = d.unclaimed.iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, [9, 10]);
        assert_eq!(d.stale, 0);
    }

    #[test]
    fn a_refused_post_leaves_no_slot_and_ids_skip_live_ones() {
        let mut d = Dispatch::default();
        let id = d.register(Qpn::new(1));
        d.unregister(id);
        assert!(d.slots.is_empty());
        // Wrapped around onto a live slot, registration skips it.
        let live = d.register(Qpn::new(1));
        d.next = live & !ASYNC_WR_BIT;
        let other = d.register(Qpn::new(1));
        assert_ne!(live, other);
    }

    #[test]
    fn ranges_outside_a_region_are_refused() {
        assert!(check_range(0, 10, 10).is_ok());
        assert!(matches!(
            check_range(1, 10, 10),
            Err(AsyncError::Range {
                offset: 1,
                len: 10,
                region: 10
            })
        ));
        assert!(check_range(u64::MAX, 2, 10).is_err());
    }
}
