//! The shared-memory capture ring between an endpoint process and `roce dump`.
//!
//! An endpoint's engines copy the frames they process (received from the AF_XDP RX rings, sent
//! into the TX rings, looped back) into a [`CaptureRing`] while someone captures; `roce dump`
//! maps the same file and takes the records out. The ring is a file (under
//! `/run/roce/capture/<ifname>/`, a tmpfs) mapped `MAP_SHARED` by both processes: one producer
//! (the endpoint, whose engine threads take turns under a lock) and one consumer (the dump).
//!
//! It never blocks the producer: [`CaptureRing::push`] either copies the record in or, when
//! the ring has no room, counts it in `lost` and returns at once. The frame itself is never
//! touched, so a capture that falls behind loses capture records, counted, never traffic.
//! See docs/capture.md for the whole design.
//!
//! # Layout
//! A [`HEADER_LEN`]-byte header (magic, data capacity, owner PID, `closed`, and on their own
//! cache lines the producer's `head`, `records`, `lost` and the consumer's `tail`, all
//! monotonically increasing byte or record counts), then `capacity` bytes of records. A record
//! is a [`RECORD_HEADER_LEN`]-byte header (total length, frame length, timestamp, QPN, queue,
//! direction, drop reason) and the frame, padded to 8 bytes. A record never wraps: when it
//! does not fit before the end of the data area, a filler (frame length `u32::MAX`) takes the
//! rest and the record starts at offset 0.

use std::{
    fs::File,
    io,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    ptr::NonNull,
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
};

use roce_common::counters::{DeviceCounters, QpCounters};

/// `ROCECAP1`, little-endian.
const MAGIC: u64 = u64::from_le_bytes(*b"ROCECAP1");
/// Bytes before the data area.
pub const HEADER_LEN: usize = 256;
/// Bytes of a record's header.
pub const RECORD_HEADER_LEN: usize = 24;
/// The capacity an endpoint gives its ring: 8 MiB of records (about 5000 frames of 1500 bytes).
pub const DEFAULT_CAPACITY: usize = 8 << 20;

const OFF_MAGIC: usize = 0;
const OFF_CAPACITY: usize = 8;
const OFF_PID: usize = 16;
const OFF_CLOSED: usize = 20;
const OFF_HEAD: usize = 64;
const OFF_RECORDS: usize = 72;
const OFF_LOST: usize = 80;
const OFF_TAIL: usize = 128;
/// A filler record's frame length.
const FILLER: u32 = u32::MAX;

/// The record's frame was received (from an RX ring, or looped back into the receive path).
pub const DIR_RX: u8 = 1;
/// The record's frame was sent (into a TX ring, or addressed to this interface and looped back).
pub const DIR_TX: u8 = 2;
/// Flag next to [`DIR_RX`] or [`DIR_TX`]: the frame went from the transmit path straight back
/// into the receive path (a QP connected to another QP of the same interface).
pub const DIR_LOOPBACK: u8 = 4;
/// A record's QPN when the frame names none (too short to hold a BTH).
pub const NO_QPN: u32 = u32::MAX;

/// First drop code of the [`DeviceCounters`] names (code `1 + index`).
const REASON_DEVICE: u8 = 1;
/// First drop code of the [`QpCounters`] names (code `128 + index`).
const REASON_QP: u8 = 128;

/// The drop code of the transport counter `DeviceCounters::NAMES[index]`, or 0 (none) for an
/// index out of range. Names live once, in roce-common's counter structs.
#[must_use]
pub fn reason_device(index: usize) -> u8 {
    if index < DeviceCounters::COUNT {
        REASON_DEVICE + index as u8
    } else {
        0
    }
}

/// The drop code of the QP counter `QpCounters::NAMES[index]`, or 0 (none).
#[must_use]
pub fn reason_qp(index: usize) -> u8 {
    if index < QpCounters::COUNT {
        REASON_QP + index as u8
    } else {
        0
    }
}

/// The counter name of a drop code: the name `roce stats` and bpftool print for the counter that
/// counted the drop. `None` for 0 (not dropped) and unknown codes.
#[must_use]
pub fn reason_name(code: u8) -> Option<&'static str> {
    match code {
        0 => None,
        c if c >= REASON_QP => QpCounters::NAMES.get(usize::from(c - REASON_QP)).copied(),
        c => DeviceCounters::NAMES
            .get(usize::from(c - REASON_DEVICE))
            .copied(),
    }
}

/// What a record says about its frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordMeta {
    /// Wall-clock time, nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// The local QP: the BTH DestQP of a received frame, the sending QP of a transmitted one.
    pub qpn: u32,
    /// The AF_XDP queue.
    pub queue: u16,
    /// [`DIR_RX`] or [`DIR_TX`], with [`DIR_LOOPBACK`].
    pub dir: u8,
    /// Why the transport dropped the frame ([`reason_name`]), 0 if it did not.
    pub reason: u8,
}

/// One mapping of a capture ring file. The producer and the consumer each map it; each side
/// calls only its own methods ([`CaptureRing::push`], or [`CaptureRing::pop`]).
#[derive(Debug)]
pub struct CaptureRing {
    ptr: NonNull<u8>,
    len: usize,
    capacity: u64,
    path: PathBuf,
}

// SAFETY: the mapping is owned by this value and unmapped only by its Drop; everything shared
// through it is read and written through atomics or behind the head/tail protocol, so moving
// the value to another thread is sound.
unsafe impl Send for CaptureRing {}

impl CaptureRing {
    /// Creates the ring file at `path` for `pid` with `capacity` data bytes (rounded down to a
    /// multiple of 8, at least 4 KiB), fully initialised before it appears under its name (it
    /// is written under a temporary name and renamed), and maps it. Call from the producer.
    ///
    /// # Errors
    /// The file cannot be created, sized, mapped or renamed.
    pub fn create(path: &Path, pid: u32, capacity: usize) -> io::Result<Self> {
        let capacity = (capacity.max(4096) / 8) * 8;
        let tmp = path.with_extension("tmp");
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        file.set_len((HEADER_LEN + capacity) as u64)?;
        let mut ring = Self::map(&file, tmp.clone(), HEADER_LEN + capacity)?;
        ring.atomic64(OFF_CAPACITY)
            .store(capacity as u64, Ordering::Relaxed);
        ring.atomic32(OFF_PID).store(pid, Ordering::Relaxed);
        ring.atomic64(OFF_MAGIC).store(MAGIC, Ordering::Release);
        ring.capacity = capacity as u64;
        path.clone_into(&mut ring.path);
        if let Err(e) = std::fs::rename(&tmp, path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(ring)
    }

    /// Maps an existing ring file (the consumer's side).
    ///
    /// # Errors
    /// The file cannot be opened or mapped, or is not a capture ring (`InvalidData`).
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = File::options().read(true).write(true).open(path)?;
        let len = usize::try_from(file.metadata()?.len()).unwrap_or(0);
        if len < HEADER_LEN + 4096 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "capture ring too short",
            ));
        }
        let mut ring = Self::map(&file, path.to_owned(), len)?;
        let capacity = ring.atomic64(OFF_CAPACITY).load(Ordering::Relaxed);
        if ring.atomic64(OFF_MAGIC).load(Ordering::Acquire) != MAGIC
            || !capacity.is_multiple_of(8)
            || capacity as usize + HEADER_LEN != len
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a roce capture ring",
            ));
        }
        ring.capacity = capacity;
        Ok(ring)
    }

    fn map(file: &File, path: PathBuf, len: usize) -> io::Result<Self> {
        // SAFETY: a fresh shared mapping of `len` bytes of an open file whose size is at least
        // `len`; the kernel picks the address; the result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap: null"))?;
        Ok(Self {
            ptr,
            len,
            capacity: 0,
            path,
        })
    }

    fn atomic64(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= HEADER_LEN && off.is_multiple_of(8));
        // SAFETY: `off` is one of the 8-aligned header offsets inside the page-aligned mapping,
        // which lives as long as `self`; both processes access these words only atomically.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU64>() }
    }

    fn atomic32(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off + 4 <= HEADER_LEN && off.is_multiple_of(4));
        // SAFETY: as in `atomic64`, for a 4-aligned 32-bit header word.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU32>() }
    }

    /// The data area: `capacity` bytes after the header.
    fn data_ptr(&self) -> *mut u8 {
        // SAFETY: HEADER_LEN < len: the data area starts inside the mapping.
        unsafe { self.ptr.as_ptr().add(HEADER_LEN) }
    }

    /// The file this ring lives in.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The data capacity in bytes.
    #[must_use]
    pub const fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The PID of the process that writes into the ring.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.atomic32(OFF_PID).load(Ordering::Relaxed)
    }

    /// Records the producer copied in since the ring was created.
    #[must_use]
    pub fn records(&self) -> u64 {
        self.atomic64(OFF_RECORDS).load(Ordering::Relaxed)
    }

    /// Records the producer could not copy in (no room, or a frame longer than half the ring).
    #[must_use]
    pub fn lost(&self) -> u64 {
        self.atomic64(OFF_LOST).load(Ordering::Relaxed)
    }

    /// Whether the producer has closed the ring (its device stopped): nothing more will come.
    #[must_use]
    pub fn closed(&self) -> bool {
        self.atomic32(OFF_CLOSED).load(Ordering::Acquire) != 0
    }

    /// Marks the ring closed. Call from the producer after its last [`CaptureRing::push`].
    pub fn close(&self) {
        self.atomic32(OFF_CLOSED).store(1, Ordering::Release);
    }

    /// Copies one record in, or counts it lost and returns false when the ring has no room for
    /// it. Never waits. Call from the single producer (the endpoint serialises its engine
    /// threads around it).
    pub fn push(&mut self, meta: &RecordMeta, frame: &[u8]) -> bool {
        let cap = self.capacity;
        let need = (RECORD_HEADER_LEN + frame.len()).next_multiple_of(8) as u64;
        let head = self.atomic64(OFF_HEAD).load(Ordering::Relaxed);
        let tail = self.atomic64(OFF_TAIL).load(Ordering::Acquire);
        let off = head % cap;
        let to_end = cap - off;
        let filler = if need > to_end { to_end } else { 0 };
        let used = head.wrapping_sub(tail);
        if need > cap / 2 || used > cap || used + filler + need > cap {
            self.atomic64(OFF_LOST).fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let data = self.data_ptr();
        let mut at = off as usize;
        if filler > 0 {
            let mut hdr = [0u8; 8];
            hdr[..4].copy_from_slice(&(filler as u32).to_le_bytes());
            hdr[4..].copy_from_slice(&FILLER.to_le_bytes());
            // SAFETY: `at + 8 <= capacity` (to_end is a non-zero multiple of 8), inside the
            // data area; the bytes from head to tail + capacity belong to the producer.
            unsafe { std::ptr::copy_nonoverlapping(hdr.as_ptr(), data.add(at), 8) };
            at = 0;
        }
        let mut hdr = [0u8; RECORD_HEADER_LEN];
        hdr[0..4].copy_from_slice(&(need as u32).to_le_bytes());
        hdr[4..8].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        hdr[8..16].copy_from_slice(&meta.ts_ns.to_le_bytes());
        hdr[16..20].copy_from_slice(&meta.qpn.to_le_bytes());
        hdr[20..22].copy_from_slice(&meta.queue.to_le_bytes());
        hdr[22] = meta.dir;
        hdr[23] = meta.reason;
        // SAFETY: `at + need <= capacity` (checked above: the record fits before the end, or
        // after the filler at 0), and that stretch is free (used + filler + need <= capacity),
        // so the consumer does not read it until `head` is published below.
        unsafe {
            std::ptr::copy_nonoverlapping(hdr.as_ptr(), data.add(at), RECORD_HEADER_LEN);
            std::ptr::copy_nonoverlapping(
                frame.as_ptr(),
                data.add(at + RECORD_HEADER_LEN),
                frame.len(),
            );
        }
        self.atomic64(OFF_HEAD)
            .store(head + filler + need, Ordering::Release);
        self.atomic64(OFF_RECORDS).fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Hands every record published so far to `each`, oldest first, frees their room and
    /// returns how many there were. Call from the single consumer.
    ///
    /// # Errors
    /// `InvalidData` if a record header is inconsistent (the file was written by something
    /// else): the records read before it were handed over, the rest of the ring is skipped.
    pub fn pop(&mut self, mut each: impl FnMut(&RecordMeta, &[u8])) -> io::Result<usize> {
        let cap = self.capacity;
        let mut tail = self.atomic64(OFF_TAIL).load(Ordering::Relaxed);
        let head = self.atomic64(OFF_HEAD).load(Ordering::Acquire);
        let data = self.data_ptr();
        let mut n = 0;
        let mut bad = false;
        while tail < head {
            let at = (tail % cap) as usize;
            let mut hdr = [0u8; RECORD_HEADER_LEN];
            let avail = (cap as usize - at).min(RECORD_HEADER_LEN);
            // SAFETY: `at + avail <= capacity`: inside the data area, in the published stretch
            // between tail and head that the producer no longer writes.
            unsafe { std::ptr::copy_nonoverlapping(data.add(at), hdr.as_mut_ptr(), avail) };
            let total = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
            let frame_len = u32::from_le_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]);
            if total < 8 || !total.is_multiple_of(8) || at + total > cap as usize {
                bad = true;
                break;
            }
            if frame_len != FILLER {
                let frame_len = frame_len as usize;
                if avail < RECORD_HEADER_LEN || RECORD_HEADER_LEN + frame_len > total {
                    bad = true;
                    break;
                }
                let meta = RecordMeta {
                    ts_ns: u64::from_le_bytes(hdr[8..16].try_into().unwrap_or_default()),
                    qpn: u32::from_le_bytes([hdr[16], hdr[17], hdr[18], hdr[19]]),
                    queue: u16::from_le_bytes([hdr[20], hdr[21]]),
                    dir: hdr[22],
                    reason: hdr[23],
                };
                // SAFETY: the frame lies inside the record (checked), inside the data area and
                // the published stretch; the slice lives only for the call.
                let frame = unsafe {
                    std::slice::from_raw_parts(data.add(at + RECORD_HEADER_LEN), frame_len)
                };
                each(&meta, frame);
                n += 1;
            }
            tail += total as u64;
        }
        if bad {
            tail = head;
        }
        self.atomic64(OFF_TAIL).store(tail, Ordering::Release);
        if bad {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: inconsistent capture record", self.path.display()),
            ));
        }
        Ok(n)
    }
}

impl Drop for CaptureRing {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of `len` bytes; no reference into it outlives
        // `self` (every accessor borrows `self`).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(i: u32) -> RecordMeta {
        RecordMeta {
            ts_ns: u64::from(i) * 1000,
            qpn: i,
            queue: 1,
            dir: DIR_RX,
            reason: 0,
        }
    }

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("roce-cap-{}-{name}.ring", std::process::id()))
    }

    #[test]
    fn a_full_ring_loses_records_counted_and_takes_more_once_drained() {
        let path = tmp("full");
        let mut prod = CaptureRing::create(&path, 42, 4096).unwrap();
        let mut cons = CaptureRing::open(&path).unwrap();
        assert_eq!((cons.pid(), cons.capacity()), (42, 4096));
        // 1000-byte frames take 1024 bytes each: four fit in 4096, the fifth is lost.
        let frame = [0xabu8; 1000];
        let pushed = (0..5).filter(|i| prod.push(&meta(*i), &frame)).count();
        assert_eq!(pushed, 4);
        assert_eq!((prod.records(), prod.lost()), (4, 1));
        assert_eq!((cons.records(), cons.lost()), (4, 1));
        let mut seen = Vec::new();
        assert_eq!(
            cons.pop(|m, f| {
                assert_eq!(f, &frame[..]);
                seen.push(m.qpn);
            })
            .unwrap(),
            4
        );
        assert_eq!(seen, [0, 1, 2, 3]);
        // Drained: room again, and records wrap around the end (a filler takes the rest).
        let small = [7u8; 100]; // 128 bytes a record
        for round in 0..100u32 {
            assert!(prod.push(&meta(round), &frame), "round {round}");
            assert!(prod.push(&meta(round + 1000), &small));
            let mut got = Vec::new();
            cons.pop(|m, f| got.push((m.qpn, f.len()))).unwrap();
            assert_eq!(got, [(round, 1000), (round + 1000, 100)]);
        }
        assert_eq!(cons.lost(), 1);
        // A frame longer than half the ring is never taken, and counted.
        assert!(!prod.push(&meta(9), &[0u8; 3000]));
        assert_eq!(cons.lost(), 2);
        assert!(!cons.closed());
        prod.close();
        assert!(cons.closed());
        drop(prod);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_file_that_is_not_a_ring_is_refused() {
        let path = tmp("bad");
        std::fs::write(&path, vec![0u8; HEADER_LEN + 8192]).unwrap();
        let e = CaptureRing::open(&path).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn drop_codes_name_the_transport_counters() {
        assert_eq!(reason_name(0), None);
        let i = DeviceCounters::NAMES
            .iter()
            .position(|n| *n == "rx_unknown_qp")
            .unwrap();
        assert_eq!(reason_name(reason_device(i)), Some("rx_unknown_qp"));
        let q = QpCounters::NAMES
            .iter()
            .position(|n| *n == "rx_dropped")
            .unwrap();
        assert_eq!(reason_name(reason_qp(q)), Some("rx_dropped"));
        assert_eq!(reason_device(DeviceCounters::COUNT), 0);
    }
}
