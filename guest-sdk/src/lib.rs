//! # baton-sdk: write baton stream processors in Rust
//!
//! A processor is a plain function called once per input record. The
//! [`processor`] attribute turns it into a WebAssembly component of the
//! `baton:processor@0.2.0` world; you never depend on `wit-bindgen` yourself.
//!
//! ```rust,no_run
//! use baton_sdk::{Context, Message, Result};
//!
//! /// Counts records per key into the store `counts`.
//! #[baton_sdk::processor]
//! fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
//!     if let Some(key) = msg.key {
//!         ctx.add("counts", key, 1)?;
//!     }
//!     Ok(())
//! }
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2` (the crate is a `cdylib`), then
//! upload `target/wasm32-wasip2/release/<crate>.wasm` to a baton host.
//!
//! A setup function can read the pipeline's config once per instance:
//!
//! ```rust,no_run
//! use baton_sdk::{Context, Message, Result};
//!
//! #[baton_sdk::processor(init = setup)]
//! fn process(msg: &Message, ctx: &mut Context) -> Result<()> { Ok(()) }
//!
//! fn setup(config: &baton_sdk::Config) -> baton_sdk::Result<()> {
//!     config.require("output")?;
//!     Ok(())
//! }
//! ```
//!
//! ## Time
//! Timers call a processor back for a key once a clock reaches a time; they are state, and fire
//! exactly once. Entries can expire (`set_with_ttl`). A window that counts per key and sends its
//! count when it closes (see `plugins/windowed-count` for the whole of it, and
//! [`windows`] for tumbling and hopping windows and sessions ready-made):
//!
//! ```rust,no_run
//! use baton_sdk::{Context, Message, Result, TimeKind, Timer};
//!
//! #[baton_sdk::processor(on_timer = close)]
//! fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
//!     let Some(key) = msg.key else { return Ok(()) };
//!     let end = (msg.timestamp / 1000 + 1) * 1000;
//!     if ctx.increment("windows", key, 1)? == 1 {
//!         ctx.schedule(TimeKind::EventTime, end, key, None)?;
//!     }
//!     Ok(())
//! }
//!
//! fn close(timer: &Timer, ctx: &mut Context) -> Result<()> {
//!     let n = ctx.counter("windows", timer.key)?;
//!     ctx.send("counts", Some(timer.key), Some(n.to_string().as_bytes()))?;
//!     ctx.delete("windows", timer.key)
//! }
//! ```
//!
//! ## Batches
//! The host hands the component a whole batch of one slot's records in one call, laid out as
//! one buffer (contract 0.2's batch ABI), and [`Message`]s borrow from it: reading a record
//! copies nothing. Writes that return nothing ([`Context::set`], [`Context::delete`],
//! [`Context::add`]) and outputs ([`Context::send`]) are buffered and reach the host in one
//! call per store at the end of the batch, or before any read of the same store, so a read
//! always sees every earlier write. Prefer [`Context::add`] to [`Context::increment`] when the
//! new value is not needed: `increment` is a host call per record.
//!
//! ## Guarantees
//! All state calls are scoped to the slot of the record being processed, and a batch is atomic:
//! when the function returns an error (or panics) for a record, every state write and output of
//! the call is discarded, the host retries each record alone, and a record that still fails goes
//! to the pipeline's dead-letter topic with the error.

#![deny(missing_docs)]

use std::cell::RefCell;
use std::collections::HashMap;

pub use baton_sdk_macros::processor;

/// The generated bindings of the `baton:processor` world (raw byte API).
#[allow(missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "processor",
        path: "../wit",
        pub_export_macro: true,
        default_bindings_module: "baton_sdk::bindings",
        export_macro_name: "export",
        generate_all,
    });
}

use bindings::baton::processor::output::OutRecord;
use bindings::baton::processor::state::{AddOp, SetOp, Write};
use bindings::baton::processor::types::{HeaderEntry, Span};

pub use bindings::baton::processor::log::Level;
pub use bindings::baton::processor::state::{Expiry, Store};
pub use bindings::baton::processor::types::{Error, TimeKind};

/// The result type of processor functions.
pub type Result<T, E = Error> = core::result::Result<T, E>;

impl Error {
    /// An [`Error::Other`] with the given message.
    pub fn other(msg: impl Into<String>) -> Self {
        Error::Other(msg.into())
    }
}

impl From<String> for Error {
    fn from(msg: String) -> Self {
        Error::Other(msg)
    }
}

impl From<&str> for Error {
    fn from(msg: &str) -> Self {
        Error::Other(msg.to_string())
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::InvalidValue(format!("JSON: {e}"))
    }
}

/// One input record. It borrows from the batch the host handed over.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    /// The input topic.
    pub topic: &'a str,
    /// The slot (partition of the input topic) it was read from.
    pub slot: u32,
    /// Its position in the slot.
    pub offset: u64,
    /// Its creation time in milliseconds since the Unix epoch.
    pub timestamp: i64,
    /// `None` for a record without a key.
    pub key: Option<&'a [u8]>,
    /// `None` for a tombstone.
    pub value: Option<&'a [u8]>,
    /// Two words per header (name, value), as the batch lays them out.
    headers: &'a [u64],
    data: &'a [u8],
}

impl<'a> Message<'a> {
    /// Its headers, in order: name and value.
    pub fn headers(&self) -> impl Iterator<Item = (&'a str, &'a [u8])> + 'a {
        let data = self.data;
        self.headers.chunks_exact(2).map(move |h| {
            let name =
                std::str::from_utf8(word_bytes(data, h[0]).unwrap_or_default()).unwrap_or_default();
            (name, word_bytes(data, h[1]).unwrap_or_default())
        })
    }

    /// The value of the first header named `name`.
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.headers().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

/// The bytes a word of the host's batch names (`start << 32 | len`), `None` for all ones
/// (empty when out of range, which the host never sends).
fn word_bytes(data: &[u8], w: u64) -> Option<&[u8]> {
    if w == u64::MAX {
        return None;
    }
    let (start, len) = ((w >> 32) as usize, (w & 0xffff_ffff) as usize);
    Some(
        data.get(start..start.saturating_add(len))
            .unwrap_or_default(),
    )
}

/// A timer that fell due (see [`Context::schedule`]).
#[derive(Debug, Clone, Copy)]
pub struct Timer<'a> {
    /// Its clock.
    pub kind: TimeKind,
    /// When it was due, in milliseconds of its clock.
    pub at: i64,
    /// The key it was scheduled for.
    pub key: &'a [u8],
    /// What it carries.
    pub payload: Option<&'a [u8]>,
}

/// The pipeline's `config` object, as given to `init`.
#[derive(Debug, Default, Clone)]
pub struct Config {
    values: HashMap<String, String>,
}

impl Config {
    /// The value of `key`: a JSON string as it is, any other JSON value as its JSON text.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    /// The value of `key`, or an [`Error::InvalidInput`] naming the missing key.
    pub fn require(&self, key: &str) -> Result<&str> {
        self.get(key)
            .ok_or_else(|| Error::InvalidInput(format!("config key `{key}` is required")))
    }

    /// The value of `key` as a number, or an [`Error::InvalidInput`] naming the key.
    pub fn require_i64(&self, key: &str) -> Result<i64> {
        self.require(key)?
            .parse()
            .map_err(|_| Error::InvalidInput(format!("config key `{key}` must be an integer")))
    }
}

/// Appends `bytes` to a batched call's data and names them.
fn push_span(data: &mut Vec<u8>, bytes: &[u8]) -> Span {
    let start = data.len() as u32;
    data.extend_from_slice(bytes);
    Span {
        start,
        len: bytes.len() as u32,
    }
}

/// A store the processor opened, with its writes not yet handed to the host.
struct OpenStore {
    name: String,
    handle: Store,
    data: Vec<u8>,
    writes: Vec<Write>,
}

impl OpenStore {
    fn span(&mut self, bytes: &[u8]) -> Span {
        push_span(&mut self.data, bytes)
    }

    fn flush(&mut self) -> Result<()> {
        if self.writes.is_empty() {
            return Ok(());
        }
        let r = self.handle.apply(&self.data, &self.writes);
        self.data.clear();
        self.writes.clear();
        r.map_err(|e| e.error)
    }

    fn discard(&mut self) {
        self.data.clear();
        self.writes.clear();
    }
}

/// Outputs not yet handed to the host.
#[derive(Default)]
struct Outbox {
    data: Vec<u8>,
    records: Vec<OutRecord>,
    headers: Vec<HeaderEntry>,
}

impl Outbox {
    fn span(&mut self, bytes: &[u8]) -> Span {
        push_span(&mut self.data, bytes)
    }

    fn flush(&mut self) -> Result<()> {
        if self.records.is_empty() {
            return Ok(());
        }
        let r = bindings::baton::processor::output::send_batch(
            &self.data,
            &self.records,
            &self.headers,
        );
        self.discard();
        r.map_err(|e| e.error)
    }

    fn discard(&mut self) {
        self.data.clear();
        self.records.clear();
        self.headers.clear();
    }
}

/// What a processor function can do besides reading its record: state, timers, outputs, logs,
/// config.
#[derive(Default)]
pub struct Context {
    stores: Vec<OpenStore>,
    out: Outbox,
    config: Config,
    /// The timestamp of the record being processed (the `at` of the timer firing).
    timestamp: i64,
    /// The slot's event time.
    event_time: i64,
    /// The slot of the current call.
    slot: u32,
    /// Timers this instance knows are scheduled, per slot (by [`windows::Windows`]), so that it
    /// schedules each once; forgotten with the call's effects when a call fails.
    scheduled: std::collections::HashSet<(u32, Vec<u8>)>,
}

impl Context {
    /// The index of store `name` in `stores`, opened on first use.
    fn open(&mut self, name: &str) -> Result<usize> {
        if let Some(i) = self.stores.iter().position(|s| s.name == name) {
            return Ok(i);
        }
        let handle = Store::open(name)?;
        self.stores.push(OpenStore {
            name: name.to_string(),
            handle,
            data: Vec::new(),
            writes: Vec::new(),
        });
        Ok(self.stores.len() - 1)
    }

    /// Store `name` with its buffered writes handed to the host, ready for a read.
    fn flushed(&mut self, name: &str) -> Result<&Store> {
        let i = self.open(name)?;
        let s = &mut self.stores[i];
        s.flush()?;
        Ok(&s.handle)
    }

    /// The raw handle of store `name` (opened once and cached), for calls this type does not
    /// wrap. `Error::NoSuchStore` if the pipeline does not declare it.
    pub fn store(&mut self, name: &str) -> Result<&Store> {
        self.flushed(name)
    }

    /// The pipeline's config.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The timestamp of the record being processed (in a timer callback: the timer's `at`).
    pub fn timestamp(&self) -> i64 {
        self.timestamp
    }

    /// The slot's event time: the highest record timestamp seen in it, up to and including the
    /// record being processed (in a timer callback: with the whole batch counted).
    pub fn event_time(&self) -> i64 {
        self.event_time
    }

    /// The value of `key`, `None` when it is missing or expired.
    pub fn get(&mut self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.flushed(store)?.get(key)
    }

    /// The values of many keys at once, in the order asked.
    pub fn get_many(&mut self, store: &str, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        let keys: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
        self.flushed(store)?.get_many(&keys)
    }

    /// Sets `key` to `value` (buffered until the end of the batch or the next read).
    pub fn set(&mut self, store: &str, key: &[u8], value: &[u8]) -> Result<()> {
        self.set_with_expiry(store, key, value, None)
    }

    /// Sets `key` to `value`, to expire `ttl_ms` after the record's timestamp (in event time).
    pub fn set_with_ttl(
        &mut self,
        store: &str,
        key: &[u8],
        value: &[u8],
        ttl_ms: i64,
    ) -> Result<()> {
        let at = self.timestamp.saturating_add(ttl_ms);
        let expiry = Expiry {
            kind: TimeKind::EventTime,
            at,
        };
        self.set_with_expiry(store, key, value, Some(expiry))
    }

    /// Sets `key` to `value`, to expire `ttl_ms` from now on the host's wall clock (processing
    /// time).
    pub fn set_with_processing_ttl(
        &mut self,
        store: &str,
        key: &[u8],
        value: &[u8],
        ttl_ms: i64,
    ) -> Result<()> {
        let expiry = Expiry {
            kind: TimeKind::ProcessingTime,
            at: self.processing_time().saturating_add(ttl_ms),
        };
        self.set_with_expiry(store, key, value, Some(expiry))
    }

    /// Sets `key` to `value`, to expire at `expiry` (`None`: never).
    pub fn set_with_expiry(
        &mut self,
        store: &str,
        key: &[u8],
        value: &[u8],
        expiry: Option<Expiry>,
    ) -> Result<()> {
        let i = self.open(store)?;
        let s = &mut self.stores[i];
        let key = s.span(key);
        let value = s.span(value);
        s.writes.push(Write::Set(SetOp { key, value, expiry }));
        Ok(())
    }

    /// Deletes `key` (buffered).
    pub fn delete(&mut self, store: &str, key: &[u8]) -> Result<()> {
        let i = self.open(store)?;
        let s = &mut self.stores[i];
        let key = s.span(key);
        s.writes.push(Write::Delete(key));
        Ok(())
    }

    /// Deletes every entry with `start <= key < end` (`None`: no upper bound); returns how
    /// many there were.
    pub fn delete_range(&mut self, store: &str, start: &[u8], end: Option<&[u8]>) -> Result<u64> {
        self.flushed(store)?.delete_range(start, end)
    }

    /// Adds `delta` to the counter at `key` (8-byte big-endian, Kafka's LongSerializer),
    /// buffered: errors such as an overflow surface at the end of the batch.
    pub fn add(&mut self, store: &str, key: &[u8], delta: i64) -> Result<()> {
        let i = self.open(store)?;
        let s = &mut self.stores[i];
        let key = s.span(key);
        s.writes.push(Write::Add(AddOp { key, delta }));
        Ok(())
    }

    /// Adds `delta` to the counter at `key` and returns the new value (one host call).
    pub fn increment(&mut self, store: &str, key: &[u8], delta: i64) -> Result<i64> {
        self.flushed(store)?.increment(key, delta)
    }

    /// The counter at `key`, 0 when missing.
    pub fn counter(&mut self, store: &str, key: &[u8]) -> Result<i64> {
        match self.get(store, key)? {
            None => Ok(0),
            Some(v) => <[u8; 8]>::try_from(v.as_slice())
                .map(i64::from_be_bytes)
                .map_err(|_| Error::InvalidValue(format!("counter of {} bytes, want 8", v.len()))),
        }
    }

    /// Up to `limit` entries with `start <= key < end`, in key order.
    pub fn scan(
        &mut self,
        store: &str,
        start: &[u8],
        end: Option<&[u8]>,
        limit: u32,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.flushed(store)?.scan(start, end, limit)
    }

    /// Reads a JSON value; `None` when the key is missing.
    pub fn get_json<T: serde::de::DeserializeOwned>(
        &mut self,
        store: &str,
        key: &[u8],
    ) -> Result<Option<T>> {
        match self.get(store, key)? {
            None => Ok(None),
            Some(bytes) => Ok(Some(serde_json::from_slice(&bytes)?)),
        }
    }

    /// Writes a value as JSON.
    pub fn set_json<T: serde::Serialize>(
        &mut self,
        store: &str,
        key: &[u8],
        value: &T,
    ) -> Result<()> {
        let bytes = serde_json::to_vec(value)?;
        self.set(store, key, &bytes)
    }

    /// Sends a record to a declared output topic, with the timestamp of the record being
    /// processed (buffered; an unknown topic surfaces at the end of the batch).
    pub fn send(&mut self, topic: &str, key: Option<&[u8]>, value: Option<&[u8]>) -> Result<()> {
        self.send_with_headers(topic, key, value, [])
    }

    /// Sends a record with headers to a declared output topic.
    pub fn send_with_headers<'h>(
        &mut self,
        topic: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: impl IntoIterator<Item = (&'h str, &'h [u8])>,
    ) -> Result<()> {
        let o = &mut self.out;
        let topic = o.span(topic.as_bytes());
        let key = key.map(|k| o.span(k));
        let value = value.map(|v| o.span(v));
        let first = o.headers.len() as u32;
        for (name, value) in headers {
            let name = o.span(name.as_bytes());
            let value = o.span(value);
            o.headers.push(HeaderEntry { name, value });
        }
        let headers = Span {
            start: first,
            len: o.headers.len() as u32 - first,
        };
        o.records.push(OutRecord {
            topic,
            key,
            value,
            headers,
            timestamp: Some(self.timestamp),
        });
        Ok(())
    }

    /// Schedules a timer for `key` in this slot at `at` (milliseconds of `kind`'s clock);
    /// the same `(kind, at, key)` again replaces its payload.
    pub fn schedule(
        &mut self,
        kind: TimeKind,
        at: i64,
        key: &[u8],
        payload: Option<&[u8]>,
    ) -> Result<()> {
        bindings::baton::processor::timers::schedule(kind, at, key, payload)
    }

    /// Cancels a timer; `false` when none was pending.
    pub fn cancel(&mut self, kind: TimeKind, at: i64, key: &[u8]) -> Result<bool> {
        bindings::baton::processor::timers::cancel(kind, at, key)
    }

    /// The host's wall clock, in milliseconds since the Unix epoch.
    pub fn processing_time(&self) -> i64 {
        bindings::baton::processor::timers::processing_time()
    }

    /// Logs a message at `level`; the host adds pipeline, slot and offset.
    pub fn log(&self, level: Level, message: &str) {
        bindings::baton::processor::log::log(level, message)
    }

    /// Hands every buffered write and output to the host.
    fn flush(&mut self) -> Result<()> {
        for s in &mut self.stores {
            s.flush()?;
        }
        self.out.flush()
    }

    /// Forgets every buffered write and output (the host discards the call's effects).
    fn discard(&mut self) {
        for s in &mut self.stores {
            s.discard();
        }
        self.out.discard();
        self.scheduled.clear();
    }

    /// Runs `body` and then flushes; on any error nothing buffered survives into the next call.
    fn run(&mut self, body: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        let r = body(self).and_then(|()| self.flush());
        if r.is_err() {
            self.discard();
        }
        r
    }
}

pub mod windows;

/// Support for the code `#[processor]` generates. Not a public API.
#[doc(hidden)]
pub mod __private {
    use super::*;

    pub use bindings::baton::processor::types::Batch;
    pub use bindings::exports::baton::processor::handler::{Fired, Guest};

    thread_local! {
        static CONTEXT: RefCell<Context> = RefCell::new(Context::default());
    }

    /// Stores the config and runs the user's setup function, if any.
    pub fn init(
        pairs: Vec<(String, String)>,
        setup: Option<fn(&Config) -> Result<()>>,
    ) -> Result<()> {
        let config = Config {
            values: pairs.into_iter().collect(),
        };
        if let Some(setup) = setup {
            setup(&config)?;
        }
        CONTEXT.with(|c| c.borrow_mut().config = config);
        Ok(())
    }

    /// Calls `f` for each record of the batch, stopping at the first error, then hands the
    /// buffered writes and outputs to the host.
    pub fn process(batch: Batch, f: fn(&Message, &mut Context) -> Result<()>) -> Result<()> {
        CONTEXT.with(|c| {
            let mut ctx = c.borrow_mut();
            ctx.event_time = batch.event_time;
            ctx.slot = batch.slot;
            ctx.run(|ctx| {
                for r in batch.records.chunks_exact(5) {
                    let (first, count) = ((r[4] >> 32) as usize, (r[4] & 0xffff_ffff) as usize);
                    let msg = Message {
                        topic: &batch.topic,
                        slot: batch.slot,
                        offset: r[0],
                        timestamp: r[1] as i64,
                        key: word_bytes(&batch.data, r[2]),
                        value: word_bytes(&batch.data, r[3]),
                        headers: batch
                            .headers
                            .get(first * 2..(first + count) * 2)
                            .unwrap_or_default(),
                        data: &batch.data,
                    };
                    ctx.timestamp = msg.timestamp;
                    ctx.event_time = ctx.event_time.max(msg.timestamp);
                    f(&msg, ctx)?;
                }
                Ok(())
            })
        })
    }

    /// Calls `f` for each timer that fell due, then hands the buffered writes and outputs to
    /// the host. Without `f` timers are acknowledged and dropped.
    pub fn on_timers(
        slot: u32,
        event_time: i64,
        fired: Vec<Fired>,
        f: Option<fn(&Timer, &mut Context) -> Result<()>>,
    ) -> Result<()> {
        let Some(f) = f else {
            return Ok(());
        };
        CONTEXT.with(|c| {
            let mut ctx = c.borrow_mut();
            ctx.event_time = event_time;
            ctx.slot = slot;
            ctx.run(|ctx| {
                for t in &fired {
                    let timer = Timer {
                        kind: t.kind,
                        at: t.at,
                        key: &t.key,
                        payload: t.payload.as_deref(),
                    };
                    ctx.timestamp = t.at;
                    f(&timer, ctx)?;
                }
                Ok(())
            })
        })
    }
}
