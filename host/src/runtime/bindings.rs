//! The generated bindings of the `baton:processor` world, and nothing else.
//!
//! Every import is trappable: a host function returns `wasmtime::Result<T>`, where an `Err`
//! traps the guest (host bug, limit exceeded) and `T` carries the WIT-level result the guest can
//! handle.

#![allow(missing_docs)]

wasmtime::component::bindgen!({
    path: "../wit",
    world: "processor",
    imports: { default: trappable },
    with: {
        "baton:processor/state.store": crate::runtime::host::StoreHandle,
    },
});
