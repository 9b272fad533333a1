//! Registered memory: the one module of the transport that touches a region's bytes through a
//! raw pointer.
//!
//! A region's memory is either a [`MemBuf`] the application handed over (safe Rust users: the
//! transport owns it until deregistration gives it back) or a [`RawMem`], an address and a length
//! the application keeps (the libibverbs layer: `ibv_reg_mr(pd, addr, length, access)`). The
//! transport copies between a UMEM frame and that memory directly, once, with no buffer in
//! between.
//!
//! The rules that make the raw case sound, and that every function here keeps:
//! - **Every access is bounds-checked here**, against the region's length, before any byte is
//!   touched, whatever the caller already checked ([`Memory::read`], [`Memory::write`],
//!   [`Memory::update_u64`]).
//! - **No Rust reference to application memory is ever formed**: the application may read and
//!   write its registered memory while the transport does (as it may while a NIC does), so raw
//!   memory is only copied with `core::ptr::copy` and updated with atomic operations.
//! - **Deregistration ends every access**: a [`Memory`] lives in its region's slot of the
//!   `MrTable`, which is only reached under the transport's lock; deregistration takes the slot
//!   out under that lock, so once it returns no operation can still touch the memory, and every
//!   later packet or work request that names the key fails its lookup (a protection error or a
//!   remote access NAK).
//!
//! `unsafe` in roce-user lives in `xsk/` (the UMEM), here, and in the FFI layer of the drop-in
//! libraries; `cargo xtask check-layers` fails on any other `unsafe`.

use core::{
    ops::{Deref, DerefMut},
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering},
};

/// Canary bytes kept before and after every [`MemBuf`], inside the same allocation. Nothing the
/// transport does may change them: `MrTable::guard_violations` checks them.
pub const MR_GUARD_LEN: usize = 64;

/// The value of every canary byte.
pub const MR_GUARD_BYTE: u8 = 0xc5;

/// An access that does not lie inside the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("access of {len} bytes at offset {offset} outside a region of {region} bytes")]
pub struct OutOfRegion {
    /// First byte asked for.
    pub offset: usize,
    /// Bytes asked for.
    pub len: usize,
    /// The region's length.
    pub region: usize,
}

/// An access to [`Memory::External`] whose owner's memory could not be reached: reported as an
/// access outside a region of 0 bytes, so that the transport answers it as any access
/// violation (a remote access error NAK, a local protection error completion), as a NIC does
/// for a page the program unmapped under a registration.
const fn unreachable_owner(offset: usize, len: usize) -> OutOfRegion {
    OutOfRegion {
        offset,
        len,
        region: 0,
    }
}

/// Memory a safe Rust application registers: an owned, zero-initialised buffer with
/// [`MR_GUARD_LEN`] canary bytes on each side in the same allocation. Fill it through
/// `Deref`/`DerefMut` before registering it; deregistration hands it back.
pub struct MemBuf {
    /// `MR_GUARD_LEN` canary bytes, the region, `MR_GUARD_LEN` canary bytes.
    buf: Box<[u8]>,
}

impl MemBuf {
    /// A zeroed buffer of `len` bytes.
    #[must_use]
    pub fn zeroed(len: usize) -> Self {
        let mut buf = vec![0u8; len + 2 * MR_GUARD_LEN].into_boxed_slice();
        buf[..MR_GUARD_LEN].fill(MR_GUARD_BYTE);
        buf[MR_GUARD_LEN + len..].fill(MR_GUARD_BYTE);
        Self { buf }
    }

    /// A buffer holding a copy of `data`.
    #[must_use]
    pub fn from_slice(data: &[u8]) -> Self {
        let mut b = Self::zeroed(data.len());
        b.copy_from_slice(data);
        b
    }

    /// Whether the canary bytes on both sides are untouched.
    #[must_use]
    pub fn guards_intact(&self) -> bool {
        let n = self.buf.len();
        self.buf[..MR_GUARD_LEN]
            .iter()
            .chain(&self.buf[n - MR_GUARD_LEN..])
            .all(|&b| b == MR_GUARD_BYTE)
    }

    /// Overwrites the first canary byte after the region, as a stray write would: for tests
    /// of the canary check itself.
    #[cfg(test)]
    pub(crate) fn corrupt_guard_for_test(&mut self) {
        let n = self.buf.len();
        self.buf[n - MR_GUARD_LEN] = 0;
    }
}

impl Deref for MemBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buf[MR_GUARD_LEN..self.buf.len() - MR_GUARD_LEN]
    }
}

impl DerefMut for MemBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        let n = self.buf.len();
        &mut self.buf[MR_GUARD_LEN..n - MR_GUARD_LEN]
    }
}

impl From<Vec<u8>> for MemBuf {
    /// Copies `v` into a guarded buffer (once, at registration; never on the data path).
    fn from(v: Vec<u8>) -> Self {
        Self::from_slice(&v)
    }
}

impl From<&[u8]> for MemBuf {
    fn from(v: &[u8]) -> Self {
        Self::from_slice(v)
    }
}

impl core::fmt::Debug for MemBuf {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MemBuf").field("len", &self.len()).finish()
    }
}

/// Memory the application keeps and registers by address and length, as `ibv_reg_mr` does.
/// Made only by the unsafe [`RawMem::new`], whose contract the registration relies on.
pub struct RawMem {
    ptr: NonNull<u8>,
    len: usize,
}

impl RawMem {
    /// Describes `len` bytes at `addr` for registration. Returns `None` for a null `addr` with
    /// a non-zero length, or a range that wraps the address space.
    ///
    /// # Safety
    /// From this call until the region is deregistered (the deregistration call has returned)
    /// or, if it is never registered, until the `RawMem` is dropped, `[addr, addr + len)` must
    /// be memory of this process that is valid for reads and writes, from any thread, and is
    /// not freed or unmapped. The application may read and write it concurrently with the
    /// transport (the transport never forms a reference to it); what it reads while a remote
    /// peer writes is as racy as with a NIC.
    #[must_use]
    pub unsafe fn new(addr: *mut u8, len: usize) -> Option<Self> {
        if len == 0 {
            return Some(Self {
                ptr: NonNull::new(addr).unwrap_or(NonNull::dangling()),
                len: 0,
            });
        }
        (addr as usize).checked_add(len)?;
        Some(Self {
            ptr: NonNull::new(addr)?,
            len,
        })
    }

    /// The first address.
    #[must_use]
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// The length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl core::fmt::Debug for RawMem {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RawMem")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

// SAFETY: a `RawMem` is an address and a length; the contract of `RawMem::new` makes the memory
// valid from any thread until deregistration, and this module only copies to and from it
// (never through a reference), so moving the description to another thread (the transport is
// shared between engine threads behind a lock) is sound.
unsafe impl Send for RawMem {}

/// Memory the transport reaches through someone else: another process's registered region,
/// which `roce engine` reads and writes through the program's `/proc/PID/mem`
/// (`api::remote`, docs/multiprocess.md). The transport stays sans-I/O: it only calls these.
pub trait ExternalMem: Send + core::fmt::Debug {
    /// The region's length in bytes.
    fn len(&self) -> usize;
    /// Whether the region is empty (registration refuses empty ones).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The region's address in its owner's address space (its iova, as `ibv_reg_mr` gives).
    fn addr(&self) -> u64;
    /// Copies `out.len()` bytes at `offset` (inside the region: the caller checked) into
    /// `out`; false when the owner's memory could not be reached whole (unmapped since, or
    /// the owner is gone).
    fn read(&self, offset: usize, out: &mut [u8]) -> bool;
    /// Copies `data` to `offset` (inside the region); false as for [`ExternalMem::read`].
    fn write(&self, offset: usize, data: &[u8]) -> bool;
}

/// The memory of one registered region.
#[derive(Debug)]
pub enum Memory {
    /// A buffer the transport owns until deregistration.
    Owned(MemBuf),
    /// Memory the application keeps ([`RawMem`]).
    Raw(RawMem),
    /// Memory of another process ([`ExternalMem`]).
    External(Box<dyn ExternalMem>),
}

impl From<MemBuf> for Memory {
    fn from(b: MemBuf) -> Self {
        Self::Owned(b)
    }
}

impl From<RawMem> for Memory {
    fn from(r: RawMem) -> Self {
        Self::Raw(r)
    }
}

impl From<Vec<u8>> for Memory {
    /// Copies `v` into a guarded [`MemBuf`].
    fn from(v: Vec<u8>) -> Self {
        Self::Owned(v.into())
    }
}

impl Memory {
    /// The region's length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        match self {
            Self::Owned(b) => b.len(),
            Self::Raw(r) => r.len,
            Self::External(e) => e.len(),
        }
    }

    /// Whether the region is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of an owned region; `None` for memory the application keeps (it reads that
    /// itself; a reference here could alias its writes).
    #[must_use]
    pub fn as_slice(&self) -> Option<&[u8]> {
        match self {
            Self::Owned(b) => Some(b),
            Self::Raw(_) | Self::External(_) => None,
        }
    }

    /// The bytes of an owned region, writable; `None` for raw memory.
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        match self {
            Self::Owned(b) => Some(b),
            Self::Raw(_) | Self::External(_) => None,
        }
    }

    /// Whether the canaries around an owned buffer are intact (raw memory has none: true).
    #[must_use]
    pub fn guards_intact(&self) -> bool {
        match self {
            Self::Owned(b) => b.guards_intact(),
            Self::Raw(_) | Self::External(_) => true,
        }
    }

    /// The checked range `[offset, offset + len)`.
    fn range(&self, offset: usize, len: usize) -> Result<core::ops::Range<usize>, OutOfRegion> {
        let region = self.len();
        offset
            .checked_add(len)
            .filter(|&end| end <= region)
            .map(|end| offset..end)
            .ok_or(OutOfRegion {
                offset,
                len,
                region,
            })
    }

    /// Copies `out.len()` bytes at `offset` of the region into `out`: a gather for a SEND or
    /// WRITE, a READ response, or the application's read.
    ///
    /// # Errors
    /// [`OutOfRegion`] if the range is not inside the region; nothing is copied then.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), OutOfRegion> {
        let r = self.range(offset, out.len())?;
        match self {
            Self::Owned(b) => out.copy_from_slice(&b[r]),
            Self::Raw(m) => {
                // SAFETY: `r` lies inside `[0, m.len)` (checked above), and `RawMem::new`'s
                // contract makes `[m.ptr, m.ptr + m.len)` valid for reads until deregistration,
                // which cannot have happened while this `Memory` is still in its slot. `out` is
                // valid for `r.len()` writes. `ptr::copy` allows the two to overlap (a C program
                // may register any address of its own), and no reference to the region is made.
                unsafe { core::ptr::copy(m.ptr.as_ptr().add(r.start), out.as_mut_ptr(), r.len()) }
            }
            Self::External(e) => {
                if !e.read(r.start, out) {
                    return Err(unreachable_owner(offset, out.len()));
                }
            }
        }
        Ok(())
    }

    /// Copies `data` into the region at `offset`: a scatter of a received SEND, a WRITE's
    /// payload, a READ response at the requester, or the application's write.
    ///
    /// # Errors
    /// [`OutOfRegion`] if the range is not inside the region; nothing is written then.
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), OutOfRegion> {
        let r = self.range(offset, data.len())?;
        match self {
            Self::Owned(b) => b[r].copy_from_slice(data),
            Self::Raw(m) => {
                // SAFETY: `r` lies inside the region (checked above) and `RawMem::new`'s contract
                // makes the region valid for writes until deregistration, which cannot have
                // happened while this `Memory` is in its slot. `data` is valid for `r.len()`
                // reads; `ptr::copy` tolerates overlap and no reference to the region is made.
                unsafe { core::ptr::copy(data.as_ptr(), m.ptr.as_ptr().add(r.start), r.len()) }
            }
            Self::External(e) => {
                if !e.write(r.start, data) {
                    return Err(unreachable_owner(offset, data.len()));
                }
            }
        }
        Ok(())
    }

    /// Replaces the 8 bytes at `offset`, read as a native-endian `u64` (what a C program's
    /// `uint64_t` holds), with `f(old)` and returns `old`: the responder's FETCH_ADD and
    /// CMP_SWAP (IBA 9.4.5; the requester checks 8-byte alignment of the VA). On raw memory
    /// whose address is 8-byte aligned the update is one atomic read-modify-write, so it is
    /// atomic against the application's own atomics on that word, as a NIC's would be.
    ///
    /// # Errors
    /// [`OutOfRegion`] if the 8 bytes are not inside the region.
    pub fn update_u64(
        &mut self,
        offset: usize,
        f: impl Fn(u64) -> u64,
    ) -> Result<u64, OutOfRegion> {
        let r = self.range(offset, 8)?;
        if let Self::Raw(m) = self {
            // SAFETY: `r` (8 bytes) lies inside the region, valid for reads and writes until
            // deregistration (`RawMem::new`'s contract); adding `r.start` stays inside it.
            let p = unsafe { m.ptr.as_ptr().add(r.start) };
            if p.align_offset(8) == 0 {
                // SAFETY: `p` is 8-byte aligned and valid for 8 bytes of reads and writes for as
                // long as this call runs (above); all transport accesses to it are atomic here,
                // and the application's concurrent non-atomic accesses are its own race, as
                // with a NIC. `AtomicU64::from_ptr` requires exactly this.
                let a = unsafe { AtomicU64::from_ptr(p.cast::<u64>()) };
                let old = a
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| Some(f(v)))
                    .unwrap_or_else(|v| v);
                return Ok(old);
            }
        }
        let mut b = [0u8; 8];
        self.read(r.start, &mut b)?;
        let old = u64::from_ne_bytes(b);
        self.write(r.start, &f(old).to_ne_bytes())?;
        Ok(old)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A raw region in the middle of a buffer the test owns: accesses at its edges work, one
    /// byte past either edge is refused, and the bytes around it never change.
    #[test]
    fn raw_memory_is_bounds_checked_and_nothing_outside_changes() {
        let mut backing = vec![0xeeu8; 64 + 100 + 64];
        // SAFETY: `backing` outlives `mem` (dropped at the end of the test, after `mem`), is
        // not otherwise touched while `mem` is used, and `[64, 164)` is inside it.
        let mut mem =
            Memory::Raw(unsafe { RawMem::new(backing.as_mut_ptr().add(64), 100) }.unwrap());
        mem.write(0, &[1; 10]).unwrap();
        mem.write(90, &[2; 10]).unwrap();
        assert_eq!(mem.write(91, &[3; 10]).unwrap_err().region, 100);
        assert!(mem.write(usize::MAX, &[3; 2]).is_err());
        let mut out = [0u8; 10];
        mem.read(90, &mut out).unwrap();
        assert_eq!(out, [2; 10]);
        assert!(mem.read(95, &mut out).is_err());
        assert!(mem.as_slice().is_none());
        // An aligned atomic and an unaligned one, native endian as C's uint64_t.
        let base = backing.as_ptr() as usize + 64;
        let aligned = (8 - base % 8) % 8;
        mem.write(aligned, &5u64.to_ne_bytes()).unwrap();
        assert_eq!(mem.update_u64(aligned, |v| v + 7).unwrap(), 5);
        mem.read(aligned, &mut out[..8]).unwrap();
        assert_eq!(u64::from_ne_bytes(out[..8].try_into().unwrap()), 12);
        let odd = aligned + 1;
        mem.write(odd, &0x0102_0304_0506_0708u64.to_ne_bytes())
            .unwrap();
        assert_eq!(
            mem.update_u64(odd, |v| v + 1).unwrap(),
            0x0102_0304_0506_0708
        );
        mem.read(odd, &mut out[..8]).unwrap();
        assert_eq!(
            u64::from_ne_bytes(out[..8].try_into().unwrap()),
            0x0102_0304_0506_0709
        );
        assert!(mem.update_u64(93, |v| v).is_err());
        drop(mem);
        assert!(backing[..64].iter().all(|&b| b == 0xee));
        assert!(backing[164..].iter().all(|&b| b == 0xee));
    }

    #[test]
    fn raw_memory_refuses_null_and_wrapping_ranges() {
        // SAFETY: these descriptions are refused or empty and never accessed.
        unsafe {
            assert!(RawMem::new(core::ptr::null_mut(), 8).is_none());
            assert!(RawMem::new(usize::MAX as *mut u8, 2).is_none());
            assert!(RawMem::new(core::ptr::null_mut(), 0).is_some_and(|m| m.is_empty()));
        }
    }

    #[test]
    fn owned_buffers_keep_their_canaries() {
        let mut b = MemBuf::from_slice(&[1, 2, 3]);
        assert_eq!(&b[..], &[1, 2, 3]);
        b.fill(9);
        assert!(b.guards_intact());
        let mut m = Memory::from(b);
        assert!(m.write(1, &[0; 3]).is_err());
        m.write(0, &[4; 3]).unwrap();
        assert_eq!(m.update_u64(0, |v| v).unwrap_err().len, 8);
        assert!(m.guards_intact());
        let Memory::Owned(mut b) = m else {
            unreachable!()
        };
        b.corrupt_guard_for_test();
        assert!(!b.guards_intact());
    }

    /// Both ends register memory they keep (as the libibverbs layer does): SEND, WRITE, READ
    /// and FETCH_ADD move bytes straight between the wire and that memory, the canaries the
    /// test keeps around each region stay intact, and a WRITE to a region deregistered while
    /// the WRITE was in flight fails with a remote access error and writes nothing.
    #[test]
    fn the_transport_reads_and_writes_raw_application_memory_directly() {
        use crate::transport::{
            Access, DeviceConfig, RecvWr, SendOp, SendWr, Sge, WcStatus,
            sim::{Link, Pair, RcConfig, connect_rc},
        };
        const G: usize = 64;
        const LEN: usize = 8192;
        let mut p = Pair::new(3, DeviceConfig::default(), Link::default());
        let (a, b) = connect_rc(&mut p, &RcConfig::default());
        // Each backing buffer: G canary bytes, the region, G canary bytes. 8-byte aligned
        // regions, so the atomic takes the AtomicU64 path.
        let mut back_a = vec![u64::from_ne_bytes([0xa5; 8]); (G + LEN + G) / 8];
        let mut back_b = vec![u64::from_ne_bytes([0xa5; 8]); (G + LEN + G) / 8];
        let raw = |v: &mut Vec<u64>| {
            let p = v.as_mut_ptr().cast::<u8>();
            // SAFETY: the region `[G, G + LEN)` lies inside `v`, which the test keeps alive
            // and does not touch until after both regions are deregistered below.
            unsafe { RawMem::new(p.add(G), LEN) }.unwrap()
        };
        let (ra, rb) = (raw(&mut back_a), raw(&mut back_b));
        let (va, vb) = (ra.addr(), rb.addr());
        let src: Vec<u8> = (0..LEN).map(|i| (i * 7) as u8).collect();
        let mut ra = Memory::Raw(ra);
        ra.write(0, &src).unwrap();
        let ma = p.a.reg_mr(a.pd, ra, va, Access::LOCAL_WRITE).unwrap();
        let mb = p.b.reg_mr(b.pd, rb, vb, Access::all()).unwrap();
        let sg = |off: u64, len: u32| {
            vec![Sge {
                addr: va + off,
                length: len,
                lkey: ma.lkey,
            }]
        };
        p.b.post_recv(
            b.qpn,
            RecvWr {
                wr_id: 9,
                sg_list: vec![Sge {
                    addr: vb,
                    length: 3000,
                    lkey: mb.lkey,
                }],
            },
        )
        .unwrap();
        p.a.post_send(a.qpn, SendWr::send(1, sg(0, 3000))).unwrap();
        let write = |id, off: u64, len| {
            SendWr::new(
                id,
                SendOp::Write {
                    remote_addr: vb + off,
                    rkey: mb.rkey,
                },
                sg(0, len),
            )
        };
        p.a.post_send(a.qpn, write(2, 4000, 2500)).unwrap();
        let read = SendWr::new(
            3,
            SendOp::Read {
                remote_addr: vb + 4000,
                rkey: mb.rkey,
            },
            sg(5000, 2500),
        );
        p.a.post_send(a.qpn, read).unwrap();
        let add = SendWr::new(
            4,
            SendOp::FetchAdd {
                remote_addr: vb + 8000,
                rkey: mb.rkey,
                add: 5,
            },
            sg(8000, 8),
        );
        p.a.post_send(a.qpn, add).unwrap();
        assert!(p.drive(10_000));
        let st: Vec<_> = core::iter::from_fn(|| p.a.poll_cq(a.cq))
            .map(|w| (w.wr_id, w.status))
            .collect();
        assert_eq!(
            st,
            [1, 2, 3, 4].map(|i| (i, WcStatus::Success)),
            "every operation on raw memory completes"
        );
        // A WRITE posted, then B's region deregistered before a frame of it arrives.
        p.a.post_send(a.qpn, write(5, 0, 100)).unwrap();
        let Memory::Raw(_) = p.b.dereg_mr(mb.lkey).unwrap() else {
            panic!("raw memory comes back as raw memory")
        };
        assert!(p.drive(10_000));
        let wc = core::iter::from_fn(|| p.a.poll_cq(a.cq)).next().unwrap();
        assert_eq!((wc.wr_id, wc.status), (5, WcStatus::RemAccessErr));
        let Memory::Raw(_) = p.a.dereg_mr(ma.lkey).unwrap() else {
            panic!("raw memory comes back as raw memory")
        };
        // Both regions are gone: the test reads its own memory again.
        let bytes = |v: &Vec<u64>| -> Vec<u8> { v.iter().flat_map(|w| w.to_ne_bytes()).collect() };
        let (a_mem, b_mem) = (bytes(&back_a), bytes(&back_b));
        let (a_reg, b_reg) = (&a_mem[G..G + LEN], &b_mem[G..G + LEN]);
        assert_eq!(
            &b_reg[..3000],
            &src[..3000],
            "SEND scattered into B's memory"
        );
        assert_eq!(
            &b_reg[4000..6500],
            &src[..2500],
            "WRITE placed in B's memory"
        );
        assert_eq!(
            &a_reg[5000..7500],
            &src[..2500],
            "READ response placed in A's memory"
        );
        let before = 0xa5a5_a5a5_a5a5_a5a5u64;
        assert_eq!(
            &b_reg[8000..8008],
            &(before + 5).to_ne_bytes(),
            "FETCH_ADD added"
        );
        assert_eq!(
            &a_reg[8000..8008],
            &before.to_ne_bytes(),
            "FETCH_ADD returned the original"
        );
        assert_eq!(
            &b_reg[..100],
            &src[..100],
            "the WRITE after deregistration wrote nothing"
        );
        for m in [&a_mem, &b_mem] {
            assert!(
                m[..G].iter().chain(&m[G + LEN..]).all(|&x| x == 0xa5),
                "canaries intact"
            );
        }
    }
}
