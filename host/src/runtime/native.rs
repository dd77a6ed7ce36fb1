//! Processors written in Rust and linked into the host, with no WebAssembly in between.
//!
//! They run through the same partition loop, state overlay and commit path as components and
//! call the same host functions, so a native processor with a component's logic measures exactly
//! what the Wasm boundary costs (the benchmarks use them as the baseline). They are registered in
//! code ([`crate::HostConfig::native_modules`]), never uploaded.

use std::sync::Arc;

use wasmtime::component::Resource;

use super::bindings::baton::processor::{output, state, types};
use super::host::{HostCtx, StoreHandle};
use super::{Message, describe};

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
pub struct NativeStore(u32);

fn host_err(e: wasmtime::Error) -> String {
    format!("{e:#}")
}

impl HostCtx {
    /// Opens a declared store (what a component's `store.open` does).
    pub fn native_open(&mut self, name: &str) -> Result<NativeStore, String> {
        let r = state::HostStore::open(self, name.to_string()).map_err(host_err)?;
        r.map(|h| NativeStore(h.rep())).map_err(|e| describe(&e))
    }

    fn borrow(s: &NativeStore) -> Resource<StoreHandle> {
        Resource::new_borrow(s.0)
    }

    /// `store.get`.
    pub fn native_get(&mut self, s: &NativeStore, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        state::HostStore::get(self, Self::borrow(s), key.to_vec())
            .map_err(host_err)?
            .map_err(|e| describe(&e))
    }

    /// `store.set`.
    pub fn native_set(&mut self, s: &NativeStore, key: &[u8], value: &[u8]) -> Result<(), String> {
        state::HostStore::set(self, Self::borrow(s), key.to_vec(), value.to_vec())
            .map_err(host_err)?
            .map_err(|e| describe(&e))
    }

    /// `store.increment`.
    pub fn native_increment(
        &mut self,
        s: &NativeStore,
        key: &[u8],
        delta: i64,
    ) -> Result<i64, String> {
        state::HostStore::increment(self, Self::borrow(s), key.to_vec(), delta)
            .map_err(host_err)?
            .map_err(|e| describe(&e))
    }

    /// `output.send`.
    pub fn native_send(
        &mut self,
        topic: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[types::Header],
    ) -> Result<(), String> {
        output::Host::send(
            self,
            topic.to_string(),
            key.map(<[u8]>::to_vec),
            value.map(<[u8]>::to_vec),
            headers.to_vec(),
        )
        .map_err(host_err)?
        .map_err(|e| describe(&e))
    }
}
