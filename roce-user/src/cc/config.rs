//! DCQCN parameters under their mlx5 names, with units, defaults and ranges.
//!
//! Names are the mlx5 firmware / mlxconfig names (lower-cased: `RPG_TIME_RESET` →
//! `rpg_time_reset`; the Linux debugfs knobs in drivers/infiniband/hw/mlx5/cong.c are the same
//! with `rp_`/`np_` prefixes). Defaults are those of an actual ConnectX-5 Ex (fw 16.27.2008)
//! `mlxconfig -d ... q` dump (xdp-newbies, 2020-06-22) and NVIDIA's DOCA "DCQCN CC Parameters"
//! page, as collected in `../shared/reference/roce-v2.md` §4. Units: rates in Mb/s, times in µs,
//! α and g in fixed point with 10 fractional bits (value/1024), as the DOCA page says.

use core::time::Duration;

/// A parameter's entry in a table of (name, min, max, unit) ranges, checked against `value`:
/// what DCQCN's and Swift's `set` and `validate` do first. Returns the table's `&'static`
/// name.
///
/// # Errors
/// [`ConfigError`] with the allowed range, or with unit "unknown" for a name not in the table.
pub(crate) fn check_range(
    ranges: &[(&'static str, u64, u64, &'static str)],
    name: &str,
    value: u64,
) -> Result<&'static str, ConfigError> {
    let Some(&(name, min, max, unit)) = ranges.iter().find(|r| r.0 == name) else {
        return Err(ConfigError {
            name: "unknown parameter",
            value,
            min: 0,
            max: 0,
            unit: "unknown",
        });
    };
    if (min..=max).contains(&value) {
        Ok(name)
    } else {
        Err(ConfigError {
            name,
            value,
            min,
            max,
            unit,
        })
    }
}

/// A parameter out of its allowed range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{} parameter {name} = {value} is out of range (allowed {min}..={max} {unit})",
    family(name)
)]
pub struct ConfigError {
    /// The parameter's mlx5 name.
    pub name: &'static str,
    /// The value given.
    pub value: u64,
    /// Smallest allowed value.
    pub min: u64,
    /// Largest allowed value.
    pub max: u64,
    /// Unit of the value.
    pub unit: &'static str,
}

/// The algorithm a parameter name belongs to, for [`ConfigError`]'s message.
fn family(name: &str) -> &'static str {
    if name.starts_with("swift_") {
        "Swift"
    } else {
        "DCQCN"
    }
}

/// DCQCN configuration of a port (applied to every QP). Build it with [`Default`] and change
/// fields, then call [`DcqcnConfig::validate`] (or [`DcqcnConfig::set`] by name, which
/// validates).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DcqcnConfig {
    /// Reaction point on: CNPs cut the QP's rate. Off: the RP never limits (mlx5 sysfs
    /// `ecn/roce_rp/enable/<prio>`). Default on.
    pub rp_enabled: bool,
    /// Notification point on: CE-marked packets cause CNPs (mlx5 sysfs `ecn/roce_np/enable`).
    /// Default on.
    pub np_enabled: bool,
    /// roce-xdp's addition, not an mlx5 knob: with the reaction point on, a loss the
    /// transport detects cuts the rate as a CNP does, so that a QP backs off towards a peer
    /// or path that marks nothing: a retry halves it ([`super::ReactionPoint::on_loss`]), a
    /// replayed READ takes it to what the requester took in order before its gap
    /// ([`super::ReactionPoint::on_loss_delivered`]). A READ responder also clocks its
    /// responses by ACK-eliciting probes, at most a window of frames past the newest the
    /// peer answered (`transport/cc.rs`, `ReadClock`), so that the first burst of READs
    /// does not overrun a slow receiver before any loss can tell. Off in the `mlx5` profile
    /// (the default: a NIC does neither), on in the `software` one ([`Self::software`]);
    /// `--cc-set loss_backoff=1` turns it on in either.
    pub loss_backoff: bool,
    /// roce-xdp's addition, not an mlx5 knob: a rate increase timer period (T) counts only if
    /// the QP sent at least half of what its rate allowed during it, or the pacer held a ready
    /// frame back in it ([`super::ReactionPoint::on_paced`]); after a period that did not, the
    /// timer stops and the byte counter's events do not count either until the QP sends again
    /// ([`super::ReactionPoint::handle_timeout`]). It is RFC 7661's rule for TCP's window
    /// ("new congestion window validation": an application-limited sender does not grow
    /// the window it did not use) applied to DCQCN's timer: a QP that a busy host kept from
    /// the CPU does not come back at a rate it never sent at, with no CNP able to stop it.
    /// Off in the mlx5 profile (a NIC always has the CPU), on in the software profile;
    /// `--cc-set hold_when_idle=0|1`.
    pub hold_when_idle: bool,
    /// µs between rate increases while no CNP arrives (the DCQCN "timer", T). Default 300
    /// (CX-5 dump); paper 55. Range 1..=131071.
    pub rpg_time_reset: u32,
    /// Bytes sent between rate increases while no CNP arrives (the DCQCN byte counter, BC);
    /// 0 disables the byte counter. Unit bytes, as the IEEE 802.1Qau QCN managed object defines
    /// this name (include/uapi/linux/dcbnl.h `rpg_byte_reset`); whether mlx5 firmware scales it
    /// is not documented in our sources. Default 32767 (CX-5 dump); paper 10 MB.
    pub rpg_byte_reset: u32,
    /// Increase events (timer or byte counter) of fast recovery before additive increase; past
    /// it on both counters, hyper increase (DCQCN F). Default 1 (CX-5 dump); paper 5. Range 1..=31.
    pub rpg_threshold: u32,
    /// Mb/s added to the target rate per additive-increase event (R_AI). Default 5. Range 1..=100000.
    pub rpg_ai_rate: u32,
    /// Mb/s added to the target rate per hyper-increase stage (R_HAI). Default 50. Range 1..=100000.
    pub rpg_hai_rate: u32,
    /// Rate reduction shift: a CNP cuts `rate · α / 2^rpg_gd` with α in 1024ths, so 11 is the
    /// paper's `rate · α/2` ("coefficient between alpha and the rate reduction factor").
    /// Default 11. Range 1..=15.
    pub rpg_gd: u32,
    /// Smallest factor, in percent, a single CNP may multiply the rate by (the rate after a cut
    /// is at least `rate · rpg_min_dec_fac / 100`; DOCA: "maximal ratio of rate decrease in a
    /// single event"). Default 50. Range 1..=100.
    pub rpg_min_dec_fac: u32,
    /// Mb/s below which no cut takes the rate. Default 1. Range 1..=100000.
    pub rpg_min_rate: u32,
    /// Mb/s set on the first CNP of a QP whose rate is not limited yet; 0: cut from the current
    /// rate as any other CNP does. Default 0. Range 0..=400000.
    pub rate_to_set_on_first_cnp: u32,
    /// α gain in 1024ths, in the Mellanox form (community DOC-2790 "DCQCN Parameters"):
    /// with a CNP `α ← α·g/1024 + (1024 − g)`, without `α ← α·g/1024`; the paper's gain is
    /// `(1024 − g)/1024`. Default 1019 ("fixed point with 10 bits in the fraction part").
    /// Range 0..=1023.
    pub dce_tcp_g: u32,
    /// µs between α updates while no CNP arrives (the α timer, K in the paper). Default 1
    /// (DOCA); paper 55. Range 1..=131071.
    pub dce_tcp_rtt: u32,
    /// α of a QP at its first CNP, in 1024ths. Default 1023. Range 0..=1023.
    pub initial_alpha_value: u32,
    /// µs during which at most one CNP cuts the rate; later CNPs are counted in
    /// `rp_cnp_ignored`. Default 4. Range 0..=131071 (0: every CNP cuts).
    pub rate_reduce_monitor_period: u32,
    /// µs that must pass between two CNPs the NP sends for one QP. Default 2 (CX-5 dump).
    /// Range 0..=131071.
    pub min_time_between_cnps: u32,
    /// DSCP of the CNPs the NP sends. Default 48. Range 0..=63.
    pub cnp_dscp: u8,
}

impl Default for DcqcnConfig {
    fn default() -> Self {
        Self {
            rp_enabled: true,
            np_enabled: true,
            loss_backoff: false,
            hold_when_idle: false,
            rpg_time_reset: 300,
            rpg_byte_reset: 32767,
            rpg_threshold: 1,
            rpg_ai_rate: 5,
            rpg_hai_rate: 50,
            rpg_gd: 11,
            rpg_min_dec_fac: 50,
            rpg_min_rate: 1,
            rate_to_set_on_first_cnp: 0,
            dce_tcp_g: 1019,
            dce_tcp_rtt: 1,
            initial_alpha_value: 1023,
            rate_reduce_monitor_period: 4,
            min_time_between_cnps: 2,
            cnp_dscp: 48,
        }
    }
}

/// (name, min, max, unit) of every numeric parameter, in declaration order.
const RANGES: [(&str, u64, u64, &str); 15] = [
    ("rpg_time_reset", 1, 131_071, "us"),
    ("rpg_byte_reset", 0, u32::MAX as u64, "bytes"),
    ("rpg_threshold", 1, 31, "events"),
    ("rpg_ai_rate", 1, 100_000, "Mb/s"),
    ("rpg_hai_rate", 1, 100_000, "Mb/s"),
    ("rpg_gd", 1, 15, "shift"),
    ("rpg_min_dec_fac", 1, 100, "%"),
    ("rpg_min_rate", 1, 100_000, "Mb/s"),
    ("rate_to_set_on_first_cnp", 0, 400_000, "Mb/s"),
    ("dce_tcp_g", 0, 1023, "/1024"),
    ("dce_tcp_rtt", 1, 131_071, "us"),
    ("initial_alpha_value", 0, 1023, "/1024"),
    ("rate_reduce_monitor_period", 0, 131_071, "us"),
    ("min_time_between_cnps", 0, 131_071, "us"),
    ("cnp_dscp", 0, 63, "DSCP"),
];

impl DcqcnConfig {
    /// The names of the numeric parameters, for help texts and `--set NAME=VALUE` parsing.
    pub const NAMES: [&'static str; 15] = {
        let mut n = [""; 15];
        let mut i = 0;
        while i < 15 {
            n[i] = RANGES[i].0;
            i += 1;
        }
        n
    };

    fn slot(&mut self, name: &str) -> Option<&mut u32> {
        Some(match name {
            "rpg_time_reset" => &mut self.rpg_time_reset,
            "rpg_byte_reset" => &mut self.rpg_byte_reset,
            "rpg_threshold" => &mut self.rpg_threshold,
            "rpg_ai_rate" => &mut self.rpg_ai_rate,
            "rpg_hai_rate" => &mut self.rpg_hai_rate,
            "rpg_gd" => &mut self.rpg_gd,
            "rpg_min_dec_fac" => &mut self.rpg_min_dec_fac,
            "rpg_min_rate" => &mut self.rpg_min_rate,
            "rate_to_set_on_first_cnp" => &mut self.rate_to_set_on_first_cnp,
            "dce_tcp_g" => &mut self.dce_tcp_g,
            "dce_tcp_rtt" => &mut self.dce_tcp_rtt,
            "initial_alpha_value" => &mut self.initial_alpha_value,
            "rate_reduce_monitor_period" => &mut self.rate_reduce_monitor_period,
            "min_time_between_cnps" => &mut self.min_time_between_cnps,
            _ => return None,
        })
    }

    /// The value of the numeric parameter `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<u64> {
        if name == "cnp_dscp" {
            return Some(u64::from(self.cnp_dscp));
        }
        let mut copy = *self;
        copy.slot(name).map(|v| u64::from(*v))
    }

    /// Sets parameter `name` to `value` after checking its range.
    ///
    /// # Errors
    /// [`ConfigError`] with the allowed range; `min == max == 0` and unit "unknown" for a name
    /// that is not a parameter.
    pub fn set(&mut self, name: &str, value: u64) -> Result<(), ConfigError> {
        let name = check_range(&RANGES, name, value)?;
        if name == "cnp_dscp" {
            self.cnp_dscp = value as u8; // <= 63, checked above
        } else if let Some(v) = self.slot(name) {
            *v = value as u32; // <= u32::MAX, checked above
        }
        Ok(())
    }

    /// Checks every parameter against its range. Call after building a config field by field.
    ///
    /// # Errors
    /// The first parameter out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, ..) in RANGES {
            check_range(&RANGES, name, self.get(name).unwrap_or_default())?;
        }
        Ok(())
    }

    /// `rpg_time_reset` as a duration.
    #[must_use]
    pub const fn time_reset(&self) -> Duration {
        Duration::from_micros(self.rpg_time_reset as u64)
    }
    /// `dce_tcp_rtt` (the α timer) as a duration.
    #[must_use]
    pub const fn alpha_period(&self) -> Duration {
        Duration::from_micros(self.dce_tcp_rtt as u64)
    }
    /// `rate_reduce_monitor_period` as a duration.
    #[must_use]
    pub const fn monitor_period(&self) -> Duration {
        Duration::from_micros(self.rate_reduce_monitor_period as u64)
    }
    /// `min_time_between_cnps` as a duration.
    #[must_use]
    pub const fn cnp_interval(&self) -> Duration {
        Duration::from_micros(self.min_time_between_cnps as u64)
    }
}

impl DcqcnConfig {
    /// The names [`DcqcnConfig::profile`] knows, for help texts: `mlx5` (the defaults) and
    /// `software`.
    pub const PROFILES: [&'static str; 2] = ["mlx5", "software"];

    /// The DCQCN defaults of a named profile (`--cc-profile`): `mlx5` is [`Default`] (a
    /// ConnectX-5's firmware values); `software` is [`DcqcnConfig::software`]. `None` for an
    /// unknown name ([`DcqcnConfig::PROFILES`] lists them). Every parameter can still be changed by its
    /// mlx5 name afterwards ([`DcqcnConfig::set`]).
    #[must_use]
    pub fn profile(name: &str) -> Option<Self> {
        match name {
            "mlx5" => Some(Self::default()),
            "software" => Some(Self::software()),
            _ => None,
        }
    }

    /// DCQCN for an endpoint whose NP and RP run in software threads on a shared host
    /// (docs/cc-software.md has the reasoning and the measurements): [`Default`] with
    /// `rpg_time_reset` 300 → 1500 µs, `dce_tcp_rtt` 1 → 5 µs, and [`Self::hold_when_idle`]
    /// and [`Self::loss_backoff`] on.
    ///
    /// A NIC serves its DCQCN timers within microseconds; a thread is served when the
    /// scheduler runs it, and on a busy core that is once per time slice (Linux EEVDF's base
    /// slice, 0.75 ms × (1 + log2 CPUs): 1.5 ms on 2 CPUs, 3 ms on 8). With arrival stamps
    /// (roce_xdp's, see `roce_common::stamp`) the NP and the RP measure
    /// `min_time_between_cnps` and `rate_reduce_monitor_period` between arrivals, as a NIC
    /// does, and the α timer catches up by elapsed time, so those keep mlx5's values. The rate
    /// increase timer is the one a stall breaks: after a slice without CPU it fires every
    /// missed period at once, with no CNP able to arrive in between, and a few periods of
    /// hyper increase undo any cut. At 1500 µs it is at least a slice on small hosts. A stall
    /// longer than that still leaves the QP idle for many periods: with `hold_when_idle`
    /// those periods, in which it sent nothing, do not count as increases.
    ///
    /// `dce_tcp_rtt` 1 → 5 µs: at the rates a software endpoint runs (hundreds of Mb/s, a
    /// flow's CNPs about 100 µs apart), α decaying every microsecond forgets a mark long before
    /// the next one, stays near 0, and each cut takes a fraction of a percent: DCQCN's
    /// multiplicative decrease, which drives flows to equal rates, is all but gone (two flows
    /// on a 200 Mb/s bottleneck split 161/43 Mb/s). At 5 µs they share it within a few percent
    /// and one flow still fills it; α remembering longer cuts too deep (at 20 µs one flow
    /// filled two thirds, at the paper's 55 µs two flows three quarters).
    ///
    /// `loss_backoff`: the peers of a software endpoint (Linux Soft-RoCE, another VM) and the
    /// paths to them (a tap, a software bridge) mark nothing, so DCQCN alone never slows a
    /// READ burst into a slow receiver; with it, the perftest matrix against Soft-RoCE lost
    /// no frame at the guest's tap (docs/cc-software.md, "Why `loss_backoff`"). Towards a
    /// path that marks, DCQCN converges before anything is lost and it does nothing.
    #[must_use]
    pub fn software() -> Self {
        Self {
            rpg_time_reset: 1500,
            dce_tcp_rtt: 5,
            hold_when_idle: true,
            loss_backoff: true,
            ..Self::default()
        }
    }
}

/// Mb/s to bits/s.
pub(crate) const fn mbps(v: u32) -> u64 {
    v as u64 * 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_connectx5_dump_and_valid() {
        let c = DcqcnConfig::default();
        c.validate().unwrap();
        assert_eq!(c.get("rpg_time_reset"), Some(300));
        assert_eq!(c.get("rpg_byte_reset"), Some(32767));
        assert_eq!(c.get("rpg_threshold"), Some(1));
        assert_eq!(c.get("rpg_ai_rate"), Some(5));
        assert_eq!(c.get("rpg_hai_rate"), Some(50));
        assert_eq!(c.get("rpg_gd"), Some(11));
        assert_eq!(c.get("rpg_min_dec_fac"), Some(50));
        assert_eq!(c.get("rpg_min_rate"), Some(1));
        assert_eq!(c.get("rate_to_set_on_first_cnp"), Some(0));
        assert_eq!(c.get("dce_tcp_g"), Some(1019));
        assert_eq!(c.get("initial_alpha_value"), Some(1023));
        assert_eq!(c.get("rate_reduce_monitor_period"), Some(4));
        assert_eq!(c.get("min_time_between_cnps"), Some(2));
        assert_eq!(c.get("cnp_dscp"), Some(48));
        assert_eq!(c.get("nope"), None);
    }

    #[test]
    fn profiles_by_name_differ_only_in_the_documented_timers() {
        assert_eq!(DcqcnConfig::profile("mlx5"), Some(DcqcnConfig::default()));
        assert_eq!(DcqcnConfig::profile("nope"), None);
        let sw = DcqcnConfig::profile("software").unwrap();
        sw.validate().unwrap();
        let mlx5 = DcqcnConfig::default();
        let differ: Vec<_> = DcqcnConfig::NAMES
            .iter()
            .filter(|n| sw.get(n) != mlx5.get(n))
            .map(|n| (*n, sw.get(n).unwrap()))
            .collect();
        assert_eq!(differ, [("rpg_time_reset", 1500), ("dce_tcp_rtt", 5)]);
        assert_eq!(
            (
                sw.rp_enabled,
                sw.np_enabled,
                sw.loss_backoff,
                sw.hold_when_idle
            ),
            (true, true, true, true)
        );
        assert!(!mlx5.hold_when_idle);
        // Still settable by the mlx5 names.
        let mut c = sw;
        c.set("rpg_time_reset", 500).unwrap();
        assert_eq!(c.rpg_time_reset, 500);
    }

    #[test]
    fn set_checks_ranges_and_names_the_parameter() {
        let mut c = DcqcnConfig::default();
        c.set("dce_tcp_g", 1000).unwrap();
        assert_eq!(c.dce_tcp_g, 1000);
        c.set("cnp_dscp", 26).unwrap();
        assert_eq!(c.cnp_dscp, 26);
        let e = c.set("dce_tcp_g", 1024).unwrap_err();
        assert_eq!(
            e.to_string(),
            "DCQCN parameter dce_tcp_g = 1024 is out of range (allowed 0..=1023 /1024)"
        );
        assert_eq!(c.set("cnp_dscp", 64).unwrap_err().max, 63);
        assert_eq!(c.set("rpg_min_dec_fac", 0).unwrap_err().min, 1);
        assert!(c.set("rpg_bogus", 1).is_err());
        // validate() catches fields set directly.
        c.rpg_threshold = 0;
        assert_eq!(c.validate().unwrap_err().name, "rpg_threshold");
        assert_eq!(DcqcnConfig::NAMES.len(), 15);
        assert_eq!(DcqcnConfig::NAMES[14], "cnp_dscp");
    }
}
