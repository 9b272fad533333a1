//! A real Linux Soft-RoCE (rdma_rxe) peer for the interop tests: a small Debian VM booted by the
//! rxe-peer scripts (`shared/rxe-peer/` beside the repository), whose eth0 is a tap in a network
//! namespace these helpers make and remove.
//!
//! The VM runs one command for its whole life: a tiny agent (see [`AGENT`]) that executes the
//! steps the host drops into a shared directory (`/share` in the guest, mounted over 9p), each in
//! the background, and writes back its output and exit status. So one boot (tens of seconds under
//! TCG) serves a whole matrix of ibv_rc_pingpong and perftest runs, the host can start a guest
//! server, run `roce` against it, then read rxe's hw_counters, all in one VM.
//!
//! Everything is owned by guards: [`Peer`] powers the VM off and deletes the namespace (only if
//! the scripts created it) on drop, [`Capture`] stops its tcpdump, and every process is ended by
//! its own PID, also when a test panics.
//!
//! The image is built on first use by `build-image.sh` into `$RXE_PEER_DIR` (default
//! `/tmp/rxe-peer`) and reused afterwards; [`ensure_image`] fails loudly (panics) when it cannot
//! be built, it never skips.

use std::{
    collections::BTreeMap,
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::OnceLock,
    thread,
    time::{Duration, Instant},
};

/// The directory holding the rxe-peer scripts: `$RXE_PEER_TOOLS`, else the first
/// `shared/rxe-peer` found next to the repository or one of its parents (in CI, a fresh clone
/// with `shared/` beside it).
///
/// # Panics
/// When the scripts cannot be found.
#[must_use]
pub fn tools_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RXE_PEER_TOOLS") {
        return PathBuf::from(d);
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    for dir in manifest.ancestors() {
        let cand = dir.join("shared/rxe-peer");
        if cand.join("start-peer.sh").exists() {
            return cand;
        }
    }
    panic!(
        "rxe-peer scripts not found: expected shared/rxe-peer beside the repository (searched the \
         parents of {}); set RXE_PEER_TOOLS",
        manifest.display()
    );
}

/// `$RXE_PEER_DIR`, default `/tmp/rxe-peer`: image cache and per-VM run directories.
#[must_use]
pub fn peer_dir() -> PathBuf {
    std::env::var_os("RXE_PEER_DIR").map_or_else(|| PathBuf::from("/tmp/rxe-peer"), PathBuf::from)
}

/// How long the image took to become available in this process (0 when it was cached), and
/// whether it was built now.
#[derive(Clone, Copy, Debug)]
pub struct ImageInfo {
    /// Seconds spent in `build-image.sh` (cache check or full build).
    pub secs: f64,
}

/// Builds the VM image if needed (idempotent; serialised across processes with `flock`).
///
/// # Panics
/// When the image cannot be built: the interop tests must fail loudly, never skip.
pub fn ensure_image() -> ImageInfo {
    static IMAGE: OnceLock<ImageInfo> = OnceLock::new();
    *IMAGE.get_or_init(|| {
        let dir = peer_dir();
        fs::create_dir_all(&dir).expect("create RXE_PEER_DIR");
        let t = Instant::now();
        let log = dir.join("build-image.log");
        let out = Command::new("flock")
            .arg(dir.join("build.lock"))
            .arg(tools_dir().join("build-image.sh"))
            .output()
            .expect("run build-image.sh");
        let _ = fs::write(&log, [&out.stdout[..], &out.stderr[..]].concat());
        assert!(
            out.status.success(),
            "the rxe-peer image could not be built (interop tests cannot run without it); \
             build-image.sh said:\n{}",
            tail(&String::from_utf8_lossy(&out.stderr), 40)
        );
        ImageInfo {
            secs: t.elapsed().as_secs_f64(),
        }
    })
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The guest side of the step protocol, run as the VM's command. Step `N` is `/share/step-N.cmd`
/// (written by the host with a rename, so it is complete when it appears); its output goes to
/// `step-N.out`, its PID to `step-N.pid`, and its exit status to `step-N.rc` (also renamed into
/// place). A step whose text is `exit` ends the agent.
pub const AGENT: &str = r#"#!/bin/bash
n=0
while :; do
    f=/share/step-$n.cmd
    while [ ! -e "$f" ]; do sleep 0.05; done
    c=$(cat "$f")
    [ "$c" = exit ] && break
    ( bash -c "$c" >/share/step-$n.out 2>&1 </dev/null; echo $? >/share/step-$n.rc.tmp; mv /share/step-$n.rc.tmp /share/step-$n.rc ) &
    echo $! >/share/step-$n.pid
    n=$((n+1))
done
wait
"#;

/// The guest's `-smp` (start-peer.sh `--cpus`, passed to qemu as it is): one vCPU, but room
/// for two. Under TCG, qemu translates a guest with `maxcpus` 1 without `CF_PARALLEL`
/// (`tcg_cpu_init_cflags(cpu, max_cpus > 1)`): the guest's memory barriers (`mfence`, the
/// `lock addl` of the kernel's `smp_mb`) are then left out and its locked instructions are
/// plain loads and stores. The guest has one vCPU, but virtio-net runs in qemu's main thread
/// beside it, and the virtio ring's notification handshake needs that barrier: the guest
/// writes its avail index and then reads the device's avail_event; qemu writes avail_event,
/// fences, then reads the avail index. Without the guest's fence the x86 host may let its read
/// pass its write, both sides miss the other, and the guest's kick is lost. The transmit queue
/// then stays full for good: "NETDEV WATCHDOG: eth0: transmit queue 0 timed out", rxe's
/// requests stuck with their skbs, perftest unkillable. Seen in this sandbox in 1 of about 70
/// runs of 64 KiB `ib_read_bw -q 4` between two guests, with qemu's monitor showing the
/// transmit ring's avail index 238 entries past what qemu had read and avail_event equal to
/// the used index. `maxcpus=2` makes qemu translate with barriers and atomics.
pub const GUEST_SMP: &str = "1,maxcpus=2";

/// How to boot a peer.
#[derive(Clone, Debug)]
pub struct PeerOptions {
    /// Netdev MTU of the guest's eth0 and of the tap (9000 gives rxe path MTU 4096).
    pub mtu: u32,
    /// Keep IPv6 on (guest and namespace), for IPv6 GIDs.
    pub ipv6: bool,
    /// Guest memory in MB.
    pub mem_mb: u32,
    /// Power the VM off after this many seconds at the latest: a safety net for a test process
    /// killed before its `Drop` stops the VM, so it must outlast the longest test on a slow CI
    /// machine (the first `interop_pingpong.rs` test passed 900 s there once, and its VM went
    /// away under it). A step waited for after that fails at once, saying so.
    pub timeout_secs: u32,
}

impl Default for PeerOptions {
    fn default() -> Self {
        Self {
            mtu: 1500,
            ipv6: false,
            mem_mb: 512,
            timeout_secs: 2400,
        }
    }
}

/// A booted rxe VM on a tap in its own namespace, running the step agent.
#[derive(Debug)]
pub struct Peer {
    /// VM name (run directory `$RXE_PEER_DIR/run/NAME`).
    pub name: String,
    /// The namespace the tap lives in (also where our endpoint runs).
    pub netns: String,
    /// The VM's tap in `netns`, a port of `bridge` (captures are taken here: it sees every
    /// frame to and from the guest, which a tap carrying our AF_XDP traffic directly would not:
    /// XDP-redirected receives and AF_XDP transmits bypass packet sockets).
    pub tap: String,
    /// The bridge joining the tap and our veth.
    pub bridge: String,
    /// Our endpoint's interface: one end of a veth pair whose other end (`vb<tag>`) is a port
    /// of `bridge`. It holds `host_ip`.
    pub ifname: String,
    /// The host side's IPv4 address (on the tap).
    pub host_ip: Ipv4Addr,
    /// The guest's IPv4 address.
    pub guest_ip: Ipv4Addr,
    /// The guest's ready file (`RXE_GID_INDEX`, `RXE_GID`, `RXE_MAC`, `RXE_KERNEL`...).
    pub ready: BTreeMap<String, String>,
    /// The host directory mounted at /share in the guest.
    pub share: PathBuf,
    /// Seconds from launch until rxe0 was up.
    pub boot_secs: f64,
    /// The namespace is this peer's to delete on drop ([`Peer::boot_beside`]'s is not).
    owns_netns: bool,
    next: std::cell::Cell<usize>,
    stopped: std::cell::Cell<bool>,
}

/// The result of a finished guest step.
#[derive(Clone, Debug)]
pub struct StepOut {
    /// Exit status.
    pub rc: i32,
    /// stdout and stderr, interleaved.
    pub out: String,
}

/// A guest step started with [`Peer::spawn`].
#[derive(Debug)]
pub struct Step {
    base: PathBuf,
    /// The VM's run directory: `qemu.pid` there exists exactly while the VM runs (start-peer.sh
    /// removes it when qemu exits).
    run: PathBuf,
    /// The command line, for messages.
    pub cmd: String,
}

impl Step {
    /// Whether the step has exited.
    #[must_use]
    pub fn done(&self) -> bool {
        self.base.with_extension("rc").exists()
    }

    /// Output so far.
    #[must_use]
    pub fn output(&self) -> String {
        fs::read(self.base.with_extension("out"))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Whether the VM is gone (powered off by its `--timeout`, crashed or stopped): then no step
    /// will ever finish, and waiting for one is pointless.
    #[must_use]
    pub fn vm_gone(&self) -> bool {
        !self.run.join("qemu.pid").exists()
    }

    /// Waits for the step to exit, at most `timeout`; `None` on timeout, or as soon as the VM is
    /// gone ([`Self::vm_gone`]).
    #[must_use]
    pub fn wait_timeout(&self, timeout: Duration) -> Option<StepOut> {
        let deadline = Instant::now() + timeout;
        let rc = self.base.with_extension("rc");
        loop {
            if let Ok(s) = fs::read_to_string(&rc)
                && let Ok(code) = s.trim().parse()
            {
                return Some(StepOut {
                    rc: code,
                    out: self.output(),
                });
            }
            if Instant::now() >= deadline || self.vm_gone() {
                return None;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Why a step did not finish, for a failure message: the VM's end (with its console's last
    /// lines) when it is gone, else the time waited.
    fn why_unfinished(&self, timeout: Duration) -> String {
        if self.vm_gone() {
            let console = fs::read_to_string(self.run.join("console.log")).unwrap_or_default();
            format!(
                "did not finish: the VM is gone (powered off by its --timeout, see \
                 PeerOptions::timeout_secs, or crashed); console:\n{}\noutput so far",
                tail(&console, 15)
            )
        } else {
            format!("did not finish within {timeout:?}; output so far")
        }
    }

    /// Waits for the step to exit.
    ///
    /// # Panics
    /// After `timeout`, with the output so far.
    #[must_use]
    pub fn wait(&self, timeout: Duration) -> StepOut {
        self.wait_timeout(timeout).unwrap_or_else(|| {
            panic!(
                "guest step `{}` {}:\n{}",
                self.cmd,
                self.why_unfinished(timeout),
                self.output()
            )
        })
    }

    /// The guest PID of the step's shell (for a later `kill` step).
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(s) = fs::read_to_string(self.base.with_extension("pid"))
                && let Ok(p) = s.trim().parse()
            {
                return Some(p);
            }
            thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

/// The tap name start-peer.sh would pick (`rxt` + the guest IP in hex).
fn tap_for(ip: Ipv4Addr) -> String {
    let o = ip.octets();
    format!("rxt{:02x}{:02x}{:02x}{:02x}", o[0], o[1], o[2], o[3])
}

impl Peer {
    /// Boots a peer: namespace `rxi<tag>` holding bridge `br<tag>` with the VM's tap and one end
    /// of a veth pair as ports; the other end, `ve<tag>`, is ours, with 10.79.`subnet`.1 (and
    /// fd79:`subnet`::1 with `ipv6`); the guest is .2 (`::2`). Returns once rxe0 is up and the
    /// agent runs.
    ///
    /// # Panics
    /// When the image cannot be built or the VM does not come up (with its console output).
    #[must_use]
    pub fn boot(tag: &str, subnet: u8, opts: &PeerOptions) -> Self {
        let name = format!("rxi{tag}");
        let host_ip = Ipv4Addr::new(10, 79, subnet, 1);
        let guest_ip = Ipv4Addr::new(10, 79, subnet, 2);
        let peer = Self::launch(
            name.clone(),
            name,
            format!("br{tag}"),
            format!("ve{tag}"),
            host_ip,
            guest_ip,
            true,
            opts,
        );
        let vb = format!("vb{tag}");
        let ip = |args: &[&str]| {
            let o = Command::new("ip")
                .args(["-n", &peer.netns])
                .args(args)
                .output()
                .expect("run ip");
            assert!(
                o.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        };
        // The namespace's kernel owns host_ip (on our veth) and, by default, answers ARP for it
        // on every interface, the bridge included: the guest then may learn the bridge's MAC
        // for host_ip, and rxe's frames land in the namespace's own UDP stack (ICMP port
        // unreachable) instead of reaching our veth. Answer only on the interface that holds
        // the address.
        let o = Command::new("ip")
            .args(["netns", "exec", &peer.netns, "sysctl", "-q", "-w"])
            .args([
                "net.ipv4.conf.all.arp_ignore=1",
                "net.ipv4.conf.default.arp_ignore=1",
            ])
            .output()
            .expect("sysctl");
        assert!(
            o.status.success(),
            "arp_ignore: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let mtu = opts.mtu.to_string();
        ip(&[
            "link",
            "add",
            &peer.ifname,
            "mtu",
            &mtu,
            "type",
            "veth",
            "peer",
            "name",
            &vb,
            "mtu",
            &mtu,
        ]);
        ip(&["link", "set", &vb, "master", &peer.bridge, "up"]);
        ip(&["addr", "add", &format!("{host_ip}/24"), "dev", &peer.ifname]);
        if opts.ipv6 {
            ip(&[
                "addr",
                "add",
                &format!("fd79:{subnet}::1/64"),
                "dev",
                &peer.ifname,
                "nodad",
            ]);
            let o = peer.exec(
                &format!("ip addr add fd79:{subnet}::2/64 dev eth0 nodad && sleep 1 && cat /sys/class/infiniband/rxe0/ports/1/gids/* | grep -n fd79"),
                Duration::from_secs(30),
            );
            assert_eq!(o.rc, 0, "guest IPv6 address / GID: {}", o.out);
        }
        ip(&["link", "set", &peer.ifname, "up"]);
        peer
    }

    /// Boots a second rxe VM on `first`'s bridge, guest address .3 of its subnet, for rxe ↔ rxe
    /// references measured in the same run as the scenarios against `first` (see
    /// [`rxe_pair`]). It shares `first`'s namespace and leaves it alone on drop (`first` owns
    /// it), so drop it before `first`. `host_ip` and `ifname` are `first`'s: this VM has no veth
    /// of ours.
    ///
    /// # Panics
    /// As [`Peer::boot`].
    #[must_use]
    pub fn boot_beside(first: &Self, opts: &PeerOptions) -> Self {
        let o = first.guest_ip.octets();
        Self::launch(
            format!("{}b", first.name),
            first.netns.clone(),
            first.bridge.clone(),
            first.ifname.clone(),
            first.host_ip,
            Ipv4Addr::new(o[0], o[1], o[2], 3),
            false,
            opts,
        )
    }

    /// Starts the VM (start-peer.sh in the background, the agent as its command) on `bridge` in
    /// `netns` and waits until rxe0 is up. `owns_netns`: the namespace is this peer's to delete
    /// on drop (start-peer.sh creates it when it is missing, and stop-peer.sh deletes only
    /// namespaces it created). The bridge gets no address from here.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        name: String,
        netns: String,
        bridge: String,
        ifname: String,
        host_ip: Ipv4Addr,
        guest_ip: Ipv4Addr,
        owns_netns: bool,
        opts: &PeerOptions,
    ) -> Self {
        ensure_image();
        let tap = tap_for(guest_ip);
        let share = peer_dir().join("share").join(&name);
        let _ = fs::remove_dir_all(&share);
        fs::create_dir_all(&share).expect("share dir");
        fs::write(share.join("agent.sh"), AGENT).expect("write agent");
        let mut cmd = Command::new(tools_dir().join("start-peer.sh"));
        cmd.args([
            "--bg", "-q", "--name", &name, "--bridge", &bridge, "--share",
        ])
        .arg(&share)
        .args(["--mtu", &opts.mtu.to_string()])
        .args(["--mem", &opts.mem_mb.to_string()])
        .args(["--cpus", GUEST_SMP])
        .args(["--timeout", &opts.timeout_secs.to_string()])
        .args(["--bg-timeout", "300"]);
        if opts.ipv6 {
            cmd.arg("--ipv6");
        }
        // On a loaded host the guest kernel's check that the 8254 timer reaches the IO-APIC can
        // fail under TCG, and the guest then sleeps forever before init (seen here: console
        // stuck at "..MP-BIOS bug: 8254 timer not connected to IO-APIC", boot timeout).
        // `possible_cpus=1`: the guest stays a one-CPU machine although qemu has room for two
        // ([`GUEST_SMP`]); with two possible CPUs its kernel marks the TSC unstable ("TSCs
        // unsynchronized"), takes HPET as clocksource, and perftest's clock calibration fails
        // ("Correlation coefficient r^2 < 0.9", no report).
        if std::env::var_os("RXE_PEER_KERNEL_ARGS").is_none() {
            cmd.env("RXE_PEER_KERNEL_ARGS", "no_timer_check possible_cpus=1");
        }
        cmd.args([
            &netns,
            "-",
            &guest_ip.to_string(),
            "--",
            "bash",
            "/share/agent.sh",
        ]);
        let t = Instant::now();
        // Built before the VM starts, so that a failed boot is still cleaned up by Drop.
        let mut peer = Self {
            name,
            netns,
            tap,
            bridge,
            ifname,
            host_ip,
            guest_ip,
            ready: BTreeMap::new(),
            share,
            boot_secs: 0.0,
            owns_netns,
            next: std::cell::Cell::new(0),
            stopped: std::cell::Cell::new(false),
        };
        let out = cmd.output().expect("run start-peer.sh");
        peer.boot_secs = t.elapsed().as_secs_f64();
        let console = fs::read_to_string(peer.run_dir().join("console.log")).unwrap_or_default();
        assert!(
            out.status.success(),
            "rxe peer {} did not come up ({}):\n{}\n{}\nconsole:\n{}",
            peer.name,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            tail(&console, 30)
        );
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some((k, v)) = line.split_once('=') {
                peer.ready.insert(k.trim().to_owned(), v.trim().to_owned());
            }
        }
        assert!(
            peer.ready.contains_key("RXE_GID_INDEX"),
            "no ready file from {}: {:?}",
            peer.name,
            String::from_utf8_lossy(&out.stdout)
        );
        peer
    }

    /// `$RXE_PEER_DIR/run/NAME`.
    #[must_use]
    pub fn run_dir(&self) -> PathBuf {
        peer_dir().join("run").join(&self.name)
    }

    /// rxe's RoCE v2 GID index of the guest's IPv4 address.
    ///
    /// # Panics
    /// When the ready file lacks it.
    #[must_use]
    pub fn gid_index(&self) -> u32 {
        self.ready["RXE_GID_INDEX"].parse().expect("RXE_GID_INDEX")
    }

    /// Starts `cmd` (bash) in the guest, in the background; returns at once.
    #[must_use]
    pub fn spawn(&self, cmd: &str) -> Step {
        let n = self.next.get();
        self.next.set(n + 1);
        let base = self.share.join(format!("step-{n}.x"));
        let tmp = self.share.join(format!(".step-{n}.tmp"));
        fs::write(&tmp, cmd).expect("write step");
        fs::rename(&tmp, self.share.join(format!("step-{n}.cmd"))).expect("publish step");
        Step {
            base,
            run: self.run_dir(),
            cmd: cmd.to_owned(),
        }
    }

    /// Runs `cmd` in the guest and waits for it.
    ///
    /// # Panics
    /// After `timeout`.
    #[must_use]
    pub fn exec(&self, cmd: &str, timeout: Duration) -> StepOut {
        self.spawn(cmd).wait(timeout)
    }

    /// Waits until something in the guest listens on TCP `port` (from the guest's `ss` snapshot,
    /// refreshed every 0.2 s: never a probe connection, which would use up a server's accept).
    ///
    /// # Panics
    /// After `timeout`, or when the step exits first, with the step's output.
    pub fn wait_listen(&self, port: u16, step: &Step, timeout: Duration) {
        if let Err(e) = self.try_wait_listen(port, step, timeout) {
            panic!("{e}");
        }
    }

    /// [`Self::wait_listen`] that reports instead of panicking, so that a matrix can record
    /// one scenario's failure and go on.
    ///
    /// # Errors
    /// After `timeout`, or when the step exits first, with the step's output.
    pub fn try_wait_listen(&self, port: u16, step: &Step, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let needle = format!(":{port} ");
        while Instant::now() < deadline {
            let l = fs::read_to_string(self.run_dir().join("listen")).unwrap_or_default();
            if l.lines()
                .any(|x| x.starts_with("tcp") && x.contains(&needle))
            {
                return Ok(());
            }
            if step.done() {
                return Err(format!(
                    "guest `{}` exited before listening: {}",
                    step.cmd,
                    step.output()
                ));
            }
            thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "guest `{}` not listening on {port} after {timeout:?}: {}",
            step.cmd,
            step.output()
        ))
    }

    /// rxe's hw_counters of rxe0 port 1, read in the guest, plus the guest's own drop counters
    /// on the way out (`guest.eth0_tx_dropped`, `guest.qdisc_dropped`): rxe counts a packet in
    /// `sent_pkts` even when the guest's qdisc then drops it.
    ///
    /// # Panics
    /// When they cannot be read.
    #[must_use]
    pub fn hw_counters(&self) -> BTreeMap<String, u64> {
        let o = self.exec(
            "cd /sys/class/infiniband/rxe0/ports/1/hw_counters && for f in *; do echo \"$f $(cat $f)\"; done; \
             echo \"guest.eth0_tx_dropped $(cat /sys/class/net/eth0/statistics/tx_dropped)\"; \
             echo \"guest.qdisc_dropped $(tc -s qdisc show dev eth0 | grep -o 'dropped [0-9]*' | awk '{s+=$2} END {print s+0}')\"",
            Duration::from_secs(30),
        );
        assert_eq!(o.rc, 0, "hw_counters: {}", o.out);
        o.out
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_owned(), v.trim().parse().ok()?))
            })
            .collect()
    }

    /// Waits for `step` at most `timeout`; a step still running then is killed (its shell and
    /// the shell's children), and its output so far is returned with status -1.
    #[must_use]
    pub fn wait_or_kill(&self, step: &Step, timeout: Duration) -> StepOut {
        step.wait_timeout(timeout).unwrap_or_else(|| {
            if let Some(pid) = step.pid() {
                let _ = self
                    .spawn(&format!("pkill -P {pid}; kill {pid}"))
                    .wait_timeout(Duration::from_secs(10));
            }
            StepOut {
                rc: -1,
                out: format!(
                    "({}; killed) {}",
                    step.why_unfinished(timeout),
                    step.output()
                ),
            }
        })
    }

    /// Powers the VM off now (as if the peer's host died); the tap goes with it.
    pub fn kill_vm(&self) {
        let _ = Command::new(tools_dir().join("stop-peer.sh"))
            .arg(&self.name)
            .output();
        self.stopped.set(true);
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if !self.stopped.get() {
            let _ = Command::new(tools_dir().join("stop-peer.sh"))
                .arg(&self.name)
                .output();
        }
        // The VM's start-peer.sh removes the tap when qemu exits; give it a moment, then delete
        // the namespace (stop-peer.sh does so only if start-peer.sh created it).
        thread::sleep(Duration::from_millis(300));
        if self.owns_netns {
            let _ = Command::new(tools_dir().join("stop-peer.sh"))
                .args(["--netns", &self.netns])
                .output();
        }
        let _ = fs::remove_dir_all(&self.share);
    }
}

/// A tcpdump of an interface in a namespace, stopped (by its PID) on [`Capture::stop`] or drop.
#[derive(Debug)]
pub struct Capture {
    child: Option<Child>,
    /// tcpdump's stderr, gathered by a thread until it exits (its closing statistics).
    stderr: Option<thread::JoinHandle<String>>,
    /// The pcap file.
    pub path: PathBuf,
}

/// What a finished [`Capture`] holds.
#[derive(Clone, Debug)]
pub struct Captured {
    /// The pcap file.
    pub path: PathBuf,
    /// tcpdump's "N packets dropped by kernel" (`None` when tcpdump did not say).
    pub kernel_dropped: Option<u64>,
}

impl Capture {
    /// Starts capturing whole packets on `ifname` in `netns` into `path`; returns once tcpdump
    /// listens.
    ///
    /// `--immediate-mode` matters: without it libpcap reads the kernel's TPACKET_V3 ring one
    /// block at a time, a block is handed over only when full or after the 1 s block timeout,
    /// and tcpdump stopped by SIGINT never reads the current one. Measured here: 200 datagrams
    /// sent 0.3 s before the SIGINT, 0 to 4 of them in the file without it, all with it; a short
    /// scenario (ib_atomic_bw -q 1) had left an empty pcap in two matrix runs.
    ///
    /// # Panics
    /// When tcpdump cannot start.
    #[must_use]
    pub fn start(netns: &str, ifname: &str, path: &Path) -> Self {
        Self::start_filtered(netns, ifname, path, None)
    }

    /// [`Capture::start`] keeping only the frames that match the tcpdump (BPF) `filter`, e.g.
    /// [`crate::cm_trace::QP1_FILTER`] for a suite long enough that whole captures would be
    /// large.
    ///
    /// # Panics
    /// When tcpdump cannot start.
    #[must_use]
    pub fn start_filtered(netns: &str, ifname: &str, path: &Path, filter: Option<&str>) -> Self {
        if let Some(p) = path.parent() {
            fs::create_dir_all(p).expect("pcap dir");
        }
        let mut child = Command::new("ip")
            .args([
                "netns",
                "exec",
                netns,
                "tcpdump",
                "-i",
                ifname,
                "-s",
                "0",
                "-B",
                "65536",
                "--immediate-mode",
                "-U",
                "-w",
            ])
            .arg(path)
            .args(filter)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tcpdump");
        // tcpdump says "listening on ..." on stderr once the capture runs.
        let mut err = child.stderr.take().expect("tcpdump stderr");
        let mut buf = [0u8; 256];
        let n = std::io::Read::read(&mut err, &mut buf).unwrap_or(0);
        let first = String::from_utf8_lossy(&buf[..n]).into_owned();
        let stderr = thread::spawn(move || {
            let mut rest = String::new();
            let _ = std::io::Read::read_to_string(&mut err, &mut rest);
            first + &rest
        });
        Self {
            child: Some(child),
            stderr: Some(stderr),
            path: path.to_owned(),
        }
    }

    /// Stops the capture (SIGINT, so the last packets are flushed) and returns the file with
    /// tcpdump's own count of packets the kernel dropped before it could read them.
    #[must_use]
    pub fn stop(mut self) -> Captured {
        self.end();
        let text = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        Captured {
            path: self.path.clone(),
            kernel_dropped: text
                .lines()
                .find(|l| l.contains("dropped by kernel"))
                .and_then(|l| l.split_whitespace().next()?.parse().ok()),
        }
    }

    fn end(&mut self) {
        if let Some(mut c) = self.child.take() {
            thread::sleep(Duration::from_millis(300));
            let _ = Command::new("kill")
                .args(["-INT", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if matches!(c.try_wait(), Ok(Some(_))) {
                    return;
                }
                thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.end();
    }
}

/// What tshark makes of a capture.
#[derive(Clone, Debug, Default)]
pub struct Dissection {
    /// RoCE v2 packets (UDP 4791) by BTH opcode name.
    pub opcodes: BTreeMap<String, u64>,
    /// Number of RoCE packets.
    pub roce: u64,
    /// Expert-info lines of severity warning or error, and malformed packets, in the headers.
    pub problems: Vec<String>,
    /// Frames a payload-guessing dissector found "malformed" (test data is no upper-layer
    /// protocol; see [`is_payload_guess`]); counted, not failed.
    pub payload_guesses: u64,
    /// RoCE frames over IPv6 with UDP checksum 0 (illegal for IPv6, RFC 8200), by source.
    pub ipv6_zero_udp_csum: BTreeMap<String, u64>,
}

/// Dissects `pcap` with tshark (which decodes UDP 4791 as RoCE v2 by itself) and collects every
/// RoCE packet tshark marks malformed or with an expert item of severity warning or worse. (The
/// out-of-band TCP connection is left out: perftest and ibv_rc_pingpong close it with a RST
/// even between two rxe peers, see `samples/`.)
///
/// # Panics
/// When tshark cannot be run.
#[must_use]
pub fn dissect(pcap: &Path) -> Dissection {
    let mut d = Dissection::default();
    // The upper-layer dissectors that guess at InfiniBand payloads (RPC-over-RDMA, SMB
    // Direct, NVMe-oF, ...) misread test data: RPCoRDMA throws on every 1-byte SEND, rxe's own
    // included ("[Malformed Packet: RPCoRDMA]"). They are switched off; the InfiniBand
    // dissector itself stays on. tshark must succeed (a bad option fails the test). Its
    // EtherType guess cannot be switched off in tshark 4.0 (`--disable-heuristic`, the
    // heuristic_protos file and `--disable-protocol ethertype` have no effect on it): what it
    // throws is sorted out by `is_payload_guess`.
    let mut no_heur = Vec::new();
    for h in [
        "smc",
        "smb_direct",
        "rpcordma",
        "nvme-rdma",
        "lnet",
        "iser",
        "infiniband.eoib",
        "infiniband_sdp",
        "fcoib",
    ] {
        no_heur.extend(["--disable-protocol", h]);
    }
    let fields = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(pcap)
        .args([
            "-Y",
            "infiniband",
            "-T",
            "fields",
            "-e",
            "infiniband.bth.opcode",
        ])
        .output()
        .expect("run tshark");
    assert!(
        fields.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&fields.stderr)
    );
    for l in String::from_utf8_lossy(&fields.stdout).lines() {
        *d.opcodes.entry(l.trim().to_owned()).or_default() += 1;
        d.roce += 1;
    }
    let bad = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(pcap)
        .args(&no_heur)
        .args([
            "-Y",
            "udp.port == 4791 && (_ws.malformed || _ws.expert.severity >= 0x00600000) \
             && !(ipv6 && udp.checksum == 0 && !_ws.malformed)",
            "-T",
            "fields",
            "-E",
            "separator=|",
            "-E",
            "aggregator=^",
            "-e",
            "frame.number",
            "-e",
            "frame.protocols",
            "-e",
            "_ws.malformed",
            "-e",
            "_ws.expert.message",
            "-e",
            "_ws.col.Info",
        ])
        .output()
        .expect("run tshark");
    assert!(
        bad.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&bad.stderr)
    );
    // rxe sends UDP checksum 0 over IPv6 too (tshark: "Illegal checksum value (0)", an
    // error); those frames are counted by sender here, and the ICRC check covers their bytes.
    let zero = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(pcap)
        .args([
            "-Y",
            "ipv6 && udp.port == 4791 && udp.checksum == 0",
            "-T",
            "fields",
            "-e",
            "ipv6.src",
        ])
        .output()
        .expect("run tshark");
    for l in String::from_utf8_lossy(&zero.stdout).lines() {
        *d.ipv6_zero_udp_csum.entry(l.trim().to_owned()).or_default() += 1;
    }
    for l in String::from_utf8_lossy(&bad.stdout).lines() {
        let mut f = l.splitn(5, '|');
        let (_, protocols, malformed, messages) = (
            f.next(),
            f.next().unwrap_or(""),
            f.next().unwrap_or(""),
            f.next().unwrap_or(""),
        );
        if is_payload_guess(protocols, malformed, messages) {
            d.payload_guesses += 1;
        } else {
            d.problems.push(l.trim().to_owned());
        }
    }
    d
}

/// Whether tshark's complaint about one frame comes from a payload guesser misreading test
/// data rather than from the frame's headers. `protocols` is `frame.protocols`, `malformed`
/// the `_ws.malformed` items and `messages` the `_ws.expert.message`s, `^`-separated.
///
/// The InfiniBand dissector hands a payload to guessers, and one of them is not a heuristic
/// that can be switched off in tshark 4.0: when payload bytes 2..4 are zero it reads bytes
/// 0..2 as an EtherType and calls that protocol's dissector on the rest. A 2-byte SEND or
/// WRITE has exactly that shape (2 bytes of data, then the 2 pad bytes, which rxe and we send
/// as zero), so 139 of the 65,536 possible payloads throw in IPv4, PPP LCP, GMHDR, CRTP, ...
/// (`docs/interop.md`). An exception aborts the dissection of the layer it is thrown in, so
/// when the protocol chain goes past `infiniband` into such a layer, the Ethernet, IP, UDP and
/// InfiniBand headers were dissected to their end without one. A complaint is a payload guess
/// when that is the case, every expert item is a caught exception ("Malformed Packet
/// (Exception occurred)"), and none of them was caught in the outer InfiniBand dissector
/// (unless the guess itself went on into InfiniBand, as EtherType 0x8915 does). Anything
/// else (a truncated RETH, a bad UDP length, an IPv6 UDP checksum 0 of ours) is a header
/// problem.
#[must_use]
pub fn is_payload_guess(protocols: &str, malformed: &str, messages: &str) -> bool {
    let layers: Vec<&str> = protocols.split(':').collect();
    let Some(ib) = layers.iter().position(|l| *l == "infiniband") else {
        return false;
    };
    let guessed = &layers[ib + 1..];
    if guessed.iter().all(|l| *l == "data") {
        return false;
    }
    let labels: Vec<&str> = malformed
        .split('^')
        .filter(|m| m.starts_with("[Malformed Packet"))
        .collect();
    let ib_inside = guessed.contains(&"infiniband");
    !labels.is_empty()
        && messages
            .split('^')
            .all(|m| m == "Malformed Packet (Exception occurred)")
        && labels.iter().all(|m| {
            let proto = m
                .strip_prefix("[Malformed Packet: ")
                .and_then(|r| r.strip_suffix(']'))
                .unwrap_or("");
            !proto.is_empty() && (ib_inside || !["IB", "InfiniBand", "RRoCE"].contains(&proto))
        })
}

/// Every RoCE v2 frame (UDP 4791) of a classic pcap file (as tcpdump -w writes it), parsed by
/// the wire module: counts of frames with a good and a bad ICRC, and the frames that did not
/// parse at all.
#[derive(Clone, Debug, Default)]
pub struct IcrcCheck {
    /// RoCE frames whose ICRC matched.
    pub good: u64,
    /// RoCE frames whose ICRC did not match (index in the file, 1-based as tshark numbers).
    pub bad: Vec<usize>,
    /// Frames to UDP 4791 that did not parse, with the reason.
    pub unparsable: Vec<(usize, String)>,
}

/// Checks the ICRC of every RoCE frame in `pcap` (see [`IcrcCheck`]).
///
/// # Panics
/// When the file is not a pcap of Ethernet frames ([`crate::pcap::for_each_frame`]).
#[must_use]
pub fn check_icrc(pcap: &Path) -> IcrcCheck {
    let mut c = IcrcCheck::default();
    crate::pcap::for_each_frame(pcap, |idx, frame| match roce::wire::parse_frame(frame) {
        Ok(f) if f.icrc_ok => c.good += 1,
        Ok(_) => c.bad.push(idx),
        Err(roce::wire::WireError::NotRoce(_)) => {}
        Err(e) => c.unparsable.push((idx, e.to_string())),
    });
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rxe ↔ rxe sample captures: every one of their RoCE packets has a good ICRC.
    #[test]
    fn sample_captures_check_clean() {
        let dir = tools_dir().join("samples");
        let mut total = 0;
        for name in [
            "ibv_rc_pingpong-n10-s4096.pcap",
            "ib_send_bw-n10-s4096.pcap",
            "ib_write_bw-n10-s4096.pcap",
            "ib_read_bw-n10-s4096.pcap",
        ] {
            let c = check_icrc(&dir.join(name));
            assert!(c.bad.is_empty() && c.unparsable.is_empty(), "{name}: {c:?}");
            total += c.good;
        }
        assert_eq!(total, 250);
    }

    /// Frames as a classic little-endian pcap (what tcpdump -w writes).
    fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
        let mut b = Vec::new();
        for w in [0xa1b2_c3d4u32, 0x0004_0002, 0, 0, 65535, 1] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        for (i, f) in frames.iter().enumerate() {
            let len = u32::try_from(f.len()).unwrap();
            for w in [0, u32::try_from(i).unwrap(), len, len] {
                b.extend_from_slice(&w.to_le_bytes());
            }
            b.extend_from_slice(f);
        }
        fs::write(path, b).unwrap();
    }

    /// A 2-byte SEND Only (data `v`, 2 zero pad bytes), optionally with another opcode or UDP
    /// length written over the real ones.
    fn send2(v: u16, opcode: Option<u8>, udp_len: Option<u16>) -> Vec<u8> {
        let fr = crate::Frame {
            payload: 2,
            udp_len,
            psn: u32::from(v),
            ..crate::Frame::default()
        };
        let mut b = fr.build();
        let bth = fr.udp_offset() + 8;
        b[bth + 12..bth + 14].copy_from_slice(&v.to_be_bytes());
        if let Some(op) = opcode {
            b[bth] = op;
        }
        b
    }

    /// tshark's EtherType guess on 2-byte payloads (the cause of the "RC Send Only [Malformed
    /// Packet]" frames rxe sent in one CI run of `ib_send_bw -q 4 -s 2`): every one of the
    /// 65,536 payloads is either dissected cleanly or recognised as a guess, while header
    /// errors are still problems, also in a frame whose payload is guessed at too.
    #[test]
    fn payload_guesses_are_not_header_problems() {
        let dir = std::env::temp_dir().join(format!("roce-dissect-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let all = dir.join("send2.pcap");
        write_pcap(
            &all,
            &(0..=u16::MAX)
                .map(|v| send2(v, None, None))
                .collect::<Vec<_>>(),
        );
        let d = dissect(&all);
        assert_eq!(d.roce, 65_536);
        assert!(d.problems.is_empty(), "{:?}", d.problems);
        // 139 with tshark 4.0.17 (IPv4 0x0800, PPP LCP 0xc021, ...).
        assert!(d.payload_guesses > 100, "{}", d.payload_guesses);

        let bad = dir.join("headers.pcap");
        write_pcap(
            &bad,
            &[
                send2(0xe0ca, None, None),     // clean
                send2(0xe0ca, Some(10), None), // WRITE Only: RETH cut short
                send2(0xe0ca, Some(12), None), // READ request: RETH cut short
                send2(0xe0ca, None, Some(60)), // UDP length past the frame
                send2(0x0800, None, Some(60)), // the same, with an EtherType guess
                send2(0xc021, Some(10), None), // a RETH cut short, payload guessable
            ],
        );
        let d = dissect(&bad);
        let frames: Vec<&str> = d
            .problems
            .iter()
            .map(|p| p.split('|').next().unwrap())
            .collect();
        assert_eq!(frames, ["2", "3", "4", "5", "6"], "{:?}", d.problems);
        assert_eq!(d.payload_guesses, 0);
        let _ = fs::remove_dir_all(&dir);
    }
}

/// A `roce` process (`roce -j --netns NS ARGS...`), killed by its PID on drop.
#[derive(Debug)]
pub struct Roce {
    child: Option<Child>,
    /// The command line, for messages.
    pub what: String,
    /// `roce exec ...`: an unmodified program on the drop-in libibverbs, whose output is
    /// text, not JSON.
    exec: bool,
}

impl Roce {
    /// Starts `roce -j --netns NETNS ARGS...`.
    ///
    /// # Panics
    /// When the binary cannot be started.
    #[must_use]
    pub fn spawn(netns: &str, args: &[String]) -> Self {
        let child = Command::new(crate::roce_bin())
            .args(["-j", "--netns", netns])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn roce");
        Self {
            child: Some(child),
            what: format!("roce {}", args.join(" ")),
            exec: args.first().is_some_and(|a| a == "exec"),
        }
    }

    /// Waits at most `timeout` for the process to exit; returns its JSON output on success
    /// (`{"exec_stdout": TEXT}` for `roce exec`, whose program prints text), or a description
    /// of the failure (exit status, stdout, stderr; killed on timeout).
    ///
    /// # Errors
    /// The failure, as text.
    pub fn wait(mut self, timeout: Duration) -> Result<serde_json::Value, String> {
        let mut c = self.child.take().expect("child");
        let deadline = Instant::now() + timeout;
        let mut timed_out = false;
        loop {
            if matches!(c.try_wait(), Ok(Some(_))) {
                break;
            }
            if Instant::now() >= deadline {
                let _ = c.kill();
                timed_out = true;
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let o = c.wait_with_output().map_err(|e| e.to_string())?;
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        if timed_out {
            return Err(format!(
                "{}: killed after {timeout:?}; stdout {out} stderr {err}",
                self.what
            ));
        }
        if !o.status.success() {
            return Err(format!(
                "{}: {}; stdout {out} stderr {}",
                self.what,
                o.status,
                tail(&err, 10)
            ));
        }
        if self.exec {
            return Ok(serde_json::json!({ "exec_stdout": out }));
        }
        serde_json::from_str(out.trim()).map_err(|e| format!("{}: bad JSON {e}: {out}", self.what))
    }

    /// Kills the process (SIGKILL: it gets no chance to flush its QPs or say goodbye, as when
    /// a host dies) and waits for it.
    pub fn kill_hard(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Roce {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits until something in `netns` listens on TCP `port`.
///
/// # Panics
/// After `timeout`.
pub fn wait_host_listen(netns: &str, port: u16, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let needle = format!(":{port} ");
    while Instant::now() < deadline {
        let o = Command::new("ip")
            .args(["netns", "exec", netns, "ss", "-Hltn"])
            .output()
            .expect("ss");
        if String::from_utf8_lossy(&o.stdout)
            .lines()
            .any(|l| l.contains(&needle))
        {
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
    panic!("nothing listens on TCP {port} in {netns} after {timeout:?}");
}

/// roce_xdp attached to an interface for a whole test (so its counters outlive each endpoint
/// process); detached on drop.
#[derive(Debug)]
pub struct Xdp(String);

impl Xdp {
    /// Loads roce_xdp on `ifname` in `netns`.
    ///
    /// # Panics
    /// When it cannot be loaded.
    #[must_use]
    pub fn load(netns: &str, ifname: &str, mode: roce::loader::AttachMode) -> Self {
        let (n, i) = (netns.to_owned(), ifname.to_owned());
        let opts = roce::loader::LoadOptions {
            netns: Some(n.clone()),
            mode,
            ..roce::loader::LoadOptions::default()
        };
        roce::netns::in_netns(&n, move || roce::loader::load(&i, &opts))
            .expect("enter netns")
            .expect("load roce_xdp");
        Self(ifname.to_owned())
    }

    /// `roce stats -j -i IFACE`.
    ///
    /// # Panics
    /// When it fails.
    #[must_use]
    pub fn stats(&self) -> serde_json::Value {
        let o = Command::new(crate::roce_bin())
            .args(["stats", "-j", "-i", &self.0])
            .output()
            .expect("roce stats");
        serde_json::from_slice(&o.stdout).expect("roce stats JSON")
    }
}

impl Drop for Xdp {
    fn drop(&mut self) {
        let _ = roce::loader::unload(&self.0);
    }
}

/// The first result line of a perftest bandwidth test (`#bytes #iterations BW peak BW average
/// MsgRate`): (bytes, iterations, peak MB/s, average MB/s, Mpps).
#[must_use]
pub fn perftest_bw_line(out: &str) -> Option<(u64, u64, f64, f64, f64)> {
    let mut lines = out.lines();
    lines.find(|l| l.contains("#bytes"))?;
    let f: Vec<&str> = lines.next()?.split_whitespace().collect();
    Some((
        f.first()?.parse().ok()?,
        f.get(1)?.parse().ok()?,
        f.get(2)?.parse().ok()?,
        f.get(3)?.parse().ok()?,
        f.get(4)?.parse().ok()?,
    ))
}

/// ibv_rc_pingpong's summary: (iterations, µs per iteration) from `N iters in S seconds = U
/// usec/iter`.
#[must_use]
pub fn pingpong_summary(out: &str) -> Option<(u64, f64)> {
    let l = out.lines().find(|l| l.contains("usec/iter"))?;
    let f: Vec<&str> = l.split_whitespace().collect();
    Some((f.first()?.parse().ok()?, f.get(f.len() - 2)?.parse().ok()?))
}

/// Who listens in a scenario.
#[derive(Clone, Debug)]
pub enum Roles {
    /// The guest tool is the server; `roce` connects to it.
    GuestServer {
        /// The tool's command line in the guest (bash; `$RXE_GID_INDEX` is set).
        guest: String,
        /// `roce` arguments (after `-j --netns NS`), the guest's address included.
        ours: Vec<String>,
    },
    /// `roce` is the server; the guest tool connects to it.
    OurServer {
        /// `roce` arguments.
        ours: Vec<String>,
        /// The tool's command line in the guest, the host's address included.
        guest: String,
    },
}

/// What one scenario showed.
#[derive(Debug)]
pub struct SceneReport {
    /// Its name (also the pcap's file name).
    pub name: String,
    /// `roce`'s JSON output, or why it failed.
    pub ours: Result<serde_json::Value, String>,
    /// The guest tool's exit status and output.
    pub guest: StepOut,
    /// tshark's view of the capture.
    pub pcap: Dissection,
    /// The ICRC of every RoCE frame in the capture.
    pub icrc: IcrcCheck,
    /// Deltas of rxe's hw_counters over the scenario.
    pub rxe: BTreeMap<String, i64>,
    /// Deltas of our transport counters (`roce stats -j`, section `transport`).
    pub ours_ctr: BTreeMap<String, i64>,
    /// Deltas of every other counter on our side that moved: `xdp.*`, `device.*`, and the
    /// kernel's counters of the links on the path (`link.<ifname>.*`); and the scenario's own
    /// endpoint process's AF_XDP counters, `xsk_q<N>.*` (each process counts from zero).
    pub other: BTreeMap<String, i64>,
    /// Packets lost on the way, each counted by some kernel or XDP counter (see
    /// [`SceneReport::other`]); zero on a clean run.
    pub counted_drops: i64,
    /// Every check that failed; empty when the scenario passed.
    pub failures: Vec<String>,
    /// Seconds the scenario took, setup included.
    pub secs: f64,
}

impl SceneReport {
    /// Whether every check passed.
    #[must_use]
    pub fn ok(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Runs scenarios against one peer: each with a capture on the tap, counters read before and
/// after on both sides, and the checks that make traffic "clean".
#[derive(Debug)]
pub struct Harness<'a> {
    /// The peer.
    pub peer: &'a Peer,
    /// roce_xdp on the tap.
    pub xdp: Xdp,
    /// Where the pcaps go.
    pub pcap_dir: PathBuf,
    /// Give up on one run after this long.
    pub timeout: Duration,
    /// Skip the capture (for long bulk runs).
    pub capture: bool,
}

fn delta(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, i64> {
    after
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                *v as i64 - before.get(k).copied().unwrap_or(0) as i64,
            )
        })
        .collect()
}

/// Every counter of `roce stats -j` but the transport section, as `section.name`.
fn others(v: &serde_json::Value) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    if let Some(o) = v.as_object() {
        for (sec, vals) in o {
            if sec == "transport" || sec.starts_with("qp_") {
                continue;
            }
            if let Some(vals) = vals.as_object() {
                for (k, x) in vals {
                    if let Some(x) = x.as_u64() {
                        m.insert(format!("{sec}.{k}"), x);
                    }
                }
            }
        }
    }
    m
}

/// The drop counters (`ip -s`) of `links` in `netns`, as `link.<ifname>.<counter>`.
fn link_drops(netns: &str, links: &[&str]) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for l in links {
        let o = Command::new("ip")
            .args(["-n", netns, "-s", "-j", "link", "show", l])
            .output();
        let Ok(o) = o else { continue };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&o.stdout) else {
            continue;
        };
        for dir in ["rx", "tx"] {
            for k in ["dropped", "errors", "packets"] {
                if let Some(x) = v[0]["stats64"][dir][k].as_u64() {
                    m.insert(format!("link.{l}.{dir}_{k}"), x);
                }
            }
        }
    }
    m
}

fn transport(v: &serde_json::Value) -> BTreeMap<String, u64> {
    v["transport"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                .collect()
        })
        .unwrap_or_default()
}

impl<'a> Harness<'a> {
    /// Loads roce_xdp (native mode) on the peer's veth and keeps it there for the harness's
    /// life.
    #[must_use]
    pub fn new(peer: &'a Peer, pcap_dir: &Path) -> Self {
        Self::with_mode(peer, pcap_dir, roce::loader::AttachMode::Native)
    }

    /// [`Harness::new`] with an attach mode: generic (skb) XDP for links above the ~3500-byte
    /// MTU that native XDP on a veth accepts.
    #[must_use]
    pub fn with_mode(peer: &'a Peer, pcap_dir: &Path, mode: roce::loader::AttachMode) -> Self {
        fs::create_dir_all(pcap_dir).expect("pcap dir");
        Self {
            peer,
            xdp: Xdp::load(&peer.netns, &peer.ifname, mode),
            pcap_dir: pcap_dir.to_owned(),
            timeout: Duration::from_secs(120),
            capture: true,
        }
    }

    /// Runs one scenario with the given roles and TCP port (the servers listen on `port`).
    pub fn run(&self, name: &str, roles: &Roles, port: u16) -> SceneReport {
        let t = Instant::now();
        let rxe0 = self.peer.hw_counters();
        let s0 = self.xdp.stats();
        let ours0 = transport(&s0);
        let vb = format!("vb{}", &self.peer.ifname[2..]);
        let links = [
            self.peer.tap.as_str(),
            self.peer.ifname.as_str(),
            vb.as_str(),
        ];
        let mut other0 = others(&s0);
        // A queue's AF_XDP counters are the current process's own (`ROCE_XSK_STATS` holds one
        // record per queue, which each endpoint process overwrites from zero): every scenario
        // runs a new `roce`, so its counters are what it leaves there, not a difference.
        other0.retain(|k, _| !k.starts_with("xsk_q"));
        other0.extend(link_drops(&self.peer.netns, &links));
        let cap = self.capture.then(|| {
            Capture::start(
                &self.peer.netns,
                &self.peer.tap,
                &self.pcap_dir.join(format!("{name}.pcap")),
            )
        });
        let (ours, guest) = match roles {
            Roles::GuestServer { guest, ours } => {
                let step = self.peer.spawn(guest);
                let listening = self
                    .peer
                    .try_wait_listen(port, &step, Duration::from_secs(60));
                let o = match &listening {
                    Ok(()) => Roce::spawn(&self.peer.netns, ours).wait(self.timeout),
                    Err(e) => Err(format!("not started: {e}")),
                };
                // A stuck guest server (for example waiting for a peer that failed) is ended so
                // that the next scenario gets the port.
                let g = self.peer.wait_or_kill(&step, Duration::from_secs(30));
                (o, g)
            }
            Roles::OurServer { ours, guest } => {
                let server = Roce::spawn(&self.peer.netns, ours);
                wait_host_listen(&self.peer.netns, port, Duration::from_secs(30));
                let step = self.peer.spawn(guest);
                let g = step.wait_timeout(self.timeout).unwrap_or_else(|| StepOut {
                    rc: -1,
                    out: format!("({}) {}", step.why_unfinished(self.timeout), step.output()),
                });
                (server.wait(Duration::from_secs(30)), g)
            }
        };
        let captured = cap.map(Capture::stop);
        let pcap_path = captured.as_ref().map(|c| c.path.clone());
        let rxe = delta(&self.peer.hw_counters(), &rxe0);
        let s1 = self.xdp.stats();
        let ours_ctr = delta(&transport(&s1), &ours0);
        let mut other1 = others(&s1);
        other1.extend(link_drops(&self.peer.netns, &links));
        let mut other = delta(&other1, &other0);
        other.retain(|_, v| *v != 0);
        let counted_drops: i64 = other
            .iter()
            .filter(|(k, _)| {
                k.contains("drop")
                    || k.contains("fallback")
                    || k.contains("invalid")
                    || k.contains("oversize")
                    // A frame for a QP the program had already destroyed (its last ACKs and
                    // retransmissions while it tears its QPs down), counted by the transport.
                    || k.ends_with("rx_unknown_qp")
                    || (k.starts_with("xdp.pass_") && !k.ends_with("not_roce"))
            })
            .map(|(_, v)| *v)
            .sum::<i64>()
            + rxe
                .iter()
                .filter(|(k, _)| k.starts_with("guest."))
                .map(|(_, v)| *v)
                .sum::<i64>();
        let (pcap, icrc) = pcap_path.as_ref().map_or_else(
            || (Dissection::default(), IcrcCheck::default()),
            |p| (dissect(p), check_icrc(p)),
        );
        let mut failures = Vec::new();
        if let Err(e) = &ours {
            failures.push(format!("roce: {e}"));
        }
        if guest.rc != 0 {
            failures.push(format!(
                "guest tool exit {}: {}",
                guest.rc,
                tail(&guest.out, 15)
            ));
        }
        let get = |m: &BTreeMap<String, i64>, k: &str| m.get(k).copied().unwrap_or(0);
        // Every packet one side sent is received by the other, or counted as dropped on the
        // way (the tap's queue towards the guest, our veth or AF_XDP rings): a loss no counter
        // explains is a failure.
        let lost = (get(&ours_ctr, "sent_pkts") - get(&rxe, "rcvd_pkts"))
            + (get(&rxe, "sent_pkts") - get(&ours_ctr, "rcvd_pkts"));
        if lost < 0 || lost > counted_drops {
            failures.push(format!(
                "counters: we sent {} packets, rxe received {}; rxe sent {}, we received {}; drops counted on the path: {other:?}",
                get(&ours_ctr, "sent_pkts"),
                get(&rxe, "rcvd_pkts"),
                get(&rxe, "sent_pkts"),
                get(&ours_ctr, "rcvd_pkts")
            ));
        }
        // Retransmissions (duplicate_request at the receiver, completer_retry_err at the
        // sender) are not errors: under TCG on a loaded host either side's 67 ms ACK timeout
        // fires now and then, and rxe also retransmits when a stale retransmit timer fires with
        // a packet outstanding. They are reported, and the receiver must have counted each one.
        // Sequence errors and give-ups are failures.
        // A sequence NAK is the right answer to a lost packet: it fails the scenario only when
        // no drop was counted on the path.
        let seq_ok = counted_drops > 0;
        // So is one after an RNR NAK: the responder's expected PSN stays at the NAKed request
        // (IBA 9.7.5.2.8), the requests already in flight behind it arrive out of sequence, and
        // rxe answers the first of them with a PSN sequence NAK (rxe_resp.c `check_psn`: no
        // `sent_psn_nak` is set by an RNR NAK). Each RNR NAK a side sent explains at most one
        // out-of-sequence request there, and each one a side received at most one sequence NAK.
        let rnr_explains = |m: &BTreeMap<String, i64>, k: &str| match k {
            "out_of_seq_request" => get(m, "send_rnr_err"),
            "rcvd_seq_err" => get(m, "rcvd_rnr_err"),
            _ => 0,
        };
        for k in [
            "out_of_seq_request",
            "rcvd_seq_err",
            "retry_exceeded_err",
            "retry_rnr_exceeded_err",
            "send_err",
        ] {
            if seq_ok && (k == "out_of_seq_request" || k == "rcvd_seq_err") {
                continue;
            }
            if get(&rxe, k) > rnr_explains(&rxe, k) {
                failures.push(format!("rxe {k} = {}", get(&rxe, k)));
            }
            if get(&ours_ctr, k) > rnr_explains(&ours_ctr, k) {
                failures.push(format!("our {k} = {}", get(&ours_ctr, k)));
            }
        }
        if let Some(captured) = &captured {
            // The tap sees every frame either side sent, but for those dropped before it (our
            // veth and XDP, the guest's qdisc: all in `counted_drops`) and those tcpdump says
            // the kernel dropped before it could read them; and never more than was sent.
            let on_wire = (icrc.good + icrc.bad.len() as u64) as i64;
            let sent = get(&ours_ctr, "sent_pkts") + get(&rxe, "sent_pkts");
            let unread = captured.kernel_dropped.unwrap_or(0) as i64;
            if on_wire > sent {
                failures.push(format!(
                    "pcap holds {on_wire} RoCE packets, the two sides sent only {sent}"
                ));
            }
            if on_wire + counted_drops + unread < sent {
                failures.push(format!(
                    "pcap holds {on_wire} RoCE packets of the {sent} sent ({counted_drops} \
                     counted as dropped on the path, {unread} dropped by the kernel before \
                     tcpdump read them)"
                ));
            }
            if captured.kernel_dropped.is_none() {
                failures.push("tcpdump did not report its statistics".into());
            }
            if !icrc.bad.is_empty() || !icrc.unparsable.is_empty() {
                failures.push(format!(
                    "pcap: bad ICRC in frames {:?}, unparsable {:?}",
                    icrc.bad, icrc.unparsable
                ));
            }
            let ours6: Vec<&String> = pcap
                .ipv6_zero_udp_csum
                .keys()
                .filter(|a| a.starts_with("fd79:") && a.ends_with("::1"))
                .collect();
            if !ours6.is_empty() {
                failures.push(format!(
                    "we sent IPv6 RoCE frames with UDP checksum 0: {ours6:?}"
                ));
            }
            if !pcap.problems.is_empty() {
                failures.push(format!("tshark: {:?}", pcap.problems));
            }
        }
        SceneReport {
            name: name.to_owned(),
            ours,
            guest,
            pcap,
            icrc,
            rxe,
            ours_ctr,
            other,
            counted_drops,
            failures,
            secs: t.elapsed().as_secs_f64(),
        }
    }
}

/// Where the interop tests put their pcaps and matrix: `$ROCE_INTEROP_OUT`, else
/// `target/interop` of this workspace.
#[must_use]
pub fn out_dir() -> PathBuf {
    std::env::var_os("ROCE_INTEROP_OUT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/interop"),
        PathBuf::from,
    )
}

/// Whether the full matrix was asked for (`ROCE_INTEROP_FULL=1`).
#[must_use]
pub fn full() -> bool {
    std::env::var("ROCE_INTEROP_FULL").is_ok_and(|v| v == "1")
}

impl Peer {
    /// rxe's RoCE v2 GID index of `addr` (an IPv6 address on the guest's eth0), waiting up to
    /// `timeout` for rxe to add it.
    ///
    /// # Panics
    /// When rxe has no such GID.
    #[must_use]
    pub fn gid_index_of(&self, addr: std::net::Ipv6Addr, timeout: Duration) -> u32 {
        let seg = addr.segments();
        let want: Vec<String> = seg.iter().map(|s| format!("{s:04x}")).collect();
        let want = want.join(":");
        let o = self.exec(
            &format!(
                "p=/sys/class/infiniband/rxe0/ports/1; for t in $(seq {}); do for g in $p/gids/*; do i=${{g##*/}}; \
                 if [ \"$(cat $g 2>/dev/null)\" = {want} ] && [ \"$(cat $p/gid_attrs/types/$i 2>/dev/null)\" = 'RoCE v2' ]; then echo $i; exit 0; fi; done; sleep 0.5; done; exit 1",
                timeout.as_secs() * 2
            ),
            timeout + Duration::from_secs(10),
        );
        assert_eq!(o.rc, 0, "rxe has no RoCE v2 GID for {addr}: {}", o.out);
        o.out.trim().parse().expect("GID index")
    }

    /// Our GID index for `ip` on `ifname` (`roce gids -j`).
    ///
    /// # Panics
    /// When there is none.
    #[must_use]
    pub fn our_gid_index(&self, ip: std::net::IpAddr) -> usize {
        let o = Command::new(crate::roce_bin())
            .args(["-j", "--netns", &self.netns, "gids", "-i", &self.ifname])
            .output()
            .expect("roce gids");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("roce gids JSON");
        v.as_array()
            .and_then(|a| {
                a.iter()
                    .find(|g| g["ip"].as_str() == Some(&ip.to_string()))
                    .and_then(|g| g["index"].as_u64())
            })
            .unwrap_or_else(|| panic!("no GID for {ip} on {}: {v}", self.ifname)) as usize
    }
}

/// A perftest command line for the guest: `tool` (`ib_write_bw`, `ib_send_lat`, ...) on rxe0
/// with the guest's RoCE v2 GID index (`$RXE_GID_INDEX`), `-F` (no warning about the TCG
/// guest's CPU frequency), out-of-band TCP `port`, path MTU 1024, then `args` (size,
/// iterations, QPs; a client adds the server's address last).
#[must_use]
pub fn perftest_cmd(tool: &str, port: u16, args: &str) -> String {
    format!("{tool} -d rxe0 -x $RXE_GID_INDEX -F -p {port} -m 1024 {args}")
}

/// An ibv_rc_pingpong command line for the guest: rxe0 with the guest's RoCE v2 GID index,
/// out-of-band TCP `port`, `size` bytes, `iters` round trips, path MTU `mtu` (a client adds the
/// server's address after it).
#[must_use]
pub fn pingpong_cmd(port: u16, size: u32, iters: u32, mtu: u32) -> String {
    tool_pingpong_cmd("ibv_rc_pingpong", port, size, iters, mtu)
}

/// [`pingpong_cmd`] for another ibverbs-utils pingpong `tool` with the same options
/// (`ibv_uc_pingpong`, ...).
#[must_use]
pub fn tool_pingpong_cmd(tool: &str, port: u16, size: u32, iters: u32, mtu: u32) -> String {
    format!("{tool} -d rxe0 -g $RXE_GID_INDEX -p {port} -s {size} -n {iters} -m {mtu}")
}

/// One rxe ↔ rxe run, the reference a scenario against roce-xdp is compared with: `cmd` (bash,
/// in the guest; as a server it must listen on TCP `port`) on `server`, then the same `cmd`
/// followed by the server guest's address on `client` (one of the two a VM from
/// [`Peer::boot_beside`]). Call it after the scenarios it is a reference for, once the second
/// VM is up; both tools read `$RXE_GID_INDEX` of their own guest. Returns the client's
/// output ([`rxe_pair_both`] for the server's as well).
///
/// # Errors
/// When the server does not listen within 60 s, or either side fails or runs past `timeout`
/// (then it is killed), with both outputs.
pub fn rxe_pair(
    server: &Peer,
    client: &Peer,
    cmd: &str,
    port: u16,
    timeout: Duration,
) -> Result<StepOut, String> {
    rxe_pair_both(server, client, cmd, port, timeout).map(|(_, c)| c)
}

/// [`rxe_pair`], returning the server's output and the client's, for a reference that reads
/// the result of the guest in a given role (perftest prints a bandwidth line on both sides).
///
/// # Errors
/// As [`rxe_pair`].
pub fn rxe_pair_both(
    server: &Peer,
    client: &Peer,
    cmd: &str,
    port: u16,
    timeout: Duration,
) -> Result<(StepOut, StepOut), String> {
    let s = server.spawn(cmd);
    if let Err(e) = server.try_wait_listen(port, &s, Duration::from_secs(60)) {
        let _ = server.wait_or_kill(&s, Duration::ZERO);
        return Err(e);
    }
    let c = client.spawn(&format!("{cmd} {}", server.guest_ip));
    let c = client.wait_or_kill(&c, timeout);
    let s = server.wait_or_kill(&s, Duration::from_secs(30));
    if c.rc != 0 || s.rc != 0 {
        return Err(format!(
            "rxe ↔ rxe `{cmd}`: client exit {}: {}\nserver exit {}: {}",
            c.rc,
            tail(&c.out, 10),
            s.rc,
            tail(&s.out, 10)
        ));
    }
    Ok((s, c))
}

/// Checks that the rxe ↔ rxe references could be measured. A reference is a measurement of
/// rxe, not of roce-xdp: one that failed twice (rxe ↔ rxe runs hang now and then under TCG,
/// e.g. `ib_send_bw -q 4 -s 64K` once in 26) is shown as failed in the results and does not
/// fail the test; a `group` (a tool, a path MTU) without a single measured reference means
/// the reference set-up itself is broken, and does. Call it last, after the results are
/// written.
///
/// # Panics
/// When some group has no reference that succeeded.
pub fn assert_references<K: std::fmt::Debug, V>(
    refs: &BTreeMap<K, Result<V, String>>,
    group: impl Fn(&K) -> String,
) {
    let mut ok: BTreeMap<String, usize> = BTreeMap::new();
    for (k, v) in refs {
        *ok.entry(group(k)).or_default() += usize::from(v.is_ok());
    }
    let bad: Vec<String> = refs
        .iter()
        .filter(|(k, _)| ok[&group(k)] == 0)
        .filter_map(|(k, v)| v.as_ref().err().map(|e| format!("{k:?}: {e}")))
        .collect();
    assert!(
        bad.is_empty(),
        "no rxe ↔ rxe reference could be measured for {:?}:\n{}",
        ok.iter()
            .filter(|(_, n)| **n == 0)
            .map(|(g, _)| g)
            .collect::<Vec<_>>(),
        bad.join("\n")
    );
}

/// Runs `f` (one rxe ↔ rxe reference) up to twice: a TCG guest stalls now and then, and one
/// failed run says little about rxe.
///
/// # Errors
/// The second failure, with the first.
pub fn twice<T>(mut f: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    f().or_else(|first| f().map_err(|second| format!("{second} (and before: {first})")))
}
