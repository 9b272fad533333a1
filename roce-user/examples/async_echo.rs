// async_echo: an async echo service over many RC QPs at once, on roce::api::asynch and tokio.
//
//     server:  async_echo IFNAME
//     client:  async_echo IFNAME SERVER_IP [QPS [MSGS]]
//
// The client opens QPS RC connections (default 16) and tells the server, over TCP port 18516,
// each QP's number, first PSN, GID and a "landing" region the server may RDMA WRITE into. The
// server makes as many QPs, all completing on one send CQ and one receive CQ, answers with its
// own QP numbers, and serves every QP in its own task. On each QP the client sends MSGS
// requests (default 50), one at a time: a SEND of [seq][len][len payload bytes]. The server
// RDMA WRITEs the payload straight from its receive buffer into the client's landing region,
// then SENDs the reply [seq][len]; RC delivers the reply after the WRITE's bytes (IBTA 9.5), so
// when the client's receive completes it checks the landing region against what it sent. A
// request with seq 0xffffffff ends the QP's service. Each side prints one line and exits 0, or
// exits 1 with the first error. Buffers are owned: each request takes its region and the
// future hands it back; the server's last receive is dropped unanswered, and its buffer stays
// registered until its QP is destroyed (see the module doc of roce::api::asynch).

use std::time::Duration;

use roce::api::{
    Access, Device, DeviceOptions, Mtu, Psn, QpCap, QpType, Qpn, RKey, RcConnect,
    asynch::{AsyncCq, AsyncDevice, AsyncPd, AsyncQp, Completion, LocalMr, RemoteMr},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

type Error = Box<dyn std::error::Error + Send + Sync>;

const PORT: u16 = 18516;
/// The longest payload: four frames at path MTU 1024.
const MAX_PAYLOAD: usize = 4000;
/// A request's or reply's header: seq and len, big-endian.
const HEADER: usize = 8;
/// The seq that ends a QP's service.
const BYE: u32 = u32::MAX;
/// Most QPs one client may ask for.
const MAX_QPS: u32 = 256;

/// One QP's end, as the other side needs it: ibv_rc_pingpong's `pp_dest` and a region.
struct Dest {
    qpn: u32,
    psn: u32,
    gid: [u8; 16],
    landing: RemoteMr,
}

impl Dest {
    const LEN: usize = 4 + 4 + 16 + 8 + 4 + 8;

    fn encode(&self, b: &mut Vec<u8>) {
        b.extend(self.qpn.to_be_bytes());
        b.extend(self.psn.to_be_bytes());
        b.extend(self.gid);
        b.extend(self.landing.addr.to_be_bytes());
        b.extend(self.landing.rkey.value().to_be_bytes());
        b.extend(self.landing.len.to_be_bytes());
    }

    fn decode(b: &[u8]) -> Self {
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap_or_default());
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap_or_default());
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[8..24]);
        Self {
            qpn: u32_at(0),
            psn: u32_at(4),
            gid,
            landing: RemoteMr {
                addr: u64_at(24),
                rkey: RKey::new(u32_at(32)),
                len: u64_at(36),
            },
        }
    }
}

async fn send_dests(s: &mut TcpStream, dests: &[Dest]) -> Result<(), Error> {
    let mut b = Vec::with_capacity(4 + dests.len() * Dest::LEN);
    b.extend(u32::try_from(dests.len())?.to_be_bytes());
    for d in dests {
        d.encode(&mut b);
    }
    s.write_all(&b).await?;
    Ok(())
}

async fn recv_dests(s: &mut TcpStream) -> Result<Vec<Dest>, Error> {
    let n = s.read_u32().await?;
    if n == 0 || n > MAX_QPS {
        return Err(format!("asked for {n} QPs (1..={MAX_QPS})").into());
    }
    let mut b = vec![0u8; n as usize * Dest::LEN];
    s.read_exact(&mut b).await?;
    Ok(b.chunks_exact(Dest::LEN).map(Dest::decode).collect())
}

/// One side's objects: the device, a PD, the two CQs all its QPs share.
struct Side {
    pd: AsyncPd,
    send_cq: AsyncCq,
    recv_cq: AsyncCq,
    gid_index: usize,
    gid: [u8; 16],
}

impl Side {
    fn open(ifname: &str, qps: u32) -> Result<Self, Error> {
        let dev = AsyncDevice::new(Device::open(ifname, &DeviceOptions::default())?);
        let pd = dev.pd()?;
        // Each QP has at most two sends and two receives outstanding.
        let depth = qps as usize * 2 + 16;
        let (send_cq, recv_cq) = (dev.cq(depth)?, dev.cq(depth)?);
        let gid_index = dev.device().info().default_gid_index(true);
        let gid = dev.device().gid(gid_index)?.raw;
        Ok(Self {
            pd,
            send_cq,
            recv_cq,
            gid_index,
            gid,
        })
    }

    fn qp(&self) -> Result<AsyncQp, Error> {
        let cap = QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            ..QpCap::default()
        };
        let qp = self
            .pd
            .create_qp(&self.send_cq, &self.recv_cq, QpType::Rc, cap)?;
        qp.to_init(Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
        Ok(qp)
    }

    fn buf(&self, access: Access) -> Result<LocalMr, Error> {
        Ok(self.pd.reg_mr(HEADER + MAX_PAYLOAD, access)?)
    }

    fn connect(&self, qp: &AsyncQp, me: &Dest, peer: &Dest) -> Result<(), Error> {
        let path = qp.path_to(self.gid_index, &peer.gid, Qpn::new(peer.qpn))?;
        qp.connect(&RcConnect::new(
            path,
            Mtu::Mtu1024,
            Qpn::new(peer.qpn),
            Psn::new(peer.psn),
            Psn::new(me.psn),
        ))?;
        Ok(())
    }
}

fn header(seq: u32, len: u32) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(&seq.to_be_bytes());
    h[4..].copy_from_slice(&len.to_be_bytes());
    h
}

fn parse_header(b: &[u8]) -> (u32, u32) {
    let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap_or_default());
    (u32_at(0), u32_at(4))
}

/// The payload of request `seq` on the client's QP `k`: its length and bytes.
fn payload(k: usize, seq: u32) -> Vec<u8> {
    let len = 1 + (seq as usize * 997 + k * 131) % MAX_PAYLOAD;
    (0..len)
        .map(|i| (i * 31 + seq as usize * 7 + k * 13) as u8)
        .collect()
}

/// Serves one QP until its client says BYE; returns how many requests it echoed.
async fn serve(
    qp: AsyncQp,
    mut next: Completion<LocalMr>,
    (mut spare, mut out): (LocalMr, LocalMr),
    peer: RemoteMr,
) -> Result<u32, Error> {
    let mut served = 0;
    loop {
        let (r, req) = next.await;
        let wc = r?;
        // The next receive goes up at once, into the other buffer.
        next = qp.recv(spare);
        let mut h = [0u8; HEADER];
        req.read(0, &mut h)?;
        let (seq, len) = parse_header(&h);
        if seq == BYE {
            // `next` is dropped unanswered: its buffer stays registered until the QP goes.
            return Ok(served);
        }
        if len as usize > MAX_PAYLOAD
            || u64::from(len) > peer.len
            || wc.byte_len != HEADER as u32 + len
        {
            return Err(format!(
                "QP {}: request {seq} says {len} bytes in a {}-byte message",
                qp.qpn().value(),
                wc.byte_len
            )
            .into());
        }
        // The payload goes back from where it landed; then the reply, which RC delivers
        // after the WRITE's bytes.
        let (r, req) = qp.write(req, HEADER as u64, len, peer).await;
        r?;
        out.write(0, &header(seq, len))?;
        let (r, o) = qp.send(out, HEADER as u32).await;
        r?;
        out = o;
        spare = req;
        served += 1;
    }
}

async fn server(ifname: String) -> Result<(), Error> {
    let listener = TcpListener::bind(("0.0.0.0", PORT)).await?;
    let (mut s, _) = listener.accept().await?;
    let peers = recv_dests(&mut s).await?;
    let n = u32::try_from(peers.len())?;
    let side = Side::open(&ifname, n)?;
    let mut mine = Vec::new();
    let mut tasks = Vec::new();
    for peer in &peers {
        let qp = side.qp()?;
        let me = Dest {
            qpn: qp.qpn().value(),
            psn: 0x2000 + qp.qpn().value(),
            gid: side.gid,
            // The server's regions are not for the client to address.
            landing: RemoteMr {
                addr: 0,
                rkey: RKey::new(0),
                len: 0,
            },
        };
        side.connect(&qp, &me, peer)?;
        // The first receive is posted here, before the client learns the QP number.
        let first = qp.recv(side.buf(Access::LOCAL_WRITE)?);
        let bufs = (
            side.buf(Access::LOCAL_WRITE)?,
            side.buf(Access::LOCAL_WRITE)?,
        );
        mine.push(me);
        tasks.push(tokio::spawn(serve(qp, first, bufs, peer.landing)));
    }
    send_dests(&mut s, &mine).await?;
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    println!("server: served {total} requests on {n} QPs");
    Ok(())
}

/// Runs `msgs` requests on the client's QP `k`; returns how many replies it checked.
async fn ask(
    k: usize,
    qp: AsyncQp,
    landing: LocalMr,
    (mut req, mut rep): (LocalMr, LocalMr),
    msgs: u32,
) -> Result<u32, Error> {
    let mut checked = 0;
    for seq in 0..msgs {
        let data = payload(k, seq);
        let len = u32::try_from(data.len())?;
        // The reply's receive first, then the request.
        let reply = qp.recv(rep);
        req.write(0, &header(seq, len))?;
        req.write(HEADER, &data)?;
        let (r, b) = qp.send(req, HEADER as u32 + len).await;
        r?;
        req = b;
        let (r, b) = reply.await;
        let wc = r?;
        rep = b;
        let mut h = [0u8; HEADER];
        rep.read(0, &mut h)?;
        if wc.byte_len != HEADER as u32 || parse_header(&h) != (seq, len) {
            return Err(format!(
                "QP {k}: reply {:?} ({} bytes) to request {seq} of {len} bytes",
                parse_header(&h),
                wc.byte_len
            )
            .into());
        }
        let echoed = landing.to_vec(0, data.len())?;
        if echoed != data {
            let at = echoed.iter().zip(&data).position(|(a, b)| a != b);
            return Err(format!("QP {k}: request {seq}: the echo differs at byte {at:?}").into());
        }
        checked += 1;
    }
    req.write(0, &header(BYE, 0))?;
    let (r, _) = qp.send(req, HEADER as u32).await;
    r?;
    Ok(checked)
}

async fn client(ifname: String, server_ip: String, qps: u32, msgs: u32) -> Result<(), Error> {
    if qps == 0 || qps > MAX_QPS {
        return Err(format!("QPS must be 1..={MAX_QPS}").into());
    }
    let side = Side::open(&ifname, qps)?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut s = loop {
        match TcpStream::connect((server_ip.as_str(), PORT)).await {
            Ok(s) => break s,
            Err(e) if tokio::time::Instant::now() > deadline => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let mut ends = Vec::new();
    let mut mine = Vec::new();
    for _ in 0..qps {
        let qp = side.qp()?;
        let landing = side
            .pd
            .reg_mr(MAX_PAYLOAD, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
        mine.push(Dest {
            qpn: qp.qpn().value(),
            psn: 0x1000 + qp.qpn().value(),
            gid: side.gid,
            landing: landing.remote(),
        });
        ends.push((qp, landing));
    }
    send_dests(&mut s, &mine).await?;
    let peers = recv_dests(&mut s).await?;
    if peers.len() != ends.len() {
        return Err(format!("the server made {} QPs for {qps}", peers.len()).into());
    }
    let mut tasks = Vec::new();
    for (k, ((qp, landing), (me, peer))) in
        ends.into_iter().zip(mine.iter().zip(&peers)).enumerate()
    {
        side.connect(&qp, me, peer)?;
        let bufs = (
            side.buf(Access::LOCAL_WRITE)?,
            side.buf(Access::LOCAL_WRITE)?,
        );
        tasks.push(tokio::spawn(ask(k, qp, landing, bufs, msgs)));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    println!("client: {qps} QPs, {total} replies checked");
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: u32| args.get(i).map_or(Ok(default), |a| a.parse::<u32>());
    let run = async {
        match args.as_slice() {
            [ifname] => server(ifname.clone()).await,
            [ifname, ip, ..] => {
                let (qps, msgs) = (num(2, 16)?, num(3, 50)?);
                client(ifname.clone(), ip.clone(), qps, msgs).await
            }
            _ => Err("usage: async_echo IFNAME [SERVER_IP [QPS [MSGS]]]".into()),
        }
    };
    match tokio::time::timeout(Duration::from_secs(120), run).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            eprintln!("async_echo: {e}");
            std::process::exit(1);
        }
        Err(_) => {
            eprintln!("async_echo: not done within 120 s");
            std::process::exit(1);
        }
    }
}
