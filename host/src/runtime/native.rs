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

    /// `store.apply` of one increment per key, as the SDKs send a batch's increments: the
    /// counters are read in one lookup.
    pub fn native_add_all<'k>(
        &mut self,
        s: &NativeStore,
        keys: impl Iterator<Item = &'k [u8]> + Clone,
        delta: i64,
    ) -> Result<(), String> {
        let ahead = self.read_ahead(s.0, keys.clone()).map_err(host_err)?;
        for (k, a) in keys.zip(ahead) {
            self.add_counter_ahead(s.0, k, delta, a)
                .map_err(host_err)?
                .map_err(|e| e.to_string())?;
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::runtime::Cursor;
    use crate::state::StateEnv;

    fn ctx(db: &Arc<crate::state::PartitionDb>) -> HostCtx {
        HostCtx::new(
            "t".into(),
            db.clone(),
            Arc::new(crate::runtime::WriteLimits::default()),
            16 << 20,
            Default::default(),
        )
    }

    /// A database of one store, `counts`, in a directory of its own (kept while it is held).
    fn counts_db() -> (tempfile::TempDir, StateEnv, Arc<crate::state::PartitionDb>) {
        let dir = tempfile::tempdir().unwrap();
        let env = StateEnv::new(32 << 20);
        let db = env
            .open_shared(&dir.path().join("db"), &["counts".to_string()])
            .unwrap();
        (dir, env, db)
    }

    fn commit(ctx: &mut HostCtx, db: &crate::state::PartitionDb) {
        let writes = ctx.overlay.take();
        db.commit(writes.sorted(), &[]).unwrap();
        ctx.overlay.settle();
    }

    /// A batch's increments read in one lookup count exactly what one lookup per increment
    /// counts: over committed counters, counters written earlier in the same call (pending),
    /// repeated keys, absent keys and other slots' counters of the same key.
    #[test]
    fn increments_of_a_batch_count_as_one_by_one() {
        let (_dir, _env, db) = counts_db();
        let mut batched = ctx(&db);
        let counts = batched.native_open("counts").unwrap();
        let keys: Vec<Vec<u8>> = (0..200u32).map(|i| format!("k{i}").into_bytes()).collect();
        // Committed counts in slots 0 and 1: k{i} at i in slot 0, at 1000 + i in slot 1.
        for slot in [0u32, 1] {
            batched.begin_call(Cursor {
                slot,
                ..Cursor::default()
            });
            for (i, k) in keys.iter().enumerate() {
                let n = i as i64 + 1000 * i64::from(slot);
                if n > 0 {
                    batched.native_increment(&counts, k, n).unwrap();
                }
            }
            batched.keep_call();
        }
        commit(&mut batched, &db);
        // A fresh context: nothing cached, every read goes to RocksDB.
        let mut batched = ctx(&db);
        let counts = batched.native_open("counts").unwrap();
        batched.begin_call(Cursor::default());
        // Pending before the batch: k5 and a key RocksDB does not have.
        batched.native_increment(&counts, b"k5", 10).unwrap();
        batched.native_increment(&counts, b"new-0", 3).unwrap();
        // The batch: every other key, k7 three times, keys absent from RocksDB.
        let mut batch: Vec<&[u8]> = keys.iter().step_by(2).map(Vec::as_slice).collect();
        batch.extend([&b"k7"[..], b"k7", b"k5", b"new-0", b"new-1", b"new-1"]);
        batched
            .native_add_all(&counts, batch.iter().copied(), 1)
            .unwrap();
        batched.keep_call();
        for committed in [false, true] {
            // Read back before the commit (from the overlay), then after it (from RocksDB).
            if committed {
                commit(&mut batched, &db);
                batched = ctx(&db);
            }
            let counts = batched.native_open("counts").unwrap();
            batched.begin_call(Cursor::default());
            for (i, k) in keys.iter().enumerate() {
                let want = i as i64
                    + i64::from(i % 2 == 0)
                    + if i == 7 { 2 } else { 0 }
                    + if i == 5 { 10 + 1 } else { 0 };
                let got = batched.native_get(&counts, k).unwrap();
                let got = got.map_or(0, |v| i64::from_be_bytes(v.try_into().unwrap()));
                assert_eq!(got, want, "count of {}", String::from_utf8_lossy(k));
            }
            for (k, want) in [(&b"new-0"[..], 4), (b"new-1", 2)] {
                let got = batched.native_get(&counts, k).unwrap().unwrap();
                assert_eq!(i64::from_be_bytes(got.try_into().unwrap()), want);
            }
            // Slot 1's counters are untouched.
            batched.begin_call(Cursor {
                slot: 1,
                ..Cursor::default()
            });
            for (i, k) in keys.iter().enumerate() {
                let got = batched.native_get(&counts, k).unwrap().unwrap();
                assert_eq!(i64::from_be_bytes(got.try_into().unwrap()), 1000 + i as i64);
            }
        }
    }

    /// An increment read ahead from RocksDB counts from a write made between its read and its
    /// use (a set of the same key earlier in the same batch), and a repeated key of the batch
    /// from the increment before it.
    #[test]
    fn an_increment_read_ahead_counts_from_writes_made_after_its_read() {
        let (_dir, _env, db) = counts_db();
        let mut c = ctx(&db);
        let counts = c.native_open("counts").unwrap();
        c.begin_call(Cursor::default());
        for (k, n) in [(&b"a"[..], 5), (b"b", 7)] {
            c.native_increment(&counts, k, n).unwrap();
        }
        c.keep_call();
        commit(&mut c, &db);
        let mut c = ctx(&db);
        let counts = c.native_open("counts").unwrap();
        c.begin_call(Cursor::default());
        let keys: [&[u8]; 4] = [b"a", b"b", b"b", b"c"];
        let ahead = c.read_ahead(counts.0, keys.into_iter()).unwrap();
        // Only each key's first use carries a value read.
        let read: Vec<bool> = ahead.iter().map(|a| a.read.is_some()).collect();
        assert_eq!(read, [true, true, false, true]);
        // `a` is set to 100 after its read, before its increment.
        c.native_set(&counts, b"a", &100i64.to_be_bytes()).unwrap();
        let mut got = Vec::new();
        for (k, a) in keys.into_iter().zip(ahead) {
            got.push(c.add_counter_ahead(counts.0, k, 1, a).unwrap().unwrap());
        }
        assert_eq!(got, [101, 8, 9, 1]);
    }
}
