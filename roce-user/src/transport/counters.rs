//! Transport counters, per QP and per device, under the names operators know: rxe's
//! (`rxe_hw_counters.c`) and mlx5's (`mlx5/counters.c`), see reference/roce-v2.md §5.
//!
//! Some events have a name in both drivers (rxe `out_of_seq_request`, mlx5 `out_of_sequence`);
//! both are kept so dashboards written for either keep working. The device struct holds the
//! per-device events ([`crate::transport::Device::device_counters`]); the sum of every QP's
//! counters is [`crate::transport::Device::qp_counters`].

roce_common::counter_struct! {
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
        /// rxe: ACKs not sent on their own because a newer cumulative ACK replaced them.
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
        /// rxe: RDMA operations (WRITE/READ/atomic) sent.
        rdma_sends,
        /// rxe: RDMA operations (WRITE/READ/atomic) executed as responder.
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
        /// mlx5: receive WRs flushed.
        resp_cqe_flush_error,
        /// mlx5: send WRs flushed.
        req_cqe_flush_error,
        /// roce-xdp: packets dropped by the QP (wrong state, ghost responses, malformed).
        rx_dropped,
        /// roce-xdp: completions lost because the CQ was full.
        cq_overflow,
        /// roce-xdp: control responses (ACK/NAK) dropped because the bounded queue was full.
        ack_queue_full,
        /// mlx5: received RoCE packets marked ECN CE.
        np_ecn_marked_roce_packets,
    }
}

roce_common::counter_struct! {
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
        /// IB port counter name: P_Key mismatches.
        bad_pkey_cntr,
        /// IB port counter name: Q_Key violations (UD).
        qkey_viol_cntr,
        /// roce-xdp: asynchronous events lost because the bounded event queue was full.
        events_lost,
    }
}
