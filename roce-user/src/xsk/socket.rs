//! One AF_XDP socket bound to one (interface, queue), with its own UMEM.

use std::{
    collections::VecDeque,
    ffi::CString,
    io,
    os::fd::{AsRawFd, RawFd},
    time::Duration,
};

use roce_common::stamp;
use xdpilone::{
    CompletionQueue, FillQueue, IfInfo, ReadRx, RingRx, RingTx, Socket, SocketConfig, Umem,
    UmemConfig, User, WriteTx, xdp::XdpDesc,
};

use super::{
    BindMode, BindRequest, MULTI_BUFFER_MAX_LEN, XDP_PKT_CONTD, XDP_USE_SG, XskConfig, XskError,
    XskStats, errno_to_io, monotonic_ns,
    umem::{FrameAccounting, FrameBook, FrameIdx, FrameLoc, UmemArea},
};

/// What the handler wants done with a received frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxVerdict {
    /// Return the frame to the pool.
    Recycle,
    /// Transmit the first `len` bytes of the (possibly rewritten) frame on this queue.
    Transmit {
        /// Length of the frame to send, at most the received buffer's length.
        len: usize,
    },
}

/// Why [`TxSink::send`] did not queue a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TxError {
    /// The transmit backlog is full or no frame is free: try again after completions.
    #[error("no room to transmit: the backlog is full or no frame is free")]
    Full,
    /// The writer returned 0 or more than the frame size; nothing was sent.
    #[error("the frame writer returned an invalid length")]
    BadLength,
}

/// A frame queued for the TX ring.
#[derive(Clone, Copy, Debug)]
struct TxDesc {
    idx: FrameIdx,
    off: u32,
    len: u32,
    /// `XDP_PKT_CONTD` when the next descriptor continues this packet (multi-buffer).
    options: u32,
}

/// The most descriptors one multi-buffer packet takes: [`MULTI_BUFFER_MAX_LEN`] over the
/// smallest frame size (2048).
const MAX_PARTS: usize = MULTI_BUFFER_MAX_LEN.div_ceil(2048);

/// A multi-buffer packet being joined from its RX descriptors ([`XskConfig::multi_buffer`]).
/// It lives in the queue, not the batch: a packet's descriptors may straddle two batches.
struct Join {
    buf: Vec<u8>,
    /// Bytes of the packet so far.
    len: usize,
    /// The packet outgrew `buf`; its remaining descriptors are dropped with it.
    overflow: bool,
    /// One of its descriptors was unusable (counted in `bad_ring_addr`); the packet is dropped.
    broken: bool,
    /// The arrival stamp in front of the packet's first descriptor.
    stamp: stamp::Arrival,
}

impl Join {
    /// Marks the packet being joined as broken when an unusable descriptor belongs to it
    /// (one is being joined, or the descriptor says more follows); a broken packet is dropped
    /// whole at its last descriptor rather than handed over with a part missing.
    fn skip_part(&mut self, options: u32) {
        let contd = options & XDP_PKT_CONTD != 0;
        if contd {
            self.broken = true;
        } else if self.len > 0 || self.overflow || self.broken {
            self.reset();
        }
    }

    fn reset(&mut self) {
        self.len = 0;
        self.overflow = false;
        self.broken = false;
        self.stamp = stamp::Arrival::Missing;
    }
}

/// Frames held by the application in order to be sent, waiting for room on the TX ring.
struct Backlog {
    q: VecDeque<TxDesc>,
    cap: usize,
}

/// Lets a handler queue frames for transmit without allocating: each `send` takes a frame from
/// the pool, lets the caller write it, and queues it; [`XskQueue::flush_tx`] puts it on the ring.
pub struct TxSink<'q> {
    book: &'q mut FrameBook,
    backlog: &'q mut Backlog,
    stats: &'q mut XskStats,
    /// The staging buffer of a multi-buffer socket ([`XskConfig::multi_buffer`]).
    stage: Option<&'q mut Vec<u8>>,
    /// Frames this sink may still queue ([`XskQueue::with_tx_sink_limit`]).
    left: usize,
}

impl<'q> TxSink<'q> {
    /// A sink over the queue's pool and backlog that takes at most `left` frames.
    fn new(
        book: &'q mut FrameBook,
        backlog: &'q mut Backlog,
        stats: &'q mut XskStats,
        stage: Option<&'q mut Vec<u8>>,
        left: usize,
    ) -> Self {
        Self {
            book,
            backlog,
            stats,
            stage,
            left,
        }
    }

    /// Frames one `send` may take: 1, or on a multi-buffer socket as many as the longest
    /// packet needs, all of which must be free before the writer runs.
    fn frames_per_send(&self) -> usize {
        match self.stage {
            None => 1,
            Some(_) => MULTI_BUFFER_MAX_LEN.div_ceil(self.book.frame_size() as usize),
        }
    }

    /// How many more `send` calls would be accepted right now.
    #[must_use]
    pub fn room(&self) -> usize {
        let per = self.frames_per_send();
        (self.book.pool_len() / per)
            .min((self.backlog.cap - self.backlog.q.len()) / per)
            .min(self.left)
    }

    /// The largest frame `send` takes: the UMEM frame size, or [`MULTI_BUFFER_MAX_LEN`] on a
    /// multi-buffer socket.
    #[must_use]
    pub fn frame_size(&self) -> usize {
        match self.stage {
            None => self.book.frame_size() as usize,
            Some(_) => MULTI_BUFFER_MAX_LEN,
        }
    }

    /// Queues one frame: `write` gets a buffer of [`TxSink::frame_size`] bytes and returns the
    /// length to send. Call when the handler has something to transmit; on [`TxError::Full`]
    /// retry on a later turn (the engine polls again once completions free frames). `write`
    /// runs only when the frame can be queued, so what it wrote is never lost for lack of room.
    ///
    /// On a multi-buffer socket the frame is written into the staging buffer and then copied
    /// into as many UMEM frames as it needs, queued back to back, every descriptor but the
    /// last flagged `XDP_PKT_CONTD`.
    pub fn send(&mut self, write: impl FnOnce(&mut [u8]) -> usize) -> Result<(), TxError> {
        if self.left == 0 {
            return Err(TxError::Full);
        }
        let per = self.frames_per_send();
        if self.backlog.cap - self.backlog.q.len() < per || self.book.pool_len() < per {
            self.stats.tx_backpressure += 1;
            return Err(TxError::Full);
        }
        if let Some(stage) = self.stage.as_deref_mut() {
            let len = write(stage.as_mut_slice());
            if len == 0 || len > stage.len() {
                return Err(TxError::BadLength);
            }
            let size = self.book.frame_size() as usize;
            let parts = len.div_ceil(size);
            let mut idxs = [FrameIdx(0); MAX_PARTS];
            for k in 0..parts {
                // `per` frames were checked to be free above, so this does not run dry.
                let Some(idx) = self.book.alloc() else {
                    idxs[..k].iter().for_each(|i| self.book.free(*i));
                    self.stats.tx_backpressure += 1;
                    return Err(TxError::Full);
                };
                idxs[k] = idx;
            }
            if parts > 1 {
                self.stats.tx_multi_buffer += 1;
            }
            for (k, (chunk, idx)) in stage[..len].chunks(size).zip(idxs).enumerate() {
                // SAFETY: `idx` was just taken from the pool, so it is held by the application
                // and no other slice to it exists; `chunk` is at most one frame long; the
                // slice is dropped at the end of this statement.
                unsafe { self.book.bytes_mut_unchecked(idx, 0, chunk.len() as u32) }
                    .copy_from_slice(chunk);
                self.backlog.q.push_back(TxDesc {
                    idx,
                    off: 0,
                    len: chunk.len() as u32,
                    options: if k + 1 < parts { XDP_PKT_CONTD } else { 0 },
                });
            }
            self.left -= 1;
            return Ok(());
        }
        let Some(idx) = self.book.alloc() else {
            self.stats.tx_backpressure += 1;
            return Err(TxError::Full);
        };
        let size = self.book.frame_size();
        // SAFETY: `idx` was just taken from the pool, so it is held by the application and no
        // other slice to it exists; the range is the whole frame; the slice is dropped when
        // `write` returns, within this borrow of the queue.
        let buf = unsafe { self.book.bytes_mut_unchecked(idx, 0, size) };
        let len = write(buf);
        if len == 0 || len > size as usize {
            self.book.free(idx);
            return Err(TxError::BadLength);
        }
        self.backlog.q.push_back(TxDesc {
            idx,
            off: 0,
            len: len as u32,
            options: 0,
        });
        self.left -= 1;
        Ok(())
    }
}

/// A batch of descriptors read from the RX ring. See the module docs for commit and rollback.
#[must_use = "a receive batch does nothing unless its frames are handled"]
pub struct RxBatch<'q> {
    read: ReadRx<'q>,
    book: &'q mut FrameBook,
    backlog: &'q mut Backlog,
    stats: &'q mut XskStats,
    join: Option<&'q mut Join>,
    stage: Option<&'q mut Vec<u8>>,
    /// See [`XskQueue::stamp_in_place`].
    stamp_in_place: Option<[u8; 6]>,
}

impl RxBatch<'_> {
    /// Number of descriptors in the batch.
    #[must_use]
    pub fn capacity(&self) -> u32 {
        self.read.capacity()
    }

    /// Hands every frame of the batch to `handle`, with a [`TxSink`] for new frames, and applies
    /// its verdict. Returns the number of frames handled. On a multi-buffer socket a packet
    /// that came in several descriptors is handed over once, joined, after its last one.
    pub fn for_each(
        &mut self,
        mut handle: impl FnMut(&mut [u8], &mut TxSink<'_>) -> RxVerdict,
    ) -> u32 {
        self.for_each_stamped(|frame, _, tx| handle(frame, tx))
    }

    /// [`RxBatch::for_each`] that also hands over each packet's arrival time: the stamp
    /// `roce_xdp` wrote in front of it ([`roce_common::stamp`]), in CLOCK_MONOTONIC
    /// nanoseconds ([`monotonic_ns`]), or `None` when the packet carries none (counted in
    /// `rx_no_stamp`) or one without a time (`stamp::UNTIMED`, a request whose arrival the
    /// transport does not use, counted in `rx_untimed`); the caller then takes its own clock
    /// reading as the arrival time. The
    /// stamp is cleared as it is read, so the frame's next packet never shows it again.
    pub fn for_each_stamped(
        &mut self,
        mut handle: impl FnMut(&mut [u8], Option<u64>, &mut TxSink<'_>) -> RxVerdict,
    ) -> u32 {
        let mut n = 0;
        // Read once per batch, after the descriptors were reserved: every packet of the batch
        // arrived before it, which is what `stamp::decode` checks.
        let mut now_ns = None;
        while let Some(desc) = self.read.read() {
            let Some((idx, off)) = self.book.reclaim(desc.addr, FrameLoc::KernelRx) else {
                self.stats.bad_ring_addr += 1;
                if let Some(join) = self.join.as_deref_mut() {
                    join.skip_part(desc.options);
                }
                continue;
            };
            if u64::from(off) + u64::from(desc.len) > u64::from(self.book.frame_size()) {
                // The kernel never does this; the frame is ours again, so pool it.
                self.stats.bad_ring_addr += 1;
                self.book.free(idx);
                if let Some(join) = self.join.as_deref_mut() {
                    join.skip_part(desc.options);
                }
                continue;
            }
            let now = *now_ns.get_or_insert_with(monotonic_ns);
            // A packet's first descriptor (a later one of a multi-buffer packet carries none).
            let first = self
                .join
                .as_deref()
                .is_none_or(|j| j.len == 0 && !j.overflow && !j.broken);
            let stamp = match self.stamp_in_place {
                Some(mac) if first => {
                    // FLAG_STAMP_IN_PLACE: roce_xdp wrote the stamp over the destination address
                    // of every frame it redirected here; put the address back before anything
                    // reads the frame.
                    if desc.len < stamp::STAMP_IN_PLACE_LEN as u32 {
                        self.stats.bad_ring_addr += 1;
                        self.book.free(idx);
                        if let Some(join) = self.join.as_deref_mut() {
                            join.skip_part(desc.options);
                        }
                        continue;
                    }
                    self.read_stamp_in_place(idx, off, mac, now)
                }
                _ => self.read_stamp(idx, off, now),
            };
            // The packet's bytes: the frame itself, or (multi-buffer) the joined copy, whose
            // frames are already back in the pool.
            let (buf, frame, stamp): (&mut [u8], Option<FrameIdx>, stamp::Arrival) =
                match self.join.as_deref_mut() {
                    Some(join)
                        if desc.options & XDP_PKT_CONTD != 0
                            || join.len > 0
                            || join.overflow
                            || join.broken =>
                    {
                        if join.len == 0 && !join.overflow && !join.broken {
                            join.stamp = stamp;
                        }
                        let end = join.len + desc.len as usize;
                        if join.overflow || end > join.buf.len() {
                            join.overflow = true;
                        } else {
                            // SAFETY: as below; the slice lives for this statement only.
                            let part = unsafe { self.book.bytes_mut_unchecked(idx, off, desc.len) };
                            join.buf[join.len..end].copy_from_slice(part);
                            join.len = end;
                        }
                        self.book.free(idx);
                        if desc.options & XDP_PKT_CONTD != 0 {
                            continue;
                        }
                        let (len, overflow, broken, stamp) =
                            (join.len, join.overflow, join.broken, join.stamp);
                        join.reset();
                        if overflow {
                            self.stats.rx_oversize += 1;
                        }
                        if overflow || broken {
                            continue;
                        }
                        self.stats.rx_multi_buffer += 1;
                        (&mut join.buf[..len], None, stamp)
                    }
                    // SAFETY: `reclaim` moved the frame to the application, so no other slice to it
                    // exists (the TxSink below only touches frames it takes from the pool); `off +
                    // len` was checked to lie inside the frame; the slice lives only until the
                    // verdict is applied, within this iteration.
                    _ => (
                        unsafe { self.book.bytes_mut_unchecked(idx, off, desc.len) },
                        Some(idx),
                        stamp,
                    ),
                };
            n += 1;
            self.stats.rx_packets += 1;
            self.stats.rx_bytes += buf.len() as u64;
            match stamp {
                stamp::Arrival::At(_) => {}
                stamp::Arrival::Untimed => self.stats.rx_untimed += 1,
                stamp::Arrival::Missing => self.stats.rx_no_stamp += 1,
            }
            let mut sink = TxSink::new(
                self.book,
                self.backlog,
                self.stats,
                self.stage.as_deref_mut(),
                usize::MAX,
            );
            let verdict = handle(buf, stamp.time(), &mut sink);
            match (verdict, frame) {
                (RxVerdict::Recycle, None) => {}
                (RxVerdict::Transmit { len }, None) if len > 0 && len <= buf.len() => {
                    // Joined: send a copy, split again as it needs.
                    let sent = sink.send(|out| {
                        out[..len].copy_from_slice(&buf[..len]);
                        len
                    });
                    if sent.is_err() {
                        self.stats.tx_dropped += 1;
                    }
                }
                (RxVerdict::Transmit { .. }, None) => self.stats.tx_dropped += 1,
                (RxVerdict::Recycle, Some(idx)) => self.book.free(idx),
                (RxVerdict::Transmit { len }, Some(idx)) if len > 0 && len <= desc.len as usize => {
                    if self.backlog.q.len() < self.backlog.cap {
                        self.backlog.q.push_back(TxDesc {
                            idx,
                            off,
                            len: len as u32,
                            options: 0,
                        });
                    } else {
                        self.stats.tx_dropped += 1;
                        self.book.free(idx);
                    }
                }
                (RxVerdict::Transmit { .. }, Some(idx)) => {
                    self.stats.tx_dropped += 1;
                    self.book.free(idx);
                }
            }
        }
        n
    }

    /// The arrival stamp in the [`stamp::STAMP_LEN`] bytes in front of the packet at `off` in
    /// frame `idx` (held by the application), decoded against `now_ns`; the bytes are cleared.
    /// [`stamp::Arrival::Missing`] when the frame has no room in front of the packet or the
    /// bytes hold no stamp.
    fn read_stamp(&mut self, idx: FrameIdx, off: u32, now_ns: u64) -> stamp::Arrival {
        const LEN: u32 = stamp::STAMP_LEN as u32;
        let Some(at) = off.checked_sub(LEN) else {
            return stamp::Arrival::Missing;
        };
        // SAFETY: `reclaim` moved frame `idx` to the application and no other slice to it
        // exists (the packet's slice is made after this one is dropped, at the end of this
        // function); `at + LEN == off <= frame_size` lies inside the frame.
        let bytes = unsafe { self.book.bytes_mut_unchecked(idx, at, LEN) };
        let Ok(word) = <[u8; stamp::STAMP_LEN]>::try_from(&*bytes).map(u64::from_ne_bytes) else {
            return stamp::Arrival::Missing;
        };
        bytes.copy_from_slice(&stamp::CLEARED.to_ne_bytes());
        stamp::classify(word, now_ns)
    }

    /// The arrival stamp `roce_xdp` wrote over the destination address of the frame at `off`
    /// of frame `idx` (`FLAG_STAMP_IN_PLACE`, [`stamp::in_place`]), read at `now_ns`; writes `mac`,
    /// the interface's address, back in its place. The caller checked that the frame holds
    /// [`stamp::STAMP_IN_PLACE_LEN`] bytes.
    fn read_stamp_in_place(
        &mut self,
        idx: FrameIdx,
        off: u32,
        mac: [u8; 6],
        now_ns: u64,
    ) -> stamp::Arrival {
        const LEN: u32 = stamp::STAMP_IN_PLACE_LEN as u32;
        // SAFETY: `reclaim` moved frame `idx` to the application and no other slice to it
        // exists (the packet's slice is made after this one is dropped, at the end of this
        // function); the caller checked `off + LEN <= off + desc.len <= frame_size`.
        let bytes = unsafe { self.book.bytes_mut_unchecked(idx, off, LEN) };
        let Ok(word) = <[u8; stamp::STAMP_IN_PLACE_LEN]>::try_from(&*bytes).map(stamp::in_place)
        else {
            return stamp::Arrival::Missing;
        };
        bytes.copy_from_slice(&mac);
        stamp::classify(word, now_ns)
    }

    /// Releases the handled descriptors to the kernel. Dropping the batch does the same.
    pub fn commit(mut self) {
        self.read.release();
    }
}

impl Drop for RxBatch<'_> {
    fn drop(&mut self) {
        // Frames already read belong to the application: release their slots so the kernel
        // never sees them twice. xdpilone's guard then rolls back the unread rest.
        self.read.release();
    }
}

/// A reservation on the TX ring, filled from the backlog.
///
/// Dropped without [`TxBatch::commit`], it rolls back: xdpilone's inner guard cancels the
/// reservation, and the staged frames, never lent to the kernel, stay at the head of the
/// backlog, still held by the application.
#[must_use = "a transmit batch sends nothing unless committed"]
pub struct TxBatch<'q> {
    write: WriteTx<'q>,
    book: &'q mut FrameBook,
    backlog: &'q mut Backlog,
    staged: usize,
}

impl TxBatch<'_> {
    /// Free slots reserved on the ring.
    #[must_use]
    pub fn capacity(&self) -> u32 {
        self.write.capacity()
    }

    /// Writes descriptors for as many backlog frames as the reservation holds; returns how many.
    /// The frames stay at the head of the backlog until [`TxBatch::commit`].
    /// A multi-buffer packet may be split between two reservations: xdpilone refreshes its
    /// view of the kernel's consumer head only when that view shows no room at all, so a
    /// reservation that is one slot short of a whole packet would otherwise be offered again
    /// and again while the ring is in fact empty. The kernel keeps a packet whose rest has not
    /// been posted yet and completes it when the rest comes (Linux `__xsk_generic_xmit` keeps
    /// `xs->skb` when the ring ends inside a packet); [`XskQueue::flush_tx`] posts the rest
    /// in its second reservation before it kicks.
    pub fn stage_backlog(&mut self) -> usize {
        let fs = u64::from(self.book.frame_size());
        let room = (self.write.capacity() as usize).saturating_sub(self.staged);
        let take = room.min(self.backlog.q.len() - self.staged);
        let descs = self
            .backlog
            .q
            .iter()
            .skip(self.staged)
            .take(take)
            .map(|d| XdpDesc {
                addr: u64::from(d.idx.0) * fs + u64::from(d.off),
                len: d.len,
                options: d.options,
            });
        let n = self.write.insert(descs) as usize;
        self.staged += n;
        n
    }

    /// Publishes the staged descriptors; their frames are lent to the kernel. Returns the
    /// number of frames and bytes sent.
    pub fn commit(mut self) -> (usize, u64) {
        self.write.commit();
        let mut bytes = 0;
        for _ in 0..self.staged {
            let Some(d) = self.backlog.q.pop_front() else {
                break;
            };
            self.book.lend(d.idx, FrameLoc::KernelTx);
            bytes += u64::from(d.len);
        }
        let n = self.staged;
        self.staged = 0;
        (n, bytes)
    }
}

/// One AF_XDP socket bound to one (interface, queue), owning its UMEM and four rings.
///
/// Put [`XskQueue::as_raw_fd`] into `ROCE_XSKS[queue]` so that `roce_xdp` redirects to it.
pub struct XskQueue {
    // Rings first: they unmap before the socket closes and before the UMEM area goes.
    rx: RingRx,
    tx: RingTx,
    fill: FillQueue,
    comp: CompletionQueue,
    user: User,
    ifname: String,
    queue_id: u32,
    mode: BindMode,
    fill_target: u32,
    batch: u32,
    stats: XskStats,
    backlog: Backlog,
    /// Multi-buffer sockets only ([`XskConfig::multi_buffer`]): the packet being joined on
    /// receive, and the buffer a frame is written into before it is split on transmit.
    join: Option<Join>,
    stage: Option<Vec<u8>>,
    book: FrameBook,
    /// The interface's address where its roce_xdp writes each frame's arrival stamp over the
    /// frame's destination address (`FLAG_STAMP_IN_PLACE`), which receive puts back: a frame
    /// `roce_xdp` redirects was sent to this address, as a RoCE NIC takes only frames for its
    /// own. [`XskQueue::open`] reads the mode from the `LoadInfo` flags of the roce_xdp loaded
    /// on the interface (none found: no stamp in the frame) and the address from the kernel.
    stamp_in_place: Option<[u8; 6]>,
}

// SAFETY: every pointer inside (UMEM area, ring mmaps) refers to memory owned by this value and
// reached only through `&mut self`; the shared file descriptor `Arc`s are all held by this value.
// No `&` reference to a non-`Sync` resource is shared with another thread.
unsafe impl Send for XskQueue {}

impl XskQueue {
    /// Creates the UMEM and a socket, and binds it to `queue` of `ifname` with
    /// `XDP_USE_NEED_WAKEUP`: zero-copy first when `cfg.bind` is [`BindRequest::Auto`], then copy.
    /// Fills the fill ring. Call from the network namespace that holds `ifname`.
    pub fn open(ifname: &str, queue: u32, cfg: &XskConfig) -> Result<Self, XskError> {
        cfg.validate()?;
        match cfg.bind {
            BindRequest::Copy => Self::open_mode(ifname, queue, cfg, BindMode::Copy),
            BindRequest::ZeroCopy => Self::open_mode(ifname, queue, cfg, BindMode::ZeroCopy),
            BindRequest::Auto => {
                Self::open_mode(ifname, queue, cfg, BindMode::ZeroCopy).or_else(|e| {
                    log::debug!("{ifname} queue {queue}: zero-copy bind failed ({e}); copy mode");
                    Self::open_mode(ifname, queue, cfg, BindMode::Copy)
                })
            }
        }
    }

    fn open_mode(
        ifname: &str,
        queue: u32,
        cfg: &XskConfig,
        mode: BindMode,
    ) -> Result<Self, XskError> {
        let err = |step: &'static str| {
            move |e: xdpilone::Errno| XskError::Setup {
                step,
                ifname: ifname.to_owned(),
                queue,
                source: errno_to_io(&e),
            }
        };
        let name = CString::new(ifname).map_err(|_| XskError::Interface {
            name: ifname.to_owned(),
            source: io::Error::from(io::ErrorKind::InvalidInput),
        })?;
        let mut info = IfInfo::invalid();
        info.from_name(&name).map_err(|e| XskError::Interface {
            name: ifname.to_owned(),
            source: errno_to_io(&e),
        })?;
        info.set_queue(queue);
        let flags = crate::loader::Pins::new(ifname)
            .load_info()
            .map_or(0, |i| i.flags);
        if flags & roce_common::maps::FLAG_STAMP_PUSHED != 0 {
            return Err(XskError::StaleProgram(ifname.to_owned()));
        }
        let stamp_in_place =
            if crate::loader::StampMode::of_flags(flags) == crate::loader::StampMode::InPlace {
                Some(interface_mac(ifname)?)
            } else {
                None
            };

        let len = cfg.frame_size as usize * cfg.frame_count as usize;
        let area = UmemArea::new(len)?;
        let umem_cfg = UmemConfig {
            fill_size: cfg.fill_size,
            complete_size: cfg.comp_size,
            frame_size: cfg.frame_size,
            headroom: 0,
            flags: 0,
        };
        // SAFETY: the area is a fresh page-aligned mapping of exactly `len` bytes, valid for
        // `frame_count` frames of `frame_size`; it is moved into the `FrameBook`, the last field
        // of the returned queue, so it outlives the socket and every ring derived from `umem`.
        let umem =
            unsafe { Umem::new(umem_cfg, area.as_raw()) }.map_err(err("register the UMEM"))?;
        let sock = Socket::with_shared(&info, &umem).map_err(err("create the socket"))?;
        let device = umem
            .fq_cq(&sock)
            .map_err(err("map the fill and completion rings"))?;
        let flags = SocketConfig::XDP_BIND_NEED_WAKEUP
            | match mode {
                BindMode::ZeroCopy => SocketConfig::XDP_BIND_ZEROCOPY,
                BindMode::Copy => SocketConfig::XDP_BIND_COPY,
            }
            | if cfg.multi_buffer { XDP_USE_SG } else { 0 };
        let sock_cfg = SocketConfig {
            rx_size: cfg.rx_nz(),
            tx_size: cfg.tx_nz(),
            bind_flags: flags,
        };
        let user = umem
            .rx_tx(&sock, &sock_cfg)
            .map_err(err("configure the RX and TX rings"))?;
        let rx = user.map_rx().map_err(err("map the RX ring"))?;
        let tx = user.map_tx().map_err(err("map the TX ring"))?;
        umem.bind(&user).map_err(err("bind the socket"))?;
        let (fill, comp) = device.into_parts();

        let mut q = Self {
            rx,
            tx,
            fill,
            comp,
            user,
            ifname: ifname.to_owned(),
            queue_id: queue,
            mode,
            fill_target: cfg.fill_size,
            batch: 64,
            stats: XskStats::default(),
            // Every queued frame is an application frame, so the backlog never needs to hold
            // more than all of them: forwarding never drops for lack of backlog room, and
            // backpressure shows as a shrinking pool and then an empty fill ring instead.
            backlog: Backlog {
                q: VecDeque::with_capacity(cfg.frame_count as usize),
                cap: cfg.frame_count as usize,
            },
            join: cfg.multi_buffer.then(|| Join {
                buf: vec![0; MULTI_BUFFER_MAX_LEN],
                len: 0,
                overflow: false,
                broken: false,
                stamp: stamp::Arrival::Missing,
            }),
            stage: cfg.multi_buffer.then(|| vec![0; MULTI_BUFFER_MAX_LEN]),
            book: FrameBook::new(area, cfg.frame_size, cfg.frame_count),
            stamp_in_place,
        };
        q.refill();
        Ok(q)
    }

    /// Opens one queue per RX queue of `ifname` (see [`rx_queue_count`]), for one engine each.
    pub fn open_all(ifname: &str, cfg: &XskConfig) -> Result<Vec<Self>, XskError> {
        (0..rx_queue_count(ifname)?)
            .map(|q| Self::open(ifname, q, cfg))
            .collect()
    }

    /// Points `ROCE_XSKS[queue]` of the program loaded on this queue's interface (found by its
    /// pins) at this socket, so that `roce_xdp` redirects the queue's RoCE packets here. Call
    /// after [`XskQueue::open`] and before traffic is expected; the entry goes away when the
    /// socket is closed.
    pub fn register(&self, pins: &crate::loader::Pins) -> Result<(), crate::loader::LoadError> {
        let mut xsks = pins.xsks()?;
        xsks.set(self.queue_id, self.as_raw_fd(), 0)?;
        Ok(())
    }

    /// The interface name.
    #[must_use]
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The queue this socket is bound to.
    #[must_use]
    pub const fn queue_id(&self) -> u32 {
        self.queue_id
    }

    /// How the socket was bound.
    #[must_use]
    pub const fn bind_mode(&self) -> BindMode {
        self.mode
    }

    /// Bytes per frame.
    #[must_use]
    pub const fn frame_size(&self) -> u32 {
        self.book.frame_size()
    }

    /// Whether the socket is bound for multi-buffer packets ([`XskConfig::multi_buffer`]).
    #[must_use]
    pub const fn multi_buffer(&self) -> bool {
        self.stage.is_some()
    }

    /// Where the frames are now.
    #[must_use]
    pub fn accounting(&self) -> FrameAccounting {
        self.book.accounting()
    }

    /// Frames queued for transmit and not yet on the TX ring.
    #[must_use]
    pub fn backlog_len(&self) -> usize {
        self.backlog.q.len()
    }

    /// True when nothing is queued or lent to the kernel for transmit.
    #[must_use]
    pub fn tx_idle(&self) -> bool {
        self.backlog.q.is_empty() && self.book.accounting().kernel_tx == 0
    }

    /// User-space counters plus the kernel's `XDP_STATISTICS` for this socket.
    #[must_use]
    pub fn stats(&self) -> XskStats {
        let mut s = self.stats;
        if let Ok(k) = self.user.statistics_v2() {
            s.rx_dropped = k.rx_dropped;
            s.rx_invalid_descs = k.rx_invalid_descs;
            s.tx_invalid_descs = k.tx_invalid_descs;
            s.rx_ring_full = k.rx_ring_full;
            s.fill_ring_empty = k.rx_fill_ring_empty_descs;
            s.tx_ring_empty_descs = k.tx_ring_empty_descs;
        }
        s
    }

    /// Moves frames from the pool to the fill ring until `fill_size` frames are lent to the
    /// kernel for receive. Call every turn of the loop; returns how many were added.
    pub fn refill(&mut self) -> u32 {
        let lent = self.book.accounting().kernel_rx;
        let want = self.fill_target.saturating_sub(lent);
        if want == 0 {
            return 0;
        }
        let avail = (self.book.pool_len() as u32).min(want);
        if avail < want.min(self.batch) {
            self.stats.fill_pool_empty += 1;
        }
        if avail == 0 {
            return 0;
        }
        // xdpilone serves a reservation from its cached view of the kernel's consumer head and
        // refreshes it only when that view shows no room, so a short reservation is retried
        // once: the second one sees the kernel's real progress.
        let mut n = 0;
        for _ in 0..2 {
            if n == avail {
                break;
            }
            let mut w = self.fill.fill(avail - n);
            let cap = w.capacity();
            if cap == 0 {
                break;
            }
            let book = &mut self.book;
            n += w.insert((0..cap).map_while(|_| {
                let idx = book.alloc()?;
                Some(book.lend(idx, FrameLoc::KernelRx))
            }));
            w.commit();
        }
        if n > 0 && self.fill.needs_wakeup() {
            self.stats.fill_kicks += 1;
            self.fill.wake();
        }
        n
    }

    /// Returns transmitted frames from the completion ring to the pool. Call every turn.
    pub fn reap_completions(&mut self) -> u32 {
        let mut n = 0;
        let mut r = self.comp.complete(self.comp_batch());
        while let Some(addr) = r.read() {
            match self.book.reclaim(addr, FrameLoc::KernelTx) {
                Some((idx, _)) => {
                    self.book.free(idx);
                    n += 1;
                }
                None => self.stats.bad_ring_addr += 1,
            }
        }
        r.release();
        drop(r);
        self.stats.tx_completed += u64::from(n);
        n
    }

    fn comp_batch(&self) -> u32 {
        // Everything outstanding, so one call keeps up with a full TX ring.
        self.book.accounting().kernel_tx.max(1)
    }

    /// Reads up to `max` descriptors from the RX ring.
    pub fn rx_batch(&mut self, max: u32) -> RxBatch<'_> {
        RxBatch {
            read: self.rx.receive(max),
            book: &mut self.book,
            backlog: &mut self.backlog,
            stats: &mut self.stats,
            join: self.join.as_mut(),
            stage: self.stage.as_mut(),
            stamp_in_place: self.stamp_in_place,
        }
    }

    /// Receives up to `max` frames and hands each to `handle` (see [`RxBatch::for_each`]).
    pub fn receive(
        &mut self,
        max: u32,
        handle: impl FnMut(&mut [u8], &mut TxSink<'_>) -> RxVerdict,
    ) -> u32 {
        let mut b = self.rx_batch(max);
        let n = b.for_each(handle);
        b.commit();
        n
    }

    /// [`XskQueue::receive`] with each packet's arrival stamp (see
    /// [`RxBatch::for_each_stamped`]).
    pub fn receive_stamped(
        &mut self,
        max: u32,
        handle: impl FnMut(&mut [u8], Option<u64>, &mut TxSink<'_>) -> RxVerdict,
    ) -> u32 {
        let mut b = self.rx_batch(max);
        let n = b.for_each_stamped(handle);
        b.commit();
        n
    }

    /// Lets `f` queue frames for transmit.
    pub fn with_tx_sink<R>(&mut self, f: impl FnOnce(&mut TxSink<'_>) -> R) -> R {
        self.with_tx_sink_limit(usize::MAX, f)
    }

    /// [`XskQueue::with_tx_sink`] for at most `max` frames: an engine turn bounds its transmit
    /// work so that it comes back to the RX ring before the ring and the fill ring run out
    /// (see [`crate::engine::EngineConfig::tx_per_turn`]).
    pub fn with_tx_sink_limit<R>(&mut self, max: usize, f: impl FnOnce(&mut TxSink<'_>) -> R) -> R {
        let mut sink = TxSink::new(
            &mut self.book,
            &mut self.backlog,
            &mut self.stats,
            self.stage.as_mut(),
            max,
        );
        f(&mut sink)
    }

    /// Reserves up to `max` slots on the TX ring for the backlog.
    pub fn tx_batch(&mut self, max: u32) -> TxBatch<'_> {
        TxBatch {
            write: self.tx.transmit(max),
            book: &mut self.book,
            backlog: &mut self.backlog,
            staged: 0,
        }
    }

    /// Moves the backlog onto the TX ring and kicks the kernel if it asks for it. Call every
    /// turn after the handler ran. Returns the number of frames put on the ring.
    pub fn flush_tx(&mut self) -> usize {
        let sent = self.stage_tx();
        self.kick_tx();
        sent
    }

    /// [`XskQueue::flush_tx`] without the kick: the backlog goes into the TX ring, and the
    /// kernel sends it at the next [`XskQueue::kick_tx`] (a later flush's, in copy mode).
    /// For a thread that expects to transmit again at once and sends both with one kick.
    pub fn stage_tx(&mut self) -> usize {
        let want = self.backlog.q.len();
        let mut sent = 0;
        // As in `refill`: a short reservation (stale cached consumer head) is retried once.
        for _ in 0..2 {
            if sent == want {
                break;
            }
            let mut b = self.tx_batch((want - sent) as u32);
            if b.capacity() == 0 {
                break;
            }
            b.stage_backlog();
            let (n, bytes) = b.commit();
            sent += n;
            self.stats.tx_packets += n as u64;
            self.stats.tx_bytes += bytes;
        }
        if sent < want {
            self.stats.tx_ring_full += 1;
        }
        sent
    }

    /// Kicks the TX ring with `sendto()` while the kernel sets need_wakeup and has not yet
    /// consumed everything (copy mode sends a bounded number of frames per kick).
    pub fn kick_tx(&mut self) {
        let mut last = u32::MAX;
        loop {
            let pending = self.tx.pending();
            if pending == 0 || pending >= last || !self.tx.needs_wakeup() {
                break;
            }
            last = pending;
            self.stats.tx_kicks += 1;
            self.tx.wake();
        }
    }

    /// Waits in poll(2) until the RX ring has frames or, when frames wait in the backlog, the
    /// TX ring has room, or `timeout` passes (`None`: forever). In copy mode the poll also
    /// drives pending transmits. Returns whether the socket is ready; an interrupted wait
    /// returns `Ok(false)`.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool, XskError> {
        self.wait_with(timeout, None)
    }

    /// Like [`XskQueue::wait`], but also returns when `wake` becomes readable (an eventfd that
    /// another thread signals, for example after posting work).
    pub fn wait_with(
        &self,
        timeout: Option<Duration>,
        wake: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<bool, XskError> {
        self.wait_woken(timeout, wake).map(|w| w.socket || w.wake)
    }

    /// [`XskQueue::wait_with`], saying which of the two ended the wait (both `false`: the
    /// timeout, or an interrupted wait). For a caller that treats a frame and a wake-up
    /// differently (the engine's receive moderation, `EngineConfig::rx_usecs`).
    pub fn wait_woken(
        &self,
        timeout: Option<Duration>,
        wake: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<Woken, XskError> {
        use std::os::fd::AsRawFd as _;
        let mut events = libc::POLLIN;
        if !self.backlog.q.is_empty() {
            events |= libc::POLLOUT;
        }
        let mut pfds = [
            libc::pollfd {
                fd: self.as_raw_fd(),
                events,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.map_or(-1, |w| w.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let n = if wake.is_some() { 2 } else { 1 };
        if !ppoll(&mut pfds[..n], timeout)? {
            return Ok(Woken::default());
        }
        Ok(Woken {
            rx: pfds[0].revents & libc::POLLIN != 0,
            socket: pfds[0].revents != 0,
            wake: n == 2 && pfds[1].revents != 0,
        })
    }

    /// [`XskQueue::wait_with`] over several queues at once: returns when any of them has a
    /// received frame (or transmit room, if it has a backlog), `wake` is readable, or `timeout`
    /// passes. For a thread that drives every queue of a device itself (an inline device).
    pub fn wait_any(
        queues: &[&Self],
        timeout: Option<Duration>,
        wake: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<bool, XskError> {
        use std::os::fd::AsRawFd as _;
        if let [one] = queues {
            return one.wait_with(timeout, wake);
        }
        let mut pfds: Vec<libc::pollfd> = queues
            .iter()
            .map(|q| libc::pollfd {
                fd: q.as_raw_fd(),
                events: libc::POLLIN
                    | if q.backlog.q.is_empty() {
                        0
                    } else {
                        libc::POLLOUT
                    },
                revents: 0,
            })
            .collect();
        if let Some(w) = wake {
            pfds.push(libc::pollfd {
                fd: w.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        ppoll(&mut pfds, timeout)
    }

    /// Sets how many frames at most a refill tops up per turn below which it counts the pool
    /// as running dry (default 64, the engine's batch size).
    pub fn set_batch(&mut self, batch: u32) {
        self.batch = batch.max(1);
    }

    /// Where frame `idx` is (for tests and debugging).
    #[must_use]
    pub fn frame_loc(&self, idx: FrameIdx) -> Option<FrameLoc> {
        self.book.loc(idx)
    }

    /// The first `len` bytes at offset `off` of an application-held frame, if it is one.
    pub fn app_frame_mut(&mut self, idx: FrameIdx, off: u32, len: u32) -> Option<&mut [u8]> {
        self.book.bytes_mut(idx, off, len)
    }
}

/// The number of RX queues of `ifname` in the current network namespace (`num_rx_queues` of
/// `ip -d -j link show`; sysfs would show the namespace it was mounted in, not ours).
pub fn rx_queue_count(ifname: &str) -> Result<u32, XskError> {
    let fail = |e: io::Error| XskError::Interface {
        name: ifname.to_owned(),
        source: e,
    };
    let out = std::process::Command::new("ip")
        .args(["-d", "-j", "link", "show", "dev", ifname])
        .output()
        .map_err(fail)?;
    if !out.status.success() {
        return Err(fail(io::Error::other(
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        )));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| fail(io::Error::new(io::ErrorKind::InvalidData, e)))?;
    v[0]["num_rx_queues"]
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| fail(io::Error::other("no num_rx_queues in `ip -d -j link show`")))
}

/// The Ethernet address of `ifname` in the current network namespace, from the kernel's
/// link-layer entry of the interface (`getifaddrs(3)`, answered over netlink in the calling
/// thread's namespace). Read once when a socket opens ([`XskQueue::stamp_in_place`]).
fn interface_mac(ifname: &str) -> Result<[u8; 6], XskError> {
    let fail = |e: io::Error| XskError::Interface {
        name: ifname.to_owned(),
        source: e,
    };
    nix::ifaddrs::getifaddrs()
        .map_err(|e| fail(io::Error::from(e)))?
        .filter(|a| a.interface_name == ifname)
        .find_map(|a| a.address?.as_link_addr()?.addr())
        .ok_or_else(|| fail(io::Error::other("the interface has no Ethernet address")))
}

/// `ppoll(2)` on `pfds` (their fds borrowed by the caller for the call) for up to `timeout`
/// (`None`: forever). ppoll, not poll: a nanosecond timeout, so that a pacer's or timer's
/// sub-millisecond deadline (DCQCN pacing at a few hundred Mb/s) is not rounded up to a
/// millisecond. Returns whether any fd is ready; an interrupted wait returns `Ok(false)`.
fn ppoll(pfds: &mut [libc::pollfd], timeout: Option<Duration>) -> Result<bool, XskError> {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(t.subsec_nanos()),
    });
    let ts_ptr = ts.as_ref().map_or(core::ptr::null(), core::ptr::from_ref);
    let nfds = libc::nfds_t::try_from(pfds.len()).unwrap_or(libc::nfds_t::MAX);
    // SAFETY: `pfds` holds `nfds` valid, initialised pollfds for the duration of the call, and
    // the callers keep their fds open across it (borrowed sockets and wake fds); `ts_ptr` is
    // null or points to `ts`, which outlives the call; a null signal mask leaves the mask
    // unchanged.
    let rc = unsafe { libc::ppoll(pfds.as_mut_ptr(), nfds, ts_ptr, core::ptr::null()) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(XskError::Poll(e));
    }
    Ok(rc > 0)
}

/// What ended an [`XskQueue::wait_woken`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Woken {
    /// The RX ring has a frame.
    pub rx: bool,
    /// The socket is ready: a received frame, or transmit room for the backlog (or an error
    /// condition, which the next ring operation reports).
    pub socket: bool,
    /// The wake descriptor became readable.
    pub wake: bool,
}

/// A second descriptor of a queue's socket, for a thread that does not hold the queue and
/// only needs to know when a frame has arrived (the helper thread of an inline device, which
/// turns the engines only when the application's own threads are not doing so). Get one with
/// [`XskQueue::rx_waiter`]; it keeps the socket open, not the queue's rings.
#[derive(Debug)]
pub struct RxWaiter(std::os::fd::OwnedFd);

impl XskQueue {
    /// A descriptor of this queue's socket to wait on with [`RxWaiter::wait_any`] from another
    /// thread while this queue is in use (a `dup` of the socket).
    ///
    /// # Errors
    /// When the descriptor cannot be duplicated (`EMFILE`).
    pub fn rx_waiter(&self) -> Result<RxWaiter, XskError> {
        // SAFETY: the socket's descriptor stays open for as long as `self`, and it is borrowed
        // only for the duration of the dup below.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.as_raw_fd()) };
        fd.try_clone_to_owned()
            .map(RxWaiter)
            .map_err(XskError::Poll)
    }
}

impl RxWaiter {
    /// Waits until one of the sockets has a received frame on its RX ring, one of `wakes`
    /// (eventfds) is readable, or `timeout` passes. Returns whether a frame arrived and
    /// whether a wake fd fired (both `false` on a timeout or a signal).
    ///
    /// # Errors
    /// When `ppoll` fails for another reason than a signal.
    pub fn wait_any(
        waiters: &[Self],
        wakes: &[std::os::fd::BorrowedFd<'_>],
        timeout: Duration,
    ) -> Result<(bool, bool), XskError> {
        let fd = |fd: RawFd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut pfds: Vec<libc::pollfd> = waiters
            .iter()
            .map(|w| fd(std::os::fd::AsRawFd::as_raw_fd(&w.0)))
            .chain(wakes.iter().map(|w| fd(w.as_raw_fd())))
            .collect();
        if !ppoll(&mut pfds, Some(timeout))? {
            return Ok((false, false));
        }
        let (socks, wakes) = pfds.split_at(waiters.len());
        let fired = |p: &[libc::pollfd]| p.iter().any(|p| p.revents != 0);
        Ok((fired(socks), fired(wakes)))
    }
}

impl AsRawFd for XskQueue {
    /// The socket's descriptor, for `ROCE_XSKS`. Do not close it.
    fn as_raw_fd(&self) -> RawFd {
        self.rx.as_raw_fd()
    }
}

impl core::fmt::Debug for XskQueue {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("XskQueue")
            .field("ifname", &self.ifname)
            .field("queue_id", &self.queue_id)
            .field("mode", &self.mode)
            .field("accounting", &self.book.accounting())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join() -> Join {
        Join {
            buf: vec![0; 16],
            len: 0,
            overflow: false,
            broken: false,
            stamp: stamp::Arrival::Missing,
        }
    }

    #[test]
    fn an_unusable_descriptor_breaks_only_the_packet_it_belongs_to() {
        // Alone, not continued: nothing is being joined, nothing changes.
        let mut j = join();
        j.skip_part(0);
        assert!(!j.broken && j.len == 0);
        // Continued: the packet it starts or continues is broken until its last part.
        j.skip_part(XDP_PKT_CONTD);
        assert!(j.broken);
        // The last part of a packet being joined: the packet is dropped and the join starts over.
        j.len = 8;
        j.skip_part(0);
        assert!(!j.broken && j.len == 0 && !j.overflow);
        j.overflow = true;
        j.skip_part(0);
        assert!(!j.overflow);
    }
}
