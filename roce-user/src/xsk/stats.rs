//! Per-queue AF_XDP counters: user-space ring events and the kernel's `XDP_STATISTICS`.

roce_common::counter_struct! {
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
        /// Descriptors whose address was not a frame lent to the kernel (ignored).
        bad_ring_addr,
        /// sendto() kicks of the TX ring because the kernel set need_wakeup.
        tx_kicks,
        /// poll() wakeups of the fill ring because the kernel set need_wakeup.
        fill_kicks,
    }
}
