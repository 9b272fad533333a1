//! The per-interface lock file that serialises QPN claims and counter folding between
//! processes.

use std::fs::{self, File};

use super::error::{ApiError, os};

/// Takes the per-interface lock (`/run/roce/<ifname>.lock`) that serialises QPN claims and the
/// folding of counters between processes.
pub(crate) fn lock_file(ifname: &str) -> Result<nix::fcntl::Flock<File>, ApiError> {
    fs::create_dir_all("/run/roce").map_err(os("creating /run/roce"))?;
    let path = format!("/run/roce/{ifname}.lock");
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(os("opening the QPN lock file"))?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| ApiError::Os {
        what: "locking the QPN lock file",
        source: e.into(),
    })
}
