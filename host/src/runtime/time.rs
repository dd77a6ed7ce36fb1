//! Time in the host: each slot's event time, its timers, and the expiry of entries written with
//! one, all kept in the pipeline's own store [`TIME_STORE`]. Being state, they commit atomically
//! with the call that changed them, go through the store's changelog, and come back with a
//! restore: a timer fires exactly once under exactly-once, and an expiry outlives a restart.
//!
//! Keys of the store (each after the slot's 4-byte prefix, as every state key):
//! - `E` → the slot's event time (8 bytes, big-endian `i64`);
//! - `C` → how many timers the slot has pending (8 bytes, big-endian `u64`);
//! - `T` clock at key → the timer's payload (`0`, or `1` and the payload);
//! - `M` store → present once an entry of `store` in the slot was written with an expiry: reads
//!   of stores without one never look up expiries;
//! - `X` len store key → the entry's expiry (clock and at): reads check it;
//! - `Y` clock at len store key → empty: the index the sweep walks, oldest first.
//!
//! `clock` is one byte (0 event time, 1 processing time), `at` 8 bytes that sort as the `i64`
//! they hold, `len` the length of the store name (one byte, names are at most 64 bytes).

use super::host::{GuestError, HostCtx};
use crate::state::slot_key;

/// The host's own store of every pipeline: each slot's event time, its timers and the expiry
/// index of entries written with an expiry. It commits and goes through its changelog like the
/// declared stores, so time survives restarts, restores and moves with the state.
pub const TIME_STORE: &str = "__time";

const EVENT_TIME: u8 = b'E';
const TIMER_COUNT: u8 = b'C';
const TIMER: u8 = b'T';
const MARKER: u8 = b'M';
const EXPIRY: u8 = b'X';
const BY_TIME: u8 = b'Y';

/// Which clock a timer or an expiry follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Clock {
    /// The slot's event time.
    Event,
    /// The host's wall clock.
    Processing,
}

impl Clock {
    fn byte(self) -> u8 {
        match self {
            Clock::Event => 0,
            Clock::Processing => 1,
        }
    }

    fn of(b: u8) -> Option<Clock> {
        match b {
            0 => Some(Clock::Event),
            1 => Some(Clock::Processing),
            _ => None,
        }
    }
}

/// A timer that fell due, as read from the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueTimer {
    /// Its clock.
    pub clock: Clock,
    /// When it was due.
    pub at: i64,
    /// The key it was scheduled for.
    pub key: Vec<u8>,
    /// What it carries.
    pub payload: Option<Vec<u8>>,
}

/// `at` as 8 bytes that sort as the number.
fn sortable(at: i64) -> [u8; 8] {
    ((at as u64) ^ (1 << 63)).to_be_bytes()
}

fn unsortable(b: &[u8]) -> Option<i64> {
    let b: [u8; 8] = b.try_into().ok()?;
    Some((u64::from_be_bytes(b) ^ (1 << 63)) as i64)
}

/// A key of the time store: the slot, a tag and the parts.
fn key(slot: u32, tag: u8, parts: &[&[u8]]) -> Vec<u8> {
    let mut k = Vec::with_capacity(5 + parts.iter().map(|p| p.len()).sum::<usize>());
    k.extend_from_slice(&slot.to_be_bytes());
    k.push(tag);
    for p in parts {
        k.extend_from_slice(p);
    }
    k
}

fn timer_key(slot: u32, clock: Clock, at: i64, user_key: &[u8]) -> Vec<u8> {
    key(slot, TIMER, &[&[clock.byte()], &sortable(at), user_key])
}

/// The end of the keys of `tag` and `clock` due at or before `clock_now`.
fn due_end(slot: u32, tag: u8, clock: Clock, now: i64) -> Vec<u8> {
    match now.checked_add(1) {
        Some(next) => key(slot, tag, &[&[clock.byte()], &sortable(next)]),
        None => key(slot, tag, &[&[clock.byte() + 1]]),
    }
}

fn store_part(name: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(1 + name.len());
    p.push(name.len() as u8);
    p.extend_from_slice(name.as_bytes());
    p
}

fn decode_i64(v: Option<Vec<u8>>, default: i64) -> i64 {
    v.and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
        .map_or(default, i64::from_be_bytes)
}

impl HostCtx {
    fn time_get(&mut self, k: &[u8]) -> wasmtime::Result<Option<Vec<u8>>> {
        let Some(ts) = self.time_store else {
            return Ok(None);
        };
        if let Some(v) = self.overlay.get(ts, k) {
            return Ok(v.map(<[u8]>::to_vec));
        }
        let r = self.db.get(ts, k);
        self.host_result(r)
    }

    fn time_put(&mut self, k: Vec<u8>, v: Option<Vec<u8>>) {
        if let Some(ts) = self.time_store {
            // A timer or an expiry set before the floor of its index lowers the floor.
            if v.is_some()
                && let (Some(slot), Some(&tag), Some(&clock), Some(at)) = (
                    k.get(..4).and_then(|s| <[u8; 4]>::try_from(s).ok()),
                    k.get(4),
                    k.get(5),
                    k.get(6..14).and_then(unsortable),
                )
                && (tag == TIMER || tag == BY_TIME)
                && let Some(floor) =
                    self.time_floor
                        .get_mut(&(u32::from_be_bytes(slot), tag, clock))
            {
                *floor = (*floor).min(at);
            }
            self.overlay.put(ts, k, v);
        }
    }

    /// Up to `limit` entries of the index `tag` (timers or expiries) of `slot` on `clock` due
    /// by `clock_now`, oldest first. Fired entries leave tombstones at the start of the index
    /// until compaction; the scan starts at the index's floor, the oldest due entry the last
    /// scan found (or past its end when it found none), which only an entry set since can
    /// lower. A call dropped with its removals brings back entries at or after the floor.
    fn due_in_index(
        &mut self,
        ts: usize,
        slot: u32,
        tag: u8,
        clock: Clock,
        clock_now: i64,
        limit: usize,
    ) -> wasmtime::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let at_floor = (slot, tag, clock.byte());
        let lo = match self.time_floor.get(&at_floor) {
            Some(&f) => key(slot, tag, &[&[clock.byte()], &sortable(f)]),
            None => key(slot, tag, &[&[clock.byte()]]),
        };
        let hi = due_end(slot, tag, clock, clock_now);
        let rows = if lo < hi {
            self.merged_range(ts, &lo, &hi, limit)?
        } else {
            Vec::new()
        };
        let floor = match rows.first() {
            Some((k, _)) => k.get(6..14).and_then(unsortable).unwrap_or(i64::MIN),
            None => clock_now.saturating_add(1),
        };
        self.time_floor.insert(at_floor, floor);
        Ok(rows)
    }

    /// The event time of `slot`, `-1` before its first record.
    pub fn slot_event_time(&mut self, slot: u32) -> wasmtime::Result<i64> {
        if let Some(t) = self.event_times.get(&slot) {
            return Ok(*t);
        }
        let t = decode_i64(self.time_get(&key(slot, EVENT_TIME, &[]))?, -1);
        self.event_times.insert(slot, t);
        Ok(t)
    }

    /// Moves the current call's slot's event time up to `seen` (the highest timestamp of the
    /// call's records), as a write of the call; sets [`HostCtx::event_time`] and returns the
    /// event time before.
    pub fn advance_event_time(&mut self, seen: i64) -> wasmtime::Result<i64> {
        let slot = self.cursor.slot;
        let before = self.slot_event_time(slot)?;
        if seen > before {
            self.call_event_time = Some((slot, before));
            self.event_times.insert(slot, seen);
            self.time_put(
                key(slot, EVENT_TIME, &[]),
                Some(seen.to_be_bytes().to_vec()),
            );
        }
        self.event_time = seen.max(before);
        Ok(before)
    }

    /// Sets [`HostCtx::event_time`] to the current slot's, for a call without records.
    pub fn load_event_time(&mut self) -> wasmtime::Result<()> {
        self.event_time = self.slot_event_time(self.cursor.slot)?;
        Ok(())
    }

    fn timer_count(&mut self, slot: u32) -> wasmtime::Result<i64> {
        Ok(decode_i64(self.time_get(&key(slot, TIMER_COUNT, &[]))?, 0))
    }

    fn set_timer_count(&mut self, slot: u32, n: i64) {
        let v = (n > 0).then(|| n.to_be_bytes().to_vec());
        self.time_put(key(slot, TIMER_COUNT, &[]), v);
    }

    /// Schedules a timer in the current slot, replacing the payload of the same one.
    pub fn schedule_timer(
        &mut self,
        clock: Clock,
        at: i64,
        user_key: &[u8],
        payload: Option<&[u8]>,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        let Some(ts) = self.time_store else {
            return Ok(Err(GuestError::Other(
                "this partition keeps no timers".into(),
            )));
        };
        if let Err(e) = self.check_write(ts, user_key, payload.unwrap_or_default()) {
            return Ok(Err(e));
        }
        let slot = self.cursor.slot;
        let k = timer_key(slot, clock, at, user_key);
        if self.time_get(&k)?.is_none() {
            let n = self.timer_count(slot)?;
            let max = self.write_limits().max_timers;
            if n as u64 >= max {
                return Ok(Err(GuestError::Limit(format!(
                    "slot {slot} has {n} timers pending, the most limits.max_timers allows"
                ))));
            }
            self.set_timer_count(slot, n + 1);
        }
        let mut v = Vec::with_capacity(1 + payload.map_or(0, <[u8]>::len));
        match payload {
            None => v.push(0),
            Some(p) => {
                v.push(1);
                v.extend_from_slice(p);
            }
        }
        self.time_put(k, Some(v));
        Ok(Ok(()))
    }

    /// Cancels a timer of the current slot; `false` when none was pending.
    pub fn cancel_timer(
        &mut self,
        clock: Clock,
        at: i64,
        user_key: &[u8],
    ) -> wasmtime::Result<bool> {
        let slot = self.cursor.slot;
        let k = timer_key(slot, clock, at, user_key);
        if self.time_get(&k)?.is_none() {
            return Ok(false);
        }
        self.time_put(k, None);
        let n = self.timer_count(slot)?;
        self.set_timer_count(slot, n - 1);
        Ok(true)
    }

    /// How many timers `slots` have pending.
    pub fn pending_timers(&mut self, slots: std::ops::Range<u32>) -> wasmtime::Result<u64> {
        let mut n = 0;
        for slot in slots {
            n += self.timer_count(slot)?.max(0) as u64;
        }
        Ok(n)
    }

    /// Up to `limit` timers of `slot` due by its event time and by `now`, oldest first.
    pub fn due_timers(
        &mut self,
        slot: u32,
        now: i64,
        limit: usize,
    ) -> wasmtime::Result<Vec<DueTimer>> {
        let Some(ts) = self.time_store else {
            return Ok(Vec::new());
        };
        let event_time = self.slot_event_time(slot)?;
        let mut due = Vec::new();
        for (clock, clock_now) in [(Clock::Event, event_time), (Clock::Processing, now)] {
            for (k, v) in self.due_in_index(ts, slot, TIMER, clock, clock_now, limit)? {
                let (Some(at), Some(&flag)) = (unsortable(&k[6..14]), v.first()) else {
                    continue;
                };
                due.push(DueTimer {
                    clock,
                    at,
                    key: k[14..].to_vec(),
                    payload: (flag == 1).then(|| v[1..].to_vec()),
                });
            }
        }
        due.sort_by(|a, b| (a.at, a.clock, &a.key).cmp(&(b.at, b.clock, &b.key)));
        due.truncate(limit);
        Ok(due)
    }

    /// Removes fired timers of the current slot.
    pub fn remove_timers(&mut self, timers: &[DueTimer]) -> wasmtime::Result<()> {
        let slot = self.cursor.slot;
        for t in timers {
            self.time_put(timer_key(slot, t.clock, t.at, &t.key), None);
        }
        let n = self.timer_count(slot)?;
        self.set_timer_count(slot, n - timers.len() as i64);
        Ok(())
    }

    /// Whether entries of `store` in `slot` may carry an expiry (cached per session).
    pub(super) fn may_expire(&mut self, slot: u32, store: usize) -> wasmtime::Result<bool> {
        if self.time_store.is_none() {
            return Ok(false);
        }
        if let Some(&b) = self.expiring.get(&(slot, store)) {
            return Ok(b);
        }
        let name = self.db.stores()[store].clone();
        let b = self
            .time_get(&key(slot, MARKER, &[name.as_bytes()]))?
            .is_some();
        self.expiring.insert((slot, store), b);
        Ok(b)
    }

    fn expiry_key(&self, slot: u32, store: usize, user_key: &[u8]) -> Vec<u8> {
        key(
            slot,
            EXPIRY,
            &[&store_part(&self.db.stores()[store]), user_key],
        )
    }

    /// The expiry of an entry of the current slot, if it has one.
    fn expiry_of(
        &mut self,
        store: usize,
        user_key: &[u8],
    ) -> wasmtime::Result<Option<(Clock, i64)>> {
        let slot = self.cursor.slot;
        if !self.may_expire(slot, store)? {
            return Ok(None);
        }
        let k = self.expiry_key(slot, store, user_key);
        Ok(self.time_get(&k)?.and_then(|v| {
            let clock = Clock::of(*v.first()?)?;
            Some((clock, unsortable(v.get(1..9)?)?))
        }))
    }

    /// Whether an expiry has passed by the current call's clocks.
    fn passed(&self, (clock, at): (Clock, i64)) -> bool {
        match clock {
            Clock::Event => self.event_time >= at,
            Clock::Processing => self.call_now >= at,
        }
    }

    /// Whether the entry `user_key` of `store` in the current slot has expired.
    pub(super) fn is_expired(&mut self, store: usize, user_key: &[u8]) -> wasmtime::Result<bool> {
        Ok(self
            .expiry_of(store, user_key)?
            .is_some_and(|e| self.passed(e)))
    }

    /// Forgets the expiry of an entry that is written again or deleted.
    pub(super) fn clear_expiry(&mut self, store: usize, user_key: &[u8]) -> wasmtime::Result<()> {
        let Some((clock, at)) = self.expiry_of(store, user_key)? else {
            return Ok(());
        };
        let slot = self.cursor.slot;
        let name = store_part(&self.db.stores()[store]);
        self.time_put(self.expiry_key(slot, store, user_key), None);
        self.time_put(
            key(
                slot,
                BY_TIME,
                &[&[clock.byte()], &sortable(at), &name, user_key],
            ),
            None,
        );
        Ok(())
    }

    /// Gives an entry of the current slot an expiry.
    pub(super) fn set_expiry(
        &mut self,
        store: usize,
        user_key: &[u8],
        clock: Clock,
        at: i64,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        if self.time_store.is_none() {
            return Ok(Err(GuestError::Other(
                "this partition keeps no expiries".into(),
            )));
        }
        self.clear_expiry(store, user_key)?;
        let slot = self.cursor.slot;
        let name = self.db.stores()[store].clone();
        if !self.may_expire(slot, store)? {
            self.time_put(key(slot, MARKER, &[name.as_bytes()]), Some(vec![1]));
            self.expiring.insert((slot, store), true);
        }
        let mut v = vec![clock.byte()];
        v.extend_from_slice(&sortable(at));
        self.time_put(self.expiry_key(slot, store, user_key), Some(v));
        let part = store_part(&name);
        self.time_put(
            key(
                slot,
                BY_TIME,
                &[&[clock.byte()], &sortable(at), &part, user_key],
            ),
            Some(Vec::new()),
        );
        Ok(Ok(()))
    }

    /// Removes up to `limit` entries of `slot` whose expiry passed by its event time and by
    /// `now`: each entry (a tombstone goes to its store's changelog) and its index entries.
    /// Returns how many.
    pub fn sweep_expired(&mut self, slot: u32, now: i64, limit: usize) -> wasmtime::Result<usize> {
        let Some(ts) = self.time_store else {
            return Ok(0);
        };
        let event_time = self.slot_event_time(slot)?;
        let mut removed = 0;
        for (clock, clock_now) in [(Clock::Event, event_time), (Clock::Processing, now)] {
            for (k, _) in self.due_in_index(ts, slot, BY_TIME, clock, clock_now, limit - removed)? {
                self.time_put(k.clone(), None);
                let rest = &k[14..];
                let Some((&len, rest)) = rest.split_first() else {
                    continue;
                };
                let Some((name, user_key)) = rest.split_at_checked(len as usize) else {
                    continue;
                };
                let name = String::from_utf8_lossy(name);
                if let Some(store) = self.db.store_id(&name) {
                    self.time_put(key(slot, EXPIRY, &[&store_part(&name), user_key]), None);
                    self.overlay.put(store, slot_key(slot, user_key), None);
                }
                removed += 1;
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_sort_as_numbers() {
        let ts = [i64::MIN, -5, -1, 0, 1, 1_700_000_000_000, i64::MAX];
        let keys: Vec<_> = ts.iter().map(|t| sortable(*t)).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        for t in ts {
            assert_eq!(unsortable(&sortable(t)), Some(t));
        }
        // The end of what is due at `now` is past every timer at `now` and before `now + 1`.
        let at_now = timer_key(3, Clock::Event, 10, b"zzz");
        let next = timer_key(3, Clock::Event, 11, b"");
        let end = due_end(3, TIMER, Clock::Event, 10);
        assert!(at_now < end && end <= next);
        assert!(
            timer_key(3, Clock::Event, i64::MAX, b"k") < due_end(3, TIMER, Clock::Event, i64::MAX)
        );
    }
}

#[cfg(test)]
mod state_tests {
    //! Range deletes, expiries and timers through the host's operations, over a real RocksDB.
    use std::sync::Arc;

    use super::*;
    use crate::runtime::host::{Cursor, HostCtx, WriteLimits};
    use crate::state::{PartitionDb, StateEnv};

    fn ctx(dir: &std::path::Path, max_timers: u64) -> HostCtx {
        let env = StateEnv::new(32 << 20);
        let stores = vec!["s".to_string(), TIME_STORE.to_string()];
        let db: Arc<PartitionDb> = Arc::new(env.open_partition(dir, &stores).unwrap());
        let limits = WriteLimits {
            max_timers,
            ..WriteLimits::default()
        };
        HostCtx::new(
            "p".into(),
            db,
            Arc::new(limits),
            64 << 20,
            Default::default(),
        )
    }

    /// Keeps the last call and begins one of `slot`'s records up to `seen`.
    fn call(c: &mut HostCtx, slot: u32, seen: i64) {
        c.keep_call();
        c.begin_call(Cursor {
            topic: "t".into(),
            slot,
            offset: 0,
            timestamp: seen,
        });
        c.advance_event_time(seen).unwrap();
    }

    /// The keys of store `s` the pending writes delete (their changelog tombstones).
    fn tombstones(c: &mut HostCtx) -> Vec<Vec<u8>> {
        c.keep_call();
        let w = c.overlay.take();
        let mut v: Vec<_> = w
            .sorted()
            .into_iter()
            .filter(|w| w.store == 0 && w.value.is_none())
            .map(|w| w.key[4..].to_vec())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_range_delete_removes_what_is_in_range_of_its_slot_with_a_tombstone_each() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = ctx(dir.path(), 10);
        call(&mut c, 1, 0);
        for k in ["a", "b1", "b2", "b3", "c"] {
            c.set_value(0, k.as_bytes(), b"v".to_vec())
                .unwrap()
                .unwrap();
        }
        call(&mut c, 2, 0);
        c.set_value(0, b"b2", b"other slot".to_vec())
            .unwrap()
            .unwrap();
        call(&mut c, 1, 0);
        assert_eq!(c.delete_range(0, b"b", Some(b"c")).unwrap(), 3);
        let left: Vec<_> = c
            .scan_values(0, b"", None, 100)
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(left, vec![b"a".to_vec(), b"c".to_vec()]);
        assert_eq!(c.delete_range(0, b"", None).unwrap(), 2);
        call(&mut c, 2, 0);
        assert_eq!(c.get_value(0, b"b2").unwrap(), Some(b"other slot".to_vec()));
        // Nothing was committed: the deletes cancel the sets in the pending writes. Commit the
        // sets, then delete a range of committed entries: each gets a tombstone.
        let dir = tempfile::tempdir().unwrap();
        let mut c = ctx(dir.path(), 10);
        call(&mut c, 1, 0);
        for k in ["b1", "b2", "b3", "c"] {
            c.set_value(0, k.as_bytes(), b"v".to_vec())
                .unwrap()
                .unwrap();
        }
        c.keep_call();
        let w = c.overlay.take();
        c.db.commit(w.iter(), &[]).unwrap();
        c.overlay.settle();
        call(&mut c, 1, 0);
        assert_eq!(c.delete_range(0, b"b", Some(b"c")).unwrap(), 3);
        assert_eq!(
            tombstones(&mut c),
            vec![b"b1".to_vec(), b"b2".to_vec(), b"b3".to_vec()]
        );
    }

    #[test]
    fn an_expired_entry_is_invisible_at_once_and_swept_with_a_tombstone() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = ctx(dir.path(), 10);
        call(&mut c, 0, 1_000);
        c.set_expiring(0, b"e", b"1".to_vec(), Clock::Event, 1_500)
            .unwrap()
            .unwrap();
        c.set_expiring(0, b"p", b"1".to_vec(), Clock::Processing, i64::MAX)
            .unwrap()
            .unwrap();
        c.set_value(0, b"n", b"1".to_vec()).unwrap().unwrap();
        assert_eq!(c.get_value(0, b"e").unwrap(), Some(b"1".to_vec()));
        // Event time reaches the expiry: invisible to reads, scans and counters at once.
        call(&mut c, 0, 1_500);
        assert_eq!(c.get_value(0, b"e").unwrap(), None);
        let keys: Vec<_> = c
            .scan_values(0, b"", None, 10)
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, vec![b"n".to_vec(), b"p".to_vec()]);
        // Another slot's event time is its own.
        call(&mut c, 1, 0);
        c.set_expiring(0, b"e", b"2".to_vec(), Clock::Event, 1_500)
            .unwrap()
            .unwrap();
        assert_eq!(c.get_value(0, b"e").unwrap(), Some(b"2".to_vec()));
        // The sweep removes the expired entry of slot 0 only.
        c.keep_call();
        let _ = c.overlay.take();
        call(&mut c, 0, 1_500);
        assert_eq!(c.sweep_expired(0, 0, 100).unwrap(), 1);
        assert_eq!(tombstones(&mut c), vec![b"e".to_vec()]);
        // Written again without an expiry, a key stays.
        call(&mut c, 1, 0);
        c.set_value(0, b"e", b"3".to_vec()).unwrap().unwrap();
        call(&mut c, 1, 9_999);
        assert_eq!(c.get_value(0, b"e").unwrap(), Some(b"3".to_vec()));
        assert_eq!(c.sweep_expired(1, 0, 100).unwrap(), 0);
    }

    #[test]
    fn timers_are_named_by_clock_time_and_key_limited_per_slot_and_due_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = ctx(dir.path(), 3);
        call(&mut c, 0, 100);
        c.schedule_timer(Clock::Event, 300, b"b", None)
            .unwrap()
            .unwrap();
        c.schedule_timer(Clock::Event, 200, b"a", Some(b"x"))
            .unwrap()
            .unwrap();
        // The same timer again replaces its payload and does not count twice.
        c.schedule_timer(Clock::Event, 200, b"a", Some(b"y"))
            .unwrap()
            .unwrap();
        c.schedule_timer(Clock::Processing, 50, b"p", None)
            .unwrap()
            .unwrap();
        let over = c.schedule_timer(Clock::Event, 400, b"c", None).unwrap();
        assert!(matches!(over, Err(GuestError::Limit(_))), "{over:?}");
        // Another slot has its own limit.
        call(&mut c, 1, 100);
        c.schedule_timer(Clock::Event, 400, b"c", None)
            .unwrap()
            .unwrap();
        assert_eq!(c.pending_timers(0..2).unwrap(), 4);

        call(&mut c, 0, 250);
        let due = c.due_timers(0, 60, 10).unwrap();
        let got: Vec<_> = due
            .iter()
            .map(|t| (t.clock, t.at, t.key.clone(), t.payload.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (Clock::Processing, 50, b"p".to_vec(), None),
                (Clock::Event, 200, b"a".to_vec(), Some(b"y".to_vec())),
            ]
        );
        c.remove_timers(&due).unwrap();
        assert!(c.due_timers(0, 60, 10).unwrap().is_empty());
        assert!(c.cancel_timer(Clock::Event, 300, b"b").unwrap());
        assert!(!c.cancel_timer(Clock::Event, 300, b"b").unwrap());
        assert_eq!(c.pending_timers(0..1).unwrap(), 0);
        c.schedule_timer(Clock::Event, 500, b"d", None)
            .unwrap()
            .unwrap();
        // A dropped call takes its timers and its move of event time with it.
        call(&mut c, 0, 900);
        c.schedule_timer(Clock::Event, 600, b"e", None)
            .unwrap()
            .unwrap();
        c.drop_call();
        assert_eq!(c.slot_event_time(0).unwrap(), 250);
        assert_eq!(c.pending_timers(0..1).unwrap(), 1);
    }

    /// Scans for due timers start past the tombstones of fired ones; a timer scheduled before
    /// that point, or a removal dropped with its call, is still found.
    #[test]
    fn due_timers_start_past_fired_ones_yet_find_earlier_new_and_restored_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = ctx(dir.path(), 100);
        let at = |due: &[DueTimer]| due.iter().map(|t| t.at).collect::<Vec<_>>();
        call(&mut c, 0, 0);
        for t in [10, 20, 30] {
            c.schedule_timer(Clock::Event, t, b"k", None)
                .unwrap()
                .unwrap();
        }
        call(&mut c, 0, 15);
        let due = c.due_timers(0, 0, 10).unwrap();
        assert_eq!(at(&due), vec![10]);
        c.remove_timers(&due).unwrap();
        c.keep_call();
        let w = c.overlay.take();
        c.db.commit(w.iter(), &[]).unwrap();
        c.overlay.settle();
        call(&mut c, 0, 15);
        assert!(c.due_timers(0, 0, 10).unwrap().is_empty());
        // Below the floor the last scan left.
        c.schedule_timer(Clock::Event, 5, b"late", None)
            .unwrap()
            .unwrap();
        assert_eq!(at(&c.due_timers(0, 0, 10).unwrap()), vec![5]);
        // Two scans in one call raise the floor past a removal the call then drops.
        call(&mut c, 0, 25);
        let due = c.due_timers(0, 0, 1).unwrap();
        assert_eq!(at(&due), vec![5]);
        c.remove_timers(&due).unwrap();
        let due = c.due_timers(0, 0, 10).unwrap();
        assert_eq!(at(&due), vec![20]);
        c.drop_call();
        call(&mut c, 0, 25);
        assert_eq!(at(&c.due_timers(0, 0, 10).unwrap()), vec![5, 20]);
    }
}
