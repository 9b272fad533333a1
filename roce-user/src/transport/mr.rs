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

use core::fmt;

use rand::{Rng, SeedableRng, rngs::StdRng};

use super::Shard;
use super::ids::{LKey, RKey};
pub use super::mem::{MR_GUARD_BYTE, MR_GUARD_LEN, MemBuf, Memory, OutOfRegion, RawMem};

bitflags::bitflags! {
    /// Memory access rights (`enum ibv_access_flags`). [`Access::all`] is every right,
    /// [`Access::empty`] none.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
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
    }
}

/// A protection domain (`ibv_alloc_pd`): a QP reaches only the regions of its own PD, locally
/// and remotely (IBA 10.2.3); a key of another PD behaves as an invalid key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct PdId(pub u32);

/// What a registration returns: the keys and the address range of the region.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
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
}

impl Mr {
    fn len(&self) -> usize {
        self.mem.len()
    }
}

/// The table of registered memory regions of a device.
pub struct MrTable {
    slots: Vec<Option<Mr>>,
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
    (key >> 16).checked_sub(1).map(|s| s as usize)
}

impl MrTable {
    /// A table of `capacity` regions (at most 65535) whose key bits come from a ChaCha CSPRNG
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
        let capacity = capacity.min(0xffff);
        Self {
            slots: (0..capacity).map(|_| None).collect(),
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
    /// fail from now on. Returns whether a region had that valid R_Key.
    pub fn invalidate_rkey(&mut self, pd: PdId, rkey: RKey) -> bool {
        let Some(slot) = slot_of(rkey.value()) else {
            return false;
        };
        match self.slots.get_mut(slot).and_then(Option::as_mut) {
            Some(m) if m.rkey == rkey && m.rkey_valid && m.pd == pd => {
                m.rkey_valid = false;
                true
            }
            _ => false,
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

    /// Whether any region belongs to `pd`.
    #[must_use]
    pub fn uses_pd(&self, pd: PdId) -> bool {
        self.slots.iter().flatten().any(|m| m.pd == pd)
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

    /// The region of `rkey` in `pd` if it grants `need`.
    fn remote(&mut self, pd: PdId, rkey: RKey, need: Access) -> Result<&mut Mr, AccessError> {
        let m = self.by_rkey_mut(pd, rkey).ok_or(AccessError::BadKey)?;
        if !m.access.contains(need) {
            return Err(AccessError::NoRight);
        }
        Ok(m)
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

    /// Checks a remote access of `len` bytes at `va` with `rkey` needing `need`, without doing it
    /// (rxe `check_rkey`).
    ///
    /// # Errors
    /// [`AccessError`] saying why the responder must NAK with a remote access error.
    pub fn check_remote(
        &mut self,
        pd: PdId,
        rkey: RKey,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<(), AccessError> {
        let m = self.remote(pd, rkey, need)?;
        Self::offset(m, va, len).map(|_| ())
    }

    /// Writes `data` at `va` of the region of `rkey` (a WRITE's payload), checked for `need`.
    ///
    /// # Errors
    /// [`AccessError`] if the key, the right or the range is wrong; nothing is written then.
    pub fn remote_write(
        &mut self,
        pd: PdId,
        rkey: RKey,
        va: u64,
        data: &[u8],
        need: Access,
    ) -> Result<(), AccessError> {
        let m = self.remote(pd, rkey, need)?;
        let off = Self::offset(m, va, data.len() as u64)?;
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
        rkey: RKey,
        va: u64,
        out: &mut [u8],
        need: Access,
    ) -> Result<(), AccessError> {
        let m = self.remote(pd, rkey, need)?;
        let off = Self::offset(m, va, out.len() as u64)?;
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
        rkey: RKey,
        va: u64,
        f: impl Fn(u64) -> u64,
    ) -> Result<u64, AccessError> {
        let m = self.remote(pd, rkey, Access::REMOTE_ATOMIC)?;
        let off = Self::offset(m, va, 8)?;
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
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
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

    #[test]
    fn canaries_surround_every_region_and_a_stray_write_is_reported() {
        let mut t = table();
        let a = t.register(P, vec![7; 100], 0x1000, Access::all()).unwrap();
        // The region is exactly what was registered; accesses up to its last byte work.
        assert_eq!(t.bytes(a.lkey).unwrap(), &[7; 100][..]);
        t.remote_write(P, a.rkey, 0x1000, &[9; 100], Access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(
            t.remote_write(P, a.rkey, 0x1000 + 1, &[9; 100], Access::REMOTE_WRITE),
            Err(AccessError::OutOfBounds)
        );
        let mut out = [0; 100];
        assert_eq!(
            t.remote_read(P, a.rkey, 0x1000 - 1, &mut out, Access::REMOTE_READ),
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
            t.check_remote(other, a.rkey, 0, 8, Access::REMOTE_READ),
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
            t.check_remote(P, a.rkey, 0x1000, 8, Access::REMOTE_READ),
            Err(AccessError::BadKey)
        );
        assert!(
            t.check_remote(P, b.rkey, 0x1000, 8, Access::REMOTE_READ)
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
            t.check_remote(P, a.rkey, u64::MAX - 64, 64, Access::REMOTE_WRITE)
                .is_ok()
        );
        assert_eq!(
            t.check_remote(P, a.rkey, u64::MAX - 1, 2, Access::REMOTE_WRITE),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            t.check_remote(P, a.rkey, u64::MAX, u64::MAX, Access::REMOTE_WRITE),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            t.check_remote(P, a.rkey, 0, 1, Access::REMOTE_WRITE),
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
            t.check_remote(P, a.rkey, 0, 8, Access::REMOTE_WRITE),
            Err(AccessError::NoRight)
        );
        assert_eq!(
            t.local_write(P, a.lkey, 0, &[0; 8]),
            Err(AccessError::NoRight)
        );
        assert_eq!(
            t.remote_atomic(P, a.rkey, 0, |v| v),
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
            t.check_remote(P, a.rkey, 0, 8, Access::REMOTE_READ),
            Err(AccessError::BadKey)
        );
        let k = t.revalidate_rkey(a.lkey).unwrap();
        assert_ne!(k, a.rkey);
        assert!(t.check_remote(P, k, 0, 8, Access::REMOTE_READ).is_ok());
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
}
