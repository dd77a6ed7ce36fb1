//! Windowed counts in event time, built on timers and range deletes: tumbling and hopping
//! windows aligned to the epoch ([`Windows`]) and per-key activity sessions ([`Sessions`]), with
//! a grace period, each closed window handed back once.
//!
//! ```rust,no_run
//! use baton_sdk::windows::Windows;
//! use baton_sdk::{Context, Message, Result, Timer};
//!
//! const WINDOWS: Windows = Windows::tumbling("windows", 60_000).grace(5_000);
//!
//! #[baton_sdk::processor(on_timer = close)]
//! fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
//!     if let Some(key) = msg.key {
//!         if !WINDOWS.count(ctx, key, msg.timestamp, 1)? {
//!             ctx.send("late", Some(key), msg.value)?; // every window of it had closed
//!         }
//!     }
//!     Ok(())
//! }
//!
//! fn close(timer: &Timer, ctx: &mut Context) -> Result<()> {
//!     for w in WINDOWS.closed(ctx, timer)?.unwrap_or_default() {
//!         let json = format!(r#"{{"start":{},"end":{},"count":{}}}"#, w.start, w.end, w.count);
//!         ctx.send("counts", Some(&w.key), Some(json.as_bytes()))?;
//!     }
//!     Ok(())
//! }
//! ```
//!
//! State: the store's keys are the window start (8 bytes that sort as the number) then the
//! record key; one event-time timer per window (not per key) at `start + size + grace` closes
//! it, and the whole window goes with one range delete.
//!
//! Sessions, as Kafka Streams' `SessionWindows`: a key's records less than `gap` apart form one
//! session `[first, last]`; a record that falls within the gap of two sessions merges them.
//!
//! ```rust,no_run
//! use baton_sdk::windows::Sessions;
//! use baton_sdk::{Context, Message, Result, Timer};
//!
//! const SESSIONS: Sessions = Sessions::new("sessions", 30_000);
//!
//! #[baton_sdk::processor(on_timer = close)]
//! fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
//!     if let Some(key) = msg.key {
//!         SESSIONS.count(ctx, key, msg.timestamp, 1)?; // false: late, dropped
//!     }
//!     Ok(())
//! }
//!
//! fn close(timer: &Timer, ctx: &mut Context) -> Result<()> {
//!     if let Some(s) = SESSIONS.closed(ctx, timer)? {
//!         let json = format!(r#"{{"start":{},"end":{},"count":{}}}"#, s.start, s.end, s.count);
//!         ctx.send("sessions", Some(&s.key), Some(json.as_bytes()))?;
//!     }
//!     Ok(())
//! }
//! ```
//!
//! State: one entry per open session, keyed by the record key's length (4 bytes), the key and
//! the session's start, holding its end and count; one event-time timer per session at
//! `end + gap + grace`, moved when the session grows.

use crate::{Context, Error, Result, TimeKind, Timer};

/// Counting windows over one store.
#[derive(Debug, Clone, Copy)]
pub struct Windows {
    store: &'static str,
    size: i64,
    advance: i64,
    grace: i64,
}

/// A window that closed, for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed {
    /// The record key.
    pub key: Vec<u8>,
    /// The window's start (inclusive), in milliseconds.
    pub start: i64,
    /// Its end (exclusive).
    pub end: i64,
    /// What was counted in it.
    pub count: i64,
}

/// `at` as 8 bytes that sort as the number.
fn sortable(at: i64) -> [u8; 8] {
    ((at as u64) ^ (1 << 63)).to_be_bytes()
}

fn unsortable(b: &[u8]) -> Option<i64> {
    Some((u64::from_be_bytes(b.try_into().ok()?) ^ (1 << 63)) as i64)
}

impl Windows {
    /// Windows `[k·size, (k+1)·size)`, one per record.
    pub const fn tumbling(store: &'static str, size_ms: i64) -> Windows {
        Windows {
            store,
            size: size_ms,
            advance: size_ms,
            grace: 0,
        }
    }

    /// Windows of `size_ms` starting every `advance_ms` (`[k·advance, k·advance + size)`): a
    /// record counts in each window that holds it.
    pub const fn hopping(store: &'static str, size_ms: i64, advance_ms: i64) -> Windows {
        Windows {
            store,
            size: size_ms,
            advance: advance_ms,
            grace: 0,
        }
    }

    /// How long past its end a window still takes records (default 0).
    pub const fn grace(mut self, grace_ms: i64) -> Windows {
        self.grace = grace_ms;
        self
    }

    /// The starts of the windows that hold `ts`, earliest first.
    pub fn starts(&self, ts: i64) -> impl Iterator<Item = i64> {
        let (size, advance) = (self.size.max(1), self.advance.max(1));
        let last = ts.div_euclid(advance) * advance;
        let first = (ts - size).div_euclid(advance) * advance + advance;
        (0..)
            .map(move |i| first + i * advance)
            .take_while(move |s| *s <= last)
    }

    /// When the window starting at `start` closes.
    pub fn closes(&self, start: i64) -> i64 {
        start.saturating_add(self.size).saturating_add(self.grace)
    }

    fn timer_key(&self, start: i64) -> Vec<u8> {
        let mut k = Vec::with_capacity(2 + self.store.len() + 8);
        k.push(b'W');
        k.push(self.store.len() as u8);
        k.extend_from_slice(self.store.as_bytes());
        k.extend_from_slice(&sortable(start));
        k
    }

    /// Adds `delta` to `key`'s count in every window holding `ts` that has not closed by the
    /// slot's event time; returns `false` when every one had (the record is late).
    pub fn count(&self, ctx: &mut Context, key: &[u8], ts: i64, delta: i64) -> Result<bool> {
        let mut counted = false;
        for start in self.starts(ts) {
            let closes = self.closes(start);
            if ctx.event_time() >= closes {
                continue;
            }
            counted = true;
            let mut k = sortable(start).to_vec();
            k.extend_from_slice(key);
            ctx.add(self.store, &k, delta)?;
            let timer = (ctx.slot, self.timer_key(start));
            if !ctx.scheduled.contains(&timer) {
                ctx.schedule(TimeKind::EventTime, closes, &timer.1, None)?;
                ctx.scheduled.insert(timer);
            }
        }
        Ok(counted)
    }

    /// When `timer` closes one of these windows: every key's count in it, in key order, and
    /// the window's state is deleted. `None` for another timer.
    pub fn closed(&self, ctx: &mut Context, timer: &Timer) -> Result<Option<Vec<Closed>>> {
        let prefix_len = 2 + self.store.len();
        let k = timer.key;
        if k.len() != prefix_len + 8 || k[..prefix_len] != self.timer_key(0)[..prefix_len] {
            return Ok(None);
        }
        let start = unsortable(&k[prefix_len..]).ok_or_else(|| Error::other("bad window timer"))?;
        ctx.scheduled.remove(&(ctx.slot, k.to_vec()));
        let lo = sortable(start);
        let hi = match start.checked_add(1) {
            Some(next) => sortable(next).to_vec(),
            None => vec![0xff; 9],
        };
        let mut out = Vec::new();
        let mut from = lo.to_vec();
        loop {
            let rows = ctx.scan(self.store, &from, Some(&hi), 1000)?;
            let done = rows.len() < 1000;
            for (k, v) in rows {
                let count = <[u8; 8]>::try_from(v.as_slice())
                    .map(i64::from_be_bytes)
                    .map_err(|_| Error::InvalidValue("a window count is not 8 bytes".into()))?;
                from = k.clone();
                from.push(0);
                out.push(Closed {
                    key: k[8..].to_vec(),
                    start,
                    end: start + self.size,
                    count,
                });
            }
            if done {
                break;
            }
        }
        ctx.delete_range(self.store, &lo, Some(&hi))?;
        Ok(Some(out))
    }
}

/// Per-key activity sessions over one store: a session closes once the slot's event time
/// reaches its last record's timestamp plus the gap (and the grace).
#[derive(Debug, Clone, Copy)]
pub struct Sessions {
    store: &'static str,
    gap: i64,
    grace: i64,
}

fn read_i64(v: &[u8], i: usize) -> Result<i64> {
    v.get(i * 8..i * 8 + 8)
        .and_then(|b| b.try_into().ok())
        .map(i64::from_be_bytes)
        .ok_or_else(|| Error::InvalidValue("a session is not 16 bytes".into()))
}

impl Sessions {
    /// Sessions of records less than `gap_ms` apart.
    pub const fn new(store: &'static str, gap_ms: i64) -> Sessions {
        Sessions {
            store,
            gap: gap_ms,
            grace: 0,
        }
    }

    /// How long past its close a session still takes records (default 0).
    pub const fn grace(mut self, grace_ms: i64) -> Sessions {
        self.grace = grace_ms;
        self
    }

    /// When a session whose last record is at `end` closes.
    pub fn closes(&self, end: i64) -> i64 {
        end.saturating_add(self.gap).saturating_add(self.grace)
    }

    /// Whether a record at `ts` joins the session `[start, end]`, open at event time `now`.
    pub fn joins(&self, (start, end): (i64, i64), ts: i64, now: i64) -> bool {
        ts > start.saturating_sub(self.gap)
            && ts < end.saturating_add(self.gap)
            && now < self.closes(end)
    }

    fn prefix(key: &[u8]) -> Vec<u8> {
        let mut p = Vec::with_capacity(4 + key.len() + 8);
        p.extend_from_slice(&(key.len() as u32).to_be_bytes());
        p.extend_from_slice(key);
        p
    }

    fn timer_key(&self, state_key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(2 + self.store.len() + state_key.len());
        k.push(b'S');
        k.push(self.store.len() as u8);
        k.extend_from_slice(self.store.as_bytes());
        k.extend_from_slice(state_key);
        k
    }

    /// Adds `delta` to the count of `key`'s session holding `ts`: it starts one, grows one, or
    /// merges the sessions it bridges. Returns `false` when the record is late (its session
    /// would already have closed by the slot's event time); it then changes nothing.
    pub fn count(&self, ctx: &mut Context, key: &[u8], ts: i64, delta: i64) -> Result<bool> {
        let now = ctx.event_time();
        let prefix = Self::prefix(key);
        let from = [prefix.as_slice(), &sortable(i64::MIN)].concat();
        // Sessions starting before `ts + gap`: the only ones it can join.
        let to = match ts.checked_add(self.gap) {
            Some(t) => [prefix.as_slice(), &sortable(t)].concat(),
            None => [prefix.as_slice(), &[0xff; 9]].concat(),
        };
        let (mut start, mut end, mut count) = (ts, ts, delta);
        let mut merged = Vec::new();
        let mut next = from;
        loop {
            let rows = ctx.scan(self.store, &next, Some(&to), 100)?;
            let done = rows.len() < 100;
            for (k, v) in rows {
                next = k.clone();
                next.push(0);
                let s = unsortable(&k[prefix.len()..])
                    .ok_or_else(|| Error::InvalidValue("a session key is malformed".into()))?;
                let (e, n) = (read_i64(&v, 0)?, read_i64(&v, 1)?);
                if self.joins((s, e), ts, now) {
                    start = start.min(s);
                    end = end.max(e);
                    count += n;
                    merged.push((k, e));
                }
            }
            if done {
                break;
            }
        }
        if now >= self.closes(end) {
            return Ok(false);
        }
        let state_key = [prefix.as_slice(), &sortable(start)].concat();
        for (k, e) in &merged {
            ctx.cancel(TimeKind::EventTime, self.closes(*e), &self.timer_key(k))?;
            if *k != state_key {
                ctx.delete(self.store, k)?;
            }
        }
        let value = [end.to_be_bytes(), count.to_be_bytes()].concat();
        ctx.set(self.store, &state_key, &value)?;
        ctx.schedule(
            TimeKind::EventTime,
            self.closes(end),
            &self.timer_key(&state_key),
            None,
        )?;
        Ok(true)
    }

    /// When `timer` closes one of these sessions: the session, whose state is deleted. `None`
    /// for another timer.
    pub fn closed(&self, ctx: &mut Context, timer: &Timer) -> Result<Option<Closed>> {
        let head = 2 + self.store.len();
        let k = timer.key;
        if k.len() < head + 4 + 8 || k[..head] != self.timer_key(&[])[..] {
            return Ok(None);
        }
        let state_key = &k[head..];
        let key_len = u32::from_be_bytes(state_key[..4].try_into().unwrap()) as usize;
        if state_key.len() != 4 + key_len + 8 {
            return Err(Error::other("bad session timer"));
        }
        let Some(v) = ctx.get(self.store, state_key)? else {
            return Ok(None);
        };
        let start = unsortable(&state_key[4 + key_len..])
            .ok_or_else(|| Error::other("bad session timer"))?;
        ctx.delete(self.store, state_key)?;
        Ok(Some(Closed {
            key: state_key[4..4 + key_len].to_vec(),
            start,
            end: read_i64(&v, 0)?,
            count: read_i64(&v, 1)?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_falls_in_the_windows_that_hold_it() {
        let t = Windows::tumbling("w", 1000);
        assert_eq!(t.starts(0).collect::<Vec<_>>(), vec![0]);
        assert_eq!(t.starts(999).collect::<Vec<_>>(), vec![0]);
        assert_eq!(t.starts(1000).collect::<Vec<_>>(), vec![1000]);
        assert_eq!(t.starts(-1).collect::<Vec<_>>(), vec![-1000]);
        let h = Windows::hopping("w", 1000, 250);
        assert_eq!(
            h.starts(1000).collect::<Vec<_>>(),
            vec![250, 500, 750, 1000]
        );
        assert_eq!(
            h.starts(1249).collect::<Vec<_>>(),
            vec![250, 500, 750, 1000]
        );
        assert_eq!(
            h.starts(1250).collect::<Vec<_>>(),
            vec![500, 750, 1000, 1250]
        );
        assert_eq!(h.grace(5).closes(500), 1505);
        let keys: Vec<_> = [-5, 0, 7].iter().map(|t| sortable(*t)).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_record_joins_a_session_within_its_gap_while_it_is_open() {
        let s = Sessions::new("s", 100).grace(50);
        // Within the gap after the end, or before the start.
        assert!(s.joins((1000, 1200), 1299, 1299));
        assert!(!s.joins((1000, 1200), 1300, 1300));
        assert!(s.joins((1000, 1200), 901, 1200));
        assert!(!s.joins((1000, 1200), 900, 1200));
        // Closed by event time (end + gap + grace) even when the record is near it.
        assert!(s.joins((1000, 1200), 1250, 1349));
        assert!(!s.joins((1000, 1200), 1250, 1350));
        assert_eq!(s.closes(1200), 1350);
    }
}
