//! The host side of the processor world: the state, output and log imports, implemented over
//! the batch context of the partition task that owns the instance.

use std::collections::HashMap;
use std::sync::Arc;

use wasmtime::component::{Resource, ResourceTable};
use wasmtime::{ResourceLimiter, StoreLimits};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::{v0_1, v0_2};
pub use super::limits::{OutputTopic, WriteLimits};
pub use super::sandbox::WasiGrants;
use super::sandbox::new_wasi;
use super::stderr::StderrTail;
use crate::record::Record;
use crate::state::{Overlay, PartitionDb, slot_key};

/// An error a guest can handle, whichever contract it speaks; each contract's bindings convert
/// it into their own `error` variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestError {
    /// The pipeline declares no store of this name.
    NoSuchStore(String),
    /// The pipeline declares no output topic of this name.
    NoSuchTopic(String),
    /// A stored value cannot be used as asked.
    InvalidValue(String),
    /// The processor rejects its input or configuration (or a batched call names bytes
    /// outside its data).
    InvalidInput(String),
    /// A key, value or record over a limit.
    TooLarge(String),
    /// A limit of the pipeline was reached.
    Limit(String),
    /// Anything else.
    Other(String),
}

impl std::fmt::Display for GuestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuestError::NoSuchStore(s) => write!(f, "no-such-store: {s}"),
            GuestError::NoSuchTopic(s) => write!(f, "no-such-topic: {s}"),
            GuestError::InvalidValue(s) => write!(f, "invalid-value: {s}"),
            GuestError::InvalidInput(s) => write!(f, "invalid-input: {s}"),
            GuestError::TooLarge(s) => write!(f, "too-large: {s}"),
            GuestError::Limit(s) => write!(f, "limit: {s}"),
            GuestError::Other(s) => f.write_str(s),
        }
    }
}

impl From<GuestError> for v0_1::baton::processor::types::Error {
    /// Contract 0.1 has no cases for `too-large` and `limit`: they are `other`, starting with
    /// their name.
    fn from(e: GuestError) -> Self {
        use v0_1::baton::processor::types::Error as E;
        match e {
            GuestError::NoSuchStore(s) => E::NoSuchStore(s),
            GuestError::NoSuchTopic(s) => E::NoSuchTopic(s),
            GuestError::InvalidValue(s) => E::InvalidValue(s),
            GuestError::InvalidInput(s) => E::InvalidInput(s),
            e @ (GuestError::TooLarge(_) | GuestError::Limit(_)) => E::Other(e.to_string()),
            GuestError::Other(s) => E::Other(s),
        }
    }
}

impl From<v0_1::baton::processor::types::Error> for GuestError {
    fn from(e: v0_1::baton::processor::types::Error) -> Self {
        use v0_1::baton::processor::types::Error as E;
        match e {
            E::NoSuchStore(s) => GuestError::NoSuchStore(s),
            E::NoSuchTopic(s) => GuestError::NoSuchTopic(s),
            E::InvalidValue(s) => GuestError::InvalidValue(s),
            E::InvalidInput(s) => GuestError::InvalidInput(s),
            E::Other(s) => GuestError::Other(s),
        }
    }
}

impl From<GuestError> for v0_2::baton::processor::types::Error {
    fn from(e: GuestError) -> Self {
        use v0_2::baton::processor::types::Error as E;
        match e {
            GuestError::NoSuchStore(s) => E::NoSuchStore(s),
            GuestError::NoSuchTopic(s) => E::NoSuchTopic(s),
            GuestError::InvalidValue(s) => E::InvalidValue(s),
            GuestError::InvalidInput(s) => E::InvalidInput(s),
            GuestError::TooLarge(s) => E::TooLarge(s),
            GuestError::Limit(s) => E::Limit(s),
            GuestError::Other(s) => E::Other(s),
        }
    }
}

impl From<v0_2::baton::processor::types::Error> for GuestError {
    fn from(e: v0_2::baton::processor::types::Error) -> Self {
        use v0_2::baton::processor::types::Error as E;
        match e {
            E::NoSuchStore(s) => GuestError::NoSuchStore(s),
            E::NoSuchTopic(s) => GuestError::NoSuchTopic(s),
            E::InvalidValue(s) => GuestError::InvalidValue(s),
            E::InvalidInput(s) => GuestError::InvalidInput(s),
            E::TooLarge(s) => GuestError::TooLarge(s),
            E::Limit(s) => GuestError::Limit(s),
            E::Other(s) => GuestError::Other(s),
        }
    }
}

type Error = GuestError;

/// The error a guest gets for a key, value or record over a limit.
fn too_large(what: String) -> Error {
    Error::TooLarge(what)
}

/// The guest's handle on a store: the store id within the partition database.
#[derive(Debug, Clone, Copy)]
pub struct StoreHandle {
    store: usize,
}

pub use crate::record::Output;

/// Where the record being processed came from, for logs and dead letters.
#[derive(Debug, Clone, Default)]
pub struct Cursor {
    /// Input topic.
    pub topic: String,
    /// Slot.
    pub slot: u32,
    /// Offset of the first record of the current call.
    pub offset: u64,
    /// Timestamp of the first record of the current call.
    pub timestamp: i64,
}

/// A guest log line, kept for the pipeline's event list.
#[derive(Debug, Clone)]
pub struct GuestLog {
    /// Level name.
    pub level: &'static str,
    /// Message.
    pub message: String,
    /// Where it was logged.
    pub cursor: Cursor,
}

/// Everything an instance's imports reach: WASI (nothing granted), limits, and the batch.
pub struct HostCtx {
    wasi: WasiCtx,
    /// What the guest wrote to stderr (a Rust panic message, say), kept to explain traps.
    stderr: StderrTail,
    table: ResourceTable,
    limits: StoreLimits,
    pipeline: Arc<str>,
    pub(super) db: Arc<PartitionDb>,
    /// Declared output topics and the size limits of writes.
    limits_w: Arc<WriteLimits>,
    /// Writes not yet committed, and the hot-key cache.
    pub overlay: Overlay,
    /// Outputs not yet committed; those past `call_start` belong to the current call.
    pub outputs: Vec<Output>,
    call_start: usize,
    /// The record being processed.
    pub cursor: Cursor,
    /// Guest log lines since they were last taken.
    pub logs: Vec<GuestLog>,
    grants: WasiGrants,
    /// Set when a host call failed through no fault of the guest (state I/O): the call traps,
    /// and the partition ends its session and retries instead of dead-lettering the record.
    pub host_fault: Option<String>,
    /// The event time of the current call's slot (`timers.event-time`), `-1` before any record.
    pub event_time: i64,
    /// The event time of each slot seen.
    pub event_times: HashMap<u32, i64>,
    /// The slot whose event time the current call moved, and where it was before.
    pub(super) call_event_time: Option<(u32, i64)>,
    /// The processing time of the current call, in milliseconds since the Unix epoch.
    pub(super) call_now: i64,
    /// When set, the processing time of every call (local runs drive it from the records'
    /// timestamps); `None` is the wall clock.
    pub clock: Option<i64>,
    /// The Wasm backtrace of the last trap, when there was one.
    pub last_backtrace: parking_lot::Mutex<Option<String>>,
    /// The id of the host's own store (`__time`), when the partition keeps one.
    pub(super) time_store: Option<usize>,
    /// Per slot and store: whether entries may carry an expiry.
    pub(super) expiring: HashMap<(u32, usize), bool>,
    /// Per slot, time-store index (timers, expiries) and clock: no live entry is due before
    /// this time, so scans for due entries start there instead of walking the tombstones of
    /// those that fired (see `time::HostCtx::due_timers`).
    pub(super) time_floor: HashMap<(u32, u8, u8), i64>,
}

impl HostCtx {
    /// A context for a partition's instance.
    pub fn new(
        pipeline: Arc<str>,
        db: Arc<PartitionDb>,
        write_limits: Arc<WriteLimits>,
        memory_limit: usize,
        grants: WasiGrants,
    ) -> Self {
        let (wasi, stderr) = new_wasi(&grants);
        let overlay = Overlay::with_budget(db.hot_budget());
        HostCtx {
            wasi,
            stderr,
            table: ResourceTable::new(),
            limits: wasmtime::StoreLimitsBuilder::new()
                .memory_size(memory_limit)
                // Components of other languages link several core modules (Python: libc, libpython,
                // the runtime and adapters); a bound still, against runaway instantiation.
                .instances(64)
                .build(),
            pipeline,
            db: db.clone(),
            limits_w: write_limits,
            overlay,
            outputs: Vec::new(),
            call_start: 0,
            cursor: Cursor::default(),
            logs: Vec::new(),
            grants,
            host_fault: None,
            event_time: -1,
            event_times: HashMap::new(),
            call_event_time: None,
            call_now: 0,
            clock: None,
            last_backtrace: parking_lot::Mutex::new(None),
            time_store: db.store_id(super::time::TIME_STORE),
            expiring: HashMap::new(),
            time_floor: HashMap::new(),
        }
    }

    /// The memory limiter of the store.
    pub fn limiter(&mut self) -> &mut dyn ResourceLimiter {
        &mut self.limits
    }

    /// Marks the start of a guest call (its writes and outputs can be dropped alone).
    pub fn begin_call(&mut self, cursor: Cursor) {
        self.cursor = cursor;
        self.call_event_time = None;
        self.call_now = self.clock.unwrap_or_else(now_ms);
        self.call_start = self.outputs.len();
    }

    /// Keeps the call's writes and outputs.
    pub fn keep_call(&mut self) {
        self.call_event_time = None;
        self.overlay.keep_call();
        self.call_start = self.outputs.len();
    }

    /// Drops the call's writes and outputs.
    pub fn drop_call(&mut self) {
        if let Some((slot, before)) = self.call_event_time.take() {
            self.event_times.insert(slot, before);
        }
        self.overlay.drop_call();
        self.outputs.truncate(self.call_start);
        // The call's removals of due timers and expiries come back, maybe under a floor a
        // later scan of the call raised.
        self.time_floor.clear();
    }

    /// Adds a dead letter to the batch's outputs (not part of any call).
    pub fn push_dead_letter(&mut self, o: Output) {
        self.outputs.push(o);
        self.call_start = self.outputs.len();
    }

    /// Forgets what was read and cached from state (values, event times, which stores have
    /// expiries, where due timers start): after a restore wrote under it.
    pub fn forget_cached_state(&mut self) {
        self.overlay.forget_cache();
        self.event_times.clear();
        self.expiring.clear();
        self.time_floor.clear();
    }

    /// Forgets the resources and WASI state of a dropped instance before a new one is made.
    pub fn reset_instance_resources(&mut self) {
        self.table = ResourceTable::new();
        (self.wasi, self.stderr) = new_wasi(&self.grants);
    }

    /// Checks a state key against `limits.max_key_bytes`.
    fn check_key(&self, key: &[u8]) -> Result<(), Error> {
        let max = self.limits_w.max_key_bytes;
        if key.len() > max {
            return Err(too_large(format!(
                "state key of {} bytes exceeds limits.max_key_bytes ({max})",
                key.len()
            )));
        }
        Ok(())
    }

    /// Checks a state write against the key and value limits and its changelog's record limit.
    pub(super) fn check_write(&self, store: usize, key: &[u8], value: &[u8]) -> Result<(), Error> {
        self.check_key(key)?;
        let max = self.limits_w.max_value_bytes;
        if value.len() > max {
            return Err(too_large(format!(
                "state value of {} bytes exceeds limits.max_value_bytes ({max})",
                value.len()
            )));
        }
        if let Some(Some(max)) = self.limits_w.changelog_record_bytes.get(store)
            && key.len() + value.len() > *max
        {
            return Err(too_large(format!(
                "state entry of {} bytes exceeds what its changelog topic takes ({max} bytes: \
                 its max.message.bytes less 1 KiB)",
                key.len() + value.len()
            )));
        }
        Ok(())
    }

    /// The size limits of writes.
    pub fn write_limits(&self) -> &WriteLimits {
        &self.limits_w
    }

    /// The last bytes the guest wrote to stderr, on one line.
    pub fn stderr_tail(&self) -> String {
        self.stderr.text()
    }

    fn read(&mut self, store: usize, key: &[u8]) -> wasmtime::Result<Option<Vec<u8>>> {
        let k = slot_key(self.cursor.slot, key);
        let v = match self.overlay.get(store, &k) {
            Some(v) => v.map(<[u8]>::to_vec),
            None => {
                let r = self.db.get(store, &k);
                let v = self.host_result(r)?;
                self.overlay.remember(store, k, v.clone());
                v
            }
        };
        if v.is_some() && self.is_expired(store, key)? {
            return Ok(None);
        }
        Ok(v)
    }

    /// A state failure is the host's fault, not the guest's: it is recorded in
    /// [`HostCtx::host_fault`] and traps the call, so that the session ends and retries the
    /// batch instead of dead-lettering the record.
    pub(super) fn host_result<T>(&mut self, r: crate::state::Result<T>) -> wasmtime::Result<T> {
        r.map_err(|e| {
            let msg = e.to_string();
            self.host_fault.get_or_insert_with(|| msg.clone());
            wasmtime::Error::msg(format!("host fault: {msg}"))
        })
    }
}

impl WasiView for HostCtx {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// A key of a batch of increments, as [`HostCtx::read_ahead`] left it.
pub(super) struct Ahead {
    /// The key in the current slot.
    pub(super) key: Vec<u8>,
    /// Its [`Overlay::hash`].
    pub(super) hash: u64,
    /// Its value in RocksDB, read just now (`Some(None)`: absent there); `None` when the
    /// overlay knew the key then, or an earlier use of the key in the batch took the value.
    pub(super) read: Option<Option<Vec<u8>>>,
}

/// The operations of the contracts, whichever version the guest speaks. Keys are the guest's
/// (without the slot prefix); everything is scoped to the slot of the current call.
impl HostCtx {
    /// The id of a declared store (the host's own are not the guest's to open).
    pub fn open_store(&self, name: &str) -> Result<usize, Error> {
        self.db
            .store_id(name)
            .filter(|id| Some(*id) != self.time_store)
            .ok_or_else(|| {
                let declared: Vec<&str> = self
                    .db
                    .stores()
                    .iter()
                    .map(String::as_str)
                    .filter(|s| *s != super::time::TIME_STORE)
                    .collect();
                Error::NoSuchStore(format!(
                    "store `{name}` is not declared by pipeline `{}`; declared: [{}]",
                    self.pipeline,
                    declared.join(", ")
                ))
            })
    }

    /// The value of `key`.
    pub fn get_value(&mut self, store: usize, key: &[u8]) -> wasmtime::Result<Option<Vec<u8>>> {
        self.read(store, key)
    }

    /// The values of many keys, in the order asked.
    pub fn get_values(
        &mut self,
        store: usize,
        keys: &[Vec<u8>],
    ) -> wasmtime::Result<Vec<Option<Vec<u8>>>> {
        self.prefetch(store, keys.iter().map(Vec::as_slice))?;
        keys.iter().map(|k| self.get_value(store, k)).collect()
    }

    /// Reads the committed values of those of `keys` (the guest's, in the current slot) that
    /// the overlay does not know into its hot-key cache, in one batched RocksDB lookup: the
    /// reads of a batch (its increments, say) then find them there. At millions of keys most
    /// reads miss the hot-key cache, and one lookup per key walks every memtable and SST file
    /// once per key; a batched lookup walks each once for all the keys, in key order.
    pub(super) fn prefetch<'k>(
        &mut self,
        store: usize,
        keys: impl Iterator<Item = &'k [u8]>,
    ) -> wasmtime::Result<()> {
        let slot = self.cursor.slot.to_be_bytes();
        // One buffer for the keys the overlay knows (all of them, at a few thousand keys).
        let mut k = Vec::with_capacity(64);
        let mut wanted: Vec<Vec<u8>> = Vec::new();
        for key in keys {
            k.clear();
            k.extend_from_slice(&slot);
            k.extend_from_slice(key);
            if self.overlay.get_before_read(store, &k).is_none() {
                wanted.push(k.clone());
            }
        }
        if wanted.len() < 2 {
            return Ok(());
        }
        wanted.sort_unstable();
        wanted.dedup();
        let found = self.read_sorted(store, wanted.iter().map(Vec::as_slice))?;
        for (k, v) in wanted.into_iter().zip(found) {
            self.overlay.remember(store, k, v);
        }
        Ok(())
    }

    /// The committed values of `keys` (slot-prefixed, in key order, each once), in one batched
    /// RocksDB lookup.
    fn read_sorted<'k>(
        &mut self,
        store: usize,
        keys: impl Iterator<Item = &'k [u8]>,
    ) -> wasmtime::Result<Vec<Option<Vec<u8>>>> {
        let refs: Vec<&[u8]> = keys.collect();
        let mut found = Vec::with_capacity(refs.len());
        let r = self
            .db
            .get_sorted_with(store, &refs, |v| found.push(v.map(<[u8]>::to_vec)));
        self.host_result(r)?;
        Ok(found)
    }

    /// Looks `keys` (the guest's, in the current slot) up in the overlay, and reads those it
    /// does not know from RocksDB in one batched lookup, for a batch of increments: one
    /// [`Ahead`] per key, in the order given. The values read go to the caller, which writes
    /// every key at once, rather than into the overlay's map of the batch's reads: at millions
    /// of keys, that map's inserts and a second lookup of each key in every map of the overlay
    /// (their tables out of the CPU's caches) were a fifth of a partition thread.
    pub(super) fn read_ahead<'k>(
        &mut self,
        store: usize,
        keys: impl Iterator<Item = &'k [u8]>,
    ) -> wasmtime::Result<Vec<Ahead>> {
        let slot = self.cursor.slot;
        let mut out: Vec<Ahead> = Vec::with_capacity(keys.size_hint().0);
        let mut wanted: Vec<usize> = Vec::new();
        for key in keys {
            let k = slot_key(slot, key);
            let hash = self.overlay.hash(&k);
            if self
                .overlay
                .get_before_read_hashed(store, &k, hash)
                .is_none()
            {
                wanted.push(out.len());
            }
            out.push(Ahead {
                key: k,
                hash,
                read: None,
            });
        }
        if wanted.is_empty() {
            return Ok(out);
        }
        // In key order, a key's first use in the batch first.
        wanted.sort_unstable_by(|&a, &b| out[a].key.cmp(&out[b].key).then(a.cmp(&b)));
        let mut firsts = wanted;
        firsts.dedup_by(|b, a| out[*a].key == out[*b].key);
        let found = self.read_sorted(store, firsts.iter().map(|&i| out[i].key.as_slice()))?;
        // Only a key's first use takes the value: a later one finds the first one's write.
        for (&i, v) in firsts.iter().zip(found) {
            let a = &mut out[i];
            self.overlay.note_read(store, &a.key, a.hash, v.as_deref());
            a.read = Some(v);
        }
        Ok(out)
    }

    /// Sets `key` to `value`, checking the limits; an expiry it had is gone.
    pub fn set_value(
        &mut self,
        store: usize,
        key: &[u8],
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), Error>> {
        if let Err(e) = self.check_write(store, key, &value) {
            return Ok(Err(e));
        }
        self.clear_expiry(store, key)?;
        self.overlay
            .put(store, slot_key(self.cursor.slot, key), Some(value));
        Ok(Ok(()))
    }

    /// Sets `key` to `value`, to expire at `at` by `clock`.
    pub fn set_expiring(
        &mut self,
        store: usize,
        key: &[u8],
        value: Vec<u8>,
        clock: super::time::Clock,
        at: i64,
    ) -> wasmtime::Result<Result<(), Error>> {
        if let Err(e) = self.set_value(store, key, value)? {
            return Ok(Err(e));
        }
        self.set_expiry(store, key, clock, at)
    }

    /// Removes `key`. No size check: a key stored under older, larger limits can always be
    /// deleted.
    pub fn delete_value(&mut self, store: usize, key: &[u8]) -> wasmtime::Result<()> {
        self.clear_expiry(store, key)?;
        self.overlay
            .put(store, slot_key(self.cursor.slot, key), None);
        Ok(())
    }

    /// Adds `delta` to the counter at `key` and returns the new value.
    pub fn add_counter(
        &mut self,
        store: usize,
        key: &[u8],
        delta: i64,
    ) -> wasmtime::Result<Result<i64, Error>> {
        let k = slot_key(self.cursor.slot, key);
        let hash = self.overlay.hash(&k);
        self.add_counter_ahead(
            store,
            key,
            delta,
            Ahead {
                key: k,
                hash,
                read: None,
            },
        )
    }

    /// [`HostCtx::add_counter`] of a key that [`HostCtx::read_ahead`] looked up (`ahead.key`
    /// is `key` in the current slot).
    pub(super) fn add_counter_ahead(
        &mut self,
        store: usize,
        key: &[u8],
        delta: i64,
        ahead: Ahead,
    ) -> wasmtime::Result<Result<i64, Error>> {
        if let Err(e) = self.check_write(store, key, &[0; 8]) {
            return Ok(Err(e));
        }
        debug_assert_eq!(ahead.key.get(4..), Some(key), "a read-ahead of another key");
        let Ahead { key: k, hash, read } = ahead;
        // A key read from RocksDB just now missed the overlay then: only a write of this batch
        // since can stand in front of what was read.
        let known = match &read {
            Some(_) => self.overlay.pending_hashed(store, &k, hash),
            None => self.overlay.get_hashed(store, &k, hash),
        };
        let current = match (known, read) {
            (Some(v), _) => decode_counter(v),
            (None, Some(v)) => decode_counter(v.as_deref()),
            (None, None) => {
                let r = self.db.get_with(store, &k, decode_counter);
                self.host_result(r)?
            }
        };
        // An expired counter counts as missing, and the write keeps the new one for good.
        let expired = self.is_expired(store, key)?;
        let current = match current {
            _ if expired => 0,
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        if expired {
            self.clear_expiry(store, key)?;
        }
        let Some(next) = current.checked_add(delta) else {
            return Ok(Err(Error::InvalidValue(format!(
                "increment by {delta} overflows the counter at {current}"
            ))));
        };
        self.overlay
            .put_hashed(store, k, hash, Some(next.to_be_bytes().to_vec()));
        Ok(Ok(next))
    }

    /// The entries of `store` with `lo <= key < hi` (whole keys), committed and pending
    /// merged, in key order; at most `limit`.
    pub(super) fn merged_range(
        &mut self,
        store: usize,
        lo: &[u8],
        hi: &[u8],
        limit: usize,
    ) -> wasmtime::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let pending = self.overlay.range(store, lo, hi);
        // Committed rows may be shadowed by pending deletes: read enough to fill `limit`.
        let r = self
            .db
            .scan(store, lo, hi, limit.saturating_add(pending.len()));
        let committed = self.host_result(r)?;
        let mut merged = std::collections::BTreeMap::new();
        for (k, v) in committed {
            merged.insert(k, Some(v));
        }
        for (k, v) in pending {
            merged.insert(k, v);
        }
        Ok(merged
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .take(limit)
            .collect())
    }

    /// The visible entries with `start <= key < end` (slot-prefixed keys) of the current
    /// slot, in key order, expired ones left out; at most `limit`.
    fn visible_range(
        &mut self,
        store: usize,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> wasmtime::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let slot = self.cursor.slot;
        let lo = slot_key(slot, start);
        let hi = match end {
            Some(e) => slot_key(slot, e),
            // The end of the slot: the next slot's prefix.
            None => match slot.checked_add(1) {
                Some(next) => next.to_be_bytes().to_vec(),
                None => vec![0xff; 5],
            },
        };
        if !self.may_expire(slot, store)? {
            return self.merged_range(store, &lo, &hi, limit);
        }
        // Expired rows are left out: read on until `limit` live ones or the end.
        let mut out = Vec::new();
        let mut from = lo;
        while out.len() < limit {
            let want = (limit - out.len()).clamp(1, 1024);
            let rows = self.merged_range(store, &from, &hi, want)?;
            let done = rows.len() < want;
            for (k, v) in rows {
                from = k.clone();
                from.push(0);
                if !self.is_expired(store, &k[4..])? {
                    out.push((k, v));
                }
            }
            if done {
                break;
            }
        }
        Ok(out)
    }

    /// Up to `limit` entries with `start <= key < end`, in key order.
    pub fn scan_values(
        &mut self,
        store: usize,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> wasmtime::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let rows = self.visible_range(store, start, end, limit)?;
        Ok(rows
            .into_iter()
            .map(|(k, v)| (k[4..].to_vec(), v))
            .collect())
    }

    /// Removes every entry with `start <= key < end`; returns how many there were.
    pub fn delete_range(
        &mut self,
        store: usize,
        start: &[u8],
        end: Option<&[u8]>,
    ) -> wasmtime::Result<u64> {
        let rows = self.visible_range(store, start, end, usize::MAX)?;
        let n = rows.len() as u64;
        for (k, _) in rows {
            self.clear_expiry(store, &k[4..])?;
            self.overlay.put(store, k, None);
        }
        Ok(n)
    }

    /// Adds a record to the call's outputs, checking the topic and its size limit.
    pub fn send_output(
        &mut self,
        topic: &str,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        headers: Vec<(String, Vec<u8>)>,
        timestamp: Option<i64>,
    ) -> Result<(), Error> {
        let any = OutputTopic {
            partitions: 1,
            max_record_bytes: None,
        };
        let declared = self.limits_w.outputs.get(topic).copied();
        let Some(out) = declared.or(self.limits_w.any_output.then_some(any)) else {
            let mut declared: Vec<_> = self.limits_w.outputs.keys().cloned().collect();
            declared.sort();
            return Err(Error::NoSuchTopic(format!(
                "topic `{topic}` is not an output of pipeline `{}`; declared: [{}]",
                self.pipeline,
                declared.join(", ")
            )));
        };
        if let Some(max) = out.max_record_bytes {
            let size = key.as_ref().map_or(0, Vec::len)
                + value.as_ref().map_or(0, Vec::len)
                + headers
                    .iter()
                    .map(|(k, v)| k.len() + v.len())
                    .sum::<usize>();
            if size > max {
                return Err(too_large(format!(
                    "output of {size} bytes exceeds what topic `{topic}` takes ({max} bytes: \
                     its max.message.bytes less 1 KiB)"
                )));
            }
        }
        let partitions = out.partitions;
        let partition = match &key {
            Some(k) => crate::partitioner::partition_for_key(k, partitions),
            None => self.cursor.slot % partitions,
        };
        let record = Record {
            key,
            value,
            headers,
            timestamp: timestamp.unwrap_or(self.cursor.timestamp),
        };
        self.outputs.push(Output {
            topic: topic.to_string(),
            partition,
            record,
        });
        Ok(())
    }

    /// Writes a guest log line to the host's log and keeps it for the pipeline's events.
    fn guest_log(&mut self, level: tracing::Level, message: String) {
        let c = &self.cursor;
        let lvl = match level {
            tracing::Level::TRACE => {
                tracing::trace!(pipeline = %self.pipeline, topic = %c.topic, slot = c.slot, offset = c.offset, "guest: {message}");
                "trace"
            }
            tracing::Level::DEBUG => {
                tracing::debug!(pipeline = %self.pipeline, topic = %c.topic, slot = c.slot, offset = c.offset, "guest: {message}");
                "debug"
            }
            tracing::Level::INFO => {
                tracing::info!(pipeline = %self.pipeline, topic = %c.topic, slot = c.slot, offset = c.offset, "guest: {message}");
                "info"
            }
            tracing::Level::WARN => {
                tracing::warn!(pipeline = %self.pipeline, topic = %c.topic, slot = c.slot, offset = c.offset, "guest: {message}");
                "warn"
            }
            tracing::Level::ERROR => {
                tracing::error!(pipeline = %self.pipeline, topic = %c.topic, slot = c.slot, offset = c.offset, "guest: {message}");
                "error"
            }
        };
        if self.logs.len() < 1000 {
            self.logs.push(GuestLog {
                level: lvl,
                message,
                cursor: self.cursor.clone(),
            });
        }
    }
}

fn decode_counter(v: Option<&[u8]>) -> Result<i64, Error> {
    match v {
        None => Ok(0),
        Some(b) => <[u8; 8]>::try_from(b).map(i64::from_be_bytes).map_err(|_| {
            Error::InvalidValue(format!(
                "the stored value has {} bytes; a counter has 8",
                b.len()
            ))
        }),
    }
}

/// The bytes a span names in a batched call's data, or an error naming the span.
fn span_of<'a>(data: &'a [u8], start: u32, len: u32, what: &str) -> Result<&'a [u8], Error> {
    let (s, l) = (start as usize, len as usize);
    s.checked_add(l)
        .and_then(|e| data.get(s..e))
        .ok_or_else(|| {
            Error::InvalidInput(format!(
                "{what} spans bytes {s}..{} but the call's data has {} bytes",
                s as u64 + l as u64,
                data.len()
            ))
        })
}

/// Contract 0.1: every call maps onto the operations above.
mod contract_0_1;

/// Contract 0.2: the calls of 0.1, plus the batched `apply` and `send-batch`, range deletes,
/// expiring entries and timers.
mod contract_0_2;

/// The wall clock in milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
