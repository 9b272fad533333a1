//! The UMEM area and the book that tracks where each of its frames is.
//!
//! A frame is always in exactly one [`FrameLoc`]: in the free pool, lent to the kernel for
//! receive (on the fill ring or, once filled, on the RX ring), held by the application (being
//! handled or queued for transmit), or lent to the kernel for transmit (on the TX ring or, once
//! sent, on the completion ring). The kernel-side halves of the rings cannot be told apart from
//! user space, so each pair is one location; every transition is checked, and an address the
//! kernel hands back for a frame that is not lent to it is counted and ignored, never trusted.

use core::ptr::NonNull;

use super::XskError;

/// Index of a frame in the UMEM (its address divided by the frame size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FrameIdx(pub u32);

/// Where a frame is. See the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameLoc {
    /// In the free pool.
    Pool,
    /// Lent to the kernel for receive: on the fill ring or the RX ring.
    KernelRx,
    /// Held by the application: being handled, or waiting for room on the TX ring.
    App,
    /// Lent to the kernel for transmit: on the TX ring or the completion ring.
    KernelTx,
}

/// How many frames are in each [`FrameLoc`]. The four always add up to `total`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameAccounting {
    /// Frames in the UMEM.
    pub total: u32,
    /// Frames in the free pool.
    pub pool: u32,
    /// Frames on the fill or RX ring.
    pub kernel_rx: u32,
    /// Frames held by the application.
    pub app: u32,
    /// Frames on the TX or completion ring.
    pub kernel_tx: u32,
}

impl FrameAccounting {
    /// True when every frame is accounted for exactly once.
    #[must_use]
    pub const fn is_consistent(&self) -> bool {
        self.pool as u64 + self.kernel_rx as u64 + self.app as u64 + self.kernel_tx as u64
            == self.total as u64
    }
}

/// A page-aligned anonymous memory mapping that backs a UMEM.
pub(crate) struct UmemArea {
    ptr: NonNull<u8>,
    len: usize,
}

impl UmemArea {
    /// Maps `len` bytes of zeroed, populated, private anonymous memory.
    pub(crate) fn new(len: usize) -> Result<Self, XskError> {
        // SAFETY: an anonymous private mapping with a null hint has no preconditions; the result
        // is checked against MAP_FAILED before use.
        let ptr = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(XskError::Mmap(std::io::Error::last_os_error()));
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(XskError::Mmap(std::io::Error::other(
            "mmap returned a null pointer",
        )))?;
        Ok(Self { ptr, len })
    }

    /// The whole area as a raw slice pointer, for UMEM registration.
    pub(crate) fn as_raw(&self) -> NonNull<[u8]> {
        NonNull::slice_from_raw_parts(self.ptr, self.len)
    }
}

impl Drop for UmemArea {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping created in `new`, unmapped only here. The
        // socket that registered it is closed before (field order in `XskQueue`), and the kernel
        // keeps its own pin on the pages while a socket still uses them.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

// SAFETY: the area is plain memory owned by this value; it is accessed only through `&mut`
// borrows of the owning `FrameBook` (or the kernel), so moving it to another thread is sound.
unsafe impl Send for UmemArea {}

/// The ownership book of a UMEM: the area, the location of every frame and the free pool.
pub(crate) struct FrameBook {
    frame_size: u32,
    loc: Vec<FrameLoc>,
    pool: Vec<FrameIdx>,
    counts: [u32; 4],
    area: UmemArea,
}

impl FrameBook {
    /// A book for `frames` frames of `frame_size` bytes, all in the pool.
    pub(crate) fn new(area: UmemArea, frame_size: u32, frames: u32) -> Self {
        debug_assert!(area.len >= frame_size as usize * frames as usize);
        // Pop from the end hands out low indices first.
        let pool = (0..frames).rev().map(FrameIdx).collect();
        let mut counts = [0; 4];
        counts[FrameLoc::Pool as usize] = frames;
        Self {
            frame_size,
            loc: vec![FrameLoc::Pool; frames as usize],
            pool,
            counts,
            area,
        }
    }

    pub(crate) const fn frame_size(&self) -> u32 {
        self.frame_size
    }

    pub(crate) fn accounting(&self) -> FrameAccounting {
        FrameAccounting {
            total: self.loc.len() as u32,
            pool: self.counts[FrameLoc::Pool as usize],
            kernel_rx: self.counts[FrameLoc::KernelRx as usize],
            app: self.counts[FrameLoc::App as usize],
            kernel_tx: self.counts[FrameLoc::KernelTx as usize],
        }
    }

    pub(crate) fn pool_len(&self) -> usize {
        self.pool.len()
    }

    pub(crate) fn loc(&self, idx: FrameIdx) -> Option<FrameLoc> {
        self.loc.get(idx.0 as usize).copied()
    }

    fn set(&mut self, idx: FrameIdx, from: FrameLoc, to: FrameLoc) -> bool {
        match self.loc.get_mut(idx.0 as usize) {
            Some(l) if *l == from => {
                *l = to;
                self.counts[from as usize] -= 1;
                self.counts[to as usize] += 1;
                true
            }
            _ => false,
        }
    }

    /// Takes a frame out of the pool for the application.
    pub(crate) fn alloc(&mut self) -> Option<FrameIdx> {
        let idx = self.pool.pop()?;
        let moved = self.set(idx, FrameLoc::Pool, FrameLoc::App);
        debug_assert!(moved, "pooled frame {idx:?} was not in the pool");
        Some(idx)
    }

    /// Returns an application frame to the pool.
    pub(crate) fn free(&mut self, idx: FrameIdx) {
        if self.set(idx, FrameLoc::App, FrameLoc::Pool) {
            self.pool.push(idx);
        } else {
            debug_assert!(
                false,
                "freeing frame {idx:?} that the application does not hold"
            );
        }
    }

    /// Moves an application frame to a kernel location; returns its UMEM address.
    pub(crate) fn lend(&mut self, idx: FrameIdx, to: FrameLoc) -> u64 {
        let moved = self.set(idx, FrameLoc::App, to);
        debug_assert!(
            moved,
            "lending frame {idx:?} that the application does not hold"
        );
        u64::from(idx.0) * u64::from(self.frame_size)
    }

    /// Takes back a frame the kernel returned at UMEM address `addr` from location `from`.
    /// Returns the frame and the offset of `addr` within it, or `None` (and changes nothing) if
    /// the address is outside the UMEM or its frame was not lent to the kernel as `from`.
    pub(crate) fn reclaim(&mut self, addr: u64, from: FrameLoc) -> Option<(FrameIdx, u32)> {
        let fs = u64::from(self.frame_size);
        let idx = FrameIdx(u32::try_from(addr / fs).ok()?);
        let off = (addr % fs) as u32;
        self.set(idx, from, FrameLoc::App).then_some((idx, off))
    }

    /// The bytes `off..off + len` of an application-held frame, or `None` if out of the frame.
    pub(crate) fn bytes_mut(&mut self, idx: FrameIdx, off: u32, len: u32) -> Option<&mut [u8]> {
        if self.loc(idx) != Some(FrameLoc::App) || off.checked_add(len)? > self.frame_size {
            return None;
        }
        // SAFETY: see `bytes_mut_unchecked`; the frame is held by the application and the range
        // was checked to lie inside it.
        Some(unsafe { self.bytes_mut_unchecked(idx, off, len) })
    }

    /// The bytes of an application-held frame, with a lifetime not tied to `self`, so that the
    /// handler can hold one frame while the [`super::TxSink`] allocates others from the pool.
    ///
    /// # Safety
    /// `idx` must be held by the application (so no other slice to it exists: every slice is
    /// handed out for an `App` frame only, to one user at a time), `off + len <= frame_size`,
    /// the returned slice must not outlive the borrow of the owning queue, and no other slice to
    /// this frame may be created while it lives.
    pub(crate) unsafe fn bytes_mut_unchecked<'a>(
        &mut self,
        idx: FrameIdx,
        off: u32,
        len: u32,
    ) -> &'a mut [u8] {
        debug_assert_eq!(self.loc(idx), Some(FrameLoc::App));
        let start = idx.0 as usize * self.frame_size as usize + off as usize;
        debug_assert!(start + len as usize <= self.area.len);
        // SAFETY: `start + len` lies inside the mapping (the frame is inside the area and the
        // range inside the frame, per the caller), the mapping lives as long as the book, and the
        // caller guarantees exclusivity of this frame's bytes.
        unsafe { core::slice::from_raw_parts_mut(self.area.ptr.as_ptr().add(start), len as usize) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book(frames: u32) -> FrameBook {
        let area = UmemArea::new(2048 * frames as usize).expect("mmap");
        FrameBook::new(area, 2048, frames)
    }

    #[test]
    fn frames_move_between_exactly_one_place() {
        let mut b = book(4);
        let a = b.alloc().expect("frame");
        assert_eq!(a, FrameIdx(0));
        let addr = b.lend(a, FrameLoc::KernelRx);
        assert_eq!(addr, 0);
        // The kernel hands back addr + headroom; the frame comes back with its offset.
        assert_eq!(b.reclaim(addr + 256, FrameLoc::KernelRx), Some((a, 256)));
        // A second return of the same address is a bad descriptor, not a duplicate frame.
        assert_eq!(b.reclaim(addr + 256, FrameLoc::KernelRx), None);
        assert_eq!(b.reclaim(addr, FrameLoc::KernelTx), None);
        let acc = b.accounting();
        assert!(acc.is_consistent());
        assert_eq!((acc.pool, acc.app), (3, 1));
        b.bytes_mut(a, 0, 2048).expect("in frame")[0] = 7;
        assert!(b.bytes_mut(a, 1, 2048).is_none());
        b.free(a);
        assert_eq!(b.accounting().pool, 4);
        assert!(
            b.bytes_mut(a, 0, 1).is_none(),
            "pooled frames are not accessible"
        );
        // Out of range addresses are rejected.
        assert_eq!(b.reclaim(4 * 2048, FrameLoc::KernelRx), None);
        assert_eq!(b.reclaim(u64::MAX, FrameLoc::KernelRx), None);
    }

    #[test]
    fn pool_runs_dry_then_refills() {
        let mut b = book(2);
        let x = b.alloc().expect("one");
        let y = b.alloc().expect("two");
        assert!(b.alloc().is_none());
        b.free(y);
        b.free(x);
        assert_eq!(b.pool_len(), 2);
        assert!(b.accounting().is_consistent());
    }
}
