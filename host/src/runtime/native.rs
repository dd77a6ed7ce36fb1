//! Processors written in Rust and linked into the host, with no WebAssembly in between.
//!
//! They run through the same partition loop, state overlay and commit path as components and
//! call the same host functions, so a native processor with a component's logic measures exactly
//! what the Wasm boundary costs (the benchmarks use them as the baseline). They are registered in
//! code ([`crate::HostConfig::native_modules`]), never uploaded.

use std::sync::Arc;

use super::host::HostCtx;
use super::{Header, Message};

/// A processor compiled into the host.
pub trait NativeProcessor: Send {
    /// Called once per instance with the pipeline's config, like a component's `init`.
    fn init(&mut self, ctx: &mut HostCtx, config: &[(String, String)]) -> Result<(), String> {
        let _ = (ctx, config);
        Ok(())
    }

    /// Processes one slot's records, like a component's `process`.
    fn process(&mut self, ctx: &mut HostCtx, batch: &[Message]) -> Result<(), String>;
}

/// Makes a fresh processor per instance.
pub type NativeFactory = Arc<dyn Fn() -> Box<dyn NativeProcessor> + Send + Sync>;

/// A native module: a name and version pipelines can name, and its factory.
#[derive(Clone)]
pub struct NativeModule {
    /// Module name.
    pub name: String,
    /// Module version.
    pub version: String,
    /// Makes instances.
    pub factory: NativeFactory,
}

impl std::fmt::Debug for NativeModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NativeModule({} {})", self.name, self.version)
    }
}

impl NativeModule {
    /// The content address that stands in for a sha256 in the catalog.
    pub fn address(&self) -> String {
        format!("native:{}@{}", self.name, self.version)
    }
}

/// An open store of a native processor.
pub struct NativeStore(usize);

impl HostCtx {
    /// Opens a declared store (what a component's `store.open` does).
    pub fn native_open(&mut self, name: &str) -> Result<NativeStore, String> {
        self.open_store(name)
            .map(NativeStore)
            .map_err(|e| e.to_string())
    }

    /// `store.get`.
    pub fn native_get(&mut self, s: &NativeStore, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        self.get_value(s.0, key).map_err(host_err)
    }

    /// `store.set`.
    pub fn native_set(&mut self, s: &NativeStore, key: &[u8], value: &[u8]) -> Result<(), String> {
        self.set_value(s.0, key, value.to_vec())
            .map_err(host_err)?
            .map_err(|e| e.to_string())
    }

    /// `store.increment`.
    pub fn native_increment(
        &mut self,
        s: &NativeStore,
        key: &[u8],
        delta: i64,
    ) -> Result<i64, String> {
        self.add_counter(s.0, key, delta)
            .map_err(host_err)?
            .map_err(|e| e.to_string())
    }

    /// `output.send`.
    pub fn native_send(
        &mut self,
        topic: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[Header],
    ) -> Result<(), String> {
        let headers = headers
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect();
        self.send_output(
            topic,
            key.map(<[u8]>::to_vec),
            value.map(<[u8]>::to_vec),
            headers,
            None,
        )
        .map_err(|e| e.to_string())
    }
}

fn host_err(e: wasmtime::Error) -> String {
    format!("{e:#}")
}
