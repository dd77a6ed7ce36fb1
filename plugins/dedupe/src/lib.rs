//! dedupe: sends each record on to `config.output` unless a record with the same key was seen
//! within `config.ttl_ms` before it. Seen keys live in the store `seen` with a time-to-live, and
//! the host removes an entry when it expires, with a tombstone to the changelog. Records without
//! a key pass.
//!
//! `config.clock` picks the clock of the TTL: `event-time` (the default: an entry expires
//! `ttl_ms` after the timestamp of the record that wrote it, once the slot's event time gets
//! there) or `processing-time` (`ttl_ms` after it was written, on the host's wall clock, even
//! while no records come).
use std::cell::RefCell;

use baton_sdk::{Config, Context, Error, Message, Result};

struct Settings {
    ttl: i64,
    output: String,
    processing_time: bool,
}

thread_local! {
    static SETTINGS: RefCell<Settings> = const {
        RefCell::new(Settings { ttl: 0, output: String::new(), processing_time: false })
    };
}

#[baton_sdk::processor(init = setup)]
fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
    let (ttl, output, processing_time) = SETTINGS.with(|s| {
        let s = s.borrow();
        (s.ttl, s.output.clone(), s.processing_time)
    });
    if let Some(key) = msg.key {
        let seen = ctx.get("seen", key)?;
        if processing_time {
            // An entry is visible only until it expires.
            if seen.is_some() {
                return Ok(());
            }
            let now = ctx.processing_time();
            ctx.set_with_processing_ttl("seen", key, &now.to_be_bytes(), ttl)?;
        } else {
            if let Some(seen) = seen {
                let seen = <[u8; 8]>::try_from(seen.as_slice())
                    .map(i64::from_be_bytes)
                    .map_err(|_| Error::InvalidValue("a seen entry is not 8 bytes".into()))?;
                if msg.timestamp - seen < ttl {
                    return Ok(());
                }
            }
            ctx.set_with_ttl("seen", key, &msg.timestamp.to_be_bytes(), ttl)?;
        }
    }
    ctx.send_with_headers(&output, msg.key, msg.value, msg.headers())
}

fn setup(config: &Config) -> Result<()> {
    let ttl = config.require_i64("ttl_ms")?;
    if ttl <= 0 {
        return Err(Error::InvalidInput(
            "config `ttl_ms` must be positive".into(),
        ));
    }
    let processing_time = match config.get("clock") {
        None | Some("event-time") => false,
        Some("processing-time") => true,
        Some(other) => {
            return Err(Error::InvalidInput(format!(
                "config `clock` is {other:?}; use \"event-time\" or \"processing-time\""
            )));
        }
    };
    let output = config.require("output")?.to_string();
    SETTINGS.with(|s| {
        *s.borrow_mut() = Settings {
            ttl,
            output,
            processing_time,
        }
    });
    Ok(())
}
