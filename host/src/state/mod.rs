//! Partition state: one RocksDB instance per partition, a column family per store, keys
//! prefixed by slot, and the batch overlay that gives processors read-your-writes. Knows nothing
//! of wasmtime or of the transport.
//!
//! Layout of one partition's database:
//! - column family `s.<store>` per declared store: key = slot (u32 big-endian) ‖ user key;
//! - column family `_meta`: `in/<topic>/<slot>` = next input offset (u64 BE), `seq` = number of
//!   committed batches (u64 BE), `outbox` = outputs of the last batch not yet known to be in the
//!   log (see the task module).
//!
//! Memory is bounded per host, not per partition: every database of a host shares one block
//! cache (index and filter blocks charged to it) and one write-buffer manager charged to the same
//! cache, sized by `--state-memory`. RocksDB's info logs are capped.

pub mod checkpoint;
mod overlay;

pub use overlay::{HotBudget, Overlay, WriteOp, WriteRef, Writes};

use std::sync::Arc;

use std::path::{Path, PathBuf};

use rocksdb::statistics::{StatsLevel, Ticker};
use rocksdb::{
    BlockBasedIndexType, BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, LogLevel, Options,
    WriteBatch, WriteBufferManager,
};

/// The column family of partition metadata.
pub const META_CF: &str = "_meta";

/// Errors of the state layer.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// RocksDB failed.
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    /// A stored value does not have the expected shape.
    #[error("corrupt state: {0}")]
    Corrupt(String),
    /// A failure armed by [`Faults`] (tests only).
    #[error("injected state fault: {0}")]
    Injected(&'static str),
}

/// Fault injection at the state layer, for tests of the host's failure handling: each counter
/// arms that many faults on the next reads of the partition. Never armed in production.
#[derive(Default)]
pub struct Faults {
    read_errors: std::sync::atomic::AtomicU32,
    read_panics: std::sync::atomic::AtomicU32,
}

impl Faults {
    /// The next `n` reads fail with an I/O-like error.
    pub fn fail_reads(&self, n: u32) {
        self.read_errors
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// The next `n` reads panic.
    pub fn panic_reads(&self, n: u32) {
        self.read_panics
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    fn take(counter: &std::sync::atomic::AtomicU32) -> bool {
        use std::sync::atomic::Ordering;
        counter.load(Ordering::Relaxed) > 0
            && counter
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
    }

    /// Called by every read: fails or panics when armed.
    fn on_read(&self) -> Result<()> {
        if Self::take(&self.read_panics) {
            panic!("injected panic in a state read");
        }
        if Self::take(&self.read_errors) {
            return Err(StateError::Injected("state read failed"));
        }
        Ok(())
    }
}

/// A result of the state layer.
pub type Result<T> = std::result::Result<T, StateError>;

/// What all partitions of one host share: the block cache and the write-buffer manager.
pub struct StateEnv {
    cache: Cache,
    /// The partitions' hot-key caches: an eighth of `memory`, the block cache the rest.
    hot: Arc<overlay::HotBudget>,
    write_buffers: WriteBufferManager,
    memory: usize,
    /// Bytes of the block cache (what `memory` leaves after the hot-key caches).
    cache_capacity: usize,
    /// The block cache's capacity now: `cache_capacity`, less what the rest of the heap holds
    /// over [`HEAP_BESIDE_STATE`] ([`StateEnv::fit_cache_to_heap`]).
    cache_now: std::sync::atomic::AtomicUsize,
    /// Database options shared by every partition; their copies share one statistics object,
    /// so block-cache hits and misses are counted per host.
    db_options: Options,
    /// The partition databases open through [`StateEnv::open_shared`], by path: RocksDB locks
    /// a database to one opener, so a partition that starts again while its old database is
    /// still held (by a query in flight, say) gets that one.
    open: parking_lot::Mutex<std::collections::HashMap<PathBuf, std::sync::Weak<PartitionDb>>>,
    /// Where partitions are checkpointed, and restored from when a host has no database of
    /// theirs.
    checkpoints: std::sync::OnceLock<Arc<checkpoint::CheckpointStore>>,
}

/// Block-cache counters of a host since it started.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct CacheStats {
    /// Block reads served from the cache.
    pub hits: u64,
    /// Block reads that went to disk.
    pub misses: u64,
    /// `hits / (hits + misses)`, or `None` before the first block read.
    pub hit_rate: Option<f64>,
    /// Of the misses: index blocks (partitions of the index included).
    pub index_misses: u64,
    /// Of the misses: filter blocks (partitions of the filters included).
    pub filter_misses: u64,
    /// Of the misses: data blocks.
    pub data_misses: u64,
}

/// What the RocksDB memory of a host holds and how its databases keep up, as
/// `GET /api/v1/host` shows it under `state_memory` and `/metrics` exports it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MemoryReport {
    /// The `--state-memory` bound: block cache, memtables and hot-key caches together.
    pub bound: usize,
    /// Bytes the shared block cache holds (memtable reservations included).
    pub block_cache_usage: usize,
    /// Bytes of the cache pinned by live readers and pinned metadata.
    pub block_cache_pinned: usize,
    /// Bytes of memtables across all partitions.
    pub memtable_usage: usize,
    /// The block cache's capacity now: less than its share of the bound while the rest of the
    /// heap holds more than [`HEAP_BESIDE_STATE`].
    pub block_cache_capacity: usize,
    /// Bytes the partitions' hot-key caches hold.
    pub hot_cache_usage: usize,
    /// Bytes of index and filter blocks in the block cache (partitions and top levels), from
    /// RocksDB's last scan of the cache (at most a minute old).
    pub index_filter_bytes: u64,
    /// Bytes of table readers outside the block cache, over every partition.
    pub table_readers_bytes: u64,
    /// Compaction debt: bytes RocksDB estimates it must rewrite to bring every level within
    /// its target size, over every partition.
    pub pending_compaction_bytes: u64,
    /// Microseconds writes were stalled or slowed by RocksDB since the host started.
    pub write_stall_micros: u64,
    /// Block-cache hits and misses.
    pub block_cache: CacheStats,
}

impl StateEnv {
    /// A state environment bounded to `memory` bytes of block cache and memtables together.
    pub fn new(memory: usize) -> Self {
        let memory = memory.max(16 << 20);
        let hot = overlay::HotBudget::new(memory / 8);
        let cache_capacity = memory - memory / 8;
        // HyperClockCache: a lookup is a few atomic operations on a lock-free table. The LRU
        // cache's lookups (a mutex per shard, a chained hash table, the LRU list's relinking)
        // were 12% of a partition thread at 10M keys, where every record's batched lookup
        // walks the cache for filter, index and data blocks of several SST files. Its shards
        // are at least 32 MiB, so that a metadata block is never large beside its shard.
        let cache = Cache::new_hyper_clock_cache(cache_capacity, 0);
        // Memtables are charged to the cache, so both stay within `memory`; a quarter may be
        // memtables before RocksDB flushes.
        let write_buffers = WriteBufferManager::new_write_buffer_manager_with_cache(
            memory / 4,
            false,
            cache.clone(),
        );
        let db_options = Self::make_db_options(&write_buffers);
        StateEnv {
            cache,
            hot,
            write_buffers,
            memory,
            cache_capacity,
            cache_now: std::sync::atomic::AtomicUsize::new(cache_capacity),
            db_options,
            open: Default::default(),
            checkpoints: Default::default(),
        }
    }

    /// Block-cache hits and misses of every partition of the host.
    pub fn cache_stats(&self) -> CacheStats {
        let tick = |t| self.db_options.get_ticker_count(t);
        let hits = tick(Ticker::BlockCacheHit);
        let misses = tick(Ticker::BlockCacheMiss);
        let total = hits + misses;
        CacheStats {
            hits,
            misses,
            hit_rate: (total > 0).then(|| hits as f64 / total as f64),
            index_misses: tick(Ticker::BlockCacheIndexMiss),
            filter_misses: tick(Ticker::BlockCacheFilterMiss),
            data_misses: tick(Ticker::BlockCacheDataMiss),
        }
    }

    /// The host's RocksDB memory and how its databases keep up.
    pub fn report(&self) -> MemoryReport {
        let open: Vec<Arc<PartitionDb>> = self
            .open
            .lock()
            .values()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        let sum = |prop: &str| -> u64 { open.iter().map(|db| db.property_sum(prop)).sum() };
        // The cache is shared, so any database's scan of it covers every partition.
        let index_filter_bytes = open
            .first()
            .and_then(|db| {
                // Asked of a column family of ours: the default column family has a cache of
                // its own.
                let cf = db.meta().ok()?;
                db.db
                    .property_value_cf(cf, "rocksdb.block-cache-entry-stats")
                    .ok()
                    .flatten()
            })
            .map(|text| {
                // Portions are of the capacity in force when the cache was scanned.
                cache_role_bytes(
                    &text,
                    self.cache_capacity_now(),
                    &["IndexBlock", "FilterBlock", "FilterMetaBlock"],
                )
            })
            .unwrap_or(0);
        MemoryReport {
            bound: self.memory,
            block_cache_usage: self.cache_usage(),
            block_cache_pinned: self.cache_pinned(),
            memtable_usage: self.memtable_usage(),
            block_cache_capacity: self.cache_capacity_now(),
            hot_cache_usage: self.hot_usage(),
            index_filter_bytes,
            table_readers_bytes: sum("rocksdb.estimate-table-readers-mem"),
            pending_compaction_bytes: sum("rocksdb.estimate-pending-compaction-bytes"),
            write_stall_micros: self.db_options.get_ticker_count(Ticker::StallMicros),
            block_cache: self.cache_stats(),
        }
    }

    /// Gives the block cache what the rest of the heap leaves it: of the `resident` bytes
    /// (jemalloc's count of the heap's physical memory, for the whole process), what neither
    /// the cache nor the hot-key caches hold is the host's other memory (Kafka clients' queues,
    /// batches in flight, Wasm instances, compactions' buffers, freed pages not yet handed
    /// back). Past [`HEAP_BESIDE_STATE`] plus [`HEAP_PER_PARTITION`]
    /// per open partition, the cache shrinks by as much, and grows back as it falls, so that the process stays within `--state-memory` plus
    /// a fixed allowance however many partitions it runs; never below half its capacity. Returns
    /// the capacity in force.
    pub fn fit_cache_to_heap(&self, resident: usize) -> usize {
        use std::sync::atomic::Ordering::Relaxed;
        let partitions = self
            .open
            .lock()
            .values()
            .filter(|db| db.strong_count() > 0)
            .count();
        let target = cache_capacity_for(
            self.cache_capacity,
            resident,
            self.cache.get_usage(),
            self.hot.used(),
            partitions,
        );
        let now = self.cache_now.load(Relaxed);
        // Small changes are not made, but the full share and the floor are always reached.
        let edge = target == self.cache_capacity || target == self.cache_capacity / 2;
        if target == now || (target.abs_diff(now) < CACHE_STEP && !edge) {
            return now;
        }
        self.cache.clone().set_capacity(target);
        self.cache_now.store(target, Relaxed);
        if target < now {
            tracing::debug!(
                capacity_mib = target >> 20,
                "the block cache gives way to the rest of the heap"
            );
        }
        target
    }

    /// The block cache's capacity now ([`StateEnv::fit_cache_to_heap`]).
    pub fn cache_capacity_now(&self) -> usize {
        self.cache_now.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The configured bound in bytes.
    pub fn memory(&self) -> usize {
        self.memory
    }

    /// Bytes the shared block cache holds now (memtable reservations included).
    pub fn cache_usage(&self) -> usize {
        self.cache.get_usage()
    }

    /// Bytes of the cache pinned by live readers.
    pub fn cache_pinned(&self) -> usize {
        self.cache.get_pinned_usage()
    }

    /// Bytes the partitions' hot-key caches hold.
    pub fn hot_usage(&self) -> usize {
        self.hot.used()
    }

    /// Bytes of memtables across all partitions.
    pub fn memtable_usage(&self) -> usize {
        self.write_buffers.get_usage()
    }

    fn make_db_options(write_buffers: &WriteBufferManager) -> Options {
        let mut o = Options::default();
        // Counters only: timers cost more than they are worth here.
        o.enable_statistics();
        o.set_statistics_level(StatsLevel::ExceptTimers);
        o.create_if_missing(true);
        o.create_missing_column_families(true);
        o.set_write_buffer_manager(write_buffers);
        o.set_max_background_jobs(2);
        o.set_max_open_files(256);
        o.set_log_level(LogLevel::Warn);
        o.set_max_log_file_size(1 << 20);
        o.set_keep_log_file_num(2);
        o.set_recycle_log_file_num(2);
        o.set_max_total_wal_size(64 << 20);
        // Data and offsets live in different column families: flush them together so that they
        // never drift apart on disk.
        o.set_atomic_flush(true);
        o
    }

    fn cf_options(&self) -> Options {
        let mut b = BlockBasedOptions::default();
        b.set_block_cache(&self.cache);
        // The index in partitions, each a block of the cache like a data block, under a small
        // top level that stays pinned. A whole index is one block per SST file: at millions of
        // keys it is megabytes, and once such blocks outgrow their share of the cache every
        // lookup reads, checksums and drops one (the collapse of a partition with 12M keys to
        // 136 records/s).
        b.set_index_type(BlockBasedIndexType::TwoLevelIndexSearch);
        b.set_cache_index_and_filter_blocks(true);
        b.set_cache_index_and_filter_blocks_with_high_priority(true);
        b.set_pin_top_level_index_and_filter(true);
        // Every partition of the index is pinned in the cache while its file is open (still
        // charged to the cache, so `--state-memory` holds): a lookup finds the partition it
        // needs through the table reader, without a cache lookup, and never reads one from disk.
        b.set_partition_pinning_tier(rocksdb::BlockBasedTablePinningTier::All);
        // Partitions of 64 KiB rather than 4 KiB: the top level that every lookup of every file
        // searches first is a sixteenth the size, and stays in the CPU's caches.
        b.set_metadata_block_size(64 << 10);
        // A filter whole per SST file, pinned while the file is open: read once when the file
        // opens, never dropped by the cache, so the collapse above (whole filters read again on
        // every lookup once the cache dropped them) cannot come back. Partitioned filters made
        // every lookup of every file first search the filters' top level (a binary search of
        // key comparisons) for the one partition to probe: at 10M keys that was 9% of a
        // partition thread, more than the probe itself. A file's filter is about 1.2 bytes per
        // key (2-3 MiB for a file of the default 64 MiB), the same bytes as its partitions,
        // still charged to the cache.
        b.set_partition_filters(false);
        b.set_unpartitioned_pinning_tier(rocksdb::BlockBasedTablePinningTier::All);
        // Data blocks stay at 4 KiB. Blocks of 16 KiB ran 10M keys per partition (all in the
        // cache) 15% faster, with a quarter of the index entries, but 50M keys per host (twice
        // the cache) 20% slower: every block the cache does not hold is read and checksummed
        // whole for one key.
        b.set_bloom_filter(10.0, false);
        b.set_optimize_filters_for_memory(true);
        // A hash index in each data block: a point lookup finds its key without a binary search
        // over the block's restart points (RocksDB's figure: about 10% less CPU per lookup).
        b.set_data_block_index_type(rocksdb::DataBlockIndexType::BinaryAndHash);
        b.set_data_block_hash_ratio(0.75);
        let mut o = Options::default();
        o.set_block_based_table_factory(&b);
        o.set_write_buffer_size(16 << 20);
        // A memtable holds at least one arena block even when nearly empty; RocksDB's default
        // block (an eighth of the write buffer, 2 MiB here) times three column families times
        // 64 partitions would be 384 MiB of memtables before a single write. Small blocks keep
        // that floor per partition negligible, so the write-buffer manager's bound holds.
        o.set_arena_block_size(64 << 10);
        // No memtable bloom filter here: RocksDB allocates it whole with each memtable, a floor
        // per column family that 64 idle partitions would turn into tens of MiB of empty
        // filters. A partition that has written a lot gets one (`count_written`).
        o
    }

    /// Sets the checkpoint store (once, before any partition opens).
    pub fn set_checkpoints(&self, store: Arc<checkpoint::CheckpointStore>) {
        if self.checkpoints.set(store).is_err() {
            tracing::error!("the checkpoint store was set twice; the first one stays");
        }
    }

    /// The checkpoint store, if one is set.
    pub fn checkpoints(&self) -> Option<&Arc<checkpoint::CheckpointStore>> {
        self.checkpoints.get()
    }

    /// [`StateEnv::open_shared`] for partition `p`: where this host has no database of it yet,
    /// the directory is first filled from its newest valid checkpoint, if the store has one
    /// (what was restored is returned). A store that fails is logged, and the database starts
    /// empty: the changelogs restore it then.
    pub fn open_partition_db(
        &self,
        path: &Path,
        stores: &[String],
        p: &checkpoint::PartitionRef,
    ) -> Result<(Arc<PartitionDb>, Option<checkpoint::Restored>)> {
        let held = self
            .open
            .lock()
            .get(path)
            .is_some_and(|w| w.strong_count() > 0);
        let mut restored = None;
        if !held
            && !path.join("CURRENT").exists()
            && let Some(store) = self.checkpoints.get()
        {
            match store.restore(p, stores, path) {
                Ok(r) => restored = r,
                Err(e) => tracing::warn!(
                    partition = %p.partition,
                    "no restore from a checkpoint: {e}; the changelogs restore it"
                ),
            }
        }
        Ok((self.open_shared(path, stores)?, restored))
    }

    /// The database of a partition at `path`: the one already open there, or opened (or
    /// created) now, with one column family per store.
    pub fn open_shared(&self, path: &Path, stores: &[String]) -> Result<Arc<PartitionDb>> {
        let mut open = self.open.lock();
        open.retain(|_, db| db.strong_count() > 0);
        if let Some(db) = open.get(path).and_then(|w| w.upgrade()) {
            if db.stores != stores {
                return Err(StateError::Corrupt(format!(
                    "{}: open with stores {:?}, asked for {:?}",
                    path.display(),
                    db.stores,
                    stores
                )));
            }
            return Ok(db);
        }
        let db = Arc::new(self.open_partition(path, stores)?);
        open.insert(path.to_path_buf(), Arc::downgrade(&db));
        Ok(db)
    }

    /// Opens (or creates) the database of a partition at `path` with one column family per store.
    pub fn open_partition(&self, path: &Path, stores: &[String]) -> Result<PartitionDb> {
        std::fs::create_dir_all(path)
            .map_err(|e| StateError::Corrupt(format!("{}: {e}", path.display())))?;
        let mut cfs = vec![ColumnFamilyDescriptor::new(META_CF, self.cf_options())];
        for s in stores {
            cfs.push(ColumnFamilyDescriptor::new(store_cf(s), self.cf_options()));
        }
        let db = DB::open_cf_descriptors(&self.db_options, path, cfs)?;
        Ok(PartitionDb {
            db,
            faults: Faults::default(),
            stores: stores.to_vec(),
            cf_names: stores.iter().map(|s| store_cf(s)).collect(),
            path: path.to_path_buf(),
            hot: self.hot.clone(),
            written: Default::default(),
            memtable_filters: Default::default(),
            level0_slowdown: std::sync::atomic::AtomicU64::new(20),
            wal_checkpoints: Default::default(),
            store_options: self.cf_options(),
            ingested: Default::default(),
        })
    }
}

/// Bytes of the cache entries of `roles` in RocksDB's `block-cache-entry-stats` text, whose
/// second line reads `Block cache entry stats(count,size,portion): DataBlock(12,1.50 MB,0.3%)
/// IndexBlock(...) ...`: the portion (a percentage of `capacity`) is more precise than the size,
/// which is rounded for people.
fn cache_role_bytes(text: &str, capacity: usize, roles: &[&str]) -> u64 {
    let Some(line) = text
        .lines()
        .find(|l| l.starts_with("Block cache entry stats"))
    else {
        return 0;
    };
    let mut bytes = 0u64;
    let mut rest = line;
    while let Some(open) = rest.find('(') {
        let role = rest[..open].rsplit(' ').next().unwrap_or("");
        let Some(close) = rest[open..].find(')') else {
            break;
        };
        let inner = &rest[open + 1..open + close];
        if roles.contains(&role)
            && let Some(pct) = inner
                .rsplit(',')
                .next()
                .and_then(|p| p.trim_end_matches('%').parse::<f64>().ok())
        {
            bytes += (pct / 100.0 * capacity as f64).round() as u64;
        }
        rest = &rest[open + close + 1..];
    }
    bytes
}

fn store_cf(store: &str) -> String {
    format!("s.{store}")
}

/// The key of `user_key` in `slot`: slot (u32 big-endian) ‖ user key.
pub fn slot_key(slot: u32, user_key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + user_key.len());
    k.extend_from_slice(&slot.to_be_bytes());
    k.extend_from_slice(user_key);
    k
}

/// A key of a store whose value differs from another database's: (store id, key, the value
/// there, `None` when it is absent there).
pub type Difference = (usize, Vec<u8>, Option<Vec<u8>>);

/// The database of one partition.
pub struct PartitionDb {
    db: DB,
    faults: Faults,
    stores: Vec<String>,
    /// Column family names by store id, computed once: the hot path must not format strings.
    cf_names: Vec<String>,
    path: PathBuf,
    hot: Arc<overlay::HotBudget>,
    /// Bytes committed since the database opened, until its memtables get filters.
    written: std::sync::atomic::AtomicU64,
    /// Whether the stores' new memtables are built with a bloom filter.
    memtable_filters: std::sync::atomic::AtomicBool,
    /// The stores' level-0 slowdown trigger in their current mode ([`STORE_MODES`]).
    level0_slowdown: std::sync::atomic::AtomicU64,
    /// Checkpoints hold the write-ahead log whether or not a flush would wait (tests).
    wal_checkpoints: std::sync::atomic::AtomicBool,
    /// The stores' options, for the SST files [`PartitionDb::ingest_sorted`] writes.
    store_options: Options,
    /// SST files ingested since the database opened (their names).
    ingested: std::sync::atomic::AtomicU64,
}

/// Where [`PartitionDb::ingest_sorted`] writes its SST files, inside the database's directory
/// (RocksDB ignores what it does not know there).
const INGEST_DIR: &str = "ingest";

/// Level-0 files of a store above which [`PartitionDb::ingest_sorted`] waits for compactions:
/// an ingestion is not held back by RocksDB's write stalls as a write is.
const INGEST_L0_MAX: u64 = 40;

/// Level-0 files of a store that [`PartitionDb::bulk_load`] waits for, at most, when it ends:
/// below the normal mode's slowdown trigger of 20, so that a restore never leaves the files
/// that would slow the writes after it. (A restore at 10M keys with 32 files before a
/// compaction left 31, and the session's first write waited 2.3 s.)
const SETTLED_L0_MAX: u64 = 16;

/// Bytes a partition commits before its stores' memtables get a bloom filter and grow to
/// [`BUSY_WRITE_BUFFER`]: four write buffers, so that a partition that has filled its
/// memtables again and again pays for them and an idle one does not.
const MEMTABLE_FILTERS_AFTER: u64 = 64 << 20;

/// The bloom filter of a memtable, as a fraction of its write buffer: 2% of 64 MiB is 1.3 MiB,
/// about 14 bits per entry of a memtable of small counters, so that a lookup of a key the
/// memtable does not hold skips its skiplist nearly always.
const MEMTABLE_FILTER_RATIO: &str = "0.02";

/// The write buffer of a busy partition's stores (the rest start at 16 MiB). Over millions of
/// keys written at random, each level-0 file overlaps the whole level below, so every
/// level-0 compaction rewrites all of it, and every lookup probes the filter of every level-0
/// file. With memtables four times larger, compactions ran a quarter as often, and at 10M keys
/// a host spent a sixth less CPU per record; the write-buffer manager still bounds the
/// memtables of all partitions together.
const BUSY_WRITE_BUFFER: &str = "67108864";

/// Resident heap a host may hold beside its state before its block cache gives way
/// ([`StateEnv::fit_cache_to_heap`]), plus [`HEAP_PER_PARTITION`] per open partition. The RSS
/// of a host may be `--state-memory` + 256 MiB; about 20 MiB of it is outside the heap (code,
/// stacks), and 20 MiB is kept as a margin.
pub const HEAP_BESIDE_STATE: usize = 216 << 20;

/// Heap each open partition database may add to [`HEAP_BESIDE_STATE`]: its guest instance,
/// Kafka queues and batches in flight at their smallest (64 partitions under
/// `--state-memory 64MiB` hold about 4 MiB each beside the state: the `memory` test).
pub const HEAP_PER_PARTITION: usize = 4 << 20;

/// How often [`fit_cache_to_heap_in_background`] looks at the heap.
const FIT_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Starts a thread that fits the block cache to the heap ([`StateEnv::fit_cache_to_heap`])
/// every [`FIT_EVERY`] while `env` lives: for a process that runs one host, whose heap is that
/// host's alone. Where jemalloc's statistics cannot be read, the cache gets its whole share back
/// and the thread stops.
pub fn fit_cache_to_heap_in_background(env: &Arc<StateEnv>) {
    let env = Arc::downgrade(env);
    let spawned = std::thread::Builder::new()
        .name("baton-memory".into())
        .spawn(move || {
            loop {
                std::thread::sleep(FIT_EVERY);
                let Some(env) = env.upgrade() else { return };
                let Some(heap) = crate::heap::report() else {
                    env.fit_cache_to_heap(0);
                    return;
                };
                env.fit_cache_to_heap(usize::try_from(heap.resident).unwrap_or(usize::MAX));
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("the block cache keeps its capacity whatever the heap holds: {e}");
    }
}

/// Changes of the cache's capacity smaller than this are not made.
const CACHE_STEP: usize = 4 << 20;

/// The block cache's capacity (of at most `full`) when the heap holds `resident` bytes, of
/// which the cache holds `cache` and the hot-key caches `hot`, and `partitions` databases open.
fn cache_capacity_for(
    full: usize,
    resident: usize,
    cache: usize,
    hot: usize,
    partitions: usize,
) -> usize {
    let beside = resident.saturating_sub(cache + hot);
    let over = beside.saturating_sub(HEAP_BESIDE_STATE + partitions * HEAP_PER_PARTITION);
    full.saturating_sub(over).max(full / 2)
}

/// A store's options in its normal mode (RocksDB's defaults) and while a restore bulk-loads it
/// ([`PartitionDb::bulk_load`]): four times as many level-0 files before a compaction.
///
/// A restore writes each key of the changelog once per update, at random over the whole key
/// space, so every level-0 file overlaps all of the next level, and each level-0 compaction
/// rewrites that level whole: at 3M keys, compactions were a quarter of a restore's CPU. One of
/// 16 level-0 files rewrites the level below once where one of 4 rewrote it four times. (Larger
/// memtables did not help: their inserts cost more than the compactions they saved.)
const STORE_MODES: [[(&str, &str); 3]; 2] = [
    [
        ("level0_file_num_compaction_trigger", "4"),
        ("level0_slowdown_writes_trigger", "20"),
        ("level0_stop_writes_trigger", "36"),
    ],
    [
        ("level0_file_num_compaction_trigger", "16"),
        ("level0_slowdown_writes_trigger", "48"),
        ("level0_stop_writes_trigger", "64"),
    ],
];

impl PartitionDb {
    /// Puts the stores in bulk-load mode (`on`) or back in their normal mode: see
    /// [`STORE_MODES`]. A restore that reads a changelog to its end turns it on while it writes.
    /// Turning it off waits (up to a minute) until the stores have at most [`SETTLED_L0_MAX`]
    /// level-0 files; the rest are compacted in the background.
    pub fn bulk_load(&self, on: bool) -> Result<()> {
        for store in 0..self.cf_names.len() {
            let cf = self.cf(store)?;
            self.db.set_options_cf(cf, &STORE_MODES[usize::from(on)])?;
        }
        self.level0_slowdown.store(
            STORE_MODES[usize::from(on)][1].1.parse().unwrap_or(20),
            std::sync::atomic::Ordering::Relaxed,
        );
        if !on {
            for store in 0..self.cf_names.len() {
                self.wait_for_level0(self.cf(store)?, SETTLED_L0_MAX);
            }
        }
        Ok(())
    }

    /// Writes `writes` (sorted by store and key, one write per key) into SST files of their
    /// own, one per store, and ingests them: they go to RocksDB's tree as files, without its
    /// write-ahead log, memtables or flushes. Then `meta` goes in a write of its own.
    ///
    /// For a restore: a changelog's updates come at random over the whole key space, and the
    /// memtable inserts of a restore were most of its partition thread's time. The ingested
    /// files are newer than anything in the database, so they override it, as writes would.
    /// The metadata (the changelog offsets reached) follows the data: a crash between them
    /// leaves the offsets behind the data, and reading the changelog again from there writes
    /// the same values again, in order.
    pub fn ingest_sorted<'a>(
        &self,
        writes: impl IntoIterator<Item = WriteRef<'a>>,
        meta: &[(String, Option<Vec<u8>>)],
    ) -> Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        let dir = self.path.join(INGEST_DIR);
        std::fs::create_dir_all(&dir)
            .map_err(|e| StateError::Corrupt(format!("{}: {e}", dir.display())))?;
        // The file being written: its store and its path.
        let mut open: Option<(usize, rocksdb::SstFileWriter<'_>, PathBuf)> = None;
        for w in writes {
            if open.as_ref().is_some_and(|(store, _, _)| *store != w.store)
                && let Some((store, sst, file)) = open.take()
            {
                self.ingest_file(store, sst, &file)?;
            }
            let (_, sst, _) = match &mut open {
                Some(o) => o,
                None => {
                    let file = dir.join(format!("{}.sst", self.ingested.fetch_add(1, Relaxed)));
                    let sst = rocksdb::SstFileWriter::create(&self.store_options);
                    sst.open(&file)?;
                    open.insert((w.store, sst, file))
                }
            };
            match w.value {
                Some(v) => sst.put(w.key, v)?,
                None => sst.delete(w.key)?,
            }
        }
        if let Some((store, sst, file)) = open.take() {
            self.ingest_file(store, sst, &file)?;
        }
        if !meta.is_empty() {
            self.commit(std::iter::empty(), meta)?;
        }
        Ok(())
    }

    /// Finishes the SST file `file` of `store` and moves it into the database.
    fn ingest_file(
        &self,
        store: usize,
        mut sst: rocksdb::SstFileWriter<'_>,
        file: &Path,
    ) -> Result<()> {
        sst.finish()?;
        let cf = self.cf(store)?;
        self.wait_for_level0(cf, INGEST_L0_MAX);
        let mut o = rocksdb::IngestExternalFileOptions::default();
        o.set_move_files(true);
        let ingested = self.db.ingest_external_file_cf_opts(cf, &o, vec![file]);
        // Moved into the database as a hard link; the name here is left to remove.
        let _ = std::fs::remove_file(file);
        Ok(ingested?)
    }

    /// Waits, up to a minute, while a store has more than `max` level-0 files.
    fn wait_for_level0(&self, cf: &rocksdb::ColumnFamily, max: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            let files = self
                .db
                .property_int_value_cf(cf, "rocksdb.num-files-at-level0")
                .ok()
                .flatten()
                .unwrap_or(0);
            if files <= max {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Every key whose committed value differs from the database of the same stores at `dir`
    /// (a checkpoint), with the value there (`None`: absent there), by store id and in key
    /// order: what makes this database hold what that one does.
    pub fn differences_from(&self, dir: &Path) -> Result<Vec<Difference>> {
        let mut names = vec![META_CF.to_string()];
        names.extend(self.cf_names.iter().cloned());
        let other = DB::open_cf_for_read_only(&Options::default(), dir, names, false)?;
        let mut out = Vec::new();
        for (store, name) in self.cf_names.iter().enumerate() {
            let theirs_cf = other.cf_handle(name).ok_or_else(|| {
                StateError::Corrupt(format!("no column family {name} in the checkpoint"))
            })?;
            let mut mine = self
                .db
                .iterator_cf(self.cf(store)?, rocksdb::IteratorMode::Start)
                .peekable();
            let mut theirs = other
                .iterator_cf(theirs_cf, rocksdb::IteratorMode::Start)
                .peekable();
            loop {
                let order = match (mine.peek(), theirs.peek()) {
                    (None, None) => break,
                    (Some(Err(_)), _) | (_, Some(Err(_))) => {
                        let e = mine
                            .next()
                            .and_then(|r| r.err())
                            .or_else(|| theirs.next().and_then(|r| r.err()));
                        return Err(e.map_or_else(
                            || StateError::Corrupt("iterator failed".into()),
                            StateError::from,
                        ));
                    }
                    (Some(Ok(_)), None) => std::cmp::Ordering::Less,
                    (None, Some(Ok(_))) => std::cmp::Ordering::Greater,
                    (Some(Ok((a, _))), Some(Ok((b, _)))) => a.cmp(b),
                };
                match order {
                    std::cmp::Ordering::Less => {
                        let (k, _) = mine.next().expect("peeked")?;
                        out.push((store, k.to_vec(), None));
                    }
                    std::cmp::Ordering::Greater => {
                        let (k, v) = theirs.next().expect("peeked")?;
                        out.push((store, k.to_vec(), Some(v.to_vec())));
                    }
                    std::cmp::Ordering::Equal => {
                        let (_, a) = mine.next().expect("peeked")?;
                        let (k, b) = theirs.next().expect("peeked")?;
                        if a != b {
                            out.push((store, k.to_vec(), Some(b.to_vec())));
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// The level of each live SST file, by name (`000123.sst`): level 0 from flushes, lower
    /// ones from compactions.
    pub fn sst_levels(&self) -> std::collections::HashMap<String, i32> {
        self.db
            .live_files()
            .unwrap_or_default()
            .into_iter()
            .map(|f| (f.name.trim_start_matches('/').to_string(), f.level))
            .collect()
    }

    /// A RocksDB checkpoint of the database at `dir` (which must not exist): memtables
    /// flushed, SST files hard-linked. It holds the state and offsets of one commit.
    pub fn create_checkpoint(&self, dir: &Path) -> Result<()> {
        rocksdb::checkpoint::Checkpoint::new(&self.db)?.create_checkpoint(dir)?;
        Ok(())
    }

    /// [`PartitionDb::create_checkpoint`] for a checkpoint that is uploaded, which does not
    /// wait for RocksDB's background work: where a flush now would wait (see
    /// [`PartitionDb::flush_would_wait`]), the memtables stay as they are and the checkpoint
    /// holds a copy of the write-ahead log instead, which opening it replays. Returns whether
    /// it did so. Such a checkpoint shares fewer files with the next one, so it is the
    /// exception: under heavy writes, where a flush waited for a compaction for over a second.
    pub fn create_checkpoint_without_waiting(&self, dir: &Path) -> Result<bool> {
        let checkpoint = rocksdb::checkpoint::Checkpoint::new(&self.db)?;
        if self.flush_would_wait()
            || self
                .wal_checkpoints
                .load(std::sync::atomic::Ordering::Relaxed)
        {
            checkpoint.create_checkpoint_with_log_size(dir, u64::MAX)?;
            Ok(true)
        } else {
            checkpoint.create_checkpoint(dir)?;
            Ok(false)
        }
    }

    /// Waits, up to `timeout`, until no flush or compaction is running or queued.
    pub fn wait_for_compactions(&self, timeout: std::time::Duration) -> Result<()> {
        let mut o = rocksdb::WaitForCompactOptions::default();
        o.set_timeout(timeout.as_micros() as u64);
        self.db.wait_for_compact(&o)?;
        Ok(())
    }

    /// Makes every later [`PartitionDb::create_checkpoint_without_waiting`] hold the
    /// write-ahead log, as if a flush would wait (for tests of that path).
    #[cfg(test)]
    pub(crate) fn force_wal_checkpoints(&self) {
        self.wal_checkpoints
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Compacts every store whole (for tests: files below level 0, at once).
    #[cfg(test)]
    pub(crate) fn compact_all(&self) -> Result<()> {
        for store in 0..self.cf_names.len() {
            self.db
                .compact_range_cf(self.cf(store)?, None::<&[u8]>, None::<&[u8]>);
        }
        Ok(())
    }

    /// Whether a flush of the memtables now would wait for background work first. RocksDB
    /// holds a flush that would put a column family into a write stall until the stall's
    /// cause is gone: with two memtables a column family (RocksDB's default), an immutable
    /// memtable not yet flushed; or level 0 one file short of the slowdown trigger, which only
    /// a compaction clears.
    pub fn flush_would_wait(&self) -> bool {
        let slowdown = self
            .level0_slowdown
            .load(std::sync::atomic::Ordering::Relaxed);
        std::iter::once(META_CF.to_string())
            .chain(self.cf_names.iter().cloned())
            .filter_map(|name| self.db.cf_handle(&name))
            .any(|cf| {
                let int = |p: &str| {
                    self.db
                        .property_int_value_cf(cf, p)
                        .ok()
                        .flatten()
                        .unwrap_or(0)
                };
                int("rocksdb.num-immutable-mem-table") > 0
                    || int("rocksdb.num-files-at-level0") + 1 >= slowdown
            })
    }

    /// Removes SST files an ingestion left behind (a crash between writing and ingesting one).
    pub fn clear_ingest_dir(&self) {
        let _ = std::fs::remove_dir_all(self.path.join(INGEST_DIR));
    }

    /// The host's budget of hot-key caches.
    pub fn hot_budget(&self) -> Arc<overlay::HotBudget> {
        self.hot.clone()
    }

    /// Declared store names, in column-family order (the index is the store id).
    pub fn stores(&self) -> &[String] {
        &self.stores
    }

    /// The id of store `name`.
    pub fn store_id(&self, name: &str) -> Option<usize> {
        self.stores.iter().position(|s| s == name)
    }

    /// The fault-injection hook of this database (tests only).
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Where the database lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Approximate bytes of state: live SST data plus memtables, over every store.
    pub fn approximate_size(&self) -> u64 {
        let mut total = 0;
        for store in 0..self.cf_names.len() {
            if let Ok(cf) = self.cf(store) {
                for prop in [
                    "rocksdb.estimate-live-data-size",
                    "rocksdb.cur-size-all-mem-tables",
                ] {
                    total += self
                        .db
                        .property_int_value_cf(cf, prop)
                        .ok()
                        .flatten()
                        .unwrap_or(0);
                }
            }
        }
        total
    }

    /// A RocksDB property of the database as text (e.g. `rocksdb.stats`), for diagnostics.
    pub fn property_text(&self, name: &str) -> Option<String> {
        self.db.property_value(name).ok().flatten()
    }

    /// The sum of an integer property over every column family of the database.
    /// Bytes of the partition's memtables, over every store.
    pub fn memtable_bytes(&self) -> u64 {
        self.property_sum("rocksdb.cur-size-all-mem-tables")
    }

    fn property_sum(&self, prop: &str) -> u64 {
        std::iter::once(META_CF.to_string())
            .chain(self.cf_names.iter().cloned())
            .filter_map(|name| self.db.cf_handle(&name))
            .filter_map(|cf| self.db.property_int_value_cf(cf, prop).ok().flatten())
            .sum()
    }

    fn cf(&self, store: usize) -> Result<&rocksdb::ColumnFamily> {
        let name = self
            .cf_names
            .get(store)
            .ok_or_else(|| StateError::Corrupt(format!("no store #{store}")))?;
        self.db
            .cf_handle(name)
            .ok_or_else(|| StateError::Corrupt(format!("no column family for {name}")))
    }

    fn meta(&self) -> Result<&rocksdb::ColumnFamily> {
        self.db
            .cf_handle(META_CF)
            .ok_or_else(|| StateError::Corrupt("no _meta column family".into()))
    }

    /// The committed value of `key` (already slot-prefixed) in `store`.
    pub fn get(&self, store: usize, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.faults.on_read()?;
        Ok(self
            .db
            .get_pinned_cf(self.cf(store)?, key)?
            .map(|v| v.to_vec()))
    }

    /// Calls `f` with the committed value of `key` in `store`, without copying it.
    pub fn get_with<R>(
        &self,
        store: usize,
        key: &[u8],
        f: impl FnOnce(Option<&[u8]>) -> R,
    ) -> Result<R> {
        self.faults.on_read()?;
        let v = self.db.get_pinned_cf(self.cf(store)?, key)?;
        Ok(f(v.as_deref()))
    }

    /// Calls `f(value)` with the committed value of each of `keys` (slot-prefixed, sorted and
    /// without duplicates) in `store`, in their order: one batched lookup, which visits each
    /// memtable and SST file once for all the keys instead of once per key.
    pub fn get_sorted_with(
        &self,
        store: usize,
        keys: &[&[u8]],
        mut f: impl FnMut(Option<&[u8]>),
    ) -> Result<()> {
        self.faults.on_read()?;
        for v in self.db.batched_multi_get_cf(self.cf(store)?, keys, true) {
            f(v?.as_deref());
        }
        Ok(())
    }

    /// Committed entries of `store` with `start <= key < end`, at most `limit`.
    pub fn scan(
        &self,
        store: usize,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.faults.on_read()?;
        let mut ro = rocksdb::ReadOptions::default();
        ro.set_iterate_upper_bound(end.to_vec());
        let it = self.db.iterator_cf_opt(
            self.cf(store)?,
            ro,
            rocksdb::IteratorMode::From(start, rocksdb::Direction::Forward),
        );
        let mut out = Vec::new();
        for item in it {
            if out.len() >= limit {
                break;
            }
            let (k, v) = item?;
            out.push((k.to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    /// A metadata value.
    pub fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.db.get_cf(self.meta()?, key.as_bytes())?)
    }

    /// A metadata value stored as u64 big-endian.
    pub fn get_meta_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.get_meta(key)? {
            None => Ok(None),
            Some(v) => Ok(Some(u64::from_be_bytes(v.as_slice().try_into().map_err(
                |_| StateError::Corrupt(format!("meta `{key}` is not 8 bytes")),
            )?))),
        }
    }

    /// Applies data writes and metadata writes as one atomic RocksDB write. The write is in the
    /// WAL but not synced: on Kafka the changelog is the durability.
    pub fn commit<'a>(
        &self,
        writes: impl IntoIterator<Item = WriteRef<'a>>,
        meta: &[(String, Option<Vec<u8>>)],
    ) -> Result<()> {
        self.commit_with(writes, meta, false)
    }

    /// [`PartitionDb::commit`], with the WAL synced to disk before it returns when `sync`: the
    /// commit survives a power loss (the embedded log, where RocksDB is the durability).
    pub fn commit_with<'a>(
        &self,
        writes: impl IntoIterator<Item = WriteRef<'a>>,
        meta: &[(String, Option<Vec<u8>>)],
        sync: bool,
    ) -> Result<()> {
        let mut wb = WriteBatch::default();
        // The handle of the last store written: writes come grouped by store, and a lookup by
        // name per write would cost a hash of its name.
        let mut last: Option<(usize, &rocksdb::ColumnFamily)> = None;
        for op in writes {
            let cf = match last {
                Some((store, cf)) if store == op.store => cf,
                _ => {
                    let cf = self.cf(op.store)?;
                    last = Some((op.store, cf));
                    cf
                }
            };
            match op.value {
                Some(v) => wb.put_cf(cf, op.key, v),
                None => wb.delete_cf(cf, op.key),
            }
        }
        let m = self.meta()?;
        for (k, v) in meta {
            match v {
                Some(v) => wb.put_cf(m, k.as_bytes(), v),
                None => wb.delete_cf(m, k.as_bytes()),
            }
        }
        let bytes = wb.size_in_bytes() as u64;
        let mut wo = rocksdb::WriteOptions::default();
        wo.set_sync(sync);
        self.db.write_opt(wb, &wo)?;
        self.count_written(bytes);
        Ok(())
    }

    /// Counts committed bytes; past [`MEMTABLE_FILTERS_AFTER`], gives the stores' memtables a
    /// bloom filter of their keys from the next memtable on, and larger write buffers
    /// ([`BUSY_WRITE_BUFFER`]).
    ///
    /// Every lookup of a key searches each memtable of its store, and at millions of keys most
    /// lookups are of keys a memtable does not hold: their skiplist searches were a sixth of a
    /// partition's time (`InlineSkipList::FindGreaterOrEqual` and its key comparisons, in a
    /// profile at 12.5M keys per partition). RocksDB allocates the filter whole with each
    /// memtable, so an idle partition does not get one: 64 idle partitions would hold 64 MiB of
    /// empty filters, flushed again and again by the write-buffer manager.
    fn count_written(&self, bytes: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.memtable_filters.load(Relaxed) {
            return;
        }
        if self.written.fetch_add(bytes, Relaxed) + bytes < MEMTABLE_FILTERS_AFTER {
            return;
        }
        if self.memtable_filters.swap(true, Relaxed) {
            return;
        }
        for store in 0..self.cf_names.len() {
            let set = self.cf(store).and_then(|cf| {
                Ok(self.db.set_options_cf(
                    cf,
                    &[
                        ("memtable_whole_key_filtering", "true"),
                        ("memtable_prefix_bloom_size_ratio", MEMTABLE_FILTER_RATIO),
                        ("write_buffer_size", BUSY_WRITE_BUFFER),
                    ],
                )?)
            });
            if let Err(e) = set {
                tracing::warn!(path = %self.path.display(), store, "memtable filters: {e}");
            }
        }
    }

    /// Whether the stores' memtables are built with bloom filters now.
    pub fn memtable_filters(&self) -> bool {
        self.memtable_filters
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Deletes every entry of `slot` in `store` and the metadata keys `meta`, in one write: the
    /// slot's state starts again from nothing (a restore from the changelog follows).
    pub fn wipe_slot(&self, store: usize, slot: u32, meta: &[String]) -> Result<()> {
        let mut wb = WriteBatch::default();
        let cf = self.cf(store)?;
        let end = match slot.checked_add(1) {
            Some(next) => slot_key(next, &[]),
            None => vec![0xff; 5],
        };
        wb.delete_range_cf(cf, slot_key(slot, &[]), end);
        let m = self.meta()?;
        for k in meta {
            wb.delete_cf(m, k.as_bytes());
        }
        self.db.write(wb)?;
        Ok(())
    }

    /// Flushes every column family's memtables to SST files (waiting for the flush): what a
    /// checkpoint taken soon after has left to flush is then small.
    pub fn flush(&self) -> Result<()> {
        let mut cfs = vec![self.meta()?];
        for store in 0..self.cf_names.len() {
            cfs.push(self.cf(store)?);
        }
        self.db
            .flush_cfs_opt(&cfs, &rocksdb::FlushOptions::default())?;
        Ok(())
    }

    /// Keeps only the slots `keep` of every store: the entries of every other slot are deleted
    /// with range tombstones, in one write with the deletion of the metadata keys `meta`, and
    /// the SST files that hold nothing but them are dropped at once. What one half of a split
    /// does to its copy of the partition; [`PartitionDb::compact_dropped`] reclaims the rest.
    pub fn keep_slots(&self, keep: std::ops::Range<u32>, meta: &[String]) -> Result<()> {
        let mut wb = WriteBatch::default();
        let below = (slot_key(0, &[]), slot_key(keep.start, &[]));
        let above = (slot_key(keep.end, &[]), vec![0xff; 5]);
        for store in 0..self.cf_names.len() {
            let cf = self.cf(store)?;
            for (from, to) in [&below, &above] {
                if from < to {
                    wb.delete_range_cf(cf, from, to);
                }
            }
        }
        let m = self.meta()?;
        for k in meta {
            wb.delete_cf(m, k.as_bytes());
        }
        self.db.write(wb)?;
        for store in 0..self.cf_names.len() {
            let cf = self.cf(store)?;
            for (from, to) in [&below, &above] {
                if from < to {
                    self.db.delete_file_in_range_cf(cf, from, to)?;
                }
            }
        }
        Ok(())
    }

    /// Copies the entries of `slots` of every store of the database at `dir` (a checkpoint of
    /// another partition of the same stores) into this one as ingested SST files, then the
    /// metadata keys `meta` that it holds, in one write: what a merge adds of the other side.
    /// Answers the entries copied.
    pub fn ingest_slots_from(
        &self,
        dir: &Path,
        slots: std::ops::Range<u32>,
        meta: &[String],
    ) -> Result<u64> {
        let mut names = vec![META_CF.to_string()];
        names.extend(self.cf_names.iter().cloned());
        let other = DB::open_cf_for_read_only(&Options::default(), dir, names, false)?;
        let (from, to) = (slot_key(slots.start, &[]), slot_key(slots.end, &[]));
        let mut copied = 0u64;
        for (store, name) in self.cf_names.iter().enumerate() {
            let cf = other.cf_handle(name).ok_or_else(|| {
                StateError::Corrupt(format!("no column family {name} in {}", dir.display()))
            })?;
            let mut ro = rocksdb::ReadOptions::default();
            ro.set_iterate_upper_bound(to.clone());
            // Streamed into SST files of up to 64 MiB each, ingested as each is full.
            let dir = self.path.join(INGEST_DIR);
            std::fs::create_dir_all(&dir)
                .map_err(|e| StateError::Corrupt(format!("{}: {e}", dir.display())))?;
            let mut open: Option<(rocksdb::SstFileWriter<'_>, PathBuf, u64)> = None;
            for item in other.iterator_cf_opt(
                cf,
                ro,
                rocksdb::IteratorMode::From(&from, rocksdb::Direction::Forward),
            ) {
                let (k, v) = item?;
                let (sst, _, bytes) = match &mut open {
                    Some(o) => o,
                    None => {
                        let n = self
                            .ingested
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let file = dir.join(format!("{n}.sst"));
                        let sst = rocksdb::SstFileWriter::create(&self.store_options);
                        sst.open(&file)?;
                        open.insert((sst, file, 0))
                    }
                };
                sst.put(&k, &v)?;
                *bytes += (k.len() + v.len()) as u64;
                copied += 1;
                if *bytes >= 64 << 20
                    && let Some((sst, file, _)) = open.take()
                {
                    self.ingest_file(store, sst, &file)?;
                }
            }
            if let Some((sst, file, _)) = open.take() {
                self.ingest_file(store, sst, &file)?;
            }
        }
        let m = other
            .cf_handle(META_CF)
            .ok_or_else(|| StateError::Corrupt(format!("no metadata in {}", dir.display())))?;
        let mut kept = Vec::new();
        for k in meta {
            if let Some(v) = other.get_cf(m, k.as_bytes())? {
                kept.push((k.clone(), Some(v)));
            }
        }
        if !kept.is_empty() {
            self.commit(std::iter::empty(), &kept)?;
        }
        Ok(copied)
    }

    /// Compacts the stores' ranges outside `keep` (what [`PartitionDb::keep_slots`] deleted),
    /// so that the files left holding deleted entries are rewritten without them.
    pub fn compact_dropped(&self, keep: std::ops::Range<u32>) -> Result<()> {
        for store in 0..self.cf_names.len() {
            let cf = self.cf(store)?;
            if keep.start > 0 {
                self.db.compact_range_cf(
                    cf,
                    Some(slot_key(0, &[])),
                    Some(slot_key(keep.start, &[])),
                );
            }
            self.db
                .compact_range_cf(cf, Some(slot_key(keep.end, &[])), Some(vec![0xff; 5]));
        }
        Ok(())
    }

    /// RocksDB's estimate of live data bytes across the stores.
    pub fn estimated_size(&self) -> u64 {
        self.stores
            .iter()
            .filter_map(|s| self.db.cf_handle(&store_cf(s)))
            .filter_map(|cf| {
                self.db
                    .property_int_value_cf(cf, "rocksdb.estimate-live-data-size")
                    .ok()
                    .flatten()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_and_filter_bytes_are_read_from_the_cache_entry_stats() {
        let text = "Block cache LRUCache@0x5581#7 capacity: 448.00 MB seed: 1 usage: 1.2 MB \
                    table_size: 64 occupancy: 12 collections: 1 last_copies: 0 last_secs: 0 \
                    secs_since: 0\nBlock cache entry stats(count,size,portion): \
                    DataBlock(10,40.00 KB,0.5%) FilterBlock(3,12.00 KB,0.25%) \
                    FilterMetaBlock(1,1.00 KB,0.125%) IndexBlock(2,8.00 KB,1%) \
                    WriteBuffer(1,256.00 KB,2%)\n";
        let cap = 1 << 20;
        assert_eq!(
            cache_role_bytes(text, cap, &["IndexBlock", "FilterBlock", "FilterMetaBlock"]),
            ((0.25 + 0.125 + 1.0) / 100.0 * cap as f64).round() as u64
        );
        assert_eq!(cache_role_bytes(text, cap, &["DataBlock"]), 5243);
        assert_eq!(cache_role_bytes("no stats", cap, &["DataBlock"]), 0);
    }

    #[test]
    fn the_block_cache_gives_way_to_the_rest_of_the_heap_and_takes_it_back() {
        const MIB: usize = 1 << 20;
        let full = 448 * MIB;
        // Four partitions of 12.5M keys at their RSS peak: a resident heap of 754 MiB, 435 in
        // the cache, 6 in hot-key caches, 313 beside them: 81 over the allowance of 216 + 4 x 4.
        let resident = 754 * MIB;
        assert_eq!(
            cache_capacity_for(full, resident, 435 * MIB, 6 * MIB, 4),
            full - 81 * MIB
        );
        // The same heap over 64 partitions is within their allowance.
        assert_eq!(
            cache_capacity_for(full, resident, 435 * MIB, 6 * MIB, 64),
            full
        );
        // Within the allowance, the cache keeps its whole share; never less than half.
        assert_eq!(
            cache_capacity_for(full, 560 * MIB, 446 * MIB, 7 * MIB, 1),
            full
        );
        assert_eq!(
            cache_capacity_for(full, 4096 * MIB, 446 * MIB, 0, 1),
            full / 2
        );

        // A real cache: given less, the blocks read next evict it down to its new capacity.
        let dir = tempfile::tempdir().unwrap();
        let env = StateEnv::new(64 << 20);
        let share = 56 * MIB;
        assert_eq!(env.report().block_cache_capacity, share);
        let stores = vec!["counts".to_string()];
        let db = env.open_shared(dir.path(), &stores).unwrap();
        let mut noise = 0x9e37_79b9_7f4a_7c15_u64;
        let mut value = || -> Vec<u8> {
            (0..128)
                .flat_map(|_| {
                    noise ^= noise << 13;
                    noise ^= noise >> 7;
                    noise ^= noise << 17;
                    noise.to_le_bytes()
                })
                .collect()
        };
        let key = |set: u32, i: u32| slot_key(0, format!("key-{set}-{i:06}").as_bytes());
        // Two sets of 48 MiB each, on disk.
        for set in 0..2 {
            for chunk in 0..12u32 {
                let writes: Vec<WriteOp> = (chunk * 4096..(chunk + 1) * 4096)
                    .map(|i| WriteOp {
                        store: 0,
                        key: key(set, i),
                        value: Some(value()),
                    })
                    .collect();
                db.commit(writes.iter().map(WriteOp::as_ref), &[]).unwrap();
            }
        }
        db.db.flush_cf(db.cf(0).unwrap()).unwrap();
        let read = |set: u32| {
            for i in 0..12 * 4096 {
                assert!(db.get(0, &key(set, i)).unwrap().is_some());
            }
        };
        read(0);
        let filled = env.cache_usage();
        assert!(filled > 40 * MIB, "48 MiB read: the cache holds {filled}");
        // The rest of the heap holds 20 MiB over its allowance (one partition open).
        let allowance = HEAP_BESIDE_STATE + HEAP_PER_PARTITION;
        let resident = filled + env.hot_usage() + allowance + 20 * MIB;
        // (The cache's usage is read again inside: a memtable reservation may move it a little.)
        let set = env.fit_cache_to_heap(resident);
        assert!(
            set.abs_diff(share - 20 * MIB) <= MIB,
            "capacity {set} against {}",
            share - 20 * MIB
        );
        assert_eq!(env.report().block_cache_capacity, set);
        read(1);
        let after = env.cache_usage();
        assert!(
            after <= set + 2 * MIB,
            "the other 48 MiB read: the cache holds {after} over its capacity of {set}"
        );
        // A change under 4 MiB is not made; the heap back within its allowance, the cache
        // takes its whole share again.
        let small = after + env.hot_usage() + allowance + 22 * MIB;
        assert_eq!(env.fit_cache_to_heap(small), set);
        assert_eq!(env.fit_cache_to_heap(after), share);
        assert_eq!(env.report().block_cache_capacity, share);
        // Within 4 MiB of its whole share, the cache still gets all of it back.
        let over = |mib: usize| env.cache_usage() + env.hot_usage() + allowance + mib * MIB;
        let near = env.fit_cache_to_heap(over(3));
        assert_eq!(near, share, "a change under 4 MiB is not made");
        let far = env.fit_cache_to_heap(over(10));
        assert!(far <= share - 9 * MIB, "{far}");
        let near = env.fit_cache_to_heap(over(3));
        assert!(near > far && near < share, "{far} then {near}");
        assert_eq!(env.fit_cache_to_heap(env.cache_usage()), share);
    }

    #[test]
    fn filters_and_index_stay_pinned_while_data_blocks_turn_over_in_the_cache() {
        // A cache of 14 MiB under 48 MB of state: data blocks come and go, but no lookup may
        // read a filter or an index block again (a filter the cache had dropped, read again by
        // every lookup, was the collapse of a partition of 12M keys to 136 records/s).
        let dir = tempfile::tempdir().unwrap();
        let env = StateEnv::new(16 << 20);
        let stores = vec!["counts".to_string()];
        let db = env.open_partition(dir.path(), &stores).unwrap();
        let key = |i: u32| {
            slot_key(
                i % 4,
                format!("user-{:010}", i.wrapping_mul(2_654_435_761)).as_bytes(),
            )
        };
        const KEYS: u32 = 400_000;
        // 100 bytes that do not compress, the key's number first.
        let value = |i: u32| -> Vec<u8> {
            let mut x = u64::from(i) | 1 << 40;
            let mut v = i.to_be_bytes().to_vec();
            while v.len() < 100 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                v.push(x as u8);
            }
            v
        };
        for round in 0..8 {
            let writes: Vec<WriteOp> = (round * KEYS / 8..(round + 1) * KEYS / 8)
                .map(|i| WriteOp {
                    store: 0,
                    key: key(i),
                    value: Some(value(i)),
                })
                .collect();
            let mut sorted: Vec<WriteRef<'_>> = writes.iter().map(WriteOp::as_ref).collect();
            sorted.sort_by(|a, b| a.key.cmp(b.key));
            db.commit(sorted, &[]).unwrap();
            db.db.flush_cf(db.cf(0).unwrap()).unwrap();
        }
        // Files opened by compactions load their filters and index: let them settle first.
        db.wait_for_compactions(std::time::Duration::from_secs(30))
            .unwrap();
        let before = env.cache_stats();
        let useful = || env.db_options.get_ticker_count(Ticker::BloomFilterUseful);
        let useful_before = useful();
        for n in 0..20_000u32 {
            let i = n.wrapping_mul(7_919) % KEYS;
            let v = db.get(0, &key(i)).unwrap();
            assert_eq!(v, Some(value(i)), "key {i}");
            // Between present keys, so that no file's key range rules it out first.
            let mut absent = key(i);
            absent.push(b'!');
            assert_eq!(db.get(0, &absent).unwrap(), None);
        }
        let after = env.cache_stats();
        assert!(
            after.data_misses > before.data_misses + 5_000,
            "the cache did not turn over: {before:?} then {after:?}"
        );
        assert_eq!(
            (after.filter_misses, after.index_misses),
            (before.filter_misses, before.index_misses),
            "filter or index blocks were read again"
        );
        // The filters answered the lookups of absent keys (but 1% of them), without a data block.
        assert!(
            useful() - useful_before > 19_000,
            "{} lookups were answered by a filter",
            useful() - useful_before
        );
    }

    #[test]
    fn the_memory_report_covers_every_open_partition() {
        let dir = tempfile::tempdir().unwrap();
        let env = StateEnv::new(32 << 20);
        let stores = vec!["counts".to_string()];
        let db = env.open_shared(dir.path(), &stores).unwrap();
        let writes: Vec<WriteOp> = (0..20_000u32)
            .map(|i| WriteOp {
                store: 0,
                key: slot_key(i % 4, format!("key-{i:08}").as_bytes()),
                value: Some(i.to_be_bytes().to_vec()),
            })
            .collect();
        db.commit(writes.iter().map(WriteOp::as_ref), &[]).unwrap();
        let report = env.report();
        assert_eq!(report.bound, 32 << 20);
        assert!(
            report.memtable_usage > 0,
            "20,000 writes are in a memtable: {report:?}"
        );
        drop(db);
        // A database no longer open counts no more.
        assert_eq!(env.report().pending_compaction_bytes, 0);
    }

    #[test]
    fn a_partition_that_writes_a_lot_gets_memtable_filters_and_larger_memtables() {
        use rocksdb::perf::{PerfContext, PerfMetric, PerfStatsLevel, set_perf_stats};
        let dir = tempfile::tempdir().unwrap();
        let env = StateEnv::new(512 << 20);
        let stores = vec!["counts".to_string()];
        let db = env.open_partition(dir.path(), &stores).unwrap();
        // Memtable filter checks of lookups of absent keys, on this thread.
        set_perf_stats(PerfStatsLevel::EnableCount);
        let mut perf = PerfContext::default();
        let mut misses = |db: &PartitionDb| {
            perf.reset();
            for i in 0..100u32 {
                assert_eq!(db.get(0, format!("absent-{i}").as_bytes()).unwrap(), None);
            }
            perf.metric(PerfMetric::BloomMemtableMissCount)
        };
        let batch = |round: u32| -> Vec<WriteOp> {
            (0..4096u32)
                .map(|i| WriteOp {
                    store: 0,
                    key: slot_key(0, format!("key-{round}-{i}").as_bytes()),
                    value: Some(vec![7; 1024]),
                })
                .collect()
        };
        let writes = batch(0);
        db.commit(writes.iter().map(WriteOp::as_ref), &[]).unwrap();
        assert!(!db.memtable_filters(), "4 MiB written");
        assert_eq!(misses(&db), 0, "no memtable filter yet");
        let mut round = 1;
        while !db.memtable_filters() {
            assert!(
                round < 40,
                "no memtable filters after {round} batches of 4 MiB"
            );
            let writes = batch(round);
            db.commit(writes.iter().map(WriteOp::as_ref), &[]).unwrap();
            round += 1;
        }
        assert!(
            round >= 16,
            "filters after {round} batches of 4 MiB, under 64 MiB"
        );
        // The memtable written before the switch has no filter: one written after it has.
        db.db.flush_cf(db.cf(0).unwrap()).unwrap();
        let writes = batch(round);
        db.commit(writes.iter().map(WriteOp::as_ref), &[]).unwrap();
        assert_eq!(
            misses(&db),
            100,
            "every absent key skipped the new memtable"
        );
        set_perf_stats(PerfStatsLevel::Disable);
        // And its memtables grew: 24 MiB more stay in one, where a store starts with 16 MiB.
        for r in 1..=6 {
            let writes = batch(round + r);
            db.commit(writes.iter().map(WriteOp::as_ref), &[]).unwrap();
        }
        let active = db
            .db
            .property_int_value_cf(db.cf(0).unwrap(), "rocksdb.cur-size-active-mem-table")
            .unwrap()
            .unwrap();
        assert!(
            active > 24 << 20,
            "the active memtable holds {active} bytes after 28 MiB written"
        );
    }

    #[test]
    fn ingested_files_override_what_was_there_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let env = StateEnv::new(32 << 20);
        let stores = vec!["counts".to_string(), "totals".to_string()];
        let put = |store, key: &[u8], value: &[u8]| WriteOp {
            store,
            key: slot_key(1, key),
            value: Some(value.to_vec()),
        };
        {
            let db = env.open_partition(dir.path(), &stores).unwrap();
            // Older state, partly in the memtable: the ingestion must override it.
            let old = [
                put(0, b"a", b"old"),
                put(0, b"b", b"old"),
                put(1, b"z", b"old"),
            ];
            db.commit(old.iter().map(WriteOp::as_ref), &[]).unwrap();
            db.bulk_load(true).unwrap();
            let writes = [
                put(0, b"a", b"new"),
                WriteOp {
                    store: 0,
                    key: slot_key(1, b"b"),
                    value: None,
                },
                put(0, b"c", b"new"),
                put(1, b"z", b"new"),
            ];
            db.ingest_sorted(
                writes.iter().map(WriteOp::as_ref),
                &[("cl/counts/1".into(), Some(9u64.to_be_bytes().to_vec()))],
            )
            .unwrap();
            db.bulk_load(false).unwrap();
            // The files were moved in: nothing is left where they were written.
            let left = std::fs::read_dir(dir.path().join(INGEST_DIR))
                .unwrap()
                .count();
            assert_eq!(left, 0);
        }
        let db = env.open_partition(dir.path(), &stores).unwrap();
        assert_eq!(
            db.get(0, &slot_key(1, b"a")).unwrap(),
            Some(b"new".to_vec())
        );
        assert_eq!(db.get(0, &slot_key(1, b"b")).unwrap(), None);
        assert_eq!(
            db.get(0, &slot_key(1, b"c")).unwrap(),
            Some(b"new".to_vec())
        );
        assert_eq!(
            db.get(1, &slot_key(1, b"z")).unwrap(),
            Some(b"new".to_vec())
        );
        assert_eq!(db.get_meta_u64("cl/counts/1").unwrap(), Some(9));
        // Writes after an ingestion override it in turn.
        db.commit([put(0, b"c", b"later")].iter().map(WriteOp::as_ref), &[])
            .unwrap();
        assert_eq!(
            db.get(0, &slot_key(1, b"c")).unwrap(),
            Some(b"later".to_vec())
        );
    }

    #[test]
    fn commit_is_atomic_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let env = StateEnv::new(32 << 20);
        let stores = vec!["counts".to_string()];
        {
            let db = env.open_partition(dir.path(), &stores).unwrap();
            db.commit(
                [WriteOp {
                    store: 0,
                    key: slot_key(3, b"a"),
                    value: Some(b"1".to_vec()),
                }
                .as_ref()],
                &[("in/t/3".into(), Some(5u64.to_be_bytes().to_vec()))],
            )
            .unwrap();
        }
        let db = env.open_partition(dir.path(), &stores).unwrap();
        assert_eq!(db.get(0, &slot_key(3, b"a")).unwrap(), Some(b"1".to_vec()));
        assert_eq!(db.get(0, &slot_key(2, b"a")).unwrap(), None);
        assert_eq!(db.get_meta_u64("in/t/3").unwrap(), Some(5));
        let all = db
            .scan(0, &slot_key(3, b""), &slot_key(4, b""), 10)
            .unwrap();
        assert_eq!(all.len(), 1);
        db.commit(
            [WriteOp {
                store: 0,
                key: slot_key(4, b"b"),
                value: Some(b"2".to_vec()),
            }
            .as_ref()],
            &[],
        )
        .unwrap();
        db.wipe_slot(0, 3, &["in/t/3".into()]).unwrap();
        assert_eq!(db.get(0, &slot_key(3, b"a")).unwrap(), None);
        assert_eq!(db.get_meta_u64("in/t/3").unwrap(), None);
        assert_eq!(db.get(0, &slot_key(4, b"b")).unwrap(), Some(b"2".to_vec()));
    }
}
