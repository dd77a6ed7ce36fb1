//! baton's integration tests: one binary, real RocksDB, real wasmtime, real plugins built to
//! wasm32-wasip2 by the build script, and a real Apache Kafka broker started by `scripts/kafka`.

mod api;
mod checkpoints;
mod cli;
mod cluster;
mod contracts;
mod dead_letters;
mod deploy;
mod expiry;
mod faults;
mod holds;
mod http_errors;
mod idle_offsets;
mod kafka;
mod languages;
mod lifecycle;
mod limits;
mod memory;
mod moves;
mod nemesis;
mod openapi;
mod quickstart;
mod release;
mod restart;
mod scaffold;
mod secured;
mod split;
mod state_scale;
mod supervisor;
mod swap;
mod test_plugin;
mod timers;
mod too_large;
mod traces;
mod windows;
mod word_count;
