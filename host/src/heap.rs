//! The process heap as jemalloc (the host's allocator, for RocksDB and librdkafka too) sees it:
//! what is allocated beside what the process holds, so that memory outside the state layer's own
//! accounting (client queues, caches above their charge, pages the allocator keeps) shows.

/// jemalloc's counters, refreshed at each call.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct HeapReport {
    /// Bytes the process has allocated and not freed.
    pub allocated: u64,
    /// Bytes in pages with allocations on them (`allocated` plus fragmentation).
    pub active: u64,
    /// Bytes of physical memory the allocator holds: `active`, its metadata and freed pages it
    /// has not handed back yet.
    pub resident: u64,
    /// Bytes of the allocator's mappings.
    pub mapped: u64,
    /// Bytes of mappings the allocator keeps without physical memory.
    pub retained: u64,
}

/// The heap now, or `None` when the process does not run on jemalloc with statistics (a test
/// binary with the system allocator, say).
pub fn report() -> Option<HeapReport> {
    use tikv_jemalloc_ctl::{epoch, stats};
    epoch::advance().ok()?;
    let r = HeapReport {
        allocated: stats::allocated::read().ok()? as u64,
        active: stats::active::read().ok()? as u64,
        resident: stats::resident::read().ok()? as u64,
        mapped: stats::mapped::read().ok()? as u64,
        retained: stats::retained::read().ok()? as u64,
    };
    (r.resident > 0).then_some(r)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_heap_counts_what_is_allocated() {
        // Test binaries link jemalloc (unprefixed, so it is malloc) with statistics on.
        let before = super::report().expect("jemalloc statistics").allocated;
        let block = vec![1u8; 64 << 20];
        let during = super::report().unwrap();
        assert!(
            during.allocated >= before + (60 << 20),
            "{before} -> {during:?}"
        );
        assert!(during.resident >= during.active && during.active >= during.allocated);
        drop(block);
        let after = super::report().unwrap().allocated;
        assert!(
            after + (60 << 20) <= during.allocated,
            "{during:?} -> {after}"
        );
    }
}
