//! Counter snapshots and their rendering.
