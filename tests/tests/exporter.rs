//! `roce stats --listen`, the Prometheus exporter, over a veth pair in namespaces these tests
//! make: scraped over HTTP during and after verified `roce perf write` traffic, the page checked
//! by Prometheus' own `promtool check metrics` and its values against bpftool and
//! `roce stats -j`; the other paths and methods; SIGTERM; the errors. Root.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    process::{ChildStdout, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use roce::netns::{self, VethPair};
use roce_common::counters::{QpCounters, XdpStats};
use roce_tests::{
    Loaded,
    bpftool::{dump as bpftool, qp_totals, xdp_total},
    child::{Reaper, args, finish_within, json_ok, spawn},
    require_root, roce_bin, veth_pair,
};
use serde_json::Value;

fn veth(t: &str, subnet: u8) -> VethPair {
    require_root();
    veth_pair(t, subnet)
}

/// A running `roce -j --netns NS stats --listen 127.0.0.1:0 EXTRA...` and the address it
/// said it listens on. Killed (by its PID, through its [`Reaper`]) on drop.
struct Exporter {
    child: Reaper,
    addr: SocketAddr,
    ns: String,
    // Kept open so the exporter never writes to a closed pipe.
    _stdout: BufReader<ChildStdout>,
}

impl Exporter {
    fn start(ns: &str, extra: &[&str]) -> Self {
        Self::start_on(ns, "127.0.0.1:0", extra)
    }

    fn start_on(ns: &str, listen: &str, extra: &[&str]) -> Self {
        let mut a = args(&format!("stats --listen {listen}"));
        a.extend(extra.iter().map(|s| (*s).to_owned()));
        let mut child = spawn(ns, &a);
        let mut stdout = BufReader::new(child.take_stdout().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("exporter's first line");
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("exporter did not start ({e}): {line:?}"));
        let addr: SocketAddr = v["listen"]
            .as_str()
            .unwrap_or_else(|| panic!("no listen address: {v}"))
            .parse()
            .unwrap();
        assert_eq!(v["url"], format!("http://{addr}/metrics"), "{v}");
        Self {
            child,
            addr,
            ns: ns.to_owned(),
            _stdout: stdout,
        }
    }

    /// One HTTP/1.1 request from inside the exporter's namespace: (status, head, body).
    fn request(&self, method: &str, path: &str) -> (u16, String, String) {
        http(&self.ns, self.addr, method, path).expect("HTTP request")
    }

    /// `GET /metrics`, which must answer 200 in the exposition format.
    fn scrape(&self) -> String {
        let (status, head, body) = self.request("GET", "/metrics");
        assert_eq!(status, 200, "{head}\n{body}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4"),
            "{head}"
        );
        body
    }
}

/// A plain HTTP/1.1 request over a std TcpStream in namespace `ns`, `Connection: close`, read
/// to the end.
fn http(
    ns: &str,
    addr: SocketAddr,
    method: &str,
    path: &str,
) -> std::io::Result<(u16, String, String)> {
    let (m, p) = (method.to_owned(), path.to_owned());
    netns::in_netns(ns, move || -> std::io::Result<(u16, String, String)> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            s,
            "{m} {p} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)?;
        let text = String::from_utf8(buf).expect("UTF-8 answer");
        let (head, body) = text
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no end of headers: {text:?}"));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line: {head}"));
        Ok((status, head.to_owned(), body.to_owned()))
    })
    .expect("enter namespace")
}

/// Runs Prometheus' own checker on a page; fails the test with its findings (format errors and
/// lint problems alike).
#[track_caller]
fn promtool_ok(page: &str) {
    let mut c = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; `cargo xtask setup` installs it)");
    c.stdin.take().unwrap().write_all(page.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(
        o.status.success() && o.stdout.is_empty() && o.stderr.is_empty(),
        "promtool check metrics: {:?}\n{}{}\npage:\n{page}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The samples of `metric` on a page whose labels start with `labels`, keyed by their whole
/// label set.
fn samples(page: &str, metric: &str, labels: &str) -> BTreeMap<String, u64> {
    let prefix = format!("{metric}{{{labels}");
    page.lines()
        .filter(|l| l.starts_with(&prefix))
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (
                k.to_owned(),
                v.parse().unwrap_or_else(|_| panic!("bad value: {l}")),
            )
        })
        .collect()
}

/// The one sample of `metric{labels}` (all its labels given).
#[track_caller]
fn sample(page: &str, metric: &str, labels: &str) -> u64 {
    let s = samples(page, metric, &format!("{labels}}}"));
    assert_eq!(s.len(), 1, "{metric}{{{labels}}} in:\n{page}");
    s.into_values().next().unwrap()
}

/// An exporter in A's namespace, scraped over HTTP while `roce perf write` runs from A to B on
/// two QPs and again after it: every page passes `promtool check metrics`; during the traffic
/// each QP has its own series (`qpn` label) with packets counted, and the AF_XDP queue its
/// `queue` series; only A's interface is on the page (B's is in another namespace); after the
/// traffic the transport counters equal bpftool's dump of ROCE_QP_STATS and `roce stats -j`
/// exactly, and the XDP counters lie between two bpftool dumps taken around the scrape.
#[test]
fn metrics_during_traffic_pass_promtool_and_match_bpftool() {
    let pair = veth("px", 213);
    let _l = Loaded::on(&[&pair.a, &pair.b]);
    let (a, b) = (&pair.a.ifname, &pair.b.ifname);
    let exporter = Exporter::start(&pair.a.netns, &[]);

    let before = exporter.scrape();
    promtool_ok(&before);
    assert_eq!(
        sample(
            &before,
            "roce_transport_sent_pkts_total",
            &format!("ifname=\"{a}\"")
        ),
        0
    );

    let server = spawn(
        &pair.b.netns,
        &args(&format!("perf write -s 4096 -m 1024 -q 2 -D 3 -d {b}")),
    );
    let client = spawn(
        &pair.a.netns,
        &args(&format!(
            "perf write -s 4096 -m 1024 -q 2 -D 3 -d {a} {}",
            pair.b.ipv4
        )),
    );
    // Scrape until a page shows both QPs of the run sending, while the run goes on.
    let qp_sent = |page: &str| {
        samples(
            page,
            "roce_qp_sent_pkts_total",
            &format!("ifname=\"{a}\",qpn="),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let during = loop {
        let page = exporter.scrape();
        let qps = qp_sent(&page);
        if qps.len() == 2 && qps.values().all(|v| *v > 0) {
            break page;
        }
        assert!(
            Instant::now() < deadline,
            "no page with both QPs sending within 20 s; last:\n{page}"
        );
        thread::sleep(Duration::from_millis(100));
    };
    promtool_ok(&during);
    assert!(!during.contains(&format!("ifname=\"{b}\"")), "{during}");
    for metric in [
        "roce_qp_rate_bps",
        "roce_qp_target_bps",
        "roce_qp_alpha_1024",
    ] {
        assert!(
            during.contains(&format!("# TYPE {metric} gauge\n")),
            "{metric}: {during}"
        );
        assert_eq!(
            samples(&during, metric, &format!("ifname=\"{a}\",qpn=")).len(),
            2,
            "{metric}"
        );
    }
    // A QP's state and owner are labels of roce_qp_info, not of its counters.
    let info = samples(&during, "roce_qp_info", &format!("ifname=\"{a}\",qpn="));
    assert_eq!(info.len(), 2, "{during}");
    assert!(
        info.iter()
            .all(|(k, v)| *v == 1 && k.contains(",state=\"RTS\",owner=\"")),
        "{info:?}"
    );
    assert!(
        qp_sent(&during).keys().all(|k| !k.contains("state=")),
        "{during}"
    );
    let line_rate = samples(&during, "roce_qp_rate_bps", &format!("ifname=\"{a}\",qpn="));
    assert!(line_rate.values().all(|v| *v > 0), "{line_rate:?}");
    let xsk = samples(
        &during,
        "roce_xsk_tx_packets_total",
        &format!("ifname=\"{a}\",queue="),
    );
    assert!(
        !xsk.is_empty() && xsk.values().sum::<u64>() > 0,
        "{xsk:?}\n{during}"
    );
    // Every counter of the structs is there once, with the struct's help text.
    for (name, help) in QpCounters::NAMES.iter().zip(QpCounters::HELP) {
        let m = format!("roce_transport_{name}_total");
        assert_eq!(
            during
                .matches(&format!("# HELP {m} {help}\n# TYPE {m} counter\n"))
                .count(),
            1,
            "{m}"
        );
    }

    let c = json_ok(
        &finish_within(client, Duration::from_secs(60), "perf client"),
        "perf client",
    );
    let s = json_ok(
        &finish_within(server, Duration::from_secs(60), "perf server"),
        "perf server",
    );
    assert_eq!(c["verified"], true, "{c}");
    assert_eq!(s["verified"], true, "{s}");

    // After the run: the transport counters no longer move.
    let xdp_before = bpftool(a, "ROCE_XDP_STATS");
    let after = exporter.scrape();
    let xdp_after = bpftool(a, "ROCE_XDP_STATS");
    promtool_ok(&after);
    let qp_dump = bpftool(a, "ROCE_QP_STATS");
    let o = Command::new(roce_bin())
        .args(["stats", "-j", "-i", a])
        .output()
        .unwrap();
    let stats: Value = serde_json::from_slice(&o.stdout).unwrap();
    let ifl = format!("ifname=\"{a}\"");
    let tool = qp_totals(&qp_dump);
    for name in QpCounters::NAMES {
        let tool = tool.get(name).unwrap();
        let got = sample(&after, &format!("roce_transport_{name}_total"), &ifl);
        assert_eq!(got, tool, "transport {name}: exporter vs bpftool");
        assert_eq!(
            Some(got),
            stats["transport"][name].as_u64(),
            "transport {name}: exporter vs roce stats -j"
        );
    }
    for name in XdpStats::NAMES {
        let (lo, hi) = (xdp_total(&xdp_before, name), xdp_total(&xdp_after, name));
        let got = sample(&after, &format!("roce_xdp_{name}_total"), &ifl);
        assert!(
            (lo..=hi).contains(&got),
            "xdp {name}: exporter {got}, bpftool {lo} before and {hi} after"
        );
    }
    // The traffic itself: WRITEs went out of A and every one was steered into B's sockets.
    let sends = sample(&after, "roce_transport_sent_pkts_total", &ifl);
    assert!(sends > 0);
    let during_sends = sample(&during, "roce_transport_sent_pkts_total", &ifl);
    assert!(during_sends <= sends, "{during_sends} > {sends}");
    assert_eq!(
        sample(&after, "roce_transport_retry_exceeded_err_total", &ifl),
        0
    );
}

/// `/` points to /metrics, other paths answer 404 and other methods 405, HEAD answers without a
/// body; SIGTERM stops the exporter cleanly (exit 0, port closed).
#[test]
fn other_paths_404_and_sigterm_stops_it() {
    let pair = veth("pp", 214);
    let _l = Loaded::on(&[&pair.a]);
    let exporter = Exporter::start(&pair.a.netns, &["-i", &pair.a.ifname]);
    let (st, head, body) = exporter.request("GET", "/");
    assert_eq!(st, 200, "{head}");
    assert!(body.contains("href=\"/metrics\""), "{body}");
    for path in ["/nope", "/metrics/", "/metricsx", "/favicon.ico"] {
        let (st, head, body) = exporter.request("GET", path);
        assert_eq!(st, 404, "{path}: {head}\n{body}");
        assert!(body.contains("/metrics"), "{body}");
    }
    let (st, head, _) = exporter.request("POST", "/metrics");
    assert_eq!(st, 405, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("allow: get, head"),
        "{head}"
    );
    let (st, head, body) = exporter.request("HEAD", "/metrics");
    assert_eq!(st, 200, "{head}");
    assert!(body.is_empty(), "{body}");
    let page = exporter.scrape();
    promtool_ok(&page);
    assert!(page.contains(&format!(
        "roce_xdp_rx_packets_total{{ifname=\"{}\"}}",
        pair.a.ifname
    )));

    let Exporter {
        child, addr, ns, ..
    } = exporter;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.pid()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let t = Instant::now();
    let o = finish_within(child, Duration::from_secs(10), "exporter after SIGTERM");
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let refused = http(&ns, addr, "GET", "/metrics");
    assert!(
        refused.is_err(),
        "still answering after SIGTERM: {refused:?}"
    );
}

/// Errors are clear, and JSON with -j: nothing loaded in the namespace (B's interface does not
/// count for A's namespace and the other way round), an interface given with -i that has no
/// roce_xdp, and an address in use.
#[test]
fn errors_nothing_loaded_and_address_in_use() {
    let pair = veth("pe", 215);
    let fails = |ns: &str, extra: &str| -> String {
        let mut cmd = Command::new(roce_bin());
        cmd.args(["-j", "--netns", ns]).args(args(extra));
        let o = cmd.output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{extra}: {o:?}");
        let v: Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{extra}: not JSON ({e}): {o:?}"));
        v["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{extra}: no error: {v}"))
            .to_owned()
    };
    let e = fails(&pair.a.netns, "stats --listen 127.0.0.1:0");
    assert!(
        e.contains("not attached to any interface in this network namespace"),
        "{e}"
    );
    let _l = Loaded::on(&[&pair.a]);
    // A's interface is loaded, but not in B's namespace.
    let e = fails(&pair.b.netns, "stats --listen 127.0.0.1:0");
    assert!(
        e.contains("not attached to any interface in this network namespace"),
        "{e}"
    );
    let e = fails(
        &pair.a.netns,
        &format!("stats --listen 127.0.0.1:0 -i {}", pair.b.ifname),
    );
    assert!(
        e.contains(&format!("roce_xdp is not attached to {}", pair.b.ifname)),
        "{e}"
    );
    // Address in use: a listener of ours in A's namespace holds the port.
    let held = netns::in_netns(&pair.a.netns, || TcpListener::bind("127.0.0.1:0"))
        .unwrap()
        .unwrap();
    let port = held.local_addr().unwrap().port();
    let e = fails(&pair.a.netns, &format!("stats --listen 127.0.0.1:{port}"));
    assert!(
        e.contains(&format!("cannot listen on 127.0.0.1:{port}"))
            && e.contains("Address already in use"),
        "{e}"
    );
    drop(held);
    // Usage errors are clap's (exit 2).
    let o = Command::new(roce_bin())
        .args(["stats", "--listen", "not-an-address"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    // With the port free again, the same command serves on it.
    let exporter = Exporter::start_on(&pair.a.netns, &format!("127.0.0.1:{port}"), &[]);
    assert_eq!(exporter.addr.port(), port);
    promtool_ok(&exporter.scrape());
}
