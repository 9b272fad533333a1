//! Running Debian's rdmacm-utils and perftest on the drop-in librdmacm at both ends of a veth
//! pair (`roce exec`), as tests/tests/rdmacm.rs and tests/tests/dump.rs do, and the check of
//! perftest's results table, of rping's `-v` lines and of `roce pingpong -R`'s summary that
//! tests/tests/interop_rdmacm.rs uses too.

use std::time::Duration;

use roce::netns::{VethEnd, VethPair};

use crate::output_text as text;

/// Runs `prog args` on end `end` through `roce exec`, line-buffered.
#[must_use]
pub fn ours(end: &VethEnd, prog: &str, args: &[String]) -> crate::child::Reaper {
    exec_in(&end.netns, &end.ifname, &[], prog, args)
}

/// Runs `roce exec EXEC_FLAGS -d IFNAME -- stdbuf -oL prog args` in namespace `netns`
/// (line-buffered, for the rdmacm-utils' progress lines); `exec_flags` e.g.
/// `["--engine", "shared"]`.
#[must_use]
pub fn exec_in(
    netns: &str,
    ifname: &str,
    exec_flags: &[&str],
    prog: &str,
    args: &[String],
) -> crate::child::Reaper {
    let mut v: Vec<String> = vec!["exec".into()];
    v.extend(exec_flags.iter().map(|f| (*f).to_owned()));
    v.extend(["-d", ifname, "--", "stdbuf", "-oL", prog].map(String::from));
    v.extend(args.iter().cloned());
    crate::child::spawn(netns, &v)
}

/// Runs a server on end A and its client on end B; the client is run again while the server
/// is not listening yet (the connect is rejected, or the REQ times out), at most 30 times.
/// Returns (client, server) after checking both succeeded.
///
/// # Panics
/// When either fails or outlives its 90 s limit.
pub fn server_and_client(
    pair: &VethPair,
    prog: &str,
    server: &[String],
    client: &[String],
) -> (String, String) {
    servers_client(pair, (prog, server), (prog, client))
}

/// [`server_and_client`] for a server and a client that are different programs (rdma_server
/// and rdma_client), each given as (program, arguments).
///
/// # Panics
/// As [`server_and_client`].
pub fn servers_client(
    pair: &VethPair,
    server: (&str, &[String]),
    client: (&str, &[String]),
) -> (String, String) {
    servers_client_on((&pair.a, server), (&pair.b, client))
}

/// [`servers_client`] between any two ends (the server's, the client's), e.g. the two ends
/// of a routed topology ([`crate::routed::Impaired`]). A program named `roce` is roce itself
/// (`roce -j --netns NS args...`, e.g. `roce pingpong -R`), not a program on the library.
///
/// # Panics
/// As [`server_and_client`].
pub fn servers_client_on(
    (server_end, (prog, server)): (&VethEnd, (&str, &[String])),
    (client_end, (client_prog, client)): (&VethEnd, (&str, &[String])),
) -> (String, String) {
    spawned_pair(
        (prog, start(server_end, prog, server)),
        (client_prog, &|| start(client_end, client_prog, client)),
    )
}

/// [`servers_client_on`] for any server and client, each named and started by the caller (the
/// client by `client`, as often as it must be): e.g. `roce perf -R` ([`roce_perf`]) against
/// perftest on the library ([`ours`]).
///
/// # Panics
/// As [`server_and_client`].
pub fn spawned_pair(
    (prog, s): (&str, crate::child::Reaper),
    (client_prog, client): (&str, &dyn Fn() -> crate::child::Reaper),
) -> (String, String) {
    let limit = Duration::from_secs(90);
    let mut attempts = 0;
    let c = loop {
        attempts += 1;
        std::thread::sleep(Duration::from_millis(500));
        let c = crate::child::finish_within(client(), limit, &format!("{client_prog} client"));
        let out = text(&c);
        let early = out.contains("REJECTED")
            || out.contains("UNREACHABLE")
            || out.contains("Unable to Connect")
            || out.contains("Failed to connect")
            || out.contains("Connection refused")
            || out.contains("nobody listens there");
        if c.status.success() || !early || attempts >= 30 {
            break c;
        }
    };
    let ct = text(&c);
    let s = crate::child::finish_within(
        s,
        limit,
        &format!(
            "{prog} server (its client exited with {}, printing:\n{ct})",
            c.status
        ),
    );
    let st = text(&s);
    assert!(
        c.status.success() && s.status.success(),
        "{prog} client ({}):\n{ct}\n{prog} server ({}):\n{st}",
        c.status,
        s.status
    );
    (ct, st)
}

/// Runs `prog args` on `end`: through `roce exec` ([`ours`]), or, for `prog` `roce`, roce
/// itself with JSON output.
fn start(end: &VethEnd, prog: &str, args: &[String]) -> crate::child::Reaper {
    if prog == "roce" {
        crate::child::spawn(&end.netns, args)
    } else {
        ours(end, prog, args)
    }
}

/// Checks rping's `-v` lines in `out` (`ping data: ...` at the client, `server ping data:
/// ...` at the server): exactly `count` of them, ping `n` being `rdma-ping-<n>: ` and a run
/// of consecutive letters of `A`..`z` (wrapping) that starts one letter later each ping, the
/// whole `size - 1` characters (rping's buffer of `size` bytes ends in its NUL).
///
/// # Errors
/// What is wrong, with `who` and the output.
pub fn check_ping_lines(who: &str, out: &str, count: usize, size: usize) -> Result<(), String> {
    let lines: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once("ping data: ").map(|(_, d)| d))
        .collect();
    if lines.len() != count {
        return Err(format!("{who}: {} pings, not {count}:\n{out}", lines.len()));
    }
    for (n, l) in lines.iter().enumerate() {
        let head = format!("rdma-ping-{n}: ");
        let run = l.strip_prefix(&head).unwrap_or_default().as_bytes();
        let first = b'A' + (n % 58) as u8;
        let letters = run.first() == Some(&first)
            && run
                .windows(2)
                .all(|w| w[1] == if w[0] == b'z' { b'A' } else { w[0] + 1 });
        if l.len() != size - 1 || !letters {
            return Err(format!("{who}: ping {n} is not rping's: {l:?}\n{out}"));
        }
    }
    Ok(())
}

/// Checks the JSON summary of `roce pingpong -R -c` in `out`: the `role` (`client` or
/// `server`) served or sent `iters` pings of `size` bytes, every one checked, with latencies
/// above zero.
///
/// # Errors
/// What is wrong, with `who` and the output.
pub fn check_pingpong_summary(
    who: &str,
    out: &str,
    role: &str,
    iters: u64,
    size: u64,
) -> Result<(), String> {
    let v = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v.get("role").is_some())
        .ok_or_else(|| format!("{who}: no summary:\n{out}"))?;
    let ok = v["role"] == role
        && v["iters"] == iters
        && v["size"] == size
        && v["checked"] == true
        && v["latency_us"]["p50"].as_f64().is_some_and(|p| p > 0.0);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{who}: not {iters} checked pings of {size} bytes as the {role}: {v}\n{out}"
        ))
    }
}

/// Owned arguments from string slices.
#[must_use]
pub fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}

/// Checks perftest's results table in `out`: the row of `size` bytes reports `iters`
/// iterations and an average bandwidth and message rate above zero (not the peak: the
/// receiving side of `ib_send_bw` measures no peak and prints 0.00).
///
/// # Errors
/// A message with `who` and the whole output when the table is not there or not right.
pub fn check_bw_row(who: &str, out: &str, size: u32, iters: u32) -> Result<(), String> {
    if !out.contains("Data ex. method : rdma_cm") {
        return Err(format!("{who} did not exchange through rdma_cm:\n{out}"));
    }
    let row = out
        .lines()
        .map(str::split_whitespace)
        .map(Iterator::collect::<Vec<_>>)
        .find(|w| w.len() >= 5 && w[0] == size.to_string())
        .ok_or_else(|| format!("{who}: no result row for {size} bytes:\n{out}"))?;
    if row[1] != iters.to_string() {
        return Err(format!("{who}: {} iterations, not {iters}:\n{out}", row[1]));
    }
    let bw = |i: usize| row[i].parse::<f64>().unwrap_or(0.0);
    if bw(3) <= 0.0 || bw(4) <= 0.0 {
        return Err(format!("{who}: no bandwidth in {row:?}:\n{out}"));
    }
    Ok(())
}

/// `roce perf -R`'s operations and the perftest tool each meets, for the suites that run them
/// against each other (rdmacm.rs on the library, interop_rdmacm.rs against rxe).
pub const PERF_R_TOOLS: [(&str, &str); 3] = [
    ("write", "ib_write_bw"),
    ("read", "ib_read_bw"),
    ("send", "ib_send_bw"),
];

/// Runs `roce -j perf ARGS` on end `end` (in its namespace, on its interface's own device).
#[must_use]
pub fn roce_perf(end: &VethEnd, args: &[String]) -> crate::child::Reaper {
    roce_perf_in(&end.netns, args)
}

/// Runs `roce -j --netns NETNS perf ARGS` (the arguments name the interface).
#[must_use]
pub fn roce_perf_in(netns: &str, args: &[String]) -> crate::child::Reaper {
    let mut v = vec!["perf".to_owned()];
    v.extend(args.iter().cloned());
    crate::child::spawn(netns, &v)
}

/// Checks the JSON report of a `roce -j perf -R` run in `out`: it connected through RDMA CM,
/// shows `msgs` messages of `size` bytes and a bandwidth above zero, and its data checked
/// out (`verified` true; null when run with --no-verify, as against perftest, whose buffers
/// hold random bytes).
///
/// # Errors
/// A message with `who` and the whole output when the report is not there or not right.
pub fn check_perf_report(
    who: &str,
    out: &str,
    (size, msgs): (u32, u64),
    verify: bool,
) -> Result<(), String> {
    let v = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v.get("bw_mb_per_sec").is_some())
        .ok_or_else(|| format!("{who}: no JSON report:\n{out}"))?;
    let bad = |what: &str| Err(format!("{who}: {what} in {v}:\n{out}"));
    if v["rdma_cm"] != serde_json::Value::Bool(true) {
        return bad("not connected through RDMA CM");
    }
    if v["size"].as_u64() != Some(u64::from(size)) || v["messages"].as_u64() != Some(msgs) {
        return bad(&format!("not {msgs} messages of {size} bytes"));
    }
    if v["bw_mb_per_sec"].as_f64().unwrap_or(0.0) <= 0.0 {
        return bad("no bandwidth");
    }
    let want = if verify {
        serde_json::Value::Bool(true)
    } else {
        serde_json::Value::Null
    };
    if v["verified"] != want {
        return bad(&format!("verified is not {want}"));
    }
    Ok(())
}

/// The lines a running child prints, read as they come (its standard output, taken from it;
/// a thread drains it until the child exits).
pub struct Lines {
    rx: std::sync::mpsc::Receiver<String>,
    who: String,
    /// Everything read so far.
    pub seen: String,
}

impl Lines {
    /// Takes `r`'s standard output (`who` names it in errors).
    ///
    /// # Panics
    /// When its output was taken already.
    pub fn of(r: &mut crate::child::Reaper, who: &str) -> Self {
        use std::io::BufRead as _;
        let out = r.take_stdout().expect("the child's stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            rx,
            who: who.to_owned(),
            seen: String::new(),
        }
    }

    /// Waits for a line that contains `needle`, for at most `limit`, and stops waiting early
    /// when `give_up` says so (asked every 100 ms: e.g. the other end exited).
    ///
    /// # Errors
    /// When the output ends, `limit` passes or `give_up` is true first: what was read.
    pub fn wait_for(
        &mut self,
        needle: &str,
        limit: Duration,
        give_up: &mut dyn FnMut() -> bool,
    ) -> Result<(), String> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            match self.rx.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => {
                    self.seen += &line;
                    self.seen.push('\n');
                    if line.contains(needle) {
                        return Ok(());
                    }
                    continue;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(e) => return Err(self.missing(needle, &e.to_string())),
            }
            if give_up() {
                return Err(self.missing(needle, "gave up"));
            }
            if std::time::Instant::now() >= deadline {
                return Err(self.missing(needle, &format!("not within {limit:?}")));
            }
        }
    }

    fn missing(&self, needle: &str, why: &str) -> String {
        format!(
            "{}: no line with {needle:?} ({why}):\n{}",
            self.who, self.seen
        )
    }
}

/// The `{"error": ...}` line of a `roce -j` run that failed, from its output.
#[must_use]
pub fn json_error(out: &str) -> Option<String> {
    out.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| v.get("error")?.as_str().map(str::to_owned))
}
