// loopback: two RC QPs of one device connected to each other, as RDMA libraries' test suites
// connect them, with every operation checked.
//
//     loopback IFNAME
//
// Opens IFNAME as a RoCE device (root), makes two QPs on it, connects each to the other
// through the interface's own GID (its frames loop back inside the engine, as rxe loops them
// back, never reaching the wire), and runs from A to B: a 64 KiB RDMA WRITE (64 packets at
// path MTU 1024), an RDMA READ of it back, a SEND with immediate data into a posted receive,
// a fetch-and-add and a compare-and-swap, each with its bytes checked. Prints one line and
// exits 0, or says what failed and exits 1.

use std::time::{Duration, Instant};

use roce::api::{
    Access, Cq, Device, DeviceOptions, Mtu, Psn, QpCap, QpType, RcConnect, RecvWr, SendOp, SendWr,
    Wc, WcFlags, WcOpcode, WcStatus,
};

type Error = Box<dyn std::error::Error>;

const LEN: usize = 64 * 1024;
const MSG: &[u8] = b"loopback: a SEND to a QP of the same device";

/// Byte `i` of the WRITE.
fn pattern(i: usize) -> u8 {
    (i * 13 + 5) as u8
}

/// The next completion of `cq` within 10 s, which must have succeeded.
fn next_wc(cq: &Cq<'_>) -> Result<Wc, Error> {
    let mut wc = [Wc::default(); 1];
    let deadline = Instant::now() + Duration::from_secs(10);
    while cq.poll(&mut wc) == 0 {
        if Instant::now() > deadline {
            return Err("no completion within 10 s".into());
        }
        std::thread::yield_now();
    }
    if wc[0].status != WcStatus::Success {
        return Err(format!("work request {} failed: {:?}", wc[0].wr_id, wc[0].status).into());
    }
    Ok(wc[0])
}

fn expect(cq: &Cq<'_>, wr_id: u64, opcode: WcOpcode) -> Result<Wc, Error> {
    let wc = next_wc(cq)?;
    if (wc.wr_id, wc.opcode) != (wr_id, opcode) {
        return Err(format!("expected {opcode:?} {wr_id}, got {wc:?}").into());
    }
    Ok(wc)
}

fn main() -> Result<(), Error> {
    let ifname = std::env::args().nth(1).ok_or("usage: loopback IFNAME")?;
    let dev = Device::open(&ifname, &DeviceOptions::default())?;
    let pd = dev.pd()?;
    let (cq_a, cq_b) = (dev.cq(16)?, dev.cq(16)?);
    let access =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let (mr_a, mr_b) = (pd.reg_mr(2 * LEN, access)?, pd.reg_mr(LEN + 64, access)?);
    let qp_a = pd.create_qp(&cq_a, &cq_a, QpType::Rc, QpCap::default())?;
    let qp_b = pd.create_qp(&cq_b, &cq_b, QpType::Rc, QpCap::default())?;
    let gid_index = dev.info().default_gid_index(true);
    let gid = dev.gid(gid_index)?.raw;
    let (psn_a, psn_b) = (Psn::new(0x100), Psn::new(0x200));
    for (qp, peer, own, theirs) in [(&qp_a, &qp_b, psn_a, psn_b), (&qp_b, &qp_a, psn_b, psn_a)] {
        qp.to_init(access)?;
        let path = qp.path_to(gid_index, &gid, peer.qpn())?;
        qp.connect(&RcConnect::new(path, Mtu::Mtu1024, peer.qpn(), theirs, own))?;
    }

    // WRITE 64 KiB from A's first half into B.
    let data: Vec<u8> = (0..LEN).map(pattern).collect();
    mr_a.write(0, &data)?;
    let write = SendOp::Write {
        remote_addr: mr_b.addr(),
        rkey: mr_b.rkey(),
    };
    qp_a.post_send(SendWr::new(1, write, vec![mr_a.sge(0, LEN as u32)]))?;
    expect(&cq_a, 1, WcOpcode::RdmaWrite)?;
    let mut got = vec![0u8; LEN];
    mr_b.read(0, &mut got)?;
    if got != data {
        return Err("the WRITE's bytes differ at B".into());
    }

    // READ it back into A's second half.
    let read = SendOp::Read {
        remote_addr: mr_b.addr(),
        rkey: mr_b.rkey(),
    };
    qp_a.post_send(SendWr::new(2, read, vec![mr_a.sge(LEN as u64, LEN as u32)]))?;
    expect(&cq_a, 2, WcOpcode::RdmaRead)?;
    mr_a.read(LEN, &mut got)?;
    if got != data {
        return Err("the READ's bytes differ at A".into());
    }

    // SEND with immediate data into B's posted receive.
    qp_b.post_recv(RecvWr {
        wr_id: 30,
        sg_list: vec![mr_b.sge(0, MSG.len() as u32)],
    })?;
    mr_a.write(0, MSG)?;
    let send = SendOp::SendWithImm { imm: 0xfeed_f00d };
    qp_a.post_send(SendWr::new(3, send, vec![mr_a.sge(0, MSG.len() as u32)]))?;
    expect(&cq_a, 3, WcOpcode::Send)?;
    let wc = expect(&cq_b, 30, WcOpcode::Recv)?;
    if wc.byte_len as usize != MSG.len()
        || !wc.wc_flags.contains(WcFlags::WITH_IMM)
        || wc.imm != 0xfeed_f00d
        || wc.qp_num != qp_b.qpn()
    {
        return Err(format!("the SEND's completion at B is wrong: {wc:?}").into());
    }
    let mut msg = vec![0u8; MSG.len()];
    mr_b.read(0, &mut msg)?;
    if msg != MSG {
        return Err("the SEND's bytes differ at B".into());
    }

    // Atomics on B's last 8-byte word.
    let word = LEN + 56;
    mr_b.write(word, &100u64.to_ne_bytes())?;
    let target = mr_b.addr() + word as u64;
    let add = SendOp::FetchAdd {
        remote_addr: target,
        rkey: mr_b.rkey(),
        add: 5,
    };
    qp_a.post_send(SendWr::new(4, add, vec![mr_a.sge(0, 8)]))?;
    expect(&cq_a, 4, WcOpcode::FetchAdd)?;
    let cas = SendOp::CompareSwap {
        remote_addr: target,
        rkey: mr_b.rkey(),
        compare: 105,
        swap: 7,
    };
    qp_a.post_send(SendWr::new(5, cas, vec![mr_a.sge(8, 8)]))?;
    expect(&cq_a, 5, WcOpcode::CompSwap)?;
    let (mut orig_add, mut orig_cas, mut now) = ([0u8; 8], [0u8; 8], [0u8; 8]);
    mr_a.read(0, &mut orig_add)?;
    mr_a.read(8, &mut orig_cas)?;
    mr_b.read(word, &mut now)?;
    let v = u64::from_ne_bytes;
    if (v(orig_add), v(orig_cas), v(now)) != (100, 105, 7) {
        return Err(format!(
            "atomics: fetch-add saw {}, compare-swap saw {}, the word is {} (want 100, 105, 7)",
            v(orig_add),
            v(orig_cas),
            v(now)
        )
        .into());
    }
    println!(
        "loopback: QP {} <-> QP {} on {ifname}: WRITE and READ of {LEN} bytes, SEND with \
         immediate, fetch-add and compare-swap, data ok",
        qp_a.qpn().value(),
        qp_b.qpn().value()
    );
    Ok(())
}
