//! # baton
//!
//! A host for stateful stream processors written as WebAssembly components. Data travels one
//! way: [`transport`] → [`partition`] (one partition's loop, and the supervisor of a host's
//! partitions) → [`runtime`] (wasmtime) → [`state`] (RocksDB per partition), with the control
//! plane beside it: [`control`] (the control log, the catalog, pipeline specs, the module
//! registry, pipelines and hot swaps), [`query`] (state lookups and scans), [`app`] (the host:
//! wiring, produce and read) and [`http`] (the API, its types in [`http::model`], and the
//! dashboard).

#![deny(missing_docs)]

pub mod app;
pub mod cluster;
pub mod componentize;
pub mod config;
pub mod control;
pub mod error;
pub mod heap;
pub mod http;
pub mod local;
pub mod otlp;
pub mod partition;
pub mod partitioner;
pub mod query;
pub mod record;
pub mod runtime;
pub mod scaffold;
pub mod state;
pub mod steps;
pub mod transport;

pub use app::{Baton, HostConfig};

/// This build's version, as hosts report it to each other.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The unit tests run on the host's allocator, as `baton` does (see `main.rs`).
#[cfg(test)]
#[global_allocator]
static TEST_ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[cfg(test)]
mod layers;
