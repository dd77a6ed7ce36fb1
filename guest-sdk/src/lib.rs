//! # baton-sdk: write baton stream processors in Rust
//!
//! A processor is a plain function called once per input record. The
//! [`processor`] attribute turns it into a WebAssembly component of the
//! `baton:processor@0.1.0` world; you never depend on `wit-bindgen` yourself.
//!
//! ```rust,ignore
//! use baton_sdk::{Context, Message, Result};
//!
//! /// Counts records per key into the store `counts`.
//! #[baton_sdk::processor]
//! fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
//!     if let Some(key) = &msg.key {
//!         ctx.increment("counts", key, 1)?;
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
//! ```rust,ignore
//! #[baton_sdk::processor(init = setup)]
//! fn process(msg: &Message, ctx: &mut Context) -> Result<()> { Ok(()) }
//!
//! fn setup(config: &baton_sdk::Config) -> baton_sdk::Result<()> {
//!     config.require("output")?;
//!     Ok(())
//! }
//! ```
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

pub use bindings::baton::processor::log::Level;
pub use bindings::baton::processor::state::Store;
pub use bindings::baton::processor::types::{Error, Header, Message};

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
}

/// What a processor function can do besides reading its record: state, outputs, logs, config.
#[derive(Default)]
pub struct Context {
    stores: HashMap<String, Store>,
    config: Config,
}

impl Context {
    /// The store `name`, opened once and cached. `Error::NoSuchStore` if the pipeline does not
    /// declare it.
    pub fn store(&mut self, name: &str) -> Result<&Store> {
        if !self.stores.contains_key(name) {
            let store = Store::open(name)?;
            self.stores.insert(name.to_string(), store);
        }
        Ok(&self.stores[name])
    }

    /// The pipeline's config.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Raw get: `None` when the key is missing.
    pub fn get(&mut self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.store(store)?.get(key)
    }

    /// Raw set.
    pub fn set(&mut self, store: &str, key: &[u8], value: &[u8]) -> Result<()> {
        self.store(store)?.set(key, value)
    }

    /// Deletes `key`.
    pub fn delete(&mut self, store: &str, key: &[u8]) -> Result<()> {
        self.store(store)?.delete(key)
    }

    /// Adds `delta` to the counter at `key` (8-byte big-endian, Kafka's LongSerializer) and
    /// returns the new value.
    pub fn increment(&mut self, store: &str, key: &[u8], delta: i64) -> Result<i64> {
        self.store(store)?.increment(key, delta)
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

    /// Sends a record to a declared output topic.
    pub fn send(&self, topic: &str, key: Option<&[u8]>, value: Option<&[u8]>) -> Result<()> {
        bindings::baton::processor::output::send(topic, key, value, &[])
    }

    /// Sends a record with headers to a declared output topic.
    pub fn send_with_headers(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[Header],
    ) -> Result<()> {
        bindings::baton::processor::output::send(topic, key, value, headers)
    }

    /// Logs a message at `level`; the host adds pipeline, slot and offset.
    pub fn log(&self, level: Level, message: &str) {
        bindings::baton::processor::log::log(level, message)
    }
}

/// Support for the code `#[processor]` generates. Not a public API.
#[doc(hidden)]
pub mod __private {
    use super::*;

    pub use bindings::exports::baton::processor::handler::Guest;

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

    /// Calls `f` for each record of the batch, stopping at the first error.
    pub fn process(batch: Vec<Message>, f: fn(&Message, &mut Context) -> Result<()>) -> Result<()> {
        CONTEXT.with(|c| {
            let mut ctx = c.borrow_mut();
            for msg in &batch {
                f(msg, &mut ctx)?;
            }
            Ok(())
        })
    }
}
