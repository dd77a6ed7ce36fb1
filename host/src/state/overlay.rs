//! The batch overlay: writes of the batches being processed, in front of RocksDB. Reads see them
//! (read-your-writes); a failed guest call drops its own writes without touching those of
//! earlier calls; the pending writes reach RocksDB only at commit.
//!
//! Writes taken for a commit stay visible, frozen, until the commit is settled: processing goes
//! on over them while they commit.
//!
//! Behind the pending writes, a hot-key cache keeps committed values (and keys known to be
//! absent) across commits, so that hot keys are not looked up in RocksDB's memtables again and
//! again. It only ever holds what RocksDB holds: a committed batch's writes enter it after the
//! RocksDB write, a read's result right after the read, and it lives as long as the instance's
//! context, which a new session (after any error, a restore, a rollback) does not reuse. Its
//! bytes are charged to a budget shared by every partition of the host, carved out of
//! `--state-memory`. The cache has two generations: new entries go into the young one, which
//! turns old when it reaches half the budget (or when other partitions hold the rest of it),
//! and the old one is dropped then.
//! A key written or read again since the last turn survives it, so hot keys stay while a
//! stream of keys seen once goes through; the cache never starts over from nothing.
//!
//! A key enters the cache on its second read from RocksDB within a window, not its first: a
//! doorkeeper (one bit per hashed key, cleared every [`DOOR_WINDOW`] keys) remembers which keys
//! were read once. Over millions of uniformly spread keys, where the cache can hold a few
//! percent of them, admitting every key read cost a fifth of a partition thread (two inserts
//! into tables far bigger than the CPU caches, per record) to save a lookup in one record of
//! twenty. A key read once is kept only for the batch that read it ([`Overlay::take`] drops
//! it), so that the batch's reads of it after a batched lookup still find it; a written key
//! the cache holds gets its new value at settle, one it does not hold stays out.

use hashbrown::HashMap;
use hashbrown::hash_map::RawEntryMut;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What the hot-key caches of a host's partitions may hold together, in bytes.
#[derive(Debug, Default)]
pub struct HotBudget {
    limit: usize,
    used: AtomicUsize,
}

impl HotBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(HotBudget {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The bound.
    pub fn limit(&self) -> usize {
        self.limit
    }

    fn try_charge(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                (u + n <= self.limit).then_some(u + n)
            })
            .is_ok()
    }

    fn release(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

/// Bytes an entry of the cache is charged: key, value and what holding them costs besides, as
/// measured with jemalloc's heap profile: the map's slot (two `Vec`s, 48 bytes, at a load
/// between 7/16 and 7/8 of its table) and the allocator's rounding of the key and the value.
fn entry_bytes(key: &[u8], value: &Option<Vec<u8>>) -> usize {
    key.len() + value.as_ref().map_or(0, Vec::len) + 80
}

/// Bits of a partition's doorkeeper: 128 KiB, charged to the hot-key budget.
const DOOR_BITS: usize = 1 << 20;

/// Keys marked before the doorkeeper starts over: at most a quarter of its bits are set, so at
/// most a quarter of the keys read once pass it by a collision.
pub const DOOR_WINDOW: usize = DOOR_BITS / 4;

/// Keys of one store the current batch read from RocksDB but the cache did not admit, beyond
/// which they are dropped (their next read goes to RocksDB again).
const FETCHED_MAX: usize = 1 << 16;

/// Which keys were read from RocksDB once in the current window.
struct Doorkeeper {
    bits: Vec<u64>,
    marked: usize,
    hasher: foldhash::fast::RandomState,
}

impl Doorkeeper {
    fn new() -> Self {
        Doorkeeper {
            bits: vec![0; DOOR_BITS / 64],
            marked: 0,
            hasher: Default::default(),
        }
    }

    /// True if the key of hash `hash` (of the overlay's maps) in `store` was marked in this
    /// window; marks it if not.
    fn seen_or_mark(&mut self, store: usize, hash: u64) -> bool {
        let h = self.hasher.hash_one((store, hash)) as usize % DOOR_BITS;
        let (word, bit) = (h / 64, 1u64 << (h % 64));
        if self.bits[word] & bit != 0 {
            return true;
        }
        if self.marked == DOOR_WINDOW {
            self.bits.fill(0);
            self.marked = 0;
        }
        self.bits[word] |= bit;
        self.marked += 1;
        false
    }
}

/// One write of a committed batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteOp {
    /// Store id (index into the partition's store list).
    pub store: usize,
    /// Slot-prefixed key.
    pub key: Vec<u8>,
    /// `None` deletes.
    pub value: Option<Vec<u8>>,
}

impl WriteOp {
    /// The write, borrowed.
    pub fn as_ref(&self) -> WriteRef<'_> {
        WriteRef {
            store: self.store,
            key: &self.key,
            value: self.value.as_deref(),
        }
    }
}

/// One write, borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteRef<'a> {
    /// Store id (index into the partition's store list).
    pub store: usize,
    /// Slot-prefixed key.
    pub key: &'a [u8],
    /// `None` deletes.
    pub value: Option<&'a [u8]>,
}

/// The writes of one commit, the last value per key, frozen while they commit: shared between
/// the overlay (reads see them) and the commit (which sends and stores them).
#[derive(Default)]
pub struct Writes {
    maps: Vec<PendingMap>,
}

impl Writes {
    /// No writes.
    pub fn none() -> Arc<Writes> {
        Arc::new(Writes::default())
    }

    /// How many keys are written.
    pub fn len(&self) -> usize {
        self.maps.iter().map(PendingMap::len).sum()
    }

    /// True when nothing is written.
    pub fn is_empty(&self) -> bool {
        self.maps.iter().all(PendingMap::is_empty)
    }

    fn get(&self, store: usize, key: &[u8], hash: u64) -> Option<Option<&[u8]>> {
        self.maps
            .get(store)
            .and_then(|m| m.raw_entry().from_key_hashed_nocheck(hash, key))
            .map(|(_, p)| p.value.as_deref())
    }

    /// Every write, in any order.
    pub fn iter(&self) -> impl Iterator<Item = WriteRef<'_>> {
        self.maps.iter().enumerate().flat_map(|(store, m)| {
            m.iter().map(move |(key, p)| WriteRef {
                store,
                key,
                value: p.value.as_deref(),
            })
        })
    }

    /// Every write, in (store, key) order: RocksDB's memtable reuses its skiplist splice from
    /// one insert to the next.
    ///
    /// Sorted on the keys' first 16 bytes held beside them, the whole keys compared only where
    /// those are equal: compared in place, every comparison read two keys from wherever the map
    /// put them, and at 10M keys the sort was a tenth of the committer's time.
    pub fn sorted(&self) -> Vec<WriteRef<'_>> {
        let mut v: Vec<(usize, u128, WriteRef<'_>)> = self
            .iter()
            .map(|w| (w.store, key_prefix(w.key), w))
            .collect();
        v.sort_unstable_by(|a, b| {
            (a.0, a.1)
                .cmp(&(b.0, b.1))
                .then_with(|| a.2.key.cmp(b.2.key))
        });
        v.into_iter().map(|(_, _, w)| w).collect()
    }
}

/// A key's first 16 bytes as a big-endian number, zeros past its end: ordered as the keys are
/// where the numbers differ (a shorter key is a prefix of the other or smaller at a byte).
fn key_prefix(key: &[u8]) -> u128 {
    let mut b = [0u8; 16];
    let n = key.len().min(16);
    b[..n].copy_from_slice(&key[..n]);
    u128::from_be_bytes(b)
}

/// The hasher of every map of the overlay: foldhash, fast, and seeded at random once per
/// process so that keys from input records cannot be chosen to collide. One seed for all the
/// maps, so that a key is hashed once and looked up with that hash in each of them (hashing
/// the key again for every map was a tenth of a partition thread at 10M keys).
#[derive(Clone)]
pub struct KeyHasher(foldhash::fast::RandomState);

impl Default for KeyHasher {
    fn default() -> Self {
        static STATE: std::sync::LazyLock<foldhash::fast::RandomState> =
            std::sync::LazyLock::new(Default::default);
        KeyHasher(STATE.clone())
    }
}

impl BuildHasher for KeyHasher {
    type Hasher = foldhash::fast::FoldHasher<'static>;
    fn build_hasher(&self) -> Self::Hasher {
        self.0.build_hasher()
    }
}

type Map = HashMap<Vec<u8>, Option<Vec<u8>>, KeyHasher>;

/// A pending write of a key.
struct Pending {
    value: Option<Vec<u8>>,
    /// The guest call that first wrote the key.
    call: u64,
    /// The key's hash: at settle, the committed keys are long out of the CPU's caches, and
    /// hashing one again waited on its bytes (a fiftieth of a partition thread at 10M keys).
    hash: u64,
}

type PendingMap = HashMap<Vec<u8>, Pending, KeyHasher>;

/// Pending writes with a savepoint per guest call, then the hot-key cache. One map per store,
/// so that a lookup borrows the key instead of building one.
///
/// A write goes straight into the pending map. A value it replaces goes to the call's undo log
/// (with the key, which the map already holds); a key it adds is tagged with the call. Keeping
/// a call forgets its undo log; dropping it replays the log backwards and removes the keys the
/// call added. Only the rare failed call pays more than a lookup.
#[derive(Default)]
pub struct Overlay {
    pending: Vec<PendingMap>,
    /// Of the current call: per replaced value, its store, key and the value before.
    undo: Vec<(usize, Vec<u8>, Option<Vec<u8>>)>,
    /// Keys the current call added.
    added: usize,
    /// The current call's number.
    call: u64,
    /// Bytes written since the last `take` (an upper bound of what is pending).
    written: usize,
    /// Writes taken for a commit that is not settled yet.
    committing: Option<Arc<Writes>>,
    /// Committed values (`None`: absent from RocksDB), the young generation; empty without a
    /// budget.
    clean: Vec<Map>,
    /// The old generation: read after the young one, which holds the newer value of a key.
    old: Vec<Map>,
    /// Bytes charged for the young and the old generation.
    clean_bytes: usize,
    old_bytes: usize,
    budget: Option<Arc<HotBudget>>,
    /// Values read from RocksDB by the current batch that the cache did not admit.
    fetched: Vec<Map>,
    /// Made (and charged) at the first read from RocksDB; `None` before, or when the budget
    /// had no room for it (every key read is admitted then).
    door: Option<Doorkeeper>,
    /// The maps of the last settled writes, emptied, for the next batch's pending writes: a
    /// batch of thousands of keys grew a new map from nothing, rehashing it again and again
    /// into freshly faulted pages (a twentieth of a partition thread at 10M keys).
    spare: Vec<PendingMap>,
    hasher: KeyHasher,
    /// Lookups ahead of a read that reached the hot-key cache, and those it answered, since
    /// the last check ([`Overlay::take`] checks every [`HOT_CHECK_EVERY`] lookups).
    hot_lookups: std::cell::Cell<u64>,
    hot_hits: std::cell::Cell<u64>,
}

/// Lookups of the hot-key cache between two checks of its hit rate.
const HOT_CHECK_EVERY: u64 = 1 << 18;

/// The hit rate, in hundredths, under which the hot-key cache is emptied at a check. A miss
/// costs a probe of each generation's table, out of the CPU's caches once they hold millions
/// of keys (about a tenth of a microsecond each); a hit saves a RocksDB lookup (a few
/// microseconds). Over 10M keys read at random, what the doorkeeper let in by collisions
/// filled the cache with keys never read again, and every lookup and every settled write
/// probed its tables for nothing.
const HOT_MIN_HIT_PERCENT: u64 = 2;

/// Entries up to which a settled batch's emptied map is kept for the next batch.
const SPARE_MAX: usize = 1 << 16;

impl Drop for Overlay {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.release(self.clean_bytes + self.old_bytes + self.door_bytes());
        }
    }
}

/// Sets `key` (of hash `hash`) to `value` in `m`.
fn upsert<V>(m: &mut HashMap<Vec<u8>, V, KeyHasher>, hash: u64, key: Vec<u8>, value: V) {
    match m
        .raw_entry_mut()
        .from_key_hashed_nocheck(hash, key.as_slice())
    {
        RawEntryMut::Occupied(mut e) => *e.get_mut() = value,
        RawEntryMut::Vacant(e) => {
            e.insert_hashed_nocheck(hash, key, value);
        }
    }
}

fn slot_of<M: Default>(maps: &mut Vec<M>, store: usize) -> &mut M {
    if maps.len() <= store {
        maps.resize_with(store + 1, M::default);
    }
    &mut maps[store]
}

impl Overlay {
    /// An overlay whose hot-key cache is charged to `budget`.
    pub fn with_budget(budget: Arc<HotBudget>) -> Self {
        let mut o = Overlay::default();
        o.budget = Some(budget);
        o
    }

    /// The value as the overlay knows it: `None` if it does not know the key (read RocksDB),
    /// `Some(None)` if the key is deleted or absent, `Some(Some(v))` if its value is `v`.
    pub fn get(&self, store: usize, key: &[u8]) -> Option<Option<&[u8]>> {
        self.lookup(store, key, self.hash(key), false)
    }

    /// [`Overlay::get`] of a key whose [`Overlay::hash`] is `hash`.
    pub fn get_hashed(&self, store: usize, key: &[u8], hash: u64) -> Option<Option<&[u8]>> {
        self.lookup(store, key, hash, false)
    }

    /// The pending value of a key whose [`Overlay::hash`] is `hash`, if the current batch
    /// wrote it.
    pub fn pending_hashed(&self, store: usize, key: &[u8], hash: u64) -> Option<Option<&[u8]>> {
        self.pending
            .get(store)
            .and_then(|m| m.raw_entry().from_key_hashed_nocheck(hash, key))
            .map(|(_, p)| p.value.as_deref())
    }

    /// The hash the overlay's maps know `key` by.
    pub fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// [`Overlay::get`] ahead of a read from RocksDB of the keys it does not know: counted for
    /// the hot-key cache's hit rate. (The reads after such a read find the keys it brought in,
    /// so only these lookups say whether the cache saves RocksDB any.)
    pub fn get_before_read(&self, store: usize, key: &[u8]) -> Option<Option<&[u8]>> {
        self.lookup(store, key, self.hash(key), true)
    }

    /// [`Overlay::get_before_read`] of a key whose [`Overlay::hash`] is `hash`.
    pub fn get_before_read_hashed(
        &self,
        store: usize,
        key: &[u8],
        hash: u64,
    ) -> Option<Option<&[u8]>> {
        self.lookup(store, key, hash, true)
    }

    fn lookup(&self, store: usize, key: &[u8], hash: u64, count: bool) -> Option<Option<&[u8]>> {
        if let Some(v) = self.pending_hashed(store, key, hash) {
            return Some(v);
        }
        if let Some(v) = self
            .committing
            .as_ref()
            .and_then(|w| w.get(store, key, hash))
        {
            return Some(v);
        }
        fn find<'m>(
            maps: &'m [Map],
            store: usize,
            key: &[u8],
            hash: u64,
        ) -> Option<&'m Option<Vec<u8>>> {
            maps.get(store)
                .and_then(|m| m.raw_entry().from_key_hashed_nocheck(hash, key))
                .map(|(_, v)| v)
        }
        if let Some(v) = find(&self.fetched, store, key, hash) {
            return Some(v.as_deref());
        }
        if self.clean_bytes + self.old_bytes == 0 {
            return None;
        }
        let v = find(&self.clean, store, key, hash).or_else(|| find(&self.old, store, key, hash));
        if count {
            self.hot_lookups.set(self.hot_lookups.get() + 1);
            self.hot_hits
                .set(self.hot_hits.get() + u64::from(v.is_some()));
        }
        v.map(|v| v.as_deref())
    }

    fn door_bytes(&self) -> usize {
        if self.door.is_some() {
            DOOR_BITS / 8
        } else {
            0
        }
    }

    /// Keeps a value read from RocksDB (`None`: the key is absent there): in the cache if the
    /// doorkeeper saw the key read before, for the current batch only if not.
    pub fn remember(&mut self, store: usize, key: Vec<u8>, value: Option<Vec<u8>>) {
        let hash = self.hash(&key);
        match self.door_admits(store, hash) {
            None => return,
            Some(true) => {
                self.admit_hashed(store, key, value, hash);
                return;
            }
            Some(false) => {}
        }
        let m = slot_of(&mut self.fetched, store);
        if m.len() >= FETCHED_MAX {
            m.clear();
        }
        upsert(m, hash, key, value);
    }

    /// A value read from RocksDB (`None`: absent there) for a caller that writes the key at
    /// once (an increment): the doorkeeper and the cache take it as [`Overlay::remember`]
    /// does, but the current batch does not keep it, since the write that follows shadows it.
    pub fn note_read(&mut self, store: usize, key: &[u8], hash: u64, value: Option<&[u8]>) {
        if self.door_admits(store, hash) == Some(true) {
            self.admit_hashed(store, key.to_vec(), value.map(<[u8]>::to_vec), hash);
        }
    }

    /// Whether the cache takes a key of hash `hash` just read from RocksDB: the doorkeeper saw
    /// it read before (and marks it if not). `None` without a budget: nothing is kept.
    fn door_admits(&mut self, store: usize, hash: u64) -> Option<bool> {
        let budget = self.budget.as_ref()?;
        if self.door.is_none() && budget.try_charge(DOOR_BITS / 8) {
            self.door = Some(Doorkeeper::new());
        }
        Some(match &mut self.door {
            Some(door) => door.seen_or_mark(store, hash),
            None => true,
        })
    }

    /// Puts a committed value into the cache.
    #[cfg(test)]
    pub(crate) fn admit(&mut self, store: usize, key: Vec<u8>, value: Option<Vec<u8>>) {
        let hash = self.hasher.hash_one(key.as_slice());
        self.admit_hashed(store, key, value, hash);
    }

    /// [`Overlay::admit`] of a key whose hash is `hash`.
    fn admit_hashed(&mut self, store: usize, key: Vec<u8>, value: Option<Vec<u8>>, hash: u64) {
        let Some(budget) = self.budget.clone() else {
            return;
        };
        let n = entry_bytes(&key, &value);
        if let RawEntryMut::Occupied(e) = slot_of(&mut self.clean, store)
            .raw_entry_mut()
            .from_key_hashed_nocheck(hash, key.as_slice())
        {
            let old = e.remove();
            // The old entry's charge goes back before the new one is charged.
            let back = entry_bytes(&key, &old).min(self.clean_bytes);
            budget.release(back);
            self.clean_bytes -= back;
        }
        // The young generation turns old at half the budget, so that the two together fit it.
        if self.clean_bytes + n > budget.limit() / 2 {
            self.turn_generations();
        }
        if !budget.try_charge(n) {
            // Other partitions hold the rest of the budget: this one drops its old generation;
            // if that frees too little, it starts over.
            self.turn_generations();
            if !budget.try_charge(n) {
                self.forget_cache();
                if !budget.try_charge(n) {
                    return;
                }
            }
        }
        upsert(slot_of(&mut self.clean, store), hash, key, value);
        self.clean_bytes += n;
    }

    /// Drops one key from the hot-key cache.
    fn forget(&mut self, store: usize, key: &[u8]) {
        if let Some(old) = self.clean.get_mut(store).and_then(|m| m.remove(key)) {
            let back = entry_bytes(key, &old).min(self.clean_bytes);
            if let Some(b) = &self.budget {
                b.release(back);
            }
            self.clean_bytes -= back;
        }
        if let Some(old) = self.old.get_mut(store).and_then(|m| m.remove(key)) {
            let back = entry_bytes(key, &old).min(self.old_bytes);
            if let Some(b) = &self.budget {
                b.release(back);
            }
            self.old_bytes -= back;
        }
    }

    /// Drops the old generation and makes the young one old. The new young maps start empty
    /// and grow: started at the size the last ones reached, their tables held as much memory
    /// again as the old generation's, uncharged (a sixth of the host's RSS over its bound at
    /// millions of keys).
    fn turn_generations(&mut self) {
        if let Some(b) = &self.budget {
            b.release(self.old_bytes);
        }
        let young: Vec<Map> = self.clean.iter().map(|_| Map::default()).collect();
        self.old = std::mem::replace(&mut self.clean, young);
        self.old_bytes = std::mem::take(&mut self.clean_bytes);
    }

    /// Empties the hot-key cache, its memory included, and gives its bytes back to the budget.
    pub fn forget_cache(&mut self) {
        if let Some(b) = &self.budget {
            b.release(self.clean_bytes + self.old_bytes + self.door_bytes());
        }
        self.clean_bytes = 0;
        self.old_bytes = 0;
        self.clean = Vec::new();
        self.old = Vec::new();
        self.fetched = Vec::new();
        self.door = None;
    }

    /// A committed write: the cache's entry of the key, if it has one, takes the new value.
    fn refresh(&mut self, store: usize, key: Vec<u8>, value: Option<Vec<u8>>, hash: u64) {
        let in_young = self.clean.get(store).is_some_and(|m| {
            m.raw_entry()
                .from_key_hashed_nocheck(hash, key.as_slice())
                .is_some()
        });
        if in_young {
            self.admit_hashed(store, key, value, hash);
        } else if let Some(old) = self.old.get_mut(store).and_then(|m| {
            match m
                .raw_entry_mut()
                .from_key_hashed_nocheck(hash, key.as_slice())
            {
                RawEntryMut::Occupied(e) => Some(e.remove()),
                RawEntryMut::Vacant(_) => None,
            }
        }) {
            // Written again since the last turn: it moves to the young generation.
            let back = entry_bytes(&key, &old).min(self.old_bytes);
            if let Some(b) = &self.budget {
                b.release(back);
            }
            self.old_bytes -= back;
            self.admit_hashed(store, key, value, hash);
        }
    }

    /// The commit of the writes last taken succeeded (they are in RocksDB): they move into the
    /// hot-key cache.
    pub fn settle(&mut self) {
        let Some(committing) = self.committing.take() else {
            return;
        };
        if self.budget.is_none() {
            return;
        }
        // The commit has let go of them by now; if not, RocksDB serves them instead, and the
        // cache must not hold older values of them.
        match Arc::try_unwrap(committing) {
            Ok(w) => {
                let mut spare = Vec::with_capacity(w.maps.len());
                for (store, mut m) in w.maps.into_iter().enumerate() {
                    if self.clean_bytes + self.old_bytes == 0 {
                        // An empty cache has no entry to refresh.
                        m.clear();
                    } else {
                        for (key, p) in m.drain() {
                            self.refresh(store, key, p.value, p.hash);
                        }
                    }
                    if m.capacity() > SPARE_MAX {
                        m = PendingMap::default();
                    }
                    spare.push(m);
                }
                self.spare = spare;
            }
            Err(w) => {
                for (store, m) in w.maps.iter().enumerate() {
                    for key in m.keys() {
                        self.forget(store, key);
                    }
                }
            }
        }
    }

    /// The commit of the writes last taken failed: reads no longer see them.
    pub fn discard_committing(&mut self) {
        self.committing = None;
    }

    /// True while writes taken for a commit are not settled.
    pub fn is_committing(&self) -> bool {
        self.committing.is_some()
    }

    /// Bytes written since the pending writes were last taken: at least what they hold.
    pub fn written_bytes(&self) -> usize {
        self.written
    }

    /// Bytes the hot-key cache holds.
    pub fn cached_bytes(&self) -> usize {
        self.clean_bytes + self.old_bytes
    }

    /// Records a write of the current call.
    pub fn put(&mut self, store: usize, key: Vec<u8>, value: Option<Vec<u8>>) {
        let hash = self.hash(&key);
        self.put_hashed(store, key, hash, value);
    }

    /// [`Overlay::put`] of a key whose [`Overlay::hash`] is `hash`.
    pub fn put_hashed(&mut self, store: usize, key: Vec<u8>, hash: u64, value: Option<Vec<u8>>) {
        self.written += key.len() + value.as_ref().map_or(0, Vec::len);
        let call = self.call;
        let m = slot_of(&mut self.pending, store);
        match m
            .raw_entry_mut()
            .from_key_hashed_nocheck(hash, key.as_slice())
        {
            RawEntryMut::Occupied(mut e) => {
                let before = std::mem::replace(&mut e.get_mut().value, value);
                self.undo.push((store, key, before));
            }
            RawEntryMut::Vacant(e) => {
                e.insert_hashed_nocheck(hash, key, Pending { value, call, hash });
                self.added += 1;
            }
        }
    }

    /// Keeps the current call's writes.
    pub fn keep_call(&mut self) {
        self.undo.clear();
        self.added = 0;
        self.call += 1;
    }

    /// Drops the current call's writes.
    pub fn drop_call(&mut self) {
        for (store, key, before) in self.undo.drain(..).rev() {
            if let Some(p) = self.pending[store].get_mut(key.as_slice()) {
                p.value = before;
            }
        }
        if self.added > 0 {
            let call = self.call;
            for m in &mut self.pending {
                m.retain(|_, p| p.call != call);
            }
        }
        self.added = 0;
        self.call += 1;
    }

    /// Pending and committing entries of `store` with `start <= key < end`, for merging into a
    /// scan.
    pub fn range(&self, store: usize, start: &[u8], end: &[u8]) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        let within = |k: &[u8]| k >= start && k < end;
        let mut found: std::collections::BTreeMap<&[u8], Option<&[u8]>> = self
            .committing
            .iter()
            .flat_map(|w| w.maps.get(store))
            .flatten()
            .filter(|(k, _)| within(k))
            .map(|(k, p)| (k.as_slice(), p.value.as_deref()))
            .collect();
        for (k, p) in self.pending.get(store).into_iter().flatten() {
            if within(k) {
                found.insert(k, p.value.as_deref());
            }
        }
        found
            .into_iter()
            .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
            .collect()
    }

    /// True when nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.pending.iter().all(PendingMap::is_empty)
    }

    /// Takes the pending writes for a commit (the current call's must have been kept or
    /// dropped, and the last commit settled). Reads still see them until [`Overlay::settle`];
    /// a failed commit ends the session, and the overlay with it.
    pub fn take(&mut self) -> Arc<Writes> {
        debug_assert!(self.committing.is_none());
        self.written = 0;
        // RocksDB's values from before the writes taken now, which may replace them: once
        // those settle, such a value would be stale.
        for m in &mut self.fetched {
            m.clear();
        }
        if self.hot_lookups.get() >= HOT_CHECK_EVERY {
            if self.hot_hits.get() * 100 < self.hot_lookups.get() * HOT_MIN_HIT_PERCENT {
                // The doorkeeper, with its window, goes too: it starts again from nothing.
                self.forget_cache();
            }
            self.hot_lookups.set(0);
            self.hot_hits.set(0);
        }
        let maps = std::mem::replace(&mut self.pending, std::mem::take(&mut self.spare));
        let w = Arc::new(Writes { maps });
        self.committing = Some(w.clone());
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_savepoints() {
        let mut o = Overlay::default();
        o.put(0, b"a".to_vec(), Some(b"1".to_vec()));
        o.keep_call();
        o.put(0, b"a".to_vec(), Some(b"2".to_vec()));
        o.put(0, b"b".to_vec(), None);
        assert_eq!(o.get(0, b"a"), Some(Some(&b"2"[..])));
        assert_eq!(o.get(0, b"b"), Some(None));
        o.drop_call();
        assert_eq!(o.get(0, b"a"), Some(Some(&b"1"[..])));
        assert_eq!(o.get(0, b"b"), None);
        assert_eq!(o.range(0, b"", b"z").len(), 1);
        let ops = o.take();
        assert_eq!(
            ops.sorted(),
            vec![WriteRef {
                store: 0,
                key: b"a",
                value: Some(b"1")
            }]
        );
        assert!(o.is_empty());
    }

    /// Keys sharing long prefixes, shorter and longer than the 16 bytes sorted on first, with
    /// zero and 0xff bytes where a key ends: the commit's order is the bytes' order, by store.
    #[test]
    fn writes_are_sorted_by_store_then_key_bytes_whatever_their_prefixes() {
        let mut o = Overlay::default();
        let mut want = Vec::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let store = (seed % 3) as usize;
            let len = (seed >> 8) as usize % 22;
            // Mostly "slot-and-word-..." prefixes, then bytes from {0, 1, 0xff}.
            let mut key = b"\0\0\0\x02key-0000"[..len.min(12)].to_vec();
            for i in key.len()..len {
                key.push([0u8, 1, 0xff][((seed >> (i % 48)) % 3) as usize]);
            }
            if !want.contains(&(store, key.clone())) {
                want.push((store, key.clone()));
            }
            o.put(store, key, Some(b"v".to_vec()));
        }
        want.sort();
        let w = o.take();
        let got: Vec<(usize, Vec<u8>)> = w
            .sorted()
            .iter()
            .map(|w| (w.store, w.key.to_vec()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn settled_writes_refresh_the_keys_the_cache_holds_and_leave_the_others_out() {
        let budget = HotBudget::new(1 << 20);
        let mut o = Overlay::with_budget(budget.clone());
        o.admit(0, b"cached".to_vec(), Some(b"0".to_vec()));
        o.put(0, b"cached".to_vec(), Some(b"1".to_vec()));
        o.put(0, b"blind".to_vec(), Some(b"1".to_vec()));
        o.keep_call();
        let w = o.take();
        assert_eq!(
            o.get(0, b"blind"),
            Some(Some(&b"1"[..])),
            "committing writes are seen"
        );
        drop(w);
        o.settle();
        assert!(!o.is_committing());
        assert_eq!(o.get(0, b"cached"), Some(Some(&b"1"[..])));
        assert_eq!(o.get(0, b"blind"), None, "never read: RocksDB answers");
        assert_eq!(
            o.cached_bytes(),
            entry_bytes(b"cached", &Some(b"1".to_vec()))
        );
        drop(o);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_key_enters_the_cache_on_its_second_read_and_serves_its_first_batch_until_then() {
        let budget = HotBudget::new(1 << 20);
        let mut o = Overlay::with_budget(budget.clone());
        o.remember(0, b"k".to_vec(), Some(b"v".to_vec()));
        assert_eq!(
            o.get(0, b"k"),
            Some(Some(&b"v"[..])),
            "the batch that read it"
        );
        assert_eq!(o.cached_bytes(), 0);
        assert_eq!(
            budget.used(),
            DOOR_BITS / 8,
            "only the doorkeeper is charged"
        );
        o.keep_call();
        o.take();
        o.settle();
        assert_eq!(o.get(0, b"k"), None, "dropped with its batch");
        o.remember(0, b"k".to_vec(), Some(b"v".to_vec()));
        o.take();
        o.settle();
        assert_eq!(
            o.get(0, b"k"),
            Some(Some(&b"v"[..])),
            "admitted at the second read"
        );
        assert!(o.cached_bytes() > 0);
        o.forget_cache();
        assert_eq!(budget.used(), 0);
        assert_eq!(o.get(0, b"k"), None);
    }

    #[test]
    fn a_value_read_then_written_in_one_batch_is_not_served_stale_after_the_commit() {
        let budget = HotBudget::new(1 << 20);
        let mut o = Overlay::with_budget(budget.clone());
        o.remember(0, b"k".to_vec(), Some(b"old".to_vec()));
        o.put(0, b"k".to_vec(), Some(b"new".to_vec()));
        o.keep_call();
        let w = o.take();
        assert_eq!(o.get(0, b"k"), Some(Some(&b"new"[..])));
        drop(w);
        o.settle();
        assert_ne!(o.get(0, b"k"), Some(Some(&b"old"[..])));
        assert_eq!(o.get(0, b"k"), None, "RocksDB has the new value");
    }

    #[test]
    fn keys_read_once_stay_out_of_the_cache_and_the_doorkeeper_starts_over() {
        let budget = HotBudget::new(64 << 20);
        let mut o = Overlay::with_budget(budget.clone());
        let keys = 20_000u32;
        for i in 0..keys {
            o.remember(0, format!("once-{i}").into_bytes(), Some(vec![0; 8]));
            if i % 100 == 99 {
                o.take();
                o.settle();
            }
        }
        // Only those whose bit another key had set got in: well under 5% at this fill.
        let entry = entry_bytes(b"once-00000", &Some(vec![0; 8]));
        assert!(
            o.cached_bytes() < keys as usize / 20 * entry,
            "{} bytes cached for {keys} keys read once",
            o.cached_bytes()
        );
        // A key read again within the window gets in; one read again after the doorkeeper
        // started over does not.
        o.remember(0, b"again".to_vec(), None);
        o.take();
        o.remember(0, b"again".to_vec(), None);
        o.take();
        assert_eq!(o.get(0, b"again"), Some(None));
        // A key read once and not let in by a collision with a key marked before it.
        let late = (0u32..)
            .map(|j| format!("late-{j}").into_bytes())
            .find(|k| {
                let before = o.cached_bytes();
                o.remember(0, k.clone(), None);
                o.take();
                o.cached_bytes() == before
            })
            .unwrap();
        let marked = |o: &Overlay| o.door.as_ref().map_or(0, |d| d.marked);
        // New keys until one starts the next window (a key whose bit is set marks nothing).
        let mut i = 0u32;
        while marked(&o) != 1 {
            assert!(
                i <= 2 * DOOR_WINDOW as u32,
                "the doorkeeper never started over"
            );
            o.remember(1, i.to_be_bytes().to_vec(), None);
            i += 1;
            if i.is_multiple_of(1000) {
                o.take();
            }
        }
        o.take();
        o.remember(0, late.clone(), None);
        o.take();
        assert_eq!(o.get(0, &late), None, "forgotten by the doorkeeper");
        drop(o);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_cache_that_answers_under_two_percent_of_lookups_is_emptied() {
        let budget = HotBudget::new(64 << 20);
        let mut o = Overlay::with_budget(budget.clone());
        for i in 0..1000u32 {
            o.admit(0, format!("hot-{i}").into_bytes(), Some(vec![1]));
        }
        let cached = o.cached_bytes();
        // Lookups ahead of reads, one in `every` of a cached key.
        let lookups = |o: &Overlay, every: u64| {
            for i in 0..HOT_CHECK_EVERY {
                let key = if i % every == 0 {
                    format!("hot-{}", i % 1000)
                } else {
                    format!("cold-{i}")
                };
                o.get_before_read(0, key.as_bytes());
            }
        };
        // A hit rate of 5%: the cache stays.
        lookups(&o, 20);
        o.take();
        o.settle();
        assert_eq!(o.cached_bytes(), cached, "kept at a 5% hit rate");
        assert_eq!(o.get(0, b"hot-7"), Some(Some(&[1u8][..])));
        // A hit rate of 1%: emptied at the next take, its bytes back in the budget.
        lookups(&o, 100);
        assert_eq!(o.cached_bytes(), cached, "only a take checks");
        o.take();
        o.settle();
        assert_eq!(o.cached_bytes(), 0, "emptied at a 1% hit rate");
        assert_eq!(o.get(0, b"hot-7"), None, "RocksDB answers again");
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn without_room_for_a_doorkeeper_every_key_read_is_admitted() {
        let budget = HotBudget::new(DOOR_BITS / 8 - 1);
        let mut o = Overlay::with_budget(budget.clone());
        o.remember(0, b"k".to_vec(), Some(b"v".to_vec()));
        o.take();
        assert_eq!(o.get(0, b"k"), Some(Some(&b"v"[..])));
        assert_eq!(budget.used(), o.cached_bytes());
    }

    #[test]
    fn the_budget_holds_across_overwrites_and_the_generations_turn_at_half_of_it() {
        let entry = entry_bytes(b"k0", &Some(vec![0; 8]));
        let budget = HotBudget::new(3 * entry);
        let mut o = Overlay::with_budget(budget.clone());
        for round in 0..5u8 {
            o.admit(0, b"k0".to_vec(), Some(vec![round; 8]));
        }
        assert_eq!(budget.used(), entry, "an overwrite is charged once");
        assert_eq!(o.get(0, b"k0"), Some(Some(&[4u8; 8][..])));
        // The young generation turns old at half the budget: the last two keys stay, one in
        // each generation, and the charge stays within the bound.
        for (i, k) in [b"k1", b"k2", b"k3"].into_iter().enumerate() {
            o.admit(0, k.to_vec(), Some(vec![i as u8 + 1; 8]));
            assert!(budget.used() <= 3 * entry);
            assert_eq!(o.cached_bytes(), budget.used());
        }
        assert_eq!(o.get(0, b"k3"), Some(Some(&[3u8; 8][..])));
        assert_eq!(o.get(0, b"k2"), Some(Some(&[2u8; 8][..])));
        assert_eq!(o.get(0, b"k0"), None, "dropped with its generation");
        o.forget_cache();
        assert_eq!(budget.used(), 0);
        assert_eq!(o.get(0, b"k3"), None);
    }

    #[test]
    fn hot_keys_survive_a_stream_of_keys_seen_once() {
        let entry = entry_bytes(b"hot", &Some(vec![0; 8]));
        let budget = HotBudget::new(100 * entry);
        let mut o = Overlay::with_budget(budget.clone());
        // Every 10th key is the hot one, written again (as each commit settles it); the rest
        // are 1,000 keys seen once each, ten times what the budget holds.
        for i in 0..1000u32 {
            if i % 10 == 0 {
                o.admit(0, b"hot".to_vec(), Some(i.to_be_bytes().repeat(2)));
            }
            o.admit(0, format!("c{i:03}").into_bytes(), Some(vec![0; 8]));
            assert!(budget.used() <= 100 * entry, "over the budget at {i}");
            assert_eq!(o.cached_bytes(), budget.used());
            assert_eq!(
                o.get(0, b"hot"),
                Some(Some(&(i / 10 * 10).to_be_bytes().repeat(2)[..])),
                "the hot key, with its newest value, at {i}"
            );
        }
        // Keys seen once long ago are gone; the newest are there.
        assert_eq!(o.get(0, b"c000"), None);
        assert_eq!(o.get(0, b"c999"), Some(Some(&[0u8; 8][..])));
        drop(o);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_dropped_call_restores_every_value_it_replaced_and_removes_what_it_added() {
        let mut o = Overlay::default();
        o.put(0, b"a".to_vec(), Some(b"1".to_vec()));
        o.put(1, b"a".to_vec(), Some(b"x".to_vec()));
        o.keep_call();
        // The failing call: replaces `a` twice, adds `b` then replaces it, deletes 1/a.
        o.put(0, b"a".to_vec(), Some(b"2".to_vec()));
        o.put(0, b"a".to_vec(), Some(b"3".to_vec()));
        o.put(0, b"b".to_vec(), Some(b"1".to_vec()));
        o.put(0, b"b".to_vec(), Some(b"2".to_vec()));
        o.put(1, b"a".to_vec(), None);
        assert_eq!(o.get(0, b"a"), Some(Some(&b"3"[..])));
        assert_eq!(o.get(1, b"a"), Some(None));
        o.drop_call();
        assert_eq!(o.get(0, b"a"), Some(Some(&b"1"[..])));
        assert_eq!(o.get(0, b"b"), None);
        assert_eq!(o.get(1, b"a"), Some(Some(&b"x"[..])));
        // The next call's writes are kept.
        o.put(0, b"c".to_vec(), Some(b"9".to_vec()));
        o.keep_call();
        let w = o.take();
        let keys: Vec<_> = w
            .sorted()
            .iter()
            .map(|w| (w.store, w.key.to_vec()))
            .collect();
        assert_eq!(
            keys,
            vec![(0, b"a".to_vec()), (0, b"c".to_vec()), (1, b"a".to_vec())]
        );
        assert!(o.is_empty());
    }

    #[test]
    fn written_bytes_bound_the_pending_writes_until_they_are_taken() {
        let mut o = Overlay::default();
        o.put(0, b"key".to_vec(), Some(vec![0; 100]));
        o.put(0, b"key".to_vec(), Some(vec![0; 10]));
        o.keep_call();
        assert_eq!(o.written_bytes(), 103 + 13);
        o.take();
        assert_eq!(o.written_bytes(), 0);
    }

    #[test]
    fn processing_goes_on_over_writes_being_committed() {
        let budget = HotBudget::new(1 << 20);
        let mut o = Overlay::with_budget(budget.clone());
        o.put(0, b"a".to_vec(), Some(b"1".to_vec()));
        o.put(0, b"b".to_vec(), Some(b"1".to_vec()));
        o.keep_call();
        let first = o.take();
        assert!(o.is_empty() && o.is_committing());
        // The next batch reads the committing values and overwrites one of them; a failed
        // call on top of them leaves them as they were.
        assert_eq!(o.get(0, b"a"), Some(Some(&b"1"[..])));
        o.put(0, b"a".to_vec(), Some(b"2".to_vec()));
        o.put(0, b"c".to_vec(), None);
        o.keep_call();
        o.put(0, b"b".to_vec(), Some(b"9".to_vec()));
        o.drop_call();
        assert_eq!(o.get(0, b"a"), Some(Some(&b"2"[..])));
        assert_eq!(o.get(0, b"b"), Some(Some(&b"1"[..])));
        assert_eq!(
            o.range(0, b"a", b"z"),
            vec![
                (b"a".to_vec(), Some(b"2".to_vec())),
                (b"b".to_vec(), Some(b"1".to_vec())),
                (b"c".to_vec(), None)
            ]
        );
        assert_eq!(first.len(), 2, "the commit holds only what was taken");
        // Settled: the first commit's values are RocksDB's (the cache held neither key), the
        // pending write still wins.
        drop(first);
        o.settle();
        assert_eq!(o.get(0, b"a"), Some(Some(&b"2"[..])));
        assert_eq!(o.get(0, b"b"), None);
        let second = o.take();
        assert_eq!(second.len(), 2);
    }

    #[test]
    fn writes_still_shared_at_settle_leave_no_stale_cache_entry() {
        let budget = HotBudget::new(1 << 20);
        let mut o = Overlay::with_budget(budget.clone());
        o.admit(0, b"k".to_vec(), Some(b"old".to_vec()));
        o.put(0, b"k".to_vec(), Some(b"new".to_vec()));
        o.keep_call();
        let held = o.take();
        o.settle();
        // Not moved into the cache (someone still holds them), and the old value is gone:
        // the next read goes to RocksDB.
        assert_eq!(o.get(0, b"k"), None);
        assert_eq!(budget.used(), 0);
        drop(held);
    }
}
