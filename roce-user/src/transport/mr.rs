//! Memory regions: every access to registered memory, local or remote, is bounds-checked
//! against the region it names. An address on the wire or in a work request is an I/O virtual
//! address (`iova`) chosen at registration and translated through this table; the bytes are
//! reached only through [`Memory`] (the one module that touches them, `transport/mem.rs`),
//! which checks the range again before every copy.
//!
//! Keys follow rxe's layout idea (index bits plus key bits): `key = (slot + 1) << 16 | random16`,
//! with fresh random bits from the injected, seeded CSPRNG at every registration and every
//! invalidation, and never the previous bits of the slot, so a stale key does not reach the new
//! region. Deregistration is safe at any time: work requests and responder resources hold keys,
//! not references, and every packet looks its key up again; an access after deregistration
//! fails with a protection error (local) or a remote access error NAK (remote). Once
//! [`MrTable::deregister`] has returned, nothing can touch the memory any more: the table is
//! reached only under the transport's lock, and the region's [`Memory`] has left it.
//!
//! Memory windows (rxe_mw.c, IBA 10.6.7) live in the same table, with key indices above
//! those of regions: a bound window is an R_Key over a range of one region with its own
//! remote rights (and, type 2, its QP); a remote access through it is checked against the
//! window and then the region. A region with windows bound cannot be deregistered or
//! invalidated (rxe: EINVAL).

use core::fmt;

use rand::{Rng, SeedableRng, rngs::StdRng};

use super::Shard;
use super::ids::{LKey, Qpn, RKey};
pub use super::mem::{
    ExternalMem, MR_GUARD_BYTE, MR_GUARD_LEN, MemBuf, Memory, OutOfRegion, RawMem,
};

bitflags::bitflags! {
    /// Memory access rights (`enum ibv_access_flags`). [`Access::all`] is every right,
    /// [`Access::empty`] none.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug, serde::Serialize, serde::Deserialize)]
    pub struct Access: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`: the HCA may write the region (receives, READ responses,
        /// atomics).
        const LOCAL_WRITE = 1;
        /// `IBV_ACCESS_REMOTE_WRITE`.
        const REMOTE_WRITE = 2;
        /// `IBV_ACCESS_REMOTE_READ`.
        const REMOTE_READ = 4;
        /// `IBV_ACCESS_REMOTE_ATOMIC`.
        const REMOTE_ATOMIC = 8;
        /// `IBV_ACCESS_MW_BIND`: memory windows may be bound to the region (IBA C10-73).
        const MW_BIND = 16;
    }
}

/// A protection domain (`ibv_alloc_pd`): a QP reaches only the regions of its own PD, locally
/// and remotely (IBA 10.2.3); a key of another PD behaves as an invalid key.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct PdId(pub u32);

/// What a registration returns: the keys and the address range of the region.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct MrInfo {
    /// Key for scatter/gather entries of local work requests.
    pub lkey: LKey,
    /// Key the peer puts in RETH/AtomicETH (valid only if a remote right was granted).
    pub rkey: RKey,
    /// First I/O virtual address of the region.
    pub iova: u64,
    /// Length in bytes.
    pub len: u64,
    /// The rights granted.
    pub access: Access,
    /// The protection domain.
    pub pd: PdId,
}

/// Why a registration or a deregistration failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MrError {
    /// Every slot of the MR table is in use.
    #[error("memory region table full ({0} regions)")]
    TableFull(usize),
    /// `iova + len` overflows.
    #[error("iova {iova:#x} + length {len} overflows")]
    RangeOverflow {
        /// Requested iova.
        iova: u64,
        /// Buffer length.
        len: u64,
    },
    /// Remote write or remote atomic without local write (IBA 10.6.3.1; verbs returns EINVAL).
    #[error("remote write/atomic access requires local write")]
    NeedsLocalWrite,
    /// No region has this key.
    #[error("no memory region with key {0}")]
    UnknownKey(LKey),
    /// The region still has memory windows bound to it (IBA 10.6.7.2.6; rxe `rxe_dereg_mr`:
    /// EINVAL).
    #[error("memory region {0} has {1} memory windows bound")]
    WindowsBound(LKey, u32),
    /// Every memory window slot is in use.
    #[error("memory window table full ({0} windows)")]
    WindowTableFull(usize),
    /// No memory window has this R_Key's index.
    #[error("no memory window with key {0}")]
    UnknownWindow(RKey),
}

/// Why an access to registered memory was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// No region with that key (never registered, deregistered, or rkey invalidated).
    #[error("invalid key")]
    BadKey,
    /// The region does not grant the right.
    #[error("access right not granted")]
    NoRight,
    /// The range is not inside the region (overflow-safe check).
    #[error("range outside the region")]
    OutOfBounds,
}

struct Mr {
    pd: PdId,
    iova: u64,
    mem: Memory,
    access: Access,
    lkey: LKey,
    rkey: RKey,
    rkey_valid: bool,
    /// Memory windows bound to the region (rxe `mr->num_mw`).
    num_mw: u32,
}

/// The type of a memory window (`enum ibv_mw_type`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub enum MwType {
    /// `IBV_MW_TYPE_1`: bound with `ibv_bind_mw`, valid from allocation, bound to a region
    /// only; it cannot be invalidated (IBA o10-37.2.26).
    One = 1,
    /// `IBV_MW_TYPE_2` (rxe implements type 2B): bound by an `IBV_WR_BIND_MW` work request,
    /// free until bound, bound to the region and to the QP that bound it; invalidated by
    /// `IBV_WR_LOCAL_INV` or a SEND with invalidate.
    Two = 2,
}

/// A memory window's binding (`struct ibv_mw_bind_info` with the window and its new key),
/// as an `IBV_WR_BIND_MW` work request carries it (rxe `wqe->wr.wr.mw`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct BindMw {
    /// The window's current R_Key.
    pub mw_rkey: RKey,
    /// The key it gets: the low 8 bits of the new R_Key, which replace the window key's (rxe
    /// `rxe_do_bind_mw`: `wqe->wr.wr.mw.rkey & 0xff`).
    pub new_key: u8,
    /// The region the window is bound to (ignored when `length` is 0).
    pub mr_lkey: LKey,
    /// First address of the window (an iova of the region; with `zero_based`, the offset in
    /// the region where the window starts).
    pub addr: u64,
    /// Length in bytes; 0 unbinds a type 1 window.
    pub length: u64,
    /// The remote rights the window grants.
    pub access: Access,
    /// `IBV_ACCESS_ZERO_BASED`: the peer addresses the window from 0.
    pub zero_based: bool,
}

/// Why a bind or an invalidation failed (rxe: `IBV_WC_MW_BIND_ERR` for a bind,
/// `IBV_WC_LOC_QP_OP_ERR` for a local invalidation, a NAK for a remote one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MwError {
    /// No window or region with that key, or the key is stale.
    #[error("no memory window or region with that key")]
    BadKey,
    /// The window is not in the state the operation needs (type 1 bound only when valid,
    /// type 2 only when free; invalidation only of a bound type 2 window).
    #[error("memory window in the wrong state")]
    WrongState,
    /// The window belongs to another PD than the QP (IBA C10-72).
    #[error("memory window of another protection domain")]
    OtherPd,
    /// A type 2 window bound with a zero length (IBA o10-37.2.40).
    #[error("type 2 memory window bound with zero length")]
    ZeroLength,
    /// Type 1 windows cannot be zero based (IBA o10-36.2.2).
    #[error("zero-based type 1 memory window")]
    ZeroBased,
    /// The region was not registered with `IBV_ACCESS_MW_BIND` (IBA C10-73).
    #[error("memory region without MW_BIND access")]
    NoBindRight,
    /// Remote write or atomic on a region without local write (IBA C10-74).
    #[error("writable window on a region without local write")]
    NeedsLocalWrite,
    /// The window is not inside the region (IBA C10-75).
    #[error("window outside the memory region")]
    OutOfRegion,
    /// Type 1 windows cannot be invalidated (IBA o10-37.2.26).
    #[error("type 1 memory windows cannot be invalidated")]
    TypeOne,
    /// The region has windows bound and cannot be invalidated (rxe `rxe_invalidate_mr`).
    #[error("memory region has windows bound")]
    WindowsBound,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum MwState {
    /// Allocated, not bound (type 2) or invalidated.
    Free,
    /// Usable (type 1 from allocation, type 2 once bound).
    Valid,
}

struct Mw {
    pd: PdId,
    ty: MwType,
    rkey: RKey,
    state: MwState,
    /// The bound region (`None` while unbound or bound with length 0).
    mr: Option<LKey>,
    /// The QP a type 2 window is bound to.
    qp: Option<Qpn>,
    addr: u64,
    len: u64,
    access: Access,
    zero_based: bool,
}

/// The first key index of memory windows: region keys have indices `1..MW_INDEX_BASE`,
/// window keys `MW_INDEX_BASE + 1..=0xffff` (rxe keeps MRs and MWs in separate index ranges
/// too, `rkey_is_mw`).
const MW_INDEX_BASE: u32 = 0x8000;

/// Whether `key` names a memory window rather than a region.
#[must_use]
pub const fn key_is_mw(key: u32) -> bool {
    key >> 16 > MW_INDEX_BASE
}

fn mw_slot_of(key: u32) -> Option<usize> {
    (key >> 16)
        .checked_sub(MW_INDEX_BASE + 1)
        .map(|s| s as usize)
}

impl Mr {
    fn len(&self) -> usize {
        self.mem.len()
    }
}

/// The table of registered memory regions of a device.
pub struct MrTable {
    slots: Vec<Option<Mr>>,
    /// Memory windows, keyed from [`MW_INDEX_BASE`].
    windows: Vec<Option<Mw>>,
    /// Key bits last used by each window slot.
    mw_last_bits: Vec<u16>,
    /// Key bits last used by each slot, so a new registration never reuses them.
    last_bits: Vec<(u16, u16)>,
    rng: StdRng,
    /// The keys this table may hand out: those of its shard ([`Shard::key_bits`], [`Shard::of_key`]).
    shard: Shard,
}

impl fmt::Debug for MrTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MrTable")
            .field("capacity", &self.slots.len())
            .field("in_use", &self.slots.iter().flatten().count())
            .finish()
    }
}

fn slot_of(key: u32) -> Option<usize> {
    (key >> 16)
        .checked_sub(1)
        .filter(|_| !key_is_mw(key))
        .map(|s| s as usize)
}

impl MrTable {
    /// A table of `capacity` regions and as many memory windows (each at most 32767) whose key bits come from a ChaCha CSPRNG
    /// seeded with `seed` (the caller injects its entropy; tests inject a constant).
    #[must_use]
    pub fn new(capacity: usize, seed: [u8; 32]) -> Self {
        Self::for_shard(capacity, seed, Shard::ONE)
    }

    /// As [`MrTable::new`], handing out only the keys of `shard` (the low 16 key bits are
    /// `shard.index` modulo `shard.count`), so that the keys of the devices sharing one
    /// interface never collide and an API call finds a key's device without a lookup.
    #[must_use]
    pub fn for_shard(capacity: usize, seed: [u8; 32], shard: Shard) -> Self {
        let capacity = capacity.min(MW_INDEX_BASE as usize - 1);
        Self {
            slots: (0..capacity).map(|_| None).collect(),
            windows: (0..capacity).map(|_| None).collect(),
            mw_last_bits: vec![0; capacity],
            last_bits: vec![(0, 0); capacity],
            rng: StdRng::from_seed(seed),
            shard,
        }
    }

    fn fresh_bits(&mut self, old: u16) -> u16 {
        loop {
            let b = self.shard.key_bits((self.rng.next_u32() & 0xffff) as u16);
            if b != old {
                return b;
            }
        }
    }

    /// Registers `mem` at I/O virtual address `iova` with rights `access` (`ibv_reg_mr`,
    /// `ibv_reg_mr_iova`). A `Vec<u8>` is copied once into a guarded [`MemBuf`].
    ///
    /// # Errors
    /// [`MrError`] if the table is full, the range overflows, or the rights are inconsistent;
    /// the memory is dropped then (a [`RawMem`] only describes the application's memory).
    pub fn register(
        &mut self,
        pd: PdId,
        mem: impl Into<Memory>,
        iova: u64,
        access: Access,
    ) -> Result<MrInfo, MrError> {
        let mem = mem.into();
        let len = mem.len() as u64;
        if iova.checked_add(len).is_none() {
            return Err(MrError::RangeOverflow { iova, len });
        }
        if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err(MrError::NeedsLocalWrite);
        }
        let slot = self
            .slots
            .iter()
            .position(Option::is_none)
            .ok_or(MrError::TableFull(self.slots.len()))?;
        let (ol, or) = self.last_bits[slot];
        let (lb, rb) = (self.fresh_bits(ol), self.fresh_bits(or));
        self.last_bits[slot] = (lb, rb);
        let hi = ((slot as u32) + 1) << 16;
        let mr = Mr {
            pd,
            iova,
            mem,
            access,
            lkey: LKey::new(hi | u32::from(lb)),
            rkey: RKey::new(hi | u32::from(rb)),
            rkey_valid: true,
            num_mw: 0,
        };
        let info = MrInfo {
            lkey: mr.lkey,
            rkey: mr.rkey,
            iova,
            len,
            access,
            pd,
        };
        self.slots[slot] = Some(mr);
        Ok(info)
    }

    /// Deregisters the region of `lkey` and gives its memory back (`ibv_dereg_mr`).
    ///
    /// Safe while operations are in flight: later accesses with its keys fail cleanly, and
    /// since every access runs under the same `&mut self`, none is still running when this
    /// returns, so the application may free raw memory at once.
    ///
    /// # Errors
    /// [`MrError::UnknownKey`] if no region has this key.
    pub fn deregister(&mut self, lkey: LKey) -> Result<Memory, MrError> {
        let slot = slot_of(lkey.value())
            .filter(|&s| {
                self.slots
                    .get(s)
                    .and_then(Option::as_ref)
                    .is_some_and(|m| m.lkey == lkey)
            })
            .ok_or(MrError::UnknownKey(lkey))?;
        if let Some(n) = self.slots[slot].as_ref().map(|m| m.num_mw)
            && n > 0
        {
            return Err(MrError::WindowsBound(lkey, n));
        }
        let mr = self.slots[slot].take().ok_or(MrError::UnknownKey(lkey))?;
        Ok(mr.mem)
    }

    /// The regions whose canary bytes (the [`MR_GUARD_LEN`] bytes before and after each
    /// region) changed: always empty unless something wrote outside a region. Call it after
    /// hostile input to prove that every access stayed inside the region it named.
    #[must_use]
    pub fn guard_violations(&self) -> Vec<LKey> {
        self.slots
            .iter()
            .flatten()
            .filter(|m| !m.mem.guards_intact())
            .map(|m| m.lkey)
            .collect()
    }

    /// The registration info of `lkey`.
    #[must_use]
    pub fn info(&self, lkey: LKey) -> Option<MrInfo> {
        self.by_lkey(lkey).map(|m| MrInfo {
            lkey: m.lkey,
            rkey: m.rkey,
            iova: m.iova,
            len: m.len() as u64,
            access: m.access,
            pd: m.pd,
        })
    }

    /// The bytes of the region of `lkey` if the transport owns them ([`Memory::Owned`]), for
    /// the application to read; `None` for an unknown key or raw memory.
    #[must_use]
    pub fn bytes(&self, lkey: LKey) -> Option<&[u8]> {
        self.by_lkey(lkey).and_then(|m| m.mem.as_slice())
    }

    /// As [`MrTable::bytes`], writable.
    pub fn bytes_mut(&mut self, lkey: LKey) -> Option<&mut [u8]> {
        self.by_lkey_mut(lkey).and_then(|m| m.mem.as_mut_slice())
    }

    /// The memory of the region of `lkey`, for the application's checked copies
    /// ([`Memory::read`], [`Memory::write`]).
    #[must_use]
    pub fn memory(&self, lkey: LKey) -> Option<&Memory> {
        self.by_lkey(lkey).map(|m| &m.mem)
    }

    /// As [`MrTable::memory`], writable.
    pub fn memory_mut(&mut self, lkey: LKey) -> Option<&mut Memory> {
        self.by_lkey_mut(lkey).map(|m| &mut m.mem)
    }

    /// Invalidates the R_Key `rkey` (SEND with invalidate, IBA 10.6.5): remote accesses with it
    /// fail from now on. `rkey` may name a region or a bound type 2 memory window
    /// ([`MrTable::invalidate_mw`]); a region with windows bound is not invalidated (rxe
    /// `rxe_invalidate_mr`). Returns whether a region or window had that valid R_Key.
    pub fn invalidate_rkey(&mut self, pd: PdId, rkey: RKey) -> bool {
        if key_is_mw(rkey.value()) {
            return self.invalidate_mw(pd, rkey).is_ok();
        }
        let Some(slot) = slot_of(rkey.value()) else {
            return false;
        };
        match self.slots.get_mut(slot).and_then(Option::as_mut) {
            Some(m) if m.rkey == rkey && m.rkey_valid && m.pd == pd && m.num_mw == 0 => {
                m.rkey_valid = false;
                true
            }
            _ => false,
        }
    }

    /// Executes `IBV_WR_LOCAL_INV` of `key` for a QP of `pd` (rxe `rxe_do_local_ops`): a bound
    /// type 2 window's R_Key ([`MrTable::invalidate_mw`]), or a region's L_Key or R_Key, whose
    /// R_Key then stops working remotely (a region with windows bound is refused, rxe
    /// `rxe_invalidate_mr`).
    ///
    /// # Errors
    /// [`MwError`] saying why; the WR then completes with `IBV_WC_LOC_QP_OP_ERR` (rxe).
    pub fn local_invalidate(&mut self, pd: PdId, key: u32) -> Result<(), MwError> {
        if key_is_mw(key) {
            return self.invalidate_mw(pd, RKey::new(key));
        }
        let m = slot_of(key)
            .and_then(|s| self.slots.get_mut(s))
            .and_then(Option::as_mut)
            .filter(|m| m.lkey.value() == key || m.rkey.value() == key)
            .ok_or(MwError::BadKey)?;
        if m.pd != pd {
            return Err(MwError::OtherPd);
        }
        if m.num_mw > 0 {
            return Err(MwError::WindowsBound);
        }
        m.rkey_valid = false;
        Ok(())
    }

    /// Allocates a memory window of type `ty` in `pd` (`ibv_alloc_mw`; rxe `rxe_alloc_mw`): a
    /// type 1 window starts valid with nothing bound, a type 2 window free. Returns its R_Key.
    ///
    /// # Errors
    /// [`MrError::WindowTableFull`].
    pub fn alloc_mw(&mut self, pd: PdId, ty: MwType) -> Result<RKey, MrError> {
        let slot = self
            .windows
            .iter()
            .position(Option::is_none)
            .ok_or(MrError::WindowTableFull(self.windows.len()))?;
        let bits = self.fresh_bits(self.mw_last_bits[slot]);
        self.mw_last_bits[slot] = bits;
        let rkey = RKey::new(((MW_INDEX_BASE + 1 + slot as u32) << 16) | u32::from(bits));
        self.windows[slot] = Some(Mw {
            pd,
            ty,
            rkey,
            state: match ty {
                MwType::One => MwState::Valid,
                MwType::Two => MwState::Free,
            },
            mr: None,
            qp: None,
            addr: 0,
            len: 0,
            access: Access::empty(),
            zero_based: false,
        });
        Ok(rkey)
    }

    /// Frees the memory window whose key has `rkey`'s index (`ibv_dealloc_mw`), bound or not
    /// (rxe `rxe_dealloc_mw`: the binding is dropped with it). The index, not the whole key,
    /// names the window, since binds change the key's low bits.
    ///
    /// # Errors
    /// [`MrError::UnknownWindow`].
    pub fn dealloc_mw(&mut self, rkey: RKey) -> Result<(), MrError> {
        let w = mw_slot_of(rkey.value())
            .and_then(|s| self.windows.get_mut(s))
            .and_then(Option::take)
            .ok_or(MrError::UnknownWindow(rkey))?;
        self.unbind_mr(&w);
        Ok(())
    }

    /// The current R_Key, type and binding state of the window with `rkey`'s index.
    #[must_use]
    pub fn mw_info(&self, rkey: RKey) -> Option<(RKey, MwType, bool)> {
        let w = self.windows.get(mw_slot_of(rkey.value())?)?.as_ref()?;
        Some((w.rkey, w.ty, w.state == MwState::Valid && w.len > 0))
    }

    /// Whether `pd` has memory windows.
    fn pd_has_windows(&self, pd: PdId) -> bool {
        self.windows.iter().flatten().any(|w| w.pd == pd)
    }

    fn unbind_mr(&mut self, w: &Mw) {
        if let Some(l) = w.mr
            && let Some(m) = self.by_lkey_mut(l)
        {
            m.num_mw = m.num_mw.saturating_sub(1);
        }
    }

    /// Executes a bind work request of QP `qp` in `qp_pd` (`IBV_WR_BIND_MW`, and
    /// `ibv_bind_mw` for type 1; rxe `rxe_bind_mw`, `rxe_check_bind_mw`, `rxe_do_bind_mw`).
    /// Checks, in rxe's order: the window key, the region key (if `length` > 0), the window's
    /// state and type rules (type 1: valid, not zero based; type 2: free, same PD as the QP,
    /// a region and a nonzero length), then the region's MW_BIND right, local write for a
    /// writable window, and the range inside the region. On success the window takes the
    /// low 8 bits of `new_rkey`, the range, the rights, the region (and, type 2, the QP), and
    /// its new R_Key is returned.
    ///
    /// # Errors
    /// [`MwError`]; the WR then completes with `IBV_WC_MW_BIND_ERR` (rxe).
    pub fn bind_mw(&mut self, qp_pd: PdId, qp: Qpn, b: &BindMw) -> Result<RKey, MwError> {
        let slot = mw_slot_of(b.mw_rkey.value()).ok_or(MwError::BadKey)?;
        let w = self
            .windows
            .get(slot)
            .and_then(Option::as_ref)
            .filter(|w| w.rkey == b.mw_rkey)
            .ok_or(MwError::BadKey)?;
        let (ty, state, mw_pd) = (w.ty, w.state, w.pd);
        let mr = if b.length > 0 {
            let m = self.by_lkey(b.mr_lkey).ok_or(MwError::BadKey)?;
            Some((m.pd, m.access, m.iova, m.len() as u64))
        } else {
            None
        };
        match ty {
            MwType::One => {
                if state != MwState::Valid {
                    return Err(MwError::WrongState);
                }
                if b.zero_based {
                    return Err(MwError::ZeroBased);
                }
            }
            MwType::Two => {
                if state != MwState::Free {
                    return Err(MwError::WrongState);
                }
                if mw_pd != qp_pd {
                    return Err(MwError::OtherPd);
                }
                if mr.is_none() {
                    return Err(MwError::ZeroLength);
                }
            }
        }
        if mw_pd != qp_pd {
            // Type 1 too: a window reaches only its own PD's regions (IBA C10-72).
            return Err(MwError::OtherPd);
        }
        if let Some((mr_pd, access, iova, len)) = mr {
            if mr_pd != mw_pd {
                return Err(MwError::OtherPd);
            }
            if !access.contains(Access::MW_BIND) {
                return Err(MwError::NoBindRight);
            }
            if b.access
                .intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
                && !access.contains(Access::LOCAL_WRITE)
            {
                return Err(MwError::NeedsLocalWrite);
            }
            let inside = if b.zero_based {
                b.addr.checked_add(b.length).is_some_and(|end| end <= len)
            } else {
                b.addr >= iova
                    && b.addr
                        .checked_add(b.length)
                        .is_some_and(|end| end <= iova + len)
            };
            if !inside {
                return Err(MwError::OutOfRegion);
            }
        }
        let old = self.windows[slot].take().ok_or(MwError::BadKey)?;
        self.unbind_mr(&old);
        let bound = mr.map(|_| b.mr_lkey);
        if let Some(l) = bound
            && let Some(m) = self.by_lkey_mut(l)
        {
            m.num_mw += 1;
        }
        let rkey = RKey::new((old.rkey.value() & !0xff) | u32::from(b.new_key));
        self.windows[slot] = Some(Mw {
            rkey,
            state: MwState::Valid,
            mr: bound,
            qp: (ty == MwType::Two).then_some(qp),
            addr: b.addr,
            len: b.length,
            access: b.access & (Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC),
            zero_based: b.zero_based,
            ..old
        });
        Ok(rkey)
    }

    /// Invalidates the bound type 2 window of `rkey` in `pd` (`IBV_WR_LOCAL_INV`, SEND with
    /// invalidate; rxe `rxe_invalidate_mw`): it becomes free, unbound from its region and QP,
    /// and may be bound again.
    ///
    /// # Errors
    /// [`MwError::BadKey`] for an unknown or stale key, [`MwError::TypeOne`],
    /// [`MwError::WrongState`] if it is not bound, [`MwError::OtherPd`].
    pub fn invalidate_mw(&mut self, pd: PdId, rkey: RKey) -> Result<(), MwError> {
        let slot = mw_slot_of(rkey.value()).ok_or(MwError::BadKey)?;
        let w = self
            .windows
            .get(slot)
            .and_then(Option::as_ref)
            .filter(|w| w.rkey == rkey)
            .ok_or(MwError::BadKey)?;
        if w.ty == MwType::One {
            return Err(MwError::TypeOne);
        }
        if w.state != MwState::Valid {
            return Err(MwError::WrongState);
        }
        if w.pd != pd {
            return Err(MwError::OtherPd);
        }
        let old = self.windows[slot].take().ok_or(MwError::BadKey)?;
        self.unbind_mr(&old);
        self.windows[slot] = Some(Mw {
            state: MwState::Free,
            mr: None,
            qp: None,
            addr: 0,
            len: 0,
            access: Access::empty(),
            zero_based: false,
            ..old
        });
        Ok(())
    }

    /// Frees the type 2 windows bound to `qp`, which is being destroyed, so that a later QP
    /// with the same number does not reach them (rxe holds a reference on the QP instead).
    pub fn qp_destroyed(&mut self, qp: Qpn) {
        for i in 0..self.windows.len() {
            if let Some((pd, rkey)) = self.windows[i]
                .as_ref()
                .filter(|w| w.qp == Some(qp))
                .map(|w| (w.pd, w.rkey))
            {
                let _ = self.invalidate_mw(pd, rkey);
            }
        }
    }

    /// Gives the region of `lkey` a fresh, valid R_Key (the local re-validation after a remote
    /// invalidation, like a fast-register WR). Returns the new key.
    pub fn revalidate_rkey(&mut self, lkey: LKey) -> Option<RKey> {
        let slot = slot_of(lkey.value())?;
        let old = self.last_bits.get(slot)?.1;
        let bits = self.fresh_bits(old);
        let m = self
            .slots
            .get_mut(slot)?
            .as_mut()
            .filter(|m| m.lkey == lkey)?;
        m.rkey = RKey::new((m.rkey.value() & 0xffff_0000) | u32::from(bits));
        m.rkey_valid = true;
        self.last_bits[slot].1 = bits;
        Some(m.rkey)
    }

    fn by_lkey(&self, lkey: LKey) -> Option<&Mr> {
        self.slots
            .get(slot_of(lkey.value())?)?
            .as_ref()
            .filter(|m| m.lkey == lkey)
    }

    fn by_lkey_mut(&mut self, lkey: LKey) -> Option<&mut Mr> {
        self.slots
            .get_mut(slot_of(lkey.value())?)?
            .as_mut()
            .filter(|m| m.lkey == lkey)
    }

    fn by_rkey_mut(&mut self, pd: PdId, rkey: RKey) -> Option<&mut Mr> {
        self.slots
            .get_mut(slot_of(rkey.value())?)?
            .as_mut()
            .filter(|m| m.rkey == rkey && m.rkey_valid && m.pd == pd)
    }

    /// Regions registered now.
    #[must_use]
    pub fn in_use(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// Whether any region belongs to `pd`.
    #[must_use]
    pub fn uses_pd(&self, pd: PdId) -> bool {
        self.slots.iter().flatten().any(|m| m.pd == pd) || self.pd_has_windows(pd)
    }

    /// The offset in `m` of `[addr, addr + len)`, if that range lies inside it (overflow-safe).
    fn offset(m: &Mr, addr: u64, len: u64) -> Result<usize, AccessError> {
        let off = addr.checked_sub(m.iova).ok_or(AccessError::OutOfBounds)?;
        let end = off.checked_add(len).ok_or(AccessError::OutOfBounds)?;
        if end > m.len() as u64 {
            return Err(AccessError::OutOfBounds);
        }
        // Fits in usize: it is at most the region's length.
        Ok(off as usize)
    }

    /// The region and the offset in it of a remote access of `len` bytes at `va` with `rkey`
    /// by QP `qp` of `pd`, needing `need` (rxe `check_rkey`). A window key is looked up as rxe
    /// `rxe_lookup_mw` does (same key, same PD, for type 2 the QP it is bound to, bound with
    /// a nonzero length, granting `need`), and the range must lie inside the window (IBA
    /// 10.6.7.1; a zero-based window is addressed from 0) and so inside its region.
    fn remote(
        &mut self,
        pd: PdId,
        qp: Qpn,
        rkey: RKey,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<(&mut Mr, usize), AccessError> {
        if !key_is_mw(rkey.value()) {
            let m = self.by_rkey_mut(pd, rkey).ok_or(AccessError::BadKey)?;
            if !m.access.contains(need) {
                return Err(AccessError::NoRight);
            }
            let off = Self::offset(m, va, len)?;
            return Ok((m, off));
        }
        let w = mw_slot_of(rkey.value())
            .and_then(|s| self.windows.get(s))
            .and_then(Option::as_ref)
            .filter(|w| {
                w.rkey == rkey
                    && w.pd == pd
                    && w.state == MwState::Valid
                    && w.len > 0
                    && (w.ty == MwType::One || w.qp == Some(qp))
            })
            .ok_or(AccessError::BadKey)?;
        if !w.access.contains(need) {
            return Err(AccessError::NoRight);
        }
        let (lkey, zero_based, waddr, wlen) = (
            w.mr.ok_or(AccessError::BadKey)?,
            w.zero_based,
            w.addr,
            w.len,
        );
        let m = self.by_lkey_mut(lkey).ok_or(AccessError::BadKey)?;
        let iova = if zero_based {
            // The window starts `waddr` bytes into the region; the peer addresses it from 0.
            if va.checked_add(len).is_none_or(|end| end > wlen) {
                return Err(AccessError::OutOfBounds);
            }
            m.iova
                .checked_add(waddr)
                .and_then(|b| b.checked_add(va))
                .ok_or(AccessError::OutOfBounds)?
        } else {
            let in_window = va >= waddr
                && va
                    .checked_add(len)
                    .is_some_and(|end| end <= waddr.saturating_add(wlen));
            if !in_window {
                return Err(AccessError::OutOfBounds);
            }
            va
        };
        let off = Self::offset(m, iova, len)?;
        Ok((m, off))
    }

    /// The region of `lkey` in `pd`; `write` requires LOCAL_WRITE.
    fn local(&mut self, pd: PdId, lkey: LKey, write: bool) -> Result<&mut Mr, AccessError> {
        let m = self
            .by_lkey_mut(lkey)
            .filter(|m| m.pd == pd)
            .ok_or(AccessError::BadKey)?;
        if write && !m.access.contains(Access::LOCAL_WRITE) {
            return Err(AccessError::NoRight);
        }
        Ok(m)
    }

    /// Checks a remote access of `len` bytes at `va` by QP `qp` with `rkey` needing `need`, without
    /// doing it (rxe `check_rkey`; window keys as [`MrTable::bind_mw`] bound them).
    ///
    /// # Errors
    /// [`AccessError`] saying why the responder must NAK with a remote access error.
    pub fn check_remote(
        &mut self,
        pd: PdId,
        qp: Qpn,
        rkey: RKey,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<(), AccessError> {
        self.remote(pd, qp, rkey, va, len, need).map(|_| ())
    }

    /// Writes `data` at `va` of the region of `rkey` (a WRITE's payload), checked for `need`.
    ///
    /// # Errors
    /// [`AccessError`] if the key, the right or the range is wrong; nothing is written then.
    pub fn remote_write(
        &mut self,
        pd: PdId,
        qp: Qpn,
        rkey: RKey,
        va: u64,
        data: &[u8],
        need: Access,
    ) -> Result<(), AccessError> {
        let (m, off) = self.remote(pd, qp, rkey, va, data.len() as u64, need)?;
        m.mem.write(off, data).map_err(|_| AccessError::OutOfBounds)
    }

    /// Reads `out.len()` bytes at `va` of the region of `rkey` (a READ response), checked for
    /// `need`.
    ///
    /// # Errors
    /// [`AccessError`] if the key, the right or the range is wrong.
    pub fn remote_read(
        &mut self,
        pd: PdId,
        qp: Qpn,
        rkey: RKey,
        va: u64,
        out: &mut [u8],
        need: Access,
    ) -> Result<(), AccessError> {
        let (m, off) = self.remote(pd, qp, rkey, va, out.len() as u64, need)?;
        m.mem.read(off, out).map_err(|_| AccessError::OutOfBounds)
    }

    /// Replaces the 8 bytes at `va` of the region of `rkey` with `f(old)` and returns `old`
    /// (FETCH_ADD, CMP_SWAP; [`Memory::update_u64`]), checked for REMOTE_ATOMIC.
    ///
    /// # Errors
    /// [`AccessError`] if the key, the right or the range is wrong.
    pub fn remote_atomic(
        &mut self,
        pd: PdId,
        qp: Qpn,
        rkey: RKey,
        va: u64,
        f: impl Fn(u64) -> u64,
    ) -> Result<u64, AccessError> {
        let (m, off) = self.remote(pd, qp, rkey, va, 8, Access::REMOTE_ATOMIC)?;
        m.mem
            .update_u64(off, f)
            .map_err(|_| AccessError::OutOfBounds)
    }

    /// Reads `out.len()` bytes at `addr` of the region of `lkey` (a gather).
    ///
    /// # Errors
    /// [`AccessError`] if the key or the range is wrong.
    pub fn local_read(
        &mut self,
        pd: PdId,
        lkey: LKey,
        addr: u64,
        out: &mut [u8],
    ) -> Result<(), AccessError> {
        let m = self.local(pd, lkey, false)?;
        let off = Self::offset(m, addr, out.len() as u64)?;
        m.mem.read(off, out).map_err(|_| AccessError::OutOfBounds)
    }

    /// Writes `data` at `addr` of the region of `lkey` (a scatter); requires LOCAL_WRITE.
    ///
    /// # Errors
    /// [`AccessError`] if the key, the right or the range is wrong; nothing is written then.
    pub fn local_write(
        &mut self,
        pd: PdId,
        lkey: LKey,
        addr: u64,
        data: &[u8],
    ) -> Result<(), AccessError> {
        let m = self.local(pd, lkey, true)?;
        let off = Self::offset(m, addr, data.len() as u64)?;
        m.mem.write(off, data).map_err(|_| AccessError::OutOfBounds)
    }
}

/// A scatter/gather entry of a work request (`struct ibv_sge`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct Sge {
    /// First I/O virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Key of the region that holds the range.
    pub lkey: LKey,
}

/// Total length of a scatter/gather list.
#[must_use]
pub fn sg_len(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| u64::from(s.length)).sum()
}

/// Visits the pieces of `sges` covering `[offset, offset + len)` as `(sge, offset in sge, piece length)`.
fn sg_walk(
    sges: &[Sge],
    mut offset: u64,
    len: usize,
    mut f: impl FnMut(&Sge, u64, usize, usize) -> Result<(), AccessError>,
) -> Result<(), AccessError> {
    let mut done = 0usize;
    for s in sges {
        if done == len {
            break;
        }
        let sl = u64::from(s.length);
        if offset >= sl {
            offset -= sl;
            continue;
        }
        let take = usize::try_from(sl - offset)
            .unwrap_or(usize::MAX)
            .min(len - done);
        f(s, offset, take, done)?;
        done += take;
        offset = 0;
    }
    if done == len {
        Ok(())
    } else {
        Err(AccessError::OutOfBounds)
    }
}

/// Gathers `out.len()` bytes from `sges` starting `offset` bytes into the list.
///
/// # Errors
/// [`AccessError`] if an entry names a bad key or range, or the list is too short.
pub fn sg_gather(
    mrs: &mut MrTable,
    pd: PdId,
    sges: &[Sge],
    offset: u64,
    out: &mut [u8],
) -> Result<(), AccessError> {
    let len = out.len();
    sg_walk(sges, offset, len, |s, off, take, done| {
        let addr = s.addr.checked_add(off).ok_or(AccessError::OutOfBounds)?;
        mrs.local_read(pd, s.lkey, addr, &mut out[done..done + take])
    })
}

/// Scatters `data` into `sges` starting `offset` bytes into the list (needs LOCAL_WRITE).
///
/// # Errors
/// [`AccessError`] if an entry names a bad key, right or range, or the list is too short.
pub fn sg_scatter(
    mrs: &mut MrTable,
    pd: PdId,
    sges: &[Sge],
    offset: u64,
    data: &[u8],
) -> Result<(), AccessError> {
    sg_walk(sges, offset, data.len(), |s, off, take, done| {
        let addr = s.addr.checked_add(off).ok_or(AccessError::OutOfBounds)?;
        mrs.local_write(pd, s.lkey, addr, &data[done..done + take])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: PdId = PdId(1);
    const Q: Qpn = Qpn::new(5);

    #[test]
    fn canaries_surround_every_region_and_a_stray_write_is_reported() {
        let mut t = table();
        let a = t.register(P, vec![7; 100], 0x1000, Access::all()).unwrap();
        // The region is exactly what was registered; accesses up to its last byte work.
        assert_eq!(t.bytes(a.lkey).unwrap(), &[7; 100][..]);
        t.remote_write(P, Q, a.rkey, 0x1000, &[9; 100], Access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(
            t.remote_write(P, Q, a.rkey, 0x1000 + 1, &[9; 100], Access::REMOTE_WRITE),
            Err(AccessError::OutOfBounds)
        );
        let mut out = [0; 100];
        assert_eq!(
            t.remote_read(P, Q, a.rkey, 0x1000 - 1, &mut out, Access::REMOTE_READ),
            Err(AccessError::OutOfBounds)
        );
        assert!(t.guard_violations().is_empty());
        assert_eq!(
            t.deregister(a.lkey).unwrap().as_slice().unwrap(),
            &[9; 100][..]
        );
        // A write past the end (here by hand) is caught.
        let b = t.register(P, vec![0; 16], 0, Access::all()).unwrap();
        let slot = slot_of(b.lkey.value()).unwrap();
        let Some(Memory::Owned(buf)) = t.slots[slot].as_mut().map(|m| &mut m.mem) else {
            panic!("an owned region")
        };
        buf.corrupt_guard_for_test();
        assert_eq!(t.guard_violations(), vec![b.lkey]);
    }

    #[test]
    fn another_pd_sees_an_invalid_key() {
        let mut t = table();
        let a = t.register(P, vec![0; 8], 0, Access::all()).unwrap();
        let other = PdId(2);
        assert_eq!(
            t.check_remote(other, Q, a.rkey, 0, 8, Access::REMOTE_READ),
            Err(AccessError::BadKey)
        );
        assert_eq!(
            t.local_read(other, a.lkey, 0, &mut [0; 8]),
            Err(AccessError::BadKey)
        );
        assert!(!t.invalidate_rkey(other, a.rkey));
        assert!(t.uses_pd(P) && !t.uses_pd(other));
    }

    fn table() -> MrTable {
        MrTable::new(4, [7; 32])
    }

    #[test]
    fn keys_are_distinct_and_stale_keys_fail_after_reregistration() {
        let mut t = table();
        let a = t.register(P, vec![0; 64], 0x1000, Access::all()).unwrap();
        assert_ne!(a.lkey.value(), a.rkey.value());
        t.deregister(a.lkey).unwrap();
        let b = t.register(P, vec![0; 64], 0x1000, Access::all()).unwrap();
        assert_ne!(a.rkey, b.rkey);
        assert_ne!(a.lkey, b.lkey);
        assert_eq!(
            t.check_remote(P, Q, a.rkey, 0x1000, 8, Access::REMOTE_READ),
            Err(AccessError::BadKey)
        );
        assert!(
            t.check_remote(P, Q, b.rkey, 0x1000, 8, Access::REMOTE_READ)
                .is_ok()
        );
    }

    #[test]
    fn bounds_checks_are_overflow_safe() {
        let mut t = table();
        let a = t
            .register(P, vec![0; 64], u64::MAX - 64, Access::all())
            .unwrap();
        assert!(
            t.check_remote(P, Q, a.rkey, u64::MAX - 64, 64, Access::REMOTE_WRITE)
                .is_ok()
        );
        assert_eq!(
            t.check_remote(P, Q, a.rkey, u64::MAX - 1, 2, Access::REMOTE_WRITE),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            t.check_remote(P, Q, a.rkey, u64::MAX, u64::MAX, Access::REMOTE_WRITE),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            t.check_remote(P, Q, a.rkey, 0, 1, Access::REMOTE_WRITE),
            Err(AccessError::OutOfBounds)
        );
        assert!(matches!(
            t.register(P, vec![0; 2], u64::MAX, Access::all()),
            Err(MrError::RangeOverflow { .. })
        ));
    }

    #[test]
    fn access_rights_are_enforced() {
        let mut t = table();
        assert_eq!(
            t.register(P, vec![0; 8], 0, Access::REMOTE_WRITE),
            Err(MrError::NeedsLocalWrite)
        );
        let a = t.register(P, vec![0; 8], 0, Access::REMOTE_READ).unwrap();
        assert_eq!(
            t.check_remote(P, Q, a.rkey, 0, 8, Access::REMOTE_WRITE),
            Err(AccessError::NoRight)
        );
        assert_eq!(
            t.local_write(P, a.lkey, 0, &[0; 8]),
            Err(AccessError::NoRight)
        );
        assert_eq!(
            t.remote_atomic(P, Q, a.rkey, 0, |v| v),
            Err(AccessError::NoRight)
        );
    }

    #[test]
    fn invalidate_then_revalidate() {
        let mut t = table();
        let a = t.register(P, vec![0; 8], 0, Access::all()).unwrap();
        assert!(t.invalidate_rkey(P, a.rkey));
        assert!(!t.invalidate_rkey(P, a.rkey));
        assert_eq!(
            t.check_remote(P, Q, a.rkey, 0, 8, Access::REMOTE_READ),
            Err(AccessError::BadKey)
        );
        let k = t.revalidate_rkey(a.lkey).unwrap();
        assert_ne!(k, a.rkey);
        assert!(t.check_remote(P, Q, k, 0, 8, Access::REMOTE_READ).is_ok());
    }

    #[test]
    fn table_is_bounded() {
        let mut t = table();
        for _ in 0..4 {
            t.register(P, vec![0; 1], 0, Access::empty()).unwrap();
        }
        assert_eq!(
            t.register(P, vec![0; 1], 0, Access::empty()),
            Err(MrError::TableFull(4))
        );
    }

    #[test]
    fn scatter_gather_across_entries() {
        let mut t = table();
        let a = t.register(P, vec![0; 8], 100, Access::LOCAL_WRITE).unwrap();
        let b = t.register(P, vec![0; 8], 200, Access::LOCAL_WRITE).unwrap();
        let sges = [
            Sge {
                addr: 104,
                length: 4,
                lkey: a.lkey,
            },
            Sge {
                addr: 200,
                length: 8,
                lkey: b.lkey,
            },
        ];
        sg_scatter(&mut t, P, &sges, 2, &[1, 2, 3, 4, 5]).unwrap();
        assert_eq!(t.bytes(a.lkey).unwrap(), &[0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(&t.bytes(b.lkey).unwrap()[..3], &[3, 4, 5]);
        let mut out = [0; 5];
        sg_gather(&mut t, P, &sges, 2, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4, 5]);
        assert_eq!(
            sg_scatter(&mut t, P, &sges, 10, &[0; 3]),
            Err(AccessError::OutOfBounds)
        );
    }

    fn bind(mw: RKey, mr: &MrInfo, addr: u64, length: u64, access: Access) -> BindMw {
        BindMw {
            mw_rkey: mw,
            new_key: (mw.value() as u8).wrapping_add(1),
            mr_lkey: mr.lkey,
            addr,
            length,
            access,
            zero_based: false,
        }
    }

    const RW: Access = Access::REMOTE_READ.union(Access::REMOTE_WRITE);

    #[test]
    fn a_type_1_window_reaches_its_range_with_its_rights_only() {
        let mut t = table();
        let mr = t.register(P, vec![0; 256], 0x1000, Access::all()).unwrap();
        let w = t.alloc_mw(P, MwType::One).unwrap();
        assert!(key_is_mw(w.value()) && !key_is_mw(mr.rkey.value()));
        // Valid but bound to nothing: no access yet.
        assert_eq!(
            t.check_remote(P, Q, w, 0x1000, 1, Access::REMOTE_READ),
            Err(AccessError::BadKey)
        );
        let k = t.bind_mw(P, Q, &bind(w, &mr, 0x1040, 64, RW)).unwrap();
        assert_eq!(k.value() & !0xff, w.value() & !0xff);
        assert_ne!(k, w);
        // The old key is stale.
        assert_eq!(
            t.check_remote(P, Q, w, 0x1040, 8, Access::REMOTE_READ),
            Err(AccessError::BadKey)
        );
        t.remote_write(P, Q, k, 0x1040, &[5; 64], Access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(&t.bytes(mr.lkey).unwrap()[0x40..0x80], &[5; 64][..]);
        // Inside the region but outside the window, on either side.
        assert_eq!(
            t.remote_write(P, Q, k, 0x103f, &[1; 2], Access::REMOTE_WRITE),
            Err(AccessError::OutOfBounds)
        );
        let mut out = [0; 2];
        assert_eq!(
            t.remote_read(P, Q, k, 0x107f, &mut out, Access::REMOTE_READ),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(t.bytes(mr.lkey).unwrap()[0x3f], 0);
        assert_eq!(t.bytes(mr.lkey).unwrap()[0x80], 0);
        // A right the window does not grant, though the region does.
        assert_eq!(
            t.remote_atomic(P, Q, k, 0x1040, |v| v + 1),
            Err(AccessError::NoRight)
        );
        // Type 1 windows are not bound to a QP, but to the PD.
        assert!(
            t.check_remote(P, Qpn::new(9), k, 0x1040, 8, Access::REMOTE_READ)
                .is_ok()
        );
        assert_eq!(
            t.check_remote(PdId(2), Q, k, 0x1040, 8, Access::REMOTE_READ),
            Err(AccessError::BadKey)
        );
        // Type 1 windows cannot be invalidated, and the region cannot be deregistered or
        // invalidated under them.
        assert_eq!(t.local_invalidate(P, k.value()), Err(MwError::TypeOne));
        assert!(!t.invalidate_rkey(P, k));
        assert_eq!(
            t.deregister(mr.lkey).err(),
            Some(MrError::WindowsBound(mr.lkey, 1))
        );
        assert_eq!(
            t.local_invalidate(P, mr.rkey.value()),
            Err(MwError::WindowsBound)
        );
        // Unbinding with length 0 keeps the window valid but reaching nothing.
        let k2 = t.bind_mw(P, Q, &bind(k, &mr, 0, 0, RW)).unwrap();
        assert_eq!(
            t.check_remote(P, Q, k2, 0x1040, 8, Access::REMOTE_READ),
            Err(AccessError::BadKey)
        );
        t.deregister(mr.lkey).unwrap();
        t.dealloc_mw(k2).unwrap();
        assert_eq!(t.dealloc_mw(k2), Err(MrError::UnknownWindow(k2)));
    }

    #[test]
    fn a_type_2_window_is_bound_to_its_qp_and_invalidated() {
        let mut t = table();
        let mr = t.register(P, vec![0; 256], 0x1000, Access::all()).unwrap();
        let w = t.alloc_mw(P, MwType::Two).unwrap();
        // A type 2 window needs a region and a nonzero length (o10-37.2.40).
        assert_eq!(
            t.bind_mw(P, Q, &bind(w, &mr, 0x1000, 0, RW)),
            Err(MwError::ZeroLength)
        );
        // And the QP's PD (C10-72).
        assert_eq!(
            t.bind_mw(PdId(2), Q, &bind(w, &mr, 0x1000, 16, RW)),
            Err(MwError::OtherPd)
        );
        let k = t.bind_mw(P, Q, &bind(w, &mr, 0x1000, 16, RW)).unwrap();
        assert!(
            t.check_remote(P, Q, k, 0x1000, 16, Access::REMOTE_WRITE)
                .is_ok()
        );
        // Another QP of the same PD does not reach it.
        assert_eq!(
            t.check_remote(P, Qpn::new(6), k, 0x1000, 16, Access::REMOTE_WRITE),
            Err(AccessError::BadKey)
        );
        // Bound type 2 windows are not bound again until invalidated (o10-37.2.30).
        assert_eq!(
            t.bind_mw(P, Q, &bind(k, &mr, 0x1000, 16, RW)),
            Err(MwError::WrongState)
        );
        t.local_invalidate(P, k.value()).unwrap();
        assert_eq!(
            t.check_remote(P, Q, k, 0x1000, 16, Access::REMOTE_WRITE),
            Err(AccessError::BadKey)
        );
        assert_eq!(t.local_invalidate(P, k.value()), Err(MwError::WrongState));
        // Free again: bind, then invalidate remotely (SEND with invalidate).
        let k2 = t.bind_mw(P, Q, &bind(k, &mr, 0x1010, 16, RW)).unwrap();
        assert!(t.invalidate_rkey(P, k2));
        assert!(!t.invalidate_rkey(P, k2));
        assert_eq!(
            t.check_remote(P, Q, k2, 0x1010, 1, Access::REMOTE_READ),
            Err(AccessError::BadKey)
        );
        // Dealloc of a bound window is allowed and releases the region.
        let k3 = t.bind_mw(P, Q, &bind(k2, &mr, 0x1010, 16, RW)).unwrap();
        t.dealloc_mw(k3).unwrap();
        assert_eq!(
            t.check_remote(P, Q, k3, 0x1010, 1, Access::REMOTE_READ),
            Err(AccessError::BadKey)
        );
        t.deregister(mr.lkey).unwrap();
    }

    #[test]
    fn binds_are_checked_as_rxe_checks_them() {
        let mut t = table();
        let all = t.register(P, vec![0; 64], 0x1000, Access::all()).unwrap();
        let nobind = t
            .register(
                P,
                vec![0; 64],
                0x2000,
                Access::LOCAL_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
        let ro = t
            .register(
                P,
                vec![0; 64],
                0x3000,
                Access::MW_BIND | Access::REMOTE_READ,
            )
            .unwrap();
        let w = t.alloc_mw(P, MwType::One).unwrap();
        // Range outside the region (C10-75), also by overflow.
        assert_eq!(
            t.bind_mw(P, Q, &bind(w, &all, 0xfff, 8, RW)),
            Err(MwError::OutOfRegion)
        );
        assert_eq!(
            t.bind_mw(P, Q, &bind(w, &all, 0x1039, 8, RW)),
            Err(MwError::OutOfRegion)
        );
        assert_eq!(
            t.bind_mw(P, Q, &bind(w, &all, u64::MAX, 2, RW)),
            Err(MwError::OutOfRegion)
        );
        // No MW_BIND right (C10-73).
        assert_eq!(
            t.bind_mw(P, Q, &bind(w, &nobind, 0x2000, 8, Access::REMOTE_READ)),
            Err(MwError::NoBindRight)
        );
        // A writable window on a region without local write (C10-74).
        assert_eq!(
            t.bind_mw(P, Q, &bind(w, &ro, 0x3000, 8, RW)),
            Err(MwError::NeedsLocalWrite)
        );
        // Zero-based type 1 (o10-36.2.2).
        let mut zb = bind(w, &all, 0, 8, RW);
        zb.zero_based = true;
        assert_eq!(t.bind_mw(P, Q, &zb), Err(MwError::ZeroBased));
        // A stale window key, an unknown region.
        assert_eq!(
            t.bind_mw(P, Q, &bind(RKey::new(w.value() ^ 1), &all, 0x1000, 8, RW)),
            Err(MwError::BadKey)
        );
        let gone = t.register(P, vec![0; 8], 0, Access::all()).unwrap();
        t.deregister(gone.lkey).unwrap();
        assert_eq!(
            t.bind_mw(P, Q, &bind(w, &gone, 0, 8, RW)),
            Err(MwError::BadKey)
        );
        // A failed bind leaves the window as it was; a read-only one works.
        let k = t
            .bind_mw(P, Q, &bind(w, &ro, 0x3000, 8, Access::REMOTE_READ))
            .unwrap();
        assert!(
            t.check_remote(P, Q, k, 0x3000, 8, Access::REMOTE_READ)
                .is_ok()
        );
        // Zero-based type 2: the peer addresses the window from 0.
        let w2 = t.alloc_mw(P, MwType::Two).unwrap();
        let mut zb = bind(w2, &all, 0x10, 8, RW);
        zb.zero_based = true;
        let k2 = t.bind_mw(P, Q, &zb).unwrap();
        t.remote_write(P, Q, k2, 0, &[3; 8], Access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(&t.bytes(all.lkey).unwrap()[0x10..0x18], &[3; 8]);
        assert_eq!(
            t.remote_write(P, Q, k2, 1, &[3; 8], Access::REMOTE_WRITE),
            Err(AccessError::OutOfBounds)
        );
        // Windows keep their PD busy; a destroyed QP's type 2 windows are freed.
        assert!(t.uses_pd(P));
        t.qp_destroyed(Q);
        assert_eq!(
            t.check_remote(P, Q, k2, 0, 8, Access::REMOTE_WRITE),
            Err(AccessError::BadKey)
        );
        assert!(t.guard_violations().is_empty());
    }
}
