//! The host side of the processor world: the state, output and log imports, implemented over
//! the batch context of the partition task that owns the instance.

use std::collections::HashMap;
use std::sync::Arc;

use wasmtime::component::{Resource, ResourceTable};
use wasmtime::{ResourceLimiter, StoreLimits};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::baton::processor::{log, output, state, types};
use super::stderr::StderrTail;
use crate::state::{Overlay, PartitionDb, slot_key};
use crate::transport::Record;

type Error = types::Error;

/// Bytes of guest stderr kept per instance, shown with a trap.
const STDERR_TAIL: usize = 1024;

/// A WASI context that grants nothing (no preopened directories, environment, arguments or
/// sockets; without `grants` a clock frozen at the Unix epoch and a fixed pseudo-random
/// sequence) and captures stderr.
fn new_wasi(grants: &WasiGrants) -> (WasiCtx, StderrTail) {
    let stderr = StderrTail::new(STDERR_TAIL);
    let mut b = WasiCtx::builder();
    b.stderr(stderr.clone());
    if !grants.clocks {
        b.wall_clock(FrozenClock).monotonic_clock(FrozenClock);
    }
    if !grants.random {
        b.secure_random(FixedSequence(0x9E37_79B9_7F4A_7C15))
            .insecure_random(FixedSequence(0x2545_F491_4F6C_DD1D))
            .insecure_random_seed(0);
    }
    (b.build(), stderr)
}

/// What a pipeline's guests may see of the host beyond their inputs (`wasi = { ... }` in the
/// spec). Without a grant a guest still runs (Rust's std asks for randomness to seed hash maps),
/// but deterministically: processing the same records gives the same results on any host.
#[derive(
    Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields, default)]
pub struct WasiGrants {
    /// Real wall and monotonic clocks (otherwise frozen at the Unix epoch).
    pub clocks: bool,
    /// Real randomness (otherwise a fixed sequence).
    pub random: bool,
}

/// A clock that never moves.
struct FrozenClock;

impl wasmtime_wasi::HostWallClock for FrozenClock {
    fn resolution(&self) -> std::time::Duration {
        std::time::Duration::from_secs(1)
    }
    fn now(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

impl wasmtime_wasi::HostMonotonicClock for FrozenClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// The same xorshift sequence every time: "randomness" that is not.
struct FixedSequence(u64);

impl rand_core::TryRng for FixedSequence {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok(self.try_next_u64()? as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Ok(self.0)
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        for chunk in dst.chunks_mut(8) {
            let v = self.try_next_u64()?.to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        Ok(())
    }
}

/// An output topic a pipeline's guests may send to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputTopic {
    /// Its partition count.
    pub partitions: u32,
    /// Most bytes of key, value and headers one record may have (the topic's
    /// `max.message.bytes` less 1 KiB of framing on Kafka); `None` for no limit.
    pub max_record_bytes: Option<usize>,
}

/// Where a pipeline's guests may write, and how much: checked by the host before Kafka sees a
/// record, so that no record the broker would refuse enters a batch.
#[derive(Debug, Clone)]
pub struct WriteLimits {
    /// Declared output topics and the dead-letter topic.
    pub outputs: HashMap<String, OutputTopic>,
    /// Most bytes of a state key (`limits.max_key_bytes`).
    pub max_key_bytes: usize,
    /// Most bytes of a state value (`limits.max_value_bytes`).
    pub max_value_bytes: usize,
    /// Per store: most bytes of key and value its changelog takes in one record (`None`: no
    /// changelog limit).
    pub changelog_record_bytes: Vec<Option<usize>>,
}

impl Default for WriteLimits {
    /// No outputs and no size limits.
    fn default() -> Self {
        WriteLimits {
            outputs: HashMap::new(),
            max_key_bytes: usize::MAX,
            max_value_bytes: usize::MAX,
            changelog_record_bytes: Vec::new(),
        }
    }
}

/// The error a guest gets for a key, value or record over a limit (the contract 0.1 has no case
/// of its own for it, so it is `other`, starting with `too-large:`).
fn too_large(what: String) -> Error {
    Error::Other(format!("too-large: {what}"))
}

/// The guest's handle on a store: the store id within the partition database.
#[derive(Debug, Clone, Copy)]
pub struct StoreHandle {
    store: usize,
}

/// A record a guest sent to an output topic during the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Destination topic.
    pub topic: String,
    /// Destination partition.
    pub partition: u32,
    /// The record.
    pub record: Record,
}

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
    db: Arc<PartitionDb>,
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
                .instances(4)
                .build(),
            pipeline,
            db,
            limits_w: write_limits,
            overlay,
            outputs: Vec::new(),
            call_start: 0,
            cursor: Cursor::default(),
            logs: Vec::new(),
            grants,
            host_fault: None,
        }
    }

    /// The memory limiter of the store.
    pub fn limiter(&mut self) -> &mut dyn ResourceLimiter {
        &mut self.limits
    }

    /// Marks the start of a guest call (its writes and outputs can be dropped alone).
    pub fn begin_call(&mut self, cursor: Cursor) {
        self.cursor = cursor;
        self.call_start = self.outputs.len();
    }

    /// Keeps the call's writes and outputs.
    pub fn keep_call(&mut self) {
        self.overlay.keep_call();
        self.call_start = self.outputs.len();
    }

    /// Drops the call's writes and outputs.
    pub fn drop_call(&mut self) {
        self.overlay.drop_call();
        self.outputs.truncate(self.call_start);
    }

    /// Adds a dead letter to the batch's outputs (not part of any call).
    pub fn push_dead_letter(&mut self, o: Output) {
        self.outputs.push(o);
        self.call_start = self.outputs.len();
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
    fn check_write(&self, store: usize, key: &[u8], value: &[u8]) -> Result<(), Error> {
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
        if let Some(v) = self.overlay.get(store, &k) {
            return Ok(v.map(<[u8]>::to_vec));
        }
        let r = self.db.get(store, &k);
        let v = self.host_result(r)?;
        self.overlay.remember(store, k, v.clone());
        Ok(v)
    }

    /// A state failure is the host's fault, not the guest's: it is recorded in
    /// [`HostCtx::host_fault`] and traps the call, so that the session ends and retries the
    /// batch instead of dead-lettering the record.
    fn host_result<T>(&mut self, r: crate::state::Result<T>) -> wasmtime::Result<T> {
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

impl types::Host for HostCtx {}

impl state::Host for HostCtx {}

impl state::HostStore for HostCtx {
    fn open(&mut self, name: String) -> wasmtime::Result<Result<Resource<StoreHandle>, Error>> {
        match self.db.store_id(&name) {
            None => Ok(Err(Error::NoSuchStore(format!(
                "store `{name}` is not declared by pipeline `{}`; declared: [{}]",
                self.pipeline,
                self.db.stores().join(", ")
            )))),
            Some(store) => Ok(Ok(self.table.push(StoreHandle { store })?)),
        }
    }

    fn get(
        &mut self,
        h: Resource<StoreHandle>,
        key: Vec<u8>,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, Error>> {
        let store = self.table.get(&h)?.store;
        Ok(Ok(self.read(store, &key)?))
    }

    fn get_many(
        &mut self,
        h: Resource<StoreHandle>,
        keys: Vec<Vec<u8>>,
    ) -> wasmtime::Result<Result<Vec<Option<Vec<u8>>>, Error>> {
        let store = self.table.get(&h)?.store;
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            out.push(self.read(store, &k)?);
        }
        Ok(Ok(out))
    }

    fn set(
        &mut self,
        h: Resource<StoreHandle>,
        key: Vec<u8>,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), Error>> {
        let store = self.table.get(&h)?.store;
        if let Err(e) = self.check_write(store, &key, &value) {
            return Ok(Err(e));
        }
        self.overlay
            .put(store, slot_key(self.cursor.slot, &key), Some(value));
        Ok(Ok(()))
    }

    fn delete(
        &mut self,
        h: Resource<StoreHandle>,
        key: Vec<u8>,
    ) -> wasmtime::Result<Result<(), Error>> {
        // No size check: a key stored under older, larger limits can always be deleted.
        let store = self.table.get(&h)?.store;
        self.overlay
            .put(store, slot_key(self.cursor.slot, &key), None);
        Ok(Ok(()))
    }

    fn increment(
        &mut self,
        h: Resource<StoreHandle>,
        key: Vec<u8>,
        delta: i64,
    ) -> wasmtime::Result<Result<i64, Error>> {
        let store = self.table.get(&h)?.store;
        if let Err(e) = self.check_write(store, &key, &[0; 8]) {
            return Ok(Err(e));
        }
        let k = slot_key(self.cursor.slot, &key);
        let current = match self.overlay.get(store, &k) {
            Some(v) => decode_counter(v),
            None => {
                let r = self.db.get_with(store, &k, decode_counter);
                self.host_result(r)?
            }
        };
        let current = match current {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let Some(next) = current.checked_add(delta) else {
            return Ok(Err(Error::InvalidValue(format!(
                "increment by {delta} overflows the counter at {current}"
            ))));
        };
        self.overlay
            .put(store, k, Some(next.to_be_bytes().to_vec()));
        Ok(Ok(next))
    }

    fn scan(
        &mut self,
        h: Resource<StoreHandle>,
        start: Vec<u8>,
        end: Option<Vec<u8>>,
        limit: u32,
    ) -> wasmtime::Result<Result<Vec<(Vec<u8>, Vec<u8>)>, Error>> {
        let store = self.table.get(&h)?.store;
        let slot = self.cursor.slot;
        let lo = slot_key(slot, &start);
        let hi = match &end {
            Some(e) => slot_key(slot, e),
            // The end of the slot: the next slot's prefix.
            None => match slot.checked_add(1) {
                Some(next) => next.to_be_bytes().to_vec(),
                None => vec![0xff; 5],
            },
        };
        let limit = limit as usize;
        let pending = self.overlay.range(store, &lo, &hi);
        // Committed rows may be shadowed by pending deletes: read enough to fill `limit`.
        let r = self.db.scan(store, &lo, &hi, limit + pending.len());
        let committed = self.host_result(r)?;
        let mut merged = std::collections::BTreeMap::new();
        for (k, v) in committed {
            merged.insert(k, Some(v));
        }
        for (k, v) in pending {
            merged.insert(k, v);
        }
        let out = merged
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k[4..].to_vec(), v)))
            .take(limit)
            .collect();
        Ok(Ok(out))
    }

    fn drop(&mut self, h: Resource<StoreHandle>) -> wasmtime::Result<()> {
        self.table.delete(h)?;
        Ok(())
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

impl output::Host for HostCtx {
    fn send(
        &mut self,
        topic: String,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        headers: Vec<types::Header>,
    ) -> wasmtime::Result<Result<(), Error>> {
        let Some(&out) = self.limits_w.outputs.get(&topic) else {
            let mut declared: Vec<_> = self.limits_w.outputs.keys().cloned().collect();
            declared.sort();
            return Ok(Err(Error::NoSuchTopic(format!(
                "topic `{topic}` is not an output of pipeline `{}`; declared: [{}]",
                self.pipeline,
                declared.join(", ")
            ))));
        };
        if let Some(max) = out.max_record_bytes {
            let size = key.as_ref().map_or(0, Vec::len)
                + value.as_ref().map_or(0, Vec::len)
                + headers
                    .iter()
                    .map(|h| h.key.len() + h.value.len())
                    .sum::<usize>();
            if size > max {
                return Ok(Err(too_large(format!(
                    "output of {size} bytes exceeds what topic `{topic}` takes ({max} bytes: \
                     its max.message.bytes less 1 KiB)"
                ))));
            }
        }
        let partitions = out.partitions;
        let partition = match &key {
            Some(k) => crate::transport::partitioner::partition_for_key(k, partitions),
            None => self.cursor.slot % partitions,
        };
        let record = Record {
            key,
            value,
            headers: headers.into_iter().map(|h| (h.key, h.value)).collect(),
            timestamp: self.cursor.timestamp,
        };
        self.outputs.push(Output {
            topic,
            partition,
            record,
        });
        Ok(Ok(()))
    }
}

impl log::Host for HostCtx {
    fn log(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
        let c = &self.cursor;
        let lvl = match level {
            log::Level::Trace => {
                tracing::trace!(pipeline = %self.pipeline, topic = %c.topic, slot = c.slot, offset = c.offset, "guest: {message}");
                "trace"
            }
            log::Level::Debug => {
                tracing::debug!(pipeline = %self.pipeline, topic = %c.topic, slot = c.slot, offset = c.offset, "guest: {message}");
                "debug"
            }
            log::Level::Info => {
                tracing::info!(pipeline = %self.pipeline, topic = %c.topic, slot = c.slot, offset = c.offset, "guest: {message}");
                "info"
            }
            log::Level::Warn => {
                tracing::warn!(pipeline = %self.pipeline, topic = %c.topic, slot = c.slot, offset = c.offset, "guest: {message}");
                "warn"
            }
            log::Level::Error => {
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
        Ok(())
    }
}
