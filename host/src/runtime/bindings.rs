//! The generated bindings of the `baton:processor` worlds the host serves, and nothing else:
//! [`v0_2`] (the current contract, `wit/`) and [`v0_1`] (`wit/v0.1/`), kept so that components
//! built for it run unchanged.
//!
//! Every import is trappable: a host function returns `wasmtime::Result<T>`, where an `Err`
//! traps the guest (host bug, limit exceeded) and `T` carries the WIT-level result the guest can
//! handle.

#![allow(missing_docs)]

/// `baton:processor@0.2.0`.
pub mod v0_2 {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "processor",
        imports: { default: trappable },
        with: {
            "baton:processor/state.store": crate::runtime::host::StoreHandle,
        },
    });
}

/// `baton:processor@0.1.0`.
pub mod v0_1 {
    wasmtime::component::bindgen!({
        path: "../wit/v0.1",
        world: "processor",
        imports: { default: trappable },
        with: {
            "baton:processor/state.store": crate::runtime::host::StoreHandle,
        },
    });
}
