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
//! state is deleted. Built on `baton_sdk::windows::Windows`: the store `windows`, keyed by the
//! window start (8 bytes that sort by time) and the record key, one timer per window, and a
//! range delete when it closes.
use std::cell::RefCell;

use baton_sdk::windows::Windows;
use baton_sdk::{Config, Context, Error, Message, Result, Timer};

struct Settings {
    windows: Windows,
    output: String,
    late: String,
}

thread_local! {
    static SETTINGS: RefCell<Option<Settings>> = const { RefCell::new(None) };
}

fn settings<T>(f: impl FnOnce(&Settings) -> T) -> T {
    SETTINGS.with(|s| f(s.borrow().as_ref().expect("init ran")))
}

#[baton_sdk::processor(init = setup, on_timer = close)]
fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
    let Some(key) = msg.key else {
        return Ok(());
    };
    let windows = settings(|s| s.windows);
    if !windows.count(ctx, key, msg.timestamp, 1)? {
        let late = settings(|s| s.late.clone());
        return ctx.send_with_headers(&late, Some(key), msg.value, msg.headers());
    }
    Ok(())
}

/// A window closed: each key's final count goes out, and the window's state is deleted.
fn close(timer: &Timer, ctx: &mut Context) -> Result<()> {
    let (windows, output) = settings(|s| (s.windows, s.output.clone()));
    for w in windows.closed(ctx, timer)?.unwrap_or_default() {
        let value = format!(
            r#"{{"start":{},"end":{},"count":{}}}"#,
            w.start, w.end, w.count
        );
        ctx.send(&output, Some(&w.key), Some(value.as_bytes()))?;
    }
    Ok(())
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
        windows: Windows::tumbling("windows", window).grace(grace),
        output: config.require("output")?.to_string(),
        late: config.require("late")?.to_string(),
    };
    SETTINGS.with(|c| *c.borrow_mut() = Some(s));
    Ok(())
}
