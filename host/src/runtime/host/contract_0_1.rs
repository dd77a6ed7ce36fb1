//! Contract 0.1: every call maps onto the operations above.

use super::*;
use v0_1::baton::processor::{log, output, state, types};

type WitError = types::Error;

impl types::Host for HostCtx {}

impl state::Host for HostCtx {}

impl state::HostStore for HostCtx {
    fn open(&mut self, name: String) -> wasmtime::Result<Result<Resource<StoreHandle>, WitError>> {
        match self.open_store(&name) {
            Err(e) => Ok(Err(e.into())),
            Ok(store) => Ok(Ok(self.table.push(StoreHandle { store })?)),
        }
    }

    fn get(
        &mut self,
        h: Resource<StoreHandle>,
        key: Vec<u8>,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, WitError>> {
        let store = self.table.get(&h)?.store;
        Ok(Ok(self.get_value(store, &key)?))
    }

    fn get_many(
        &mut self,
        h: Resource<StoreHandle>,
        keys: Vec<Vec<u8>>,
    ) -> wasmtime::Result<Result<Vec<Option<Vec<u8>>>, WitError>> {
        let store = self.table.get(&h)?.store;
        Ok(Ok(self.get_values(store, &keys)?))
    }

    fn set(
        &mut self,
        h: Resource<StoreHandle>,
        key: Vec<u8>,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), WitError>> {
        let store = self.table.get(&h)?.store;
        Ok(self.set_value(store, &key, value)?.map_err(Into::into))
    }

    fn delete(
        &mut self,
        h: Resource<StoreHandle>,
        key: Vec<u8>,
    ) -> wasmtime::Result<Result<(), WitError>> {
        let store = self.table.get(&h)?.store;
        self.delete_value(store, &key)?;
        Ok(Ok(()))
    }

    fn increment(
        &mut self,
        h: Resource<StoreHandle>,
        key: Vec<u8>,
        delta: i64,
    ) -> wasmtime::Result<Result<i64, WitError>> {
        let store = self.table.get(&h)?.store;
        Ok(self.add_counter(store, &key, delta)?.map_err(Into::into))
    }

    fn scan(
        &mut self,
        h: Resource<StoreHandle>,
        start: Vec<u8>,
        end: Option<Vec<u8>>,
        limit: u32,
    ) -> wasmtime::Result<Result<Vec<(Vec<u8>, Vec<u8>)>, WitError>> {
        let store = self.table.get(&h)?.store;
        Ok(Ok(self.scan_values(
            store,
            &start,
            end.as_deref(),
            limit as usize,
        )?))
    }

    fn drop(&mut self, h: Resource<StoreHandle>) -> wasmtime::Result<()> {
        self.table.delete(h)?;
        Ok(())
    }
}

impl output::Host for HostCtx {
    fn send(
        &mut self,
        topic: String,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        headers: Vec<types::Header>,
    ) -> wasmtime::Result<Result<(), WitError>> {
        let headers = headers.into_iter().map(|h| (h.key, h.value)).collect();
        Ok(self
            .send_output(&topic, key, value, headers, None)
            .map_err(Into::into))
    }
}

impl log::Host for HostCtx {
    fn log(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
        let level = match level {
            log::Level::Trace => tracing::Level::TRACE,
            log::Level::Debug => tracing::Level::DEBUG,
            log::Level::Info => tracing::Level::INFO,
            log::Level::Warn => tracing::Level::WARN,
            log::Level::Error => tracing::Level::ERROR,
        };
        self.guest_log(level, message);
        Ok(())
    }
}
