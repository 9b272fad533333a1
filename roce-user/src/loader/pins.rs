//! Pin handling written once for both programs: a pin directory per interface under a root
//! (`/sys/fs/bpf/roce/<ifname>` for roce_xdp, `/sys/fs/bpf/roce-impair/<ifname>` for
//! roce_impair), holding map pins and the pinned link (`link`) that keeps the program attached
//! after the loading process exits. Unpinning the link detaches the program.
//!
//! This is an I/O edge: it talks to the kernel through aya, nix and the BPF filesystem.

use std::{fs, io, path::Path};

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

/// Whether a BPF filesystem is mounted at `path` (pins can only live on one).
pub(super) fn is_bpffs(path: &str) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|s| s.filesystem_type().0 == BPF_FS_MAGIC)
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
    root: &str,
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

/// Removes every pin in `dir`, then `dir`, then `root` if that was its last interface. Returns
/// the names removed, sorted.
///
/// # Errors
/// A pin or the directory cannot be read or removed.
pub(super) fn remove_pins(dir: &Path, root: &str) -> Result<Vec<String>, LoadError> {
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
pub(super) fn detach(dir: &Path, root: &str) -> Result<Detached, LoadError> {
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
