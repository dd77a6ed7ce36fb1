//! Contract 0.2: the calls of 0.1, plus the batched `apply` and `send-batch`, range deletes,
//! expiring entries and timers.

use super::*;
use v0_2::baton::processor::{log, output, state, timers, types};

type WitError = types::Error;

fn clock(kind: types::TimeKind) -> super::super::time::Clock {
    match kind {
        types::TimeKind::EventTime => super::super::time::Clock::Event,
        types::TimeKind::ProcessingTime => super::super::time::Clock::Processing,
    }
}

fn item_error(index: usize, e: Error) -> types::ItemError {
    types::ItemError {
        index: index as u32,
        error: e.into(),
    }
}

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

    fn set_expiring(
        &mut self,
        h: Resource<StoreHandle>,
        key: Vec<u8>,
        value: Vec<u8>,
        expiry: state::Expiry,
    ) -> wasmtime::Result<Result<(), WitError>> {
        let store = self.table.get(&h)?.store;
        let r = self.set_expiring(store, &key, value, clock(expiry.kind), expiry.at)?;
        Ok(r.map_err(Into::into))
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

    fn delete_range(
        &mut self,
        h: Resource<StoreHandle>,
        start: Vec<u8>,
        end: Option<Vec<u8>>,
    ) -> wasmtime::Result<Result<u64, WitError>> {
        let store = self.table.get(&h)?.store;
        Ok(Ok(HostCtx::delete_range(
            self,
            store,
            &start,
            end.as_deref(),
        )?))
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

    fn apply(
        &mut self,
        h: Resource<StoreHandle>,
        data: Vec<u8>,
        writes: Vec<state::Write>,
    ) -> wasmtime::Result<Result<(), types::ItemError>> {
        let store = self.table.get(&h)?.store;
        // The increments read their counters: all of them in one lookup first.
        let added = writes.iter().filter_map(|w| match w {
            state::Write::Add(op) => span_of(&data, op.key.start, op.key.len, "key").ok(),
            _ => None,
        });
        // One per increment with a valid key, in order: the loop stops at the first invalid one.
        let mut ahead = self.read_ahead(store, added)?.into_iter();
        for (i, w) in writes.iter().enumerate() {
            let r = match w {
                state::Write::Set(op) => {
                    match (
                        span_of(&data, op.key.start, op.key.len, "key"),
                        span_of(&data, op.value.start, op.value.len, "value"),
                    ) {
                        (Ok(k), Ok(v)) => match op.expiry {
                            None => self.set_value(store, k, v.to_vec())?,
                            Some(e) => {
                                self.set_expiring(store, k, v.to_vec(), clock(e.kind), e.at)?
                            }
                        },
                        (Err(e), _) | (_, Err(e)) => Err(e),
                    }
                }
                state::Write::Delete(key) => match span_of(&data, key.start, key.len, "key") {
                    Ok(k) => Ok(self.delete_value(store, k)?),
                    Err(e) => Err(e),
                },
                state::Write::Add(op) => match span_of(&data, op.key.start, op.key.len, "key") {
                    Ok(k) => match ahead.next() {
                        Some(a) => self.add_counter_ahead(store, k, op.delta, a)?.map(drop),
                        None => self.add_counter(store, k, op.delta)?.map(drop),
                    },
                    Err(e) => Err(e),
                },
            };
            if let Err(e) = r {
                return Ok(Err(item_error(i, e)));
            }
        }
        Ok(Ok(()))
    }

    fn drop(&mut self, h: Resource<StoreHandle>) -> wasmtime::Result<()> {
        self.table.delete(h)?;
        Ok(())
    }
}

impl timers::Host for HostCtx {
    fn schedule(
        &mut self,
        kind: types::TimeKind,
        at: i64,
        key: Vec<u8>,
        payload: Option<Vec<u8>>,
    ) -> wasmtime::Result<Result<(), WitError>> {
        let r = self.schedule_timer(clock(kind), at, &key, payload.as_deref())?;
        Ok(r.map_err(Into::into))
    }

    fn cancel(
        &mut self,
        kind: types::TimeKind,
        at: i64,
        key: Vec<u8>,
    ) -> wasmtime::Result<Result<bool, WitError>> {
        Ok(Ok(self.cancel_timer(clock(kind), at, &key)?))
    }

    fn event_time(&mut self) -> wasmtime::Result<i64> {
        Ok(self.event_time)
    }

    fn processing_time(&mut self) -> wasmtime::Result<i64> {
        Ok(self.clock.unwrap_or_else(now_ms))
    }
}

impl output::Host for HostCtx {
    fn send(
        &mut self,
        topic: String,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        headers: Vec<types::Header>,
        timestamp: Option<i64>,
    ) -> wasmtime::Result<Result<(), WitError>> {
        let headers = headers.into_iter().map(|h| (h.key, h.value)).collect();
        Ok(self
            .send_output(&topic, key, value, headers, timestamp)
            .map_err(Into::into))
    }

    fn send_batch(
        &mut self,
        data: Vec<u8>,
        records: Vec<output::OutRecord>,
        headers: Vec<types::HeaderEntry>,
    ) -> wasmtime::Result<Result<(), types::ItemError>> {
        let one = |r: &output::OutRecord| -> Result<_, Error> {
            let topic = span_of(&data, r.topic.start, r.topic.len, "topic")?;
            let topic = std::str::from_utf8(topic)
                .map_err(|_| Error::InvalidInput("the topic name is not UTF-8".into()))?;
            let opt = |s: Option<types::Span>, what| {
                s.map(|s| span_of(&data, s.start, s.len, what).map(<[u8]>::to_vec))
                    .transpose()
            };
            let key = opt(r.key, "key")?;
            let value = opt(r.value, "value")?;
            let hs = span_of_items(&headers, r.headers)?;
            let mut hv = Vec::with_capacity(hs.len());
            for h in hs {
                let name = span_of(&data, h.name.start, h.name.len, "header name")?;
                let name = String::from_utf8(name.to_vec())
                    .map_err(|_| Error::InvalidInput("a header name is not UTF-8".into()))?;
                let value = span_of(&data, h.value.start, h.value.len, "header value")?;
                hv.push((name, value.to_vec()));
            }
            Ok((topic, key, value, hv))
        };
        for (i, r) in records.iter().enumerate() {
            let sent = one(r).and_then(|(topic, key, value, hv)| {
                self.send_output(topic, key, value, hv, r.timestamp)
            });
            if let Err(e) = sent {
                return Ok(Err(item_error(i, e)));
            }
        }
        Ok(Ok(()))
    }
}

/// The items a span of a batched call names in one of its lists.
fn span_of_items<T>(items: &[T], s: types::Span) -> Result<&[T], Error> {
    let (a, n) = (s.start as usize, s.len as usize);
    a.checked_add(n)
        .and_then(|e| items.get(a..e))
        .ok_or_else(|| {
            Error::InvalidInput(format!(
                "headers span items {a}..{} but the call has {}",
                a as u64 + n as u64,
                items.len()
            ))
        })
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
