//! # baton
//!
//! A host for stateful stream processors written as WebAssembly components. Data travels one
//! way: [`transport`] → [`task`] (one partition's loop) → [`runtime`] (wasmtime) → [`state`]
//! (RocksDB per partition), with the control plane beside it: [`cluster`] (control log, pipeline
//! specs, module registry), [`app`] (the host and its operations) and [`http`] (the API and the
//! dashboard).

#![deny(missing_docs)]

pub mod app;
pub mod cluster;
pub mod config;
pub mod error;
pub mod http;
pub mod query;
pub mod runtime;
pub mod state;
pub mod task;
pub mod transport;

pub use app::{Baton, HostConfig};
