//! `roce top` in a terminal, and the progress rule, over a veth pair in namespaces these tests
//! make. The terminal is a detached tmux session of a fixed size on a tmux server of the test's
//! own (`tmux -L`), killed at the end; its panes are read with `tmux capture-pane -p`. Root.

use std::{
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use roce_tests::{
    Loaded,
    child::{args, finish_within, json_ok, spawn, spawn_command},
    require_root, roce_bin, tag, veth_pair,
};

/// A tmux server of this test's own (its socket named after the test), holding one detached
/// session of a fixed size whose panes stay after their program exits, so that what a program
/// left on the screen and how it exited can be read. The session is killed on drop, which ends
/// the server; no other tmux server is touched.
struct Tmux {
    socket: String,
    session: String,
    /// The server's socket file, removed on drop.
    socket_path: PathBuf,
}

impl Tmux {
    /// A session `session` of `cols` x `rows`, its first window named `window` running
    /// `command` under `sh -c`.
    fn start(
        socket: &str,
        session: &str,
        (cols, rows): (u16, u16),
        window: &str,
        command: &str,
    ) -> Self {
        let mut t = Self {
            socket: socket.to_owned(),
            session: session.to_owned(),
            socket_path: PathBuf::new(),
        };
        // One tmux invocation: the option is set before the session (and its program) exists.
        let (c, r) = (cols.to_string(), rows.to_string());
        t.ok(&[
            "start-server",
            ";",
            "set-option",
            "-g",
            "remain-on-exit",
            "on",
            ";",
            "new-session",
            "-d",
            "-s",
            session,
            "-x",
            &c,
            "-y",
            &r,
            "-n",
            window,
            "sh",
            "-c",
            command,
        ]);
        t.socket_path = PathBuf::from(t.ok(&["display-message", "-p", "#{socket_path}"]).trim());
        t
    }

    /// Runs `tmux -L SOCKET -f /dev/null ARGS` and returns its stdout; fails the test when tmux
    /// does.
    #[track_caller]
    fn ok(&self, a: &[&str]) -> String {
        let o = Command::new("tmux")
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(a)
            .output()
            .expect("tmux (Debian package tmux; `cargo xtask setup` installs it)");
        assert!(
            o.status.success(),
            "tmux {a:?}: {:?}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn target(&self, window: &str) -> String {
        format!("{}:{window}", self.session)
    }

    fn new_window(&self, window: &str, command: &str) {
        self.ok(&[
            "new-window",
            "-d",
            "-t",
            &self.session,
            "-n",
            window,
            "sh",
            "-c",
            command,
        ]);
    }

    /// What the pane of `window` shows now.
    fn capture(&self, window: &str) -> String {
        self.ok(&["capture-pane", "-p", "-t", &self.target(window)])
    }

    /// A tmux format of the pane of `window` (`#{pane_dead}`, ...).
    fn format(&self, window: &str, f: &str) -> String {
        self.ok(&["display-message", "-p", "-t", &self.target(window), f])
            .trim()
            .to_owned()
    }

    fn keys(&self, window: &str, keys: &str) {
        self.ok(&["send-keys", "-t", &self.target(window), keys]);
    }

    /// Waits at most `limit` for the shell of `window` to end, and returns the exit status its
    /// command line wrote to `status` (tmux's own `#{pane_dead_status}` is sometimes left empty
    /// for a pane it marked dead, so the shell writes the status itself).
    #[track_caller]
    fn wait_exit(&self, window: &str, status: &Path, limit: Duration, what: &str) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let written = std::fs::read_to_string(status).unwrap_or_default();
            if self.format(window, "#{pane_dead}") == "1" && written.ends_with('\n') {
                return written.trim().to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "{what}: still running after {limit:?}; the pane shows:\n{}",
                self.capture(window)
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Captures the pane of `window` until `done` holds for it, for at most `limit`.
    #[track_caller]
    fn wait_for(
        &self,
        window: &str,
        limit: Duration,
        what: &str,
        done: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let screen = self.capture(window);
            if done(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {limit:?}; the pane shows:\n{screen}"
            );
            thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args([
                "-L",
                &self.socket,
                "-f",
                "/dev/null",
                "kill-session",
                "-t",
                &self.session,
            ])
            .output();
        if self.socket_path.is_absolute() {
            let _ = std::fs::remove_file(&self.socket_path);
        }
    }
}

/// A file removed on drop.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The cells of a table row as drawn (box-drawing borders dropped).
fn cells(line: &str) -> Vec<&str> {
    line.split(|c: char| c.is_whitespace() || c == '│')
        .filter(|s| !s.is_empty())
        .collect()
}

/// The rows of the QP table on a screen: lines whose first cells are `ifname` and a QPN.
fn qp_rows<'a>(screen: &'a str, ifname: &str) -> Vec<Vec<&'a str>> {
    screen
        .lines()
        .map(cells)
        .filter(|c| c.len() >= 12 && c[0] == ifname && c[1].starts_with("0x"))
        .collect()
}

/// The row of the interface table for `ifname`.
fn iface_row<'a>(screen: &'a str, ifname: &str) -> Option<Vec<&'a str>> {
    screen
        .lines()
        .map(cells)
        .find(|c| c.len() == 13 && c[0] == ifname)
}

fn sh_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// `roce top` in a 160x50 tmux pane in A's namespace while `roce perf write` runs from A to B on
/// two QPs: the interface row and both QP rows show non-zero packet rates, the QPs are in RTS
/// with a DCQCN rate, `>` moves the sort column, `q` quits with status 0 and leaves the
/// terminal as it found it (normal screen, canonical mode and echo back). The perf client runs
/// in a second tmux window, a terminal: there it shows its progress line by default. `roce -j
/// top --once` prints one JSON snapshot with the same rows.
#[test]
fn top_in_tmux_shows_rates_and_quits_clean() {
    require_root();
    let pair = veth_pair("tp", 221);
    let _l = Loaded::both(&pair);
    let (a, b) = (&pair.a.ifname, &pair.b.ifname);
    let roce = sh_quote(&roce_bin());
    let server = spawn(
        &pair.b.netns,
        &args(&format!("perf write -s 4096 -m 1024 -q 2 -D 20 -d {b}")),
    );
    let file = |what: &str| {
        let f = TempFile(std::env::temp_dir().join(format!("{}-{what}", tag("top"))));
        let _ = std::fs::remove_file(&f.0);
        f
    };
    let (stty, top_status, perf_status) = (file("stty"), file("top-exit"), file("perf-exit"));
    let name = tag("rtop");
    let tmux = Tmux::start(
        &name,
        &name,
        (160, 50),
        "perf",
        &format!(
            "{roce} --netns {} perf write -s 4096 -m 1024 -q 2 -D 20 -d {a} {}; echo $? > {}",
            pair.a.netns,
            pair.b.ipv4,
            sh_quote(&perf_status.0)
        ),
    );
    // The client is on a terminal: its progress line is there by default.
    let perf_screen = tmux.wait_for("perf", Duration::from_secs(20), "perf progress", |s| {
        s.contains("perf Write: ") && s.contains("WRs done")
    });
    assert_eq!(tmux.format("perf", "#{pane_dead}"), "0", "{perf_screen}");

    tmux.new_window(
        "top",
        &format!(
            "{roce} --netns {} top; s=$?; stty -a > {}; echo $s > {}",
            pair.a.netns,
            sh_quote(&stty.0),
            sh_quote(&top_status.0)
        ),
    );
    let screen = tmux.wait_for("top", Duration::from_secs(20), "rows with rates", |s| {
        let qps = qp_rows(s, a);
        qps.len() == 2
            && qps
                .iter()
                .all(|r| r[3] != "0" && r[4] != "0" && r[5] != "0")
            && iface_row(s, a).is_some_and(|r| r[1] != "0" && r[4] != "0")
    });
    eprintln!("roce top in tmux:\n{screen}");
    assert_eq!(tmux.format("top", "#{alternate_on}"), "1", "{screen}");
    assert!(
        screen.contains("roce top - 1 interface(s), 2 QP(s)"),
        "{screen}"
    );
    assert!(screen.contains("sorted by TX pkt/s"), "{screen}");
    assert!(screen.contains("XDP drops"), "{screen}");
    assert!(
        screen.contains(&format!("{a}: none")),
        "no XDP drops expected:\n{screen}"
    );
    assert!(
        !screen.contains(b.as_str()),
        "B is in another namespace:\n{screen}"
    );
    for r in qp_rows(&screen, a) {
        assert_eq!(r[2], "RTS", "{screen}");
        assert!(
            r[12].ends_with("bit/s") && r[12] != "0bit/s",
            "DCQCN rate: {screen}"
        );
        assert!(
            r[13].parse::<f64>().is_ok_and(|x| (0.0..=1.0).contains(&x)),
            "alpha: {screen}"
        );
    }
    let iface = iface_row(&screen, a).unwrap();
    assert_eq!(iface[12], "2", "{screen}");

    // One JSON snapshot for scripts, while the traffic goes on.
    let once = json_ok(
        &finish_within(
            spawn(&pair.a.netns, &args("top --once -d 0.5")),
            Duration::from_secs(20),
            "roce top --once",
        ),
        "roce top --once",
    );
    assert_eq!(once["interfaces"].as_array().unwrap().len(), 1, "{once}");
    assert_eq!(once["interfaces"][0]["ifname"], a.as_str(), "{once}");
    assert!(
        once["interfaces"][0]["rx_pps"].as_f64().unwrap() > 0.0,
        "{once}"
    );
    assert!(
        once["interfaces"][0]["tx_pps"].as_f64().unwrap() > 0.0,
        "{once}"
    );
    let qps = once["qps"].as_array().unwrap();
    assert_eq!(qps.len(), 2, "{once}");
    assert!(
        qps.iter().all(|q| q["tx_pps"].as_f64().unwrap() > 0.0),
        "{once}"
    );
    // This end WRITEs: each QP sends payload (at least a frame's worth a second).
    assert!(
        qps.iter()
            .all(|q| q["tx_bytes_per_sec"].as_f64().unwrap() > 1000.0),
        "{once}"
    );
    assert!(
        qps.iter().all(|q| q["rate_bps"].as_u64().unwrap() > 0),
        "{once}"
    );

    // `>` sorts by the next column.
    tmux.keys("top", ">");
    tmux.wait_for("top", Duration::from_secs(5), "sort by RX", |s| {
        s.contains("sorted by RX pkt/s")
    });

    // q quits: status 0, back on the normal screen, the terminal's modes restored.
    tmux.keys("top", "q");
    let status = tmux.wait_exit(
        "top",
        &top_status.0,
        Duration::from_secs(10),
        "roce top after q",
    );
    let after = tmux.capture("top");
    assert_eq!(status, "0", "{after}");
    assert_eq!(tmux.format("top", "#{alternate_on}"), "0", "{after}");
    assert!(
        !after.contains("QPN"),
        "the table is still on the screen:\n{after}"
    );
    let modes = std::fs::read_to_string(&stty.0).expect("stty -a after roce top");
    let flags = cells(&modes);
    for f in ["icanon", "echo", "isig", "icrnl", "opost"] {
        assert!(flags.contains(&f), "{f} not restored: {modes}");
    }

    // The traffic was clean: both ends verified their data.
    let status = tmux.wait_exit(
        "perf",
        &perf_status.0,
        Duration::from_secs(40),
        "perf client",
    );
    let perf_screen = tmux.capture("perf");
    assert_eq!(status, "0", "{perf_screen}");
    assert!(perf_screen.contains("BW average[MB/sec]"), "{perf_screen}");
    assert!(
        !perf_screen.contains("WRs done"),
        "progress line not erased:\n{perf_screen}"
    );
    let s = finish_within(server, Duration::from_secs(40), "perf server");
    let v = json_ok(&s, "perf server");
    assert_eq!(v["verified"], true, "{v}");
    // The server's output is piped and -j: no progress.
    let err = String::from_utf8_lossy(&s.stderr);
    assert!(
        !err.contains("progress") && !err.contains("perf server:"),
        "{err}"
    );
}

/// Output piped, no -j: `roce perf` prints its report and no progress (no line, no carriage
/// return); `--progress 1` forces plain progress lines onto the piped stderr, so the check
/// above can tell; `--no-progress` conflicts with `--progress`.
#[test]
fn piped_perf_shows_no_progress() {
    require_root();
    let pair = veth_pair("tq", 222);
    let _l = Loaded::both(&pair);
    let (a, b) = (&pair.a.ifname, &pair.b.ifname);
    let run = |extra: &str| {
        let server = spawn(
            &pair.b.netns,
            &args(&format!("perf write -s 4096 -m 1024 -D 3 -d {b}")),
        );
        let mut cmd = Command::new(roce_bin());
        cmd.args(["--netns", &pair.a.netns]).args(args(&format!(
            "perf write -s 4096 -m 1024 -D 3 -d {a} {extra} {}",
            pair.b.ipv4
        )));
        let c = finish_within(spawn_command(cmd), Duration::from_secs(60), "perf client");
        let s = finish_within(server, Duration::from_secs(60), "perf server");
        let v = json_ok(&s, "perf server");
        assert_eq!(v["verified"], true, "{v}");
        assert!(
            c.status.success(),
            "{}{}",
            String::from_utf8_lossy(&c.stdout),
            String::from_utf8_lossy(&c.stderr)
        );
        (
            String::from_utf8_lossy(&c.stdout).into_owned(),
            String::from_utf8_lossy(&c.stderr).into_owned(),
        )
    };
    let (out, err) = run("");
    assert!(
        out.contains("MB/s") || out.contains("BW"),
        "no report: {out}"
    );
    for text in [&out, &err] {
        assert!(!text.contains("WRs done"), "progress on a pipe: {text}");
        assert!(!text.contains('\r'), "a redrawn line on a pipe: {text:?}");
    }
    let (_, forced) = run("--progress 1");
    let lines = forced
        .lines()
        .filter(|l| l.starts_with("perf Write: ") && l.contains("WRs done"))
        .count();
    assert!(lines >= 2, "--progress 1 over 3 s: {forced}");
    assert!(!forced.contains('\r'), "{forced:?}");

    let o = Command::new(roce_bin())
        .args(args("perf write -d lo --progress 1 --no-progress"))
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
