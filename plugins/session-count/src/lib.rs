//! session-count: per-key activity sessions with an inactivity gap (`config.gap_ms`), on the
//! SDK's [`Sessions`]. A session is a run of a key's records each less than `gap_ms` from the
//! next; a record within the gap of two sessions merges them. A session closes when the slot's
//! event time reaches its last record's timestamp plus `gap_ms` plus `config.grace_ms` (default
//! 0), and then sends `{"start":s,"end":e,"count":n}` (first and last timestamp, records) once
//! to `config.output`, keyed by the record key. A record whose session would already have
//! closed is late and dropped, as Kafka Streams drops it. Open sessions live in the store
//! `sessions`.
use std::cell::RefCell;

use baton_sdk::windows::Sessions;
use baton_sdk::{Config, Context, Error, Message, Result, Timer};

thread_local! {
    static SETTINGS: RefCell<(Sessions, String)> =
        const { RefCell::new((Sessions::new("sessions", 1), String::new())) };
}

#[baton_sdk::processor(init = setup, on_timer = close)]
fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
    if let Some(key) = msg.key {
        let sessions = SETTINGS.with(|s| s.borrow().0);
        sessions.count(ctx, key, msg.timestamp, 1)?;
    }
    Ok(())
}

/// A session's gap passed: it goes out and is forgotten.
fn close(timer: &Timer, ctx: &mut Context) -> Result<()> {
    let (sessions, output) = SETTINGS.with(|s| s.borrow().clone());
    if let Some(s) = sessions.closed(ctx, timer)? {
        let value = format!(
            r#"{{"start":{},"end":{},"count":{}}}"#,
            s.start, s.end, s.count
        );
        ctx.send(&output, Some(&s.key), Some(value.as_bytes()))?;
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
    let grace = match config.get("grace_ms") {
        Some(_) => config.require_i64("grace_ms")?,
        None => 0,
    };
    if grace < 0 {
        return Err(Error::InvalidInput(
            "config `grace_ms` must not be negative".into(),
        ));
    }
    let output = config.require("output")?.to_string();
    SETTINGS.with(|s| *s.borrow_mut() = (Sessions::new("sessions", gap).grace(grace), output));
    Ok(())
}
