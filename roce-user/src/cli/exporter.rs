//! `roce stats --listen ADDR:PORT`: a Prometheus exporter. Serves `GET /metrics`, built at each
//! scrape from the pinned maps of every interface roce_xdp is attached to in this network
//! namespace, with the same counter names, help texts and types as `roce stats --prometheus`
//! (both render through [`roce::stats::prometheus`]).
//!
//! HTTP is hyper 1.x on a single-threaded tokio runtime: a scrape reads a few BPF maps, which
//! takes microseconds, so the handler reads them inline. The packet engine never runs here.

use std::{
    convert::Infallible,
    net::{SocketAddr, TcpListener},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context as _, bail};
use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header,
    server::conn::http1,
    service::service_fn,
};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    server::graceful::GracefulShutdown,
};
use roce::{
    loader::{self, Pins},
    stats::{Snapshot, prometheus},
};
use serde_json::json;

use super::Output;

/// The exposition format's content type (text format 0.0.4).
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How long a client may take to send its request headers before the connection is closed.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long open connections get to finish their scrape after SIGINT or SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// What a scrape reads.
#[derive(Debug)]
struct Scope {
    /// Only this interface (`-i`), or every one in this namespace.
    only: Option<String>,
    /// Per-CPU XDP counters too (`-e`).
    per_cpu: bool,
}

/// One exposition page: every interface in scope, with its AF_XDP queues and QPs. An interface
/// unloaded between the listing and the read is left out (and said so on stderr).
fn page(scope: &Scope) -> anyhow::Result<String> {
    let mut snaps: Vec<Snapshot> = Vec::new();
    for ifname in super::xdp::attached_here(scope.only.as_deref())? {
        match super::xdp::snapshot(&Pins::new(&ifname), &ifname, scope.per_cpu, true) {
            Ok(s) => snaps.push(s),
            Err(e) => eprintln!("roce stats --listen: {ifname} left out of this scrape: {e:#}"),
        }
    }
    Ok(prometheus(&snaps))
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

/// Answers one request: `/metrics` the page, `/` a pointer to it, other paths 404, other
/// methods than GET and HEAD 405 (hyper leaves the body out of HEAD answers).
#[allow(clippy::unused_async)] // hyper's service_fn wants a future
async fn handle(
    req: Request<Incoming>,
    scope: Arc<Scope>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path();
    if path != "/metrics" && path != "/" {
        return Ok(reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            format!("404 not found: {path}; the metrics are at /metrics\n"),
        ));
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "405 method not allowed: GET or HEAD\n".into(),
        );
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return Ok(r);
    }
    if path == "/" {
        return Ok(reply(
            StatusCode::OK,
            "text/html; charset=utf-8",
            "<html><head><title>roce-xdp exporter</title></head><body>\
             <h1>roce-xdp exporter</h1><p><a href=\"/metrics\">Metrics</a></p></body></html>\n"
                .into(),
        ));
    }
    Ok(match page(&scope) {
        Ok(text) => reply(StatusCode::OK, CONTENT_TYPE, text),
        Err(e) => {
            eprintln!("roce stats --listen: scrape failed: {e:#}");
            reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain; charset=utf-8",
                format!("500 cannot read the counters: {e:#}\n"),
            )
        }
    })
}

/// Resolves when SIGINT or SIGTERM has arrived (the flag `roce`'s signal thread sets).
async fn interrupted() {
    while !super::interrupted() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Serves until interrupted, then stops accepting and gives open connections
/// [`SHUTDOWN_GRACE`] to finish.
async fn serve(listener: tokio::net::TcpListener, scope: Arc<Scope>) {
    let graceful = GracefulShutdown::new();
    let mut stop = std::pin::pin!(interrupted());
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of descriptors and the like: say so, breathe, go on.
                        eprintln!("roce stats --listen: accept: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let scope = Arc::clone(&scope);
                let conn = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(
                        TokioIo::new(stream),
                        service_fn(move |req| handle(req, Arc::clone(&scope))),
                    );
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    // A client that goes away mid-request is its own business.
                    let _ = conn.await;
                });
            }
            () = &mut stop => break,
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
}

/// `roce stats --listen ADDR:PORT [-i IFACE] [-e]`: checks that there is something to serve,
/// binds, prints where it listens (the real port when ADDR:PORT asked for port 0), and serves
/// until SIGINT or SIGTERM.
///
/// # Errors
/// Not root, no interface with roce_xdp in this namespace (or not `only`), the address cannot
/// be bound (in use, not local), or the runtime cannot start.
pub(crate) fn run(
    out: Output,
    addr: SocketAddr,
    only: Option<&str>,
    per_cpu: bool,
) -> anyhow::Result<()> {
    loader::require_root()?;
    if let Some(i) = only {
        loader::check_ifname(i)?;
    }
    let scope = Scope {
        only: only.map(str::to_owned),
        per_cpu,
    };
    let ifaces = super::xdp::attached_here(scope.only.as_deref())?;
    if ifaces.is_empty() {
        match only {
            Some(i) => bail!(
                "roce_xdp is not attached to {i} in this network namespace (see `roce status`; \
                 `roce load -i {i}` attaches it)"
            ),
            None => bail!(
                "roce_xdp is not attached to any interface in this network namespace, nothing \
                 to export (see `roce status`; `roce load -i IFACE` attaches it)"
            ),
        }
    }
    let listener = TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
    listener
        .set_nonblocking(true)
        .context("setting the listening socket non-blocking")?;
    let local = listener
        .local_addr()
        .context("reading the listening address")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::from_std(listener)
            .context("handing the listening socket to tokio")?;
        out.emit(
            &json!({
                "listen": local.to_string(),
                "url": format!("http://{local}/metrics"),
                "interfaces": ifaces,
            }),
            &format!(
                "serving Prometheus metrics of {} at http://{local}/metrics (interrupt to stop)\n",
                ifaces.join(", ")
            ),
        );
        serve(listener, Arc::new(scope)).await;
        anyhow::Ok(())
    })
}
