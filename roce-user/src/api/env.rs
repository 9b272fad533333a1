//! The environment variables through which `roce exec` (and a user's shell) configure the
//! drop-in libibverbs (roce-user/verbs): named once here, read by the library, set by
//! `roce exec`.

/// The interfaces the library serves, comma-separated (`roce exec -d IFACE` sets it); without
/// it, every interface where `roce load` attached roce_xdp.
pub const DEVICES_ENV: &str = "ROCE_DEVICES";

/// Where the library runs the device: `inline` (in the program, its threads driving the
/// transport inside `ibv_poll_cq` and the posting verbs), `threads` (in the program, one engine
/// thread per queue) or `shared` (through the interface's `roce engine` process, shared with
/// the other programs on the interface). Unset: `shared` when an engine serves the interface,
/// else `inline`. `roce exec --engine` sets it.
pub const ENGINE_ENV: &str = "ROCE_ENGINE";

/// Congestion-control parameters for every QP of the program: `NAME=VALUE` pairs separated by
/// commas, with the names `roce perf --cc-set` takes (DCQCN's mlx5 names such as
/// `rpg_ai_rate` or `min_time_between_cnps`; `enabled`, `rp_enabled`, `np_enabled`,
/// `loss_backoff`, `hold_when_idle` as 0 or 1), for example `ROCE_CC_SET=loss_backoff=1`.
/// `roce exec --cc-set` sets it.
pub const CC_ENV: &str = "ROCE_CC_SET";

/// The congestion control of every QP of the program: `dcqcn` (the default), `swift` (delay
/// based, for peers and paths that mark no ECN) or `off`, as `roce perf --cc` takes it.
/// `roce exec --cc` sets it.
pub const CC_ALGORITHM_ENV: &str = "ROCE_CC";

/// The DCQCN and Swift defaults that [`CC_ENV`] changes: `mlx5` (the default) or `software`
/// (for a busy host), as `roce perf --cc-profile` takes it. `roce exec --cc-profile` sets it.
pub const CC_PROFILE_ENV: &str = "ROCE_CC_PROFILE";

/// Whether every RC QP of the program offers the multipath extension (docs/multipath.md): `1`
/// offers it, unset or `0` does not. `roce exec --multipath` sets it.
pub const MULTIPATH_ENV: &str = "ROCE_MULTIPATH";

/// Whether the responder of every RC QP of the program coalesces ACKs: `1` (the default, as
/// unset or empty) answers the AckReq requests of a QP that arrive in one receive batch with
/// one cumulative ACK (`DeviceConfig::coalesce_acks`); `0` answers each AckReq with an ACK of
/// its own, as rxe does. `roce exec --no-ack-coalescing` sets it to `0`.
pub const ACK_COALESCING_ENV: &str = "ROCE_ACK_COALESCING";
