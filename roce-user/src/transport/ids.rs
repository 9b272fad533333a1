//! The spec newtypes, from the wire module (one definition for the whole crate).

pub use crate::wire::types::{LKey, Msn, PKey, Psn, QKey, Qpn, RKey};
