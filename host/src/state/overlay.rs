//! The batch overlay: writes of the batch being processed, in front of RocksDB. Reads see them
//! (read-your-writes); a failed guest call drops its own writes without touching those of
//! earlier calls; the batch's writes reach RocksDB only at commit.

use std::collections::HashMap;

/// One write of a committed batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteOp {
    /// Store id (index into the partition's store list).
    pub store: usize,
    /// Slot-prefixed key.
    pub key: Vec<u8>,
    /// `None` deletes.
    pub value: Option<Vec<u8>>,
}

/// foldhash: fast, and seeded per process so that keys from input records cannot be chosen to
/// collide.
type Map = HashMap<Vec<u8>, Option<Vec<u8>>, foldhash::fast::RandomState>;

/// Pending writes of one batch, with a savepoint per guest call. One map per store, so that a
/// lookup borrows the key instead of building one.
#[derive(Default)]
pub struct Overlay {
    batch: Vec<Map>,
    call: Vec<Map>,
}

fn slot_of(maps: &mut Vec<Map>, store: usize) -> &mut Map {
    if maps.len() <= store {
        maps.resize_with(store + 1, Map::default);
    }
    &mut maps[store]
}

impl Overlay {
    /// The pending value: `None` if the overlay does not know the key, `Some(None)` if the batch
    /// deleted it, `Some(Some(v))` if it wrote `v`.
    pub fn get(&self, store: usize, key: &[u8]) -> Option<Option<&[u8]>> {
        fn hit<'a>(maps: &'a [Map], store: usize, key: &[u8]) -> Option<&'a Option<Vec<u8>>> {
            maps.get(store).and_then(|m| m.get(key))
        }
        hit(&self.call, store, key)
            .or_else(|| hit(&self.batch, store, key))
            .map(|v| v.as_deref())
    }

    /// Records a write of the current call.
    pub fn put(&mut self, store: usize, key: Vec<u8>, value: Option<Vec<u8>>) {
        slot_of(&mut self.call, store).insert(key, value);
    }

    /// Keeps the current call's writes as part of the batch.
    pub fn keep_call(&mut self) {
        for (store, call) in self.call.iter_mut().enumerate() {
            if call.is_empty() {
                continue;
            }
            let batch = slot_of(&mut self.batch, store);
            if batch.is_empty() {
                std::mem::swap(batch, call);
            } else {
                batch.extend(call.drain());
            }
        }
    }

    /// Drops the current call's writes.
    pub fn drop_call(&mut self) {
        self.call.iter_mut().for_each(Map::clear);
    }

    /// Pending entries of `store` with `start <= key < end`, for merging into a scan.
    pub fn range(&self, store: usize, start: &[u8], end: &[u8]) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        let mut merged: HashMap<&[u8], &Option<Vec<u8>>> = HashMap::new();
        for maps in [&self.batch, &self.call] {
            if let Some(m) = maps.get(store) {
                for (k, v) in m {
                    if k.as_slice() >= start && k.as_slice() < end {
                        merged.insert(k.as_slice(), v);
                    }
                }
            }
        }
        let mut v: Vec<_> = merged
            .into_iter()
            .map(|(k, v)| (k.to_vec(), v.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// True when the batch has no writes.
    pub fn is_empty(&self) -> bool {
        self.batch.iter().chain(self.call.iter()).all(Map::is_empty)
    }

    /// Takes the batch's writes (the current call's must have been kept or dropped).
    pub fn take(&mut self) -> Vec<WriteOp> {
        let mut out = Vec::new();
        for (store, m) in self.batch.iter_mut().enumerate() {
            out.extend(m.drain().map(|(key, value)| WriteOp { store, key, value }));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_savepoints() {
        let mut o = Overlay::default();
        o.put(0, b"a".to_vec(), Some(b"1".to_vec()));
        o.keep_call();
        o.put(0, b"a".to_vec(), Some(b"2".to_vec()));
        o.put(0, b"b".to_vec(), None);
        assert_eq!(o.get(0, b"a"), Some(Some(&b"2"[..])));
        assert_eq!(o.get(0, b"b"), Some(None));
        o.drop_call();
        assert_eq!(o.get(0, b"a"), Some(Some(&b"1"[..])));
        assert_eq!(o.get(0, b"b"), None);
        assert_eq!(o.range(0, b"", b"z").len(), 1);
        let ops = o.take();
        assert_eq!(
            ops,
            vec![WriteOp {
                store: 0,
                key: b"a".to_vec(),
                value: Some(b"1".to_vec())
            }]
        );
        assert!(o.is_empty());
    }
}
