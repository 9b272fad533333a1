//! Pin handling written once for both programs: a pin directory per interface under a root
//! (`/sys/fs/bpf/roce/<ifname>` for roce_xdp, `/sys/fs/bpf/roce-impair/<ifname>` for
//! roce_impair), holding map pins and the pinned link (`link`) that keeps the program attached
//! after the loading process exits. Unpinning the link detaches the program.
//!
//! The BPF filesystem is found by [`bpffs`]: `/sys/fs/bpf` itself, or, for a process started
//! with `ip netns exec` (which gives it a mount namespace of its own and remounts `/sys`, hiding
//! the host's bpffs), the host's bpffs seen through the root of a process outside that mount
//! namespace, so pins made or read there are the host's pins.
//!
//! This is an I/O edge: it talks to the kernel through aya, nix and the BPF filesystem.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use aya::programs::links::{FdLink, PinnedLink};

use super::LoadError;

/// Name of the pinned link inside an interface's pin directory.
pub const PIN_LINK: &str = "link";

/// `statfs` magic of the BPF filesystem (`BPF_FS_MAGIC` in linux/magic.h).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Maps an I/O error on `path` to [`LoadError::Io`], saying what we were doing.
pub(super) fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> LoadError {
    let path = path.display().to_string();
    move |source| LoadError::Io { what, path, source }
}

/// Where the BPF filesystem is mounted on a host: every pin root lies below it.
pub const BPFFS: &str = "/sys/fs/bpf";

/// Whether a BPF filesystem is mounted at `path` (pins can only live on one).
pub(super) fn is_bpffs(path: impl AsRef<Path>) -> bool {
    nix::sys::statfs::statfs(path.as_ref()).is_ok_and(|s| s.filesystem_type().0 == BPF_FS_MAGIC)
}

/// The host's BPF filesystem as this process can reach it: [`BPFFS`] when a bpffs is mounted
/// there; otherwise, when this process lives in a mount namespace of its own (`ip netns exec`
/// unshares one and remounts `/sys` for the network namespace, so `/sys/fs/bpf` is an empty
/// directory of sysfs), the same path through `/proc/PID/root` of a process in another mount
/// namespace whose `/sys/fs/bpf` is a bpffs. The nearest ancestor is tried first (the shell
/// that ran `ip netns exec`), then PID 1, then any other process: a program started in the
/// background has been handed to PID 1 or a subreaper, and PID 1's root is closed to us in a
/// container or a microVM whose init is not Linux's. Path lookup follows that magic link into
/// the other namespace's mounts, so pins made through it are the host's own and outlive this
/// process. `None` when no bpffs is reachable.
///
/// Call before creating or reading pins; the answer can change when a bpffs is mounted.
#[must_use]
pub fn bpffs() -> Option<PathBuf> {
    if is_bpffs(BPFFS) {
        return Some(BPFFS.into());
    }
    let rel = BPFFS.trim_start_matches('/');
    let own_ns = fs::read_link("/proc/self/ns/mnt").ok();
    let through = |pid: u32| {
        let proc = PathBuf::from(format!("/proc/{pid}"));
        let other = fs::read_link(proc.join("ns/mnt")).ok();
        let path = proc.join("root").join(rel);
        (other.is_some() && other != own_ns && is_bpffs(&path)).then_some(path)
    };
    let mut pid = std::os::unix::process::parent_id();
    for _ in 0..64 {
        if pid <= 1 {
            break;
        }
        if let Some(p) = through(pid) {
            return Some(p);
        }
        match parent_of(pid) {
            Some(p) => pid = p,
            None => break,
        }
    }
    if let Some(p) = through(1) {
        return Some(p);
    }
    fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find_map(through)
}

/// The parent of process `pid` (`/proc/PID/stat`, the field after the parenthesised name).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// `host_path`, a path below [`BPFFS`] as the host sees it, as this process reaches it (below
/// [`bpffs`]); `host_path` itself when no bpffs is reachable, where nothing will be found and
/// loading says why.
#[must_use]
pub fn reachable(host_path: &str) -> PathBuf {
    match (bpffs(), host_path.strip_prefix(BPFFS)) {
        (Some(fs), Some(rest)) => fs.join(rest.trim_start_matches('/')),
        _ => host_path.into(),
    }
}

/// Runs `populate` on a fresh, empty pin directory `dir` (below `root`). A directory without a
/// link is what a crash between pinning steps leaves, so whatever is there is cleared first; if
/// `populate` fails, everything it pinned is removed again, and its error is returned (the one
/// that matters is the first).
///
/// # Errors
/// The directory cannot be cleared or created, or `populate` failed.
pub(super) fn populate_fresh<T, E: From<LoadError>>(
    dir: &Path,
    root: &Path,
    populate: impl FnOnce(&Path) -> Result<T, E>,
) -> Result<T, E> {
    if dir.exists() {
        remove_pins(dir, root)?;
    }
    fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    let result = populate(dir);
    if result.is_err() {
        let _ = remove_pins(dir, root);
    }
    result
}

/// Pins `link` as `dir/link` so that the program stays attached, and returns its kernel link id.
/// Call last when populating a pin directory: the link's pin is what marks it complete.
///
/// # Errors
/// The link's info cannot be read or the pin cannot be made.
pub(super) fn pin_link(link: FdLink, dir: &Path) -> Result<u32, LoadError> {
    let id = link.info()?.id();
    link.pin(dir.join(PIN_LINK))?;
    Ok(id)
}

/// The kernel program and link ids of the pinned link in `dir`, or `None`s when there is no
/// pin or the link is gone. Opening the pin only takes a reference: dropping it here closes our
/// fd, and the pin keeps the program attached.
pub(super) fn link_ids(dir: &Path) -> (Option<u32>, Option<u32>) {
    match PinnedLink::from_pin(dir.join(PIN_LINK)) {
        Ok(link) => {
            let fd: FdLink = link.into();
            fd.info()
                .map_or((None, None), |i| (Some(i.program_id()), Some(i.id())))
        }
        Err(_) => (None, None),
    }
}

/// The interface index the pinned link in `dir` is attached to: `Some(0)` when the kernel has
/// detached it because its interface is gone (a veth deleted with its namespace, say: the pin
/// keeps the link object alive, attached to nothing), `None` when there is no link pin or its
/// record cannot be read. Call it to tell a live pinned load from one whose interface went away.
///
/// The kernel prints an XDP link's interface in the link fd's `fdinfo` (`ifindex:`, 0 once
/// detached; net/core/dev.c `bpf_xdp_link_show_fdinfo`), and aya does not expose the fd, so the
/// link is opened from its pin and its fd found among this process's by the link id.
pub(super) fn link_ifindex(dir: &Path) -> Option<u32> {
    let link: FdLink = PinnedLink::from_pin(dir.join(PIN_LINK)).ok()?.into();
    let id = link.info().ok()?.id();
    let found = fs::read_dir("/proc/self/fdinfo")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| fs::read_to_string(e.path()).ok())
        .find_map(|info| {
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .and_then(|v| v.trim().parse::<u32>().ok())
            };
            (field("link_id:") == Some(id))
                .then(|| field("ifindex:"))
                .flatten()
        });
    drop(link);
    found
}

/// Removes every pin in `dir`, then `dir`, then `root` if that was its last interface. Returns
/// the names removed, sorted.
///
/// # Errors
/// A pin or the directory cannot be read or removed.
pub(super) fn remove_pins(dir: &Path, root: &Path) -> Result<Vec<String>, LoadError> {
    let mut removed = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err("read", dir))? {
        let entry = entry.map_err(io_err("read", dir))?;
        let path = entry.path();
        fs::remove_file(&path).map_err(io_err("unpin", &path))?;
        removed.push(entry.file_name().to_string_lossy().into_owned());
    }
    fs::remove_dir(dir).map_err(io_err("remove", dir))?;
    // Remove the shared root once the last interface is gone.
    let _ = fs::remove_dir(root);
    removed.sort();
    Ok(removed)
}

/// What [`detach`] found and did.
pub(super) struct Detached {
    /// Whether a pinned link was found and detached.
    pub detached: bool,
    /// Pins removed, sorted (the link included).
    pub removed: Vec<String>,
}

/// Unpins the link in `dir` (dropping the last reference to a link detaches its program) and
/// removes the other pins with [`remove_pins`]. Works from the pins alone, so it also recovers
/// an interface whose loader was killed. The caller checks that `dir` exists.
///
/// # Errors
/// The link or a pin cannot be opened or removed.
pub(super) fn detach(dir: &Path, root: &Path) -> Result<Detached, LoadError> {
    let link_path = dir.join(PIN_LINK);
    let mut detached = false;
    if link_path.exists() {
        let link = PinnedLink::from_pin(&link_path)?;
        let fd_link = link.unpin().map_err(io_err("unpin", &link_path))?;
        drop(fd_link);
        detached = true;
    }
    let mut removed = remove_pins(dir, root)?;
    if detached {
        removed.push(PIN_LINK.to_owned());
        removed.sort();
    }
    Ok(Detached { detached, removed })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_are_read_from_proc() {
        let me = std::process::id();
        assert_eq!(parent_of(me), Some(std::os::unix::process::parent_id()));
        assert_eq!(parent_of(u32::MAX), None);
    }

    #[test]
    fn host_paths_map_below_the_reachable_bpffs() {
        // Outside /sys/fs/bpf a path is left as it is.
        assert_eq!(reachable("/tmp/x"), PathBuf::from("/tmp/x"));
        if let Some(fs) = bpffs() {
            assert_eq!(reachable("/sys/fs/bpf/roce"), fs.join("roce"));
        }
    }
}
