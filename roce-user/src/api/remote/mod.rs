//! Reaching a device through `roce engine` (docs/multiprocess.md): the control protocol.

pub mod proto;
