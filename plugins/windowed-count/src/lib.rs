//! windowed-count: counts records per key in tumbling event-time windows and sends each window's
//! final count once, when it closes (Kafka Streams' `groupByKey().windowedBy(TimeWindows)
//! .count().suppress(untilWindowCloses)`).
//!
//! Config: `window_ms` (window size), `grace_ms` (how long a window stays open past its end for
//! late records, default 0), `output` (the topic of final counts), `late` (the topic of records
//! that arrive after their window closed).
//!
//! Windows are aligned to the epoch: `[k·window_ms, (k+1)·window_ms)` by record timestamp. A
//! window `[s, e)` closes when the slot's event time reaches `e + grace_ms`; its count then goes
//! to `output` with the record key as key and `{"start":s,"end":e,"count":n}` as value, and its
//! state is deleted. State: the store `windows`, keyed by the window start (8 bytes, big-endian,
//! sign bit flipped so that keys sort by time) and the record key.
use std::cell::RefCell;

use baton_sdk::{Config, Context, Error, Message, Result, TimeKind, Timer};

struct Settings {
    window: i64,
    grace: i64,
    output: String,
    late: String,
}

thread_local! {
    static SETTINGS: RefCell<Option<Settings>> = const { RefCell::new(None) };
}

fn settings<T>(f: impl FnOnce(&Settings) -> T) -> T {
    SETTINGS.with(|s| f(s.borrow().as_ref().expect("init ran")))
}

fn window_key(start: i64, key: &[u8]) -> Vec<u8> {
    let mut k = ((start as u64) ^ (1 << 63)).to_be_bytes().to_vec();
    k.extend_from_slice(key);
    k
}

#[baton_sdk::processor(init = setup, on_timer = close)]
fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
    let Some(key) = msg.key else {
        return Ok(());
    };
    let (window, grace) = settings(|s| (s.window, s.grace));
    let start = msg.timestamp.div_euclid(window) * window;
    let closes = start.saturating_add(window).saturating_add(grace);
    if ctx.event_time() >= closes {
        let late = settings(|s| s.late.clone());
        return ctx.send_with_headers(&late, Some(key), msg.value, msg.headers());
    }
    let wk = window_key(start, key);
    if ctx.increment("windows", &wk, 1)? == 1 {
        ctx.schedule(TimeKind::EventTime, closes, &wk, None)?;
    }
    Ok(())
}

/// A window closed: its final count goes out and its state is deleted.
fn close(timer: &Timer, ctx: &mut Context) -> Result<()> {
    let (window, output) = settings(|s| (s.window, s.output.clone()));
    let (start, key) = timer.key.split_at(8);
    let start = (u64::from_be_bytes(start.try_into().expect("8 bytes")) ^ (1 << 63)) as i64;
    let count = ctx.counter("windows", timer.key)?;
    let value = format!(
        r#"{{"start":{start},"end":{},"count":{count}}}"#,
        start + window
    );
    ctx.send(&output, Some(key), Some(value.as_bytes()))?;
    ctx.delete("windows", timer.key)
}

fn setup(config: &Config) -> Result<()> {
    let window = config.require_i64("window_ms")?;
    if window <= 0 {
        return Err(Error::InvalidInput(
            "config `window_ms` must be positive".into(),
        ));
    }
    let grace = match config.get("grace_ms") {
        None => 0,
        Some(_) => config.require_i64("grace_ms")?,
    };
    if grace < 0 {
        return Err(Error::InvalidInput(
            "config `grace_ms` must not be negative".into(),
        ));
    }
    let s = Settings {
        window,
        grace,
        output: config.require("output")?.to_string(),
        late: config.require("late")?.to_string(),
    };
    SETTINGS.with(|c| *c.borrow_mut() = Some(s));
    Ok(())
}
