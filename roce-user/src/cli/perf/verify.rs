//! The data checks: each QP's buffer holds a pattern derived from the QP index
//! (`roce::cm::perftest::pattern`); with `--span` each message has a place of its own in it.
//! The server checks what was written or sent into it once the client is done; the client
//! checks what it read back as it goes (`bw::run_client`).

use roce::{api::RdmaDevice, cm::perftest::pattern};

use super::{PerfArgs, PerfOp, setup::QpCtx};

/// Bytes `off..off + len` of QP `q`'s pattern, into `buf` (cleared first), so that a loop over
/// many messages reuses one buffer.
pub(super) fn pattern_into(q: u32, off: usize, len: usize, buf: &mut Vec<u8>) {
    buf.clear();
    buf.extend((off..off + len).map(|i| roce::cm::perftest::pattern_byte(q, i)));
}

/// Where message `k` of `size` bytes goes in the local and remote buffers: offset
/// (k × size) mod span with `--span`, else 0 (every message on the same bytes, as perftest).
pub(super) fn msg_offset(span: u64, k: u64, size: u32) -> u64 {
    if span == 0 {
        0
    } else {
        k.wrapping_mul(u64::from(size)) % span
    }
}

/// The bytes of a QP's buffer that must hold its pattern once `msgs` messages of `size` went
/// through: the first message's with no `--span`, else all of the span they covered.
pub(super) fn verify_len(span: u64, msgs: u64, size: u32) -> usize {
    if span == 0 {
        size as usize
    } else {
        usize::try_from(span.min(msgs.saturating_mul(u64::from(size)))).unwrap_or(usize::MAX)
    }
}

/// The server's check of its buffers after the run, against the `client_msgs` messages the
/// client reported: call it once the client has finished (after the report exchange).
pub(super) fn verify_server<D: RdmaDevice>(
    dev: &D,
    a: &PerfArgs,
    qps: &[QpCtx],
    size: u32,
    client_msgs: u64,
) -> anyhow::Result<bool> {
    let mut ok = true;
    // With --span and -D the server knows only the total: it checks the span the average QP
    // covered (the test sizes -D runs so that every QP covers the whole span).
    let per_qp = client_msgs / u64::from(a.qps.max(1));
    for qp in qps {
        let n = verify_len(a.span, per_qp, size);
        ok &= match a.op {
            PerfOp::Write | PerfOp::Read => dev.with_mr(qp.mr.lkey, |b| {
                b.get(..n) == Some(pattern(qp.pattern, n).as_slice())
            })?,
            // With --span every receive was checked as it completed (run_server).
            PerfOp::Send if a.span != 0 => true,
            PerfOp::Send => dev.with_mr(qp.mr.lkey, |b| {
                b.get(..size as usize) == Some(pattern(qp.pattern, size as usize).as_slice())
            })?,
            PerfOp::Atomic => true,
        };
    }
    if a.op == PerfOp::Atomic {
        // Each atomic adds one (or swaps k for k+1): the counters sum to the client's count.
        let mut total = 0u64;
        for qp in qps {
            let mut b = [0u8; 8];
            dev.mr_read(qp.mr.lkey, 0, &mut b)?;
            total += u64::from_le_bytes(b);
        }
        ok &= total == client_msgs;
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_gives_each_message_its_own_place() {
        // 4 messages of 1 KiB in a 4 KiB span: offsets 0, 1024, 2048, 3072, then around.
        let offs: Vec<u64> = (0..6).map(|k| msg_offset(4096, k, 1024)).collect();
        assert_eq!(offs, [0, 1024, 2048, 3072, 0, 1024]);
        assert_eq!(msg_offset(0, 5, 1024), 0);
        assert_eq!(verify_len(0, 100, 1024), 1024);
        assert_eq!(verify_len(4096, 2, 1024), 2048);
        assert_eq!(verify_len(4096, 100, 1024), 4096);
        // The pattern at an offset is the same bytes as the whole pattern there.
        let mut buf = vec![0xff; 7];
        pattern_into(3, 1000, 24, &mut buf);
        assert_eq!(buf, pattern(3, 1024)[1000..]);
    }
}
