//! Windowed counts in event time, built on timers and range deletes: tumbling and hopping
//! windows aligned to the epoch, with a grace period, each closed window handed back once.
//!
//! ```rust,ignore
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
}
