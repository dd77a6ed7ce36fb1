//! dedupe: sends each record on to `config.output` unless a record with the same key was seen
//! within `config.ttl_ms` before it (by record timestamp). Seen keys live in the store `seen`
//! with a time-to-live: an entry expires `ttl_ms` after the record that wrote it, in event time,
//! and the host removes it then, with a tombstone to the changelog. Records without a key pass.
use std::cell::RefCell;

use baton_sdk::{Config, Context, Error, Message, Result};

thread_local! {
    static SETTINGS: RefCell<(i64, String)> = const { RefCell::new((0, String::new())) };
}

#[baton_sdk::processor(init = setup)]
fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
    let (ttl, output) = SETTINGS.with(|s| s.borrow().clone());
    if let Some(key) = msg.key {
        if let Some(seen) = ctx.get("seen", key)? {
            let seen = <[u8; 8]>::try_from(seen.as_slice())
                .map(i64::from_be_bytes)
                .map_err(|_| Error::InvalidValue("a seen entry is not 8 bytes".into()))?;
            if msg.timestamp - seen < ttl {
                return Ok(());
            }
        }
        ctx.set_with_ttl("seen", key, &msg.timestamp.to_be_bytes(), ttl)?;
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
    let output = config.require("output")?.to_string();
    SETTINGS.with(|s| *s.borrow_mut() = (ttl, output));
    Ok(())
}
