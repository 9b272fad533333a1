//! Counter structs and drop reasons: the one source of truth for their names.
//!
//! [`counter_struct!`](crate::counter_struct) turns a list of documented field names into a `#[repr(C)]` struct of `u64`s,
//! its `NAMES` and `HELP` tables, and element-wise addition (to sum per-CPU copies). The same
//! struct is the value of a BTF map, so `bpftool map dump` prints these very field names.

/// Defines a `#[repr(C)]` struct of `u64` counters with name and help tables.
///
/// Each field is written `/// help text` then `name`. The generated struct implements
/// `Default`, `Clone`, `Copy`, `Debug`, and has:
/// - `NAMES: [&str; N]` and `HELP: [&str; N]` in field order;
/// - `values(&self) -> [u64; N]` in field order;
/// - `get(&self, name) -> Option<u64>` and `get_mut`;
/// - `add(&mut self, &Self)` and `saturating_sub(&self, &Self) -> Self` for sums and deltas;
/// - per field, an associated `&str` constant of the same name (`XdpStats::drop_foreign_qp`).
#[macro_export]
macro_rules! counter_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( #[doc = $help:literal] $field:ident, )*
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name {
            $( #[doc = $help] pub $field: u64, )*
        }

        impl $name {
            /// Number of counters.
            pub const COUNT: usize = [$(stringify!($field)),*].len();
            /// Counter names, in field order.
            pub const NAMES: [&'static str; Self::COUNT] = [$(stringify!($field)),*];
            /// One-line help per counter, in field order.
            pub const HELP: [&'static str; Self::COUNT] = [$($help.trim_ascii()),*];

            $(
                #[doc = concat!("The name of the `", stringify!($field), "` counter: what `NAMES` holds for it, for code that names one counter (a log record's reason).")]
                #[allow(non_upper_case_globals, reason = "named after its field")]
                pub const $field: &'static str = stringify!($field);
            )*

            /// Counter values, in field order.
            #[must_use]
            pub const fn values(&self) -> [u64; Self::COUNT] {
                [$(self.$field),*]
            }

            /// The value of the counter called `name`.
            #[must_use]
            pub fn get(&self, name: &str) -> Option<u64> {
                match name {
                    $( stringify!($field) => Some(self.$field), )*
                    _ => None,
                }
            }

            /// The counter called `name`, for writing.
            pub fn get_mut(&mut self, name: &str) -> Option<&mut u64> {
                match name {
                    $( stringify!($field) => Some(&mut self.$field), )*
                    _ => None,
                }
            }

            /// Adds `other` field by field (wrapping), to sum per-CPU copies.
            pub fn add(&mut self, other: &Self) {
                $( self.$field = self.$field.wrapping_add(other.$field); )*
            }

            /// `self - earlier`, field by field, saturating at zero.
            #[must_use]
            pub const fn saturating_sub(&self, earlier: &Self) -> Self {
                Self { $( $field: self.$field.saturating_sub(earlier.$field), )* }
            }
        }
    };
}

/// Defines the drop reasons and the per-CPU XDP counter struct together, so that each reason has
/// exactly one stable code and one counter field.
macro_rules! xdp_counters {
    (
        counters { $( #[doc = $chelp:literal] $cfield:ident, )* }
        drops { $( #[doc = $dhelp:literal] $reason:ident = $code:literal => $dfield:ident, )* }
    ) => {
        counter_struct! {
            /// Per-CPU counters kept by `roce_xdp`, the value type of the `ROCE_XDP_STATS` map.
            ///
            /// Every frame is counted in `rx_packets` and exactly once in one of the verdict
            /// counters: `redirected`, `redirect_fallback_pass`, `pass_not_roce`, `pass_fragment`,
            /// `pass_foreign_qp`, `drop_foreign_qp` or one `drop_*` reason.
            pub struct XdpStats {
                $( #[doc = $chelp] $cfield, )*
                $( #[doc = $dhelp] $dfield, )*
            }
        }

        /// Why `roce_xdp` dropped a packet. Codes are stable: never renumber or reuse one.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum DropReason {
            $( #[doc = $dhelp] $reason = $code, )*
        }

        impl DropReason {
            /// Every reason, in code order.
            pub const ALL: &'static [Self] = &[$(Self::$reason),*];

            /// The reason with this stable code.
            #[must_use]
            pub const fn from_code(code: u8) -> Option<Self> {
                match code {
                    $( $code => Some(Self::$reason), )*
                    _ => None,
                }
            }

            /// The name of this reason's counter in [`XdpStats`].
            #[must_use]
            pub const fn counter_name(self) -> &'static str {
                match self {
                    $( Self::$reason => stringify!($dfield), )*
                }
            }
        }

        impl XdpStats {
            /// Counts one packet dropped for `reason`.
            #[inline(always)]
            pub fn count_drop(&mut self, reason: DropReason) {
                match reason {
                    $( DropReason::$reason => self.$dfield += 1, )*
                }
            }
        }
    };
}

xdp_counters! {
    counters {
        /// Frames seen by roce_xdp.
        rx_packets,
        /// Bytes of the frames seen by roce_xdp.
        rx_bytes,
        /// Well-formed RoCE v2 packets (UDP to the RoCE port with a valid BTH).
        roce_packets,
        /// Bytes of the well-formed RoCE v2 packets.
        roce_bytes,
        /// RoCE packets for our QPs redirected to the AF_XDP socket of their RX queue.
        redirected,
        /// RoCE packets for our QPs passed to the kernel because no AF_XDP socket serves their queue.
        redirect_fallback_pass,
        /// Frames that are not RoCE (not IP, not UDP, another port), passed to the kernel.
        pass_not_roce,
        /// IP fragments, which are never RoCE, passed to the kernel.
        pass_fragment,
        /// RoCE packets for QPs that are not ours, passed to the kernel.
        pass_foreign_qp,
        /// RoCE packets for QPs that are not ours, dropped because the program was loaded with --drop-foreign.
        drop_foreign_qp,
        /// RoCE packets that arrived with ECN Congestion Experienced.
        ecn_ce,
        /// RoCE v2 congestion notification packets (opcode 0x81).
        cnp,
    }
    drops {
        /// RoCE port, but the UDP length is shorter than a UDP header or longer than the frame.
        UdpLength = 1 => drop_udp_length,
        /// RoCE port, but the UDP payload is too short to hold a BTH and an ICRC.
        BthTruncated = 2 => drop_bth_truncated,
        /// The BTH transport version is not 0.
        BadTver = 3 => drop_bad_tver,
        /// The opcode is not one of RC, UC, UD or CNP known to roce-xdp.
        UnknownOpcode = 4 => drop_unknown_opcode,
        /// The UDP payload is too short for the opcode's headers, pad and ICRC.
        HdrTruncated = 5 => drop_hdr_truncated,
        /// Destination QP 0, which RoCE never uses.
        ReservedQpn = 6 => drop_reserved_qpn,
        /// The UDP payload is not whole 32-bit words (IBA 9.3: payload and pad fill words).
        BadLength = 7 => drop_bad_length,
        /// Bytes after the headers of an opcode that carries no payload (ACK, READ request, atomic, CNP).
        UnexpectedPayload = 8 => drop_unexpected_payload,
    }
}

// Counters kept by user space (transport, device, AF_XDP). They live here, next to the XDP
// counters, because the eBPF object declares the pinned maps the engine writes them into:
// their BTF gives bpftool the same field names that `roce stats` prints.

counter_struct! {
    /// Counters of one queue pair.
    pub struct QpCounters {
        /// rxe: packets sent by this QP (requests and responses).
        sent_pkts,
        /// rxe: packets received for this QP that passed the header checks.
        rcvd_pkts,
        /// rxe/mlx5: duplicate requests received (PSN before the expected one).
        duplicate_request,
        /// rxe: requests received after a PSN gap (NAK sequence error sent once per gap).
        out_of_seq_request,
        /// mlx5: same event as out_of_seq_request.
        out_of_sequence,
        /// rxe: ACKs (or NAKs) not sent on their own because a newer answer that implies them took their place in the full control queue (a cumulative ACK, or a NAK, which acknowledges every request before its PSN).
        ack_deferred,
        /// rxe: RNR NAKs received by the requester.
        rcvd_rnr_err,
        /// rxe: RNR NAKs sent by the responder (no receive WQE).
        send_rnr_err,
        /// mlx5: same event as send_rnr_err (receive queue empty).
        out_of_buffer,
        /// rxe: NAK sequence errors received by the requester.
        rcvd_seq_err,
        /// mlx5: same event as rcvd_seq_err.
        packet_seq_err,
        /// mlx5: READ/ATOMIC responses missing (implied NAK), requester went back.
        implied_nak_seq_err,
        /// mlx5: local ACK timeouts.
        local_ack_timeout_err,
        /// rxe: retries started by the completer (timeout, NAK or implied NAK).
        completer_retry_err,
        /// rxe: work requests failed with retry exceeded.
        retry_exceeded_err,
        /// mlx5: same event as retry_exceeded_err.
        req_transport_retries_exceeded,
        /// rxe: work requests failed with RNR retry exceeded.
        retry_rnr_exceeded_err,
        /// mlx5: same event as retry_rnr_exceeded_err.
        rnr_nak_retry_err,
        /// mlx5: same event as retry_rnr_exceeded_err (requester side).
        req_rnr_retries_exceeded,
        /// rxe: requests that could not be sent (local errors).
        send_err,
        /// rxe: SEND work requests completed by the requester, not counting flushed ones.
        rdma_sends,
        /// rxe: receive work requests completed successfully (SEND, WRITE with immediate).
        rdma_recvs,
        /// mlx5: RDMA WRITE requests received.
        rx_write_requests,
        /// mlx5: RDMA READ requests received.
        rx_read_requests,
        /// mlx5: atomic requests received.
        rx_atomic_requests,
        /// mlx5: responder local length errors (message longer than the receive WQE).
        resp_local_length_error,
        /// mlx5: responder completions with an error.
        resp_cqe_error,
        /// mlx5: requester completions with an error.
        req_cqe_error,
        /// mlx5: NAK invalid request received.
        req_remote_invalid_request,
        /// mlx5: NAK remote access error received.
        req_remote_access_errors,
        /// mlx5: remote access errors detected as responder (NAK sent).
        resp_remote_access_errors,
        /// roce-xdp: invalid requests detected as responder (NAK invalid request sent, QP to error).
        resp_invalid_request,
        /// mlx5: receive WRs flushed.
        resp_cqe_flush_error,
        /// mlx5: send WRs flushed.
        req_cqe_flush_error,
        /// roce-xdp: packets dropped by the QP (wrong state, ghost responses, malformed).
        rx_dropped,
        /// roce-xdp: completions lost because the CQ was full.
        cq_overflow,
        /// roce-xdp: control responses dropped because the bounded queue was full and they could not take the place of a queued one (a NAK for a PSN before the newest queued answer; the responder never makes one).
        ack_queue_full,
        /// roce-xdp: READ/atomic responder resources given up for a newer request while their responses were still going out (full ring; rxe overwrites too).
        rd_atomic_evicted,
        /// roce-xdp: UC messages the responder dropped whole, silently (IBA 9.7.5.1: a PSN gap, a missing FIRST or LAST, no receive WQE, a length or R_Key error); it resumes at the next FIRST or ONLY packet.
        uc_msg_dropped,
        /// mlx5: received RoCE packets marked ECN CE.
        np_ecn_marked_roce_packets,
        /// roce-xdp: RoCE payload bytes the QP sent (SEND and WRITE data, READ responses, retransmissions included).
        tx_payload_bytes,
        /// roce-xdp: RoCE payload bytes the QP received on its path (duplicates included).
        rx_payload_bytes,
        /// roce-xdp multipath (docs/multipath.md): ACKs with a SACK trailer the requester took in.
        sack_received,
        /// roce-xdp multipath: request packets resent by selective repeat (only what no ACK or SACK covered).
        selective_retransmits,
        /// roce-xdp multipath: packets placed while a PSN before them was missing (request packets at the responder, READ response packets at the requester).
        ooo_placed,
        /// roce-xdp multipath: packets beyond the responder's reassembly window, dropped (the requester resends them).
        ooo_dropped_window,
        /// roce-xdp multipath: entropies (UDP source ports) the QP stopped spraying on because one of their packets was lost (a request, or a READ response its requester asked for again).
        entropy_retired,
        /// roce-xdp: retransmission timeouts found spurious: after the replay the responder re-acknowledged a replayed request as a duplicate, so the original had arrived (RFC 3708's duplicate reports used as Eifel does, RFC 3522); the timeout's rate or window cut is undone.
        spurious_timeouts,
    }
}

counter_struct! {
    /// Congestion-control counters of one QP (or summed over QPs), under their mlx5 names
    /// (drivers/infiniband/hw/mlx5/counters.c `cong` counters). Kept by `roce::cc`.
    pub struct CcStats {
        /// RoCE packets received with ECN Congestion Experienced (NP).
        np_ecn_marked_roce_packets,
        /// CNPs sent (NP).
        np_cnp_sent,
        /// CNPs received and acted on: each cut the rate (RP).
        rp_cnp_handled,
        /// CNPs received and not acted on: within rate_reduce_monitor_period of the last cut, or RP disabled.
        rp_cnp_ignored,
        /// roce-xdp: losses (a retry, a replayed READ) that cut the rate as a CNP does (loss_backoff).
        rp_loss_handled,
        /// roce-xdp: losses not acted on: within rate_reduce_monitor_period of the last cut, RP or loss_backoff off.
        rp_loss_ignored,
        /// roce-xdp: loss cuts undone because the retransmission timeout that made them proved spurious (spurious_timeouts), with no other cut since.
        rp_loss_undone,
        /// roce-xdp: rate increase events not counted (hold_when_idle): a timer period in which the QP sent under half its rate with no frame held by the pacer (the timer then stops until it sends), and byte counter events after it.
        rp_increase_held,
        /// roce-xdp: ACK-eliciting probes a READ responder sent to clock its responses (loss_backoff): zero-length RDMA WRITEs duplicating the last acknowledged PSN, after every 32 READ responses (every eighth of the window, at least 4, once a loss has shrunk it).
        rp_probe_sent,
        /// roce-xdp: probes the peer answered (each frees the window behind it and grows it a little).
        rp_probe_answered,
        /// roce-xdp: probes unanswered for 100 ms, counted lost: each halves the window, once per window; the first probe lost before the peer ever answered one turns the clock off for the QP, and once the peer has answered, 300 ms without an answer turns it off.
        rp_probe_lost,
        /// roce-xdp Swift: RTT samples taken from ACK timing and fed to the window.
        swift_rtt_samples,
        /// roce-xdp Swift: acknowledgements that gave no RTT sample because their packet was retransmitted (Karn's rule).
        swift_rtt_skipped,
        /// roce-xdp Swift: window cuts for an RTT over the target delay.
        swift_delay_decreases,
        /// roce-xdp Swift: window cuts for a loss (a NAK's retry or the retransmission timeout).
        swift_loss_decreases,
        /// roce-xdp Swift: timeout cuts undone because the timeout proved spurious (spurious_timeouts), with no other cut since.
        swift_loss_undone,
        /// roce-xdp Swift: cuts not made because the window was already cut within the last RTT, or the delay had not stayed over the target for swift_persist.
        swift_decreases_held,
    }
}

counter_struct! {
    /// Counters of a listening endpoint's out-of-band connection setup (the perftest or
    /// ibv_rc_pingpong TCP exchange).
    pub struct CmStats {
        /// roce-xdp: TCP connections accepted while waiting for a client.
        cm_accepted,
        /// roce-xdp: connections refused because their exchange failed (malformed, old version, closed, timed out).
        cm_refused,
    }
}

counter_struct! {
    /// Counters of a device that no single QP owns.
    pub struct DeviceCounters {
        /// rxe: frames received (all, before QP lookup).
        rcvd_pkts,
        /// rxe: frames sent.
        sent_pkts,
        /// roce-xdp: frames that did not parse (truncated, bad ICRC, not RoCE).
        rx_malformed,
        /// roce-xdp: frames for a QP number that does not exist.
        rx_unknown_qp,
        /// roce-xdp: frames that arrived on an RX queue whose transport does not own their QP (sharded devices) and were handed to the owner's.
        rx_other_queue,
        /// roce-xdp: frames for another RX queue's QP (sharded devices) lost because that queue's bounded hand-over ring was full (or the frame longer than a ring slot); the peer retransmits them.
        rx_other_queue_dropped,
        /// IB port counter name: P_Key mismatches.
        bad_pkey_cntr,
        /// IB port counter name: Q_Key violations (UD).
        qkey_viol_cntr,
        /// roce-xdp: asynchronous events lost because the bounded event queue was full.
        events_lost,
        /// roce-xdp: ACKs not sent because a later cumulative ACK of the same receive batch stands for them (IBA 9.7.5.1 coalesced acknowledgements; at most 8 requests per ACK; DeviceConfig::coalesce_acks).
        ack_coalesced,
    }
}

counter_struct! {
    /// Counters of one AF_XDP queue. `rx_dropped`, `rx_invalid_descs`, `tx_invalid_descs`,
    /// `rx_ring_full`, `fill_ring_empty` and `tx_ring_empty_descs` are read from the socket
    /// (`getsockopt(SOL_XDP, XDP_STATISTICS)`, Linux `struct xdp_statistics`); the rest are
    /// counted here.
    pub struct XskStats {
        /// Frames taken from the RX ring.
        rx_packets,
        /// Bytes of the frames taken from the RX ring.
        rx_bytes,
        /// Frames placed on the TX ring.
        tx_packets,
        /// Bytes of the frames placed on the TX ring.
        tx_bytes,
        /// Transmitted frames returned on the completion ring.
        tx_completed,
        /// Frames the kernel dropped before the RX ring: RX ring full or no fill frame (kernel rx_dropped).
        rx_dropped,
        /// RX descriptors the kernel found invalid (kernel rx_invalid_descs).
        rx_invalid_descs,
        /// TX descriptors the kernel found invalid (kernel tx_invalid_descs).
        tx_invalid_descs,
        /// Frames the kernel dropped because the RX ring was full (kernel rx_ring_full).
        rx_ring_full,
        /// Times the kernel found the fill ring empty (kernel rx_fill_ring_empty_descs).
        fill_ring_empty,
        /// Times the kernel found the TX ring empty when woken (kernel tx_ring_empty_descs).
        tx_ring_empty_descs,
        /// Flushes that found the TX ring without room for every queued frame.
        tx_ring_full,
        /// Frames the handler forwarded that were dropped because the transmit backlog was full.
        tx_dropped,
        /// Sends refused to the handler because the backlog was full or no frame was free.
        tx_backpressure,
        /// Refills that found the free pool empty while the fill ring had room.
        fill_pool_empty,
        /// RX descriptors the kernel never gives (an address not lent to it, a length past the frame, a packet shorter than its head stamp): ignored.
        bad_ring_addr,
        /// sendto() kicks of the TX ring because the kernel set need_wakeup.
        tx_kicks,
        /// poll() wakeups of the fill ring because the kernel set need_wakeup.
        fill_kicks,
        /// Received packets that came in more than one descriptor (multi-buffer, `XDP_PKT_CONTD`) and were joined.
        rx_multi_buffer,
        /// Received multi-buffer packets longer than the reassembly buffer, dropped.
        rx_oversize,
        /// Transmitted packets longer than a frame, split over several descriptors (multi-buffer).
        tx_multi_buffer,
        /// Received packets without an arrival stamp from roce_xdp in front of them (metadata unsupported by the driver, or another program): their arrival time is when user space took them.
        rx_no_stamp,
        /// Received packets whose arrival time roce_xdp did not read (`stamp::UNTIMED`: requests without a CE mark, whose arrival the transport does not use); they take the time user space took them.
        rx_untimed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes_are_consistent() {
        assert_eq!(XdpStats::NAMES.len(), XdpStats::HELP.len());
        for r in DropReason::ALL {
            assert_eq!(DropReason::from_code(*r as u8), Some(*r));
            assert!(XdpStats::NAMES.contains(&r.counter_name()));
            let mut s = XdpStats::default();
            s.count_drop(*r);
            assert_eq!(s.get(r.counter_name()), Some(1));
            assert_eq!(s.values().iter().sum::<u64>(), 1);
        }
        assert_eq!(DropReason::from_code(0), None);
    }

    #[test]
    fn add_and_delta() {
        let mut a = XdpStats {
            rx_packets: 3,
            ..Default::default()
        };
        let b = XdpStats {
            rx_packets: 4,
            cnp: 1,
            ..Default::default()
        };
        a.add(&b);
        assert_eq!(a.rx_packets, 7);
        assert_eq!(a.saturating_sub(&b).rx_packets, 3);
        assert_eq!(a.saturating_sub(&b).cnp, 0);
        assert_eq!(core::mem::size_of::<XdpStats>(), 8 * XdpStats::COUNT);
    }
}
