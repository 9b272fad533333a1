// rc_write: one RC connection over the handle API, in the manner of ibv_rc_pingpong.
//
//     server:  rc_write IFNAME
//     client:  rc_write IFNAME SERVER_IP
//
// Each side opens IFNAME as a RoCE device (root), makes a PD, a CQ, a region and an RC QP, and
// swaps its QP number, first PSN, region address, R_Key and GID with the other over TCP port
// 18515. The client RDMA WRITEs a pattern into the server's region and then SENDs a message;
// RC delivers in order, so when the server's receive completes the WRITE's bytes are in place.
// The server checks both and answers "ok" over TCP. Each side prints one line and exits 0.
// Everything is released when the handles go out of scope, QP first.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    time::{Duration, Instant},
};

use roce::api::{
    Access, Cq, Device, DeviceOptions, Mtu, Psn, QpCap, QpType, Qpn, RKey, RcConnect, RecvWr,
    SendOp, SendWr, Wc, WcOpcode, WcStatus,
};

type Error = Box<dyn std::error::Error>;

const PORT: u16 = 18515;
/// Bytes the client WRITEs into the server's region.
const WRITE_LEN: usize = 8192;
/// What the client SENDs after the WRITE; it lands after the WRITE's bytes.
const MSG: &[u8] = b"rc_write: the WRITE is done";

/// What one side tells the other: ibv_rc_pingpong's `pp_dest` and a region to WRITE into.
struct Dest {
    qpn: u32,
    psn: u32,
    addr: u64,
    rkey: u32,
    gid: [u8; 16],
}

impl Dest {
    fn send(&self, s: &mut TcpStream) -> std::io::Result<()> {
        let mut b = Vec::with_capacity(36);
        b.extend(self.qpn.to_be_bytes());
        b.extend(self.psn.to_be_bytes());
        b.extend(self.addr.to_be_bytes());
        b.extend(self.rkey.to_be_bytes());
        b.extend(self.gid);
        s.write_all(&b)
    }

    fn recv(s: &mut TcpStream) -> std::io::Result<Self> {
        let mut b = [0u8; 36];
        s.read_exact(&mut b)?;
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut addr = [0u8; 8];
        addr.copy_from_slice(&b[8..16]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[20..36]);
        Ok(Self {
            qpn: u32_at(0),
            psn: u32_at(4),
            addr: u64::from_be_bytes(addr),
            rkey: u32_at(16),
            gid,
        })
    }
}

/// Byte `i` of the WRITE.
fn pattern(i: usize) -> u8 {
    (i * 7 + 3) as u8
}

/// The next completion of `cq`, polled into a one-entry slice (no allocation), within 10 s.
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

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let ifname = args.next().ok_or("usage: rc_write IFNAME [SERVER_IP]")?;
    let server_ip = args.next();

    let dev = Device::open(&ifname, &DeviceOptions::default())?;
    let pd = dev.pd()?;
    let cq = dev.cq(16)?;
    let len = WRITE_LEN + MSG.len();
    let mr = pd.reg_mr(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let qp = pd.create_qp(&cq, &cq, QpType::Rc, QpCap::default())?;
    qp.to_init(Access::REMOTE_WRITE)?;
    let gid_index = dev.info().default_gid_index(true);
    let me = Dest {
        qpn: qp.qpn().value(),
        psn: 0x1000 + qp.qpn().value(),
        addr: mr.addr(),
        rkey: mr.rkey().value(),
        gid: dev.gid(gid_index)?.raw,
    };
    let connect = |peer: &Dest| {
        let path = qp.path_to(gid_index, &peer.gid, Qpn::new(peer.qpn))?;
        let c = RcConnect::new(
            path,
            Mtu::Mtu1024,
            Qpn::new(peer.qpn),
            Psn::new(peer.psn),
            Psn::new(me.psn),
        );
        qp.connect(&c)
    };

    if let Some(ip) = server_ip {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut s = loop {
            match TcpStream::connect((ip.as_str(), PORT)) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => return Err(e.into()),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        me.send(&mut s)?;
        let peer = Dest::recv(&mut s)?;
        connect(&peer)?;
        let data: Vec<u8> = (0..WRITE_LEN).map(pattern).collect();
        mr.write(0, &data)?;
        mr.write(WRITE_LEN, MSG)?;
        let write = SendOp::Write {
            remote_addr: peer.addr,
            rkey: RKey::new(peer.rkey),
        };
        qp.post_send(SendWr::new(1, write, vec![mr.sge(0, WRITE_LEN as u32)]))?;
        let msg = mr.sge(WRITE_LEN as u64, MSG.len() as u32);
        qp.post_send(SendWr::send(2, vec![msg]))?;
        for (wr_id, opcode) in [(1, WcOpcode::RdmaWrite), (2, WcOpcode::Send)] {
            let wc = next_wc(&cq)?;
            if (wc.wr_id, wc.opcode) != (wr_id, opcode) {
                return Err(format!("expected {opcode:?} {wr_id}, got {wc:?}").into());
            }
        }
        let mut ok = [0u8; 2];
        s.read_exact(&mut ok)?;
        if &ok != b"ok" {
            return Err("the server did not confirm the data".into());
        }
        println!(
            "client: wrote {WRITE_LEN} bytes and sent {} bytes",
            MSG.len()
        );
    } else {
        // The receive goes up before the client can send.
        let msg = mr.sge(WRITE_LEN as u64, MSG.len() as u32);
        qp.post_recv(RecvWr {
            wr_id: 7,
            sg_list: vec![msg],
        })?;
        let (mut s, _) = TcpListener::bind(("0.0.0.0", PORT))?.accept()?;
        let peer = Dest::recv(&mut s)?;
        connect(&peer)?;
        me.send(&mut s)?;
        let wc = next_wc(&cq)?;
        if wc.opcode != WcOpcode::Recv || wc.byte_len as usize != MSG.len() {
            return Err(format!("expected the client's SEND, got {wc:?}").into());
        }
        let mut got = vec![0u8; len];
        mr.read(0, &mut got)?;
        if got[..WRITE_LEN]
            .iter()
            .enumerate()
            .any(|(i, b)| *b != pattern(i))
        {
            return Err("the WRITE's bytes differ".into());
        }
        if &got[WRITE_LEN..] != MSG {
            return Err("the SEND's bytes differ".into());
        }
        s.write_all(b"ok")?;
        // Until the client has its completions and closes: our ACKs must go out first.
        let _ = s.read(&mut [0u8; 1]);
        println!(
            "server: received a {WRITE_LEN}-byte WRITE and a {}-byte SEND from QP {}, data ok",
            MSG.len(),
            peer.qpn
        );
    }
    Ok(())
}
