//! A program's registered region as the engine reaches it: reads and writes on the program's
//! `/proc/PID/mem`, opened once per connection (docs/multiprocess.md, "Registered memory": the
//! simplest correct path, measured at 0.1 to 0.3 of a memcpy, no slower than
//! `process_vm_readv/writev`; the memfd remap replaces it on the fast path).
//!
//! Why the file and not `process_vm_*` by pid: the open file holds the program's address space
//! itself, not its number. Once that program has exited (or exec'd another image), every access
//! through it fails, so a WRITE that arrives between a program's death and the engine's
//! cleanup of its regions cannot land in a process that got the same pid, or in the new image.

use std::{fs::File, os::unix::fs::FileExt as _, sync::Arc};

use crate::transport::ExternalMem;

/// A process's address space, as an open `/proc/PID/mem`: shared by the regions of one
/// connection. Open it when the connection starts, from the pid of `SO_PEERCRED`.
#[derive(Debug, Clone)]
pub struct AddressSpace(Arc<File>);

impl AddressSpace {
    /// Opens process `pid`'s memory for reading and writing (root, or ptrace rights over it).
    ///
    /// # Errors
    /// No such process, or no right to it.
    pub fn open(pid: i32) -> std::io::Result<Self> {
        Self::at(&format!("/proc/{pid}/mem"))
    }

    /// This process's own memory (`/proc/self/mem`), for a program that reads its registered
    /// regions as the engine does.
    ///
    /// # Errors
    /// `/proc` is not mounted, or the file cannot be opened.
    pub fn own() -> std::io::Result<Self> {
        Self::at("/proc/self/mem")
    }

    fn at(path: &str) -> std::io::Result<Self> {
        let f = File::options().read(true).write(true).open(path)?;
        Ok(Self(Arc::new(f)))
    }
}

/// `len` bytes at `addr` in one process's [`AddressSpace`]. The space comes from the
/// connection's `SO_PEERCRED` pid, never from a request, so a program can name only its own
/// memory; the kernel checks the access itself (ptrace rules: the engine runs as root).
#[derive(Debug, Clone)]
pub struct ProcessMem {
    space: AddressSpace,
    addr: u64,
    len: usize,
}

impl ProcessMem {
    /// The region, if `addr + len` does not wrap and fits this platform's addresses and a
    /// file offset.
    #[must_use]
    pub fn new(space: AddressSpace, addr: u64, len: u64) -> Option<Self> {
        let len = usize::try_from(len).ok()?;
        let end = addr.checked_add(len as u64)?;
        usize::try_from(end).ok()?;
        i64::try_from(end).ok()?;
        Some(Self { space, addr, len })
    }

    /// The file offset of byte `offset` of the region for an access of `len` bytes, if the
    /// access stays inside it.
    fn at(&self, offset: usize, len: usize) -> Option<u64> {
        if offset.checked_add(len)? > self.len {
            return None;
        }
        self.addr.checked_add(offset as u64)
    }

    /// Whether the first and the last byte of the region can be read now: the check
    /// registration makes (`ibv_reg_mr` pins the pages, failing with `EFAULT` on a hole; the
    /// engine cannot pin another process's pages, so holes met later fail the access).
    #[must_use]
    pub fn reachable(&self) -> bool {
        let mut b = [0u8; 1];
        self.len > 0 && self.read(0, &mut b) && self.read(self.len - 1, &mut b)
    }
}

impl ExternalMem for ProcessMem {
    fn len(&self) -> usize {
        self.len
    }

    fn addr(&self) -> u64 {
        self.addr
    }

    fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        if out.is_empty() {
            return true;
        }
        self.at(offset, out.len())
            .is_some_and(|pos| self.space.0.read_exact_at(out, pos).is_ok())
    }

    fn write(&self, offset: usize, data: &[u8]) -> bool {
        if data.is_empty() {
            return true;
        }
        self.at(offset, data.len())
            .is_some_and(|pos| self.space.0.write_all_at(data, pos).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::Memory;

    /// Through this process's own pid: reads and writes land in the buffer, the bytes around
    /// the region stay, a hole is refused (Memory reports it as outside the region).
    #[test]
    fn process_memory_reads_and_writes_the_owner_and_refuses_holes() {
        let mut backing = vec![0xeeu8; 300];
        let addr = backing.as_mut_ptr() as u64 + 100;
        let own = AddressSpace::own().unwrap();
        let pm = ProcessMem::new(own.clone(), addr, 100).unwrap();
        assert!(pm.reachable());
        let mut mem = Memory::External(Box::new(pm));
        mem.write(0, &[1; 10]).unwrap();
        mem.write(90, &[2; 10]).unwrap();
        assert!(mem.write(91, &[3; 10]).is_err(), "past the end");
        let mut out = [0u8; 10];
        mem.read(90, &mut out).unwrap();
        assert_eq!(out, [2; 10]);
        assert_eq!(mem.update_u64(0, |v| v + 1).unwrap(), 0x0101_0101_0101_0101);
        drop(mem);
        let backing = std::hint::black_box(backing);
        assert_eq!(backing[100..110], [2, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
        assert!(backing[..100].iter().all(|&b| b == 0xee));
        assert!(backing[200..].iter().all(|&b| b == 0xee));
        // Page 0 is never mapped.
        let hole = ProcessMem::new(own.clone(), 16, 64).unwrap();
        assert!(!hole.reachable());
        let mut mem = Memory::External(Box::new(hole));
        assert!(mem.read(0, &mut out).is_err());
        assert!(mem.write(0, &out).is_err());
        assert!(
            ProcessMem::new(own.clone(), u64::MAX - 4, 8).is_none(),
            "wraps"
        );
        assert!(
            ProcessMem::new(own, 1 << 63, 8).is_none(),
            "beyond a file offset"
        );
    }

    /// The start of process `pid`'s first mapping, from `/proc/PID/maps`.
    fn first_mapping(pid: i32) -> u64 {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
        maps.lines()
            .next()
            .and_then(|l| l.split('-').next())
            .and_then(|a| u64::from_str_radix(a, 16).ok())
            .expect("a mapping")
    }

    /// The hole that `process_vm_*` by pid had: the space is the program's image, not its
    /// number. A child's region reads while the child runs; once it has exec'd another image
    /// (same pid), the old space reaches nothing, even at an address the new image maps, where
    /// a pid-based access would read the new program; once it has exited and been reaped
    /// (its pid free for anyone), every access fails.
    #[test]
    fn a_gone_programs_regions_reach_nothing() {
        use std::io::Write as _;
        let mut child = std::process::Command::new("sh")
            .args(["-c", "read _ ; exec sleep 30"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        let pid = i32::try_from(child.id()).expect("pid");
        let space = AddressSpace::open(pid).expect("its memory (root or own child)");
        let pm = ProcessMem::new(space.clone(), first_mapping(pid), 64).expect("region");
        assert!(pm.reachable(), "the running child's memory reads");
        // Let it exec sleep, and wait until it has.
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(b"go\n")
            .expect("write");
        let t0 = std::time::Instant::now();
        while !std::fs::read_link(format!("/proc/{pid}/exe"))
            .is_ok_and(|e| e.to_string_lossy().contains("sleep"))
        {
            assert!(t0.elapsed().as_secs() < 10, "the child never exec'd");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let now = first_mapping(pid);
        let fresh = ProcessMem::new(AddressSpace::open(pid).expect("reopen"), now, 64).unwrap();
        assert!(fresh.reachable(), "the new image maps {now:#x}");
        let stale = ProcessMem::new(space, now, 64).unwrap();
        assert!(
            !stale.reachable(),
            "the old image's space reaches the new one"
        );
        assert!(!pm.reachable());
        let mut out = [0u8; 16];
        assert!(!stale.write(0, &out));
        child.kill().expect("kill");
        child.wait().expect("reap");
        assert!(
            !fresh.reachable(),
            "a dead program's region reaches nothing"
        );
        assert!(!fresh.read(0, &mut out));
        assert!(!fresh.write(0, &out));
    }
}
