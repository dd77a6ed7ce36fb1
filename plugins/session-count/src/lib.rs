//! session-count: per-key activity sessions with an inactivity gap (`config.gap_ms`). A session
//! is a run of a key's records each less than `gap_ms` after the one before; it closes when the
//! slot's event time reaches its last record's timestamp plus `gap_ms`, and then sends
//! `{"start":s,"end":e,"count":n}` (first and last timestamp, records) once to `config.output`,
//! keyed by the record key. Open sessions live in the store `sessions`, one per key, each with
//! an event-time timer at its close.
//!
//! A record that falls before the open session's start by a gap or more is older than the
//! session and is counted into it all the same (sessions are not split or merged backwards).
use std::cell::RefCell;

use baton_sdk::{Config, Context, Error, Message, Result, TimeKind, Timer};

thread_local! {
    static SETTINGS: RefCell<(i64, String)> = const { RefCell::new((0, String::new())) };
}

/// An open session: first and last timestamp, and its count.
fn decode(v: &[u8]) -> Result<(i64, i64, i64)> {
    let n = |i: usize| -> Result<i64> {
        v.get(i * 8..i * 8 + 8)
            .and_then(|b| b.try_into().ok())
            .map(i64::from_be_bytes)
            .ok_or_else(|| Error::InvalidValue("a session is not 24 bytes".into()))
    };
    Ok((n(0)?, n(1)?, n(2)?))
}

fn encode(start: i64, end: i64, count: i64) -> Vec<u8> {
    [start, end, count]
        .iter()
        .flat_map(|n| n.to_be_bytes())
        .collect()
}

fn emit(ctx: &mut Context, key: &[u8], (start, end, count): (i64, i64, i64)) -> Result<()> {
    let output = SETTINGS.with(|s| s.borrow().1.clone());
    let value = format!(r#"{{"start":{start},"end":{end},"count":{count}}}"#);
    ctx.send(&output, Some(key), Some(value.as_bytes()))
}

#[baton_sdk::processor(init = setup, on_timer = close)]
fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
    let Some(key) = msg.key else {
        return Ok(());
    };
    let gap = SETTINGS.with(|s| s.borrow().0);
    let ts = msg.timestamp;
    let open = match ctx.get("sessions", key)? {
        Some(v) => Some(decode(&v)?),
        None => None,
    };
    let session = match open {
        Some((start, end, count)) if ts < end + gap && ctx.event_time() < end + gap => {
            ctx.cancel(TimeKind::EventTime, end + gap, key)?;
            (start.min(ts), end.max(ts), count + 1)
        }
        Some(closed) => {
            // Its timer has not fired yet (it fires after the batch): close it here.
            ctx.cancel(TimeKind::EventTime, closed.1 + gap, key)?;
            emit(ctx, key, closed)?;
            (ts, ts, 1)
        }
        None => (ts, ts, 1),
    };
    ctx.set("sessions", key, &encode(session.0, session.1, session.2))?;
    ctx.schedule(TimeKind::EventTime, session.1 + gap, key, None)
}

/// A session's gap passed: it goes out and is forgotten.
fn close(timer: &Timer, ctx: &mut Context) -> Result<()> {
    if let Some(v) = ctx.get("sessions", timer.key)? {
        emit(ctx, timer.key, decode(&v)?)?;
        ctx.delete("sessions", timer.key)?;
    }
    Ok(())
}

fn setup(config: &Config) -> Result<()> {
    let gap = config.require_i64("gap_ms")?;
    if gap <= 0 {
        return Err(Error::InvalidInput(
            "config `gap_ms` must be positive".into(),
        ));
    }
    let output = config.require("output")?.to_string();
    SETTINGS.with(|s| *s.borrow_mut() = (gap, output));
    Ok(())
}
