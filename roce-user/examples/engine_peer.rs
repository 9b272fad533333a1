//! One side of an RDMA WRITE through `roce engine` (docs/multiprocess.md): run two of these
//! as separate processes against the same engine, and the engine moves the bytes from one
//! process's registered memory into the other's.
//!
//! `engine_peer SOCKET DIR target` registers 64 KiB of zeros, writes `DIR/target` (its QPN,
//! rkey, address and GID), waits for `DIR/writer`, connects, waits for `DIR/done`, and checks
//! that its memory holds the pattern. `engine_peer SOCKET DIR writer` fills 64 KiB with the
//! pattern, waits for `DIR/target`, writes `DIR/writer`, connects, WRITEs all of it, waits
//! for the completion and writes `DIR/done`. Both print one line and exit 0 on success.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use roce::api::{
    Access, Mtu, QpInit, QpType, Qpn, WcStatus,
    remote::{
        EngineClient,
        proto::{WireOp, WireSendWr, WireSge},
    },
};

const LEN: usize = 64 * 1024;

fn pattern(i: usize) -> u8 {
    (i * 31 + 7) as u8
}

fn wait_file(p: &Path) -> anyhow::Result<String> {
    let t0 = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(p)
            && s.ends_with('\n')
        {
            return Ok(s);
        }
        if t0.elapsed() > Duration::from_secs(20) {
            bail!("no {} after 20 s", p.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Writes `s` to `p` whole (through a temporary file and a rename).
fn put_file(p: &Path, s: &str) -> anyhow::Result<()> {
    let tmp = p.with_extension("tmp");
    std::fs::write(&tmp, s)?;
    std::fs::rename(&tmp, p)?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, socket, dir, role] = &args[..] else {
        bail!("usage: engine_peer SOCKET DIR target|writer");
    };
    let dir = PathBuf::from(dir);
    let writer = match role.as_str() {
        "writer" => true,
        "target" => false,
        r => bail!("role {r}: target or writer"),
    };
    let mut c = EngineClient::connect_at(Path::new(socket)).context("engine")?;
    let mut mem: Vec<u8> = if writer {
        (0..LEN).map(pattern).collect()
    } else {
        vec![0; LEN]
    };
    let addr = mem.as_mut_ptr() as u64;
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let pd = c.alloc_pd()?;
    let (lkey, rkey) = c.reg_mr(pd, addr, LEN as u64, access)?;
    let cq = c.create_cq(16)?;
    let qpn = c.create_qp(&QpInit::new(QpType::Rc, pd, cq))?;
    c.qp_to_init(qpn, access)?;
    let gid = c.query_gid(1)?;
    let me = format!("{} {} {addr} {}\n", qpn.value(), rkey.value(), hex(&gid));
    let (mine, theirs) = if writer {
        ("writer", "target")
    } else {
        ("target", "writer")
    };
    if writer {
        let peer = wait_file(&dir.join(theirs))?;
        put_file(&dir.join(mine), &me)?;
        let f: Vec<&str> = peer.split_whitespace().collect();
        let (pqpn, prkey, paddr): (u32, u32, u64) = (f[0].parse()?, f[1].parse()?, f[2].parse()?);
        c.qp_connect(qpn, 1, gid, Qpn::new(pqpn), 2, 1, Mtu::Mtu1024)?;
        c.post_send(
            qpn,
            WireSendWr {
                wr_id: 7,
                op: WireOp::Write {
                    remote_addr: paddr,
                    rkey: prkey,
                },
                signaled: true,
                sges: vec![WireSge {
                    addr,
                    length: LEN as u32,
                    lkey: lkey.value(),
                }],
            },
        )?;
        let t0 = Instant::now();
        let wc = loop {
            if let Some(w) = c.poll_cq(cq, 1)?.first() {
                break *w;
            }
            if t0.elapsed() > Duration::from_secs(10) {
                bail!("no completion");
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        if wc.status != WcStatus::Success || wc.wr_id != 7 {
            bail!("completion {wc:?}");
        }
        put_file(&dir.join("done"), "done\n")?;
        println!("wrote {LEN} bytes through engine pid {}", c.engine_pid());
    } else {
        put_file(&dir.join(mine), &me)?;
        let peer = wait_file(&dir.join(theirs))?;
        let pqpn: u32 = peer
            .split_whitespace()
            .next()
            .context("peer line")?
            .parse()?;
        c.qp_connect(qpn, 1, gid, Qpn::new(pqpn), 1, 2, Mtu::Mtu1024)?;
        wait_file(&dir.join("done"))?;
        std::hint::black_box(&mut mem);
        if let Some(i) = (0..LEN).find(|&i| mem[i] != pattern(i)) {
            bail!("byte {i} is {:#x}, not {:#x}", mem[i], pattern(i));
        }
        println!(
            "received {LEN} bytes, all right, through engine pid {}",
            c.engine_pid()
        );
    }
    // Keep the memory registered until the engine has let go of it.
    drop(c);
    drop(mem);
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
