//! fail-on: counts records per key, but fails on records whose value equals `config.value`.
use baton_sdk::{Config, Context, Error, Message, Result};

/// Increments `counts[key]` first, then fails when the value matches, so a test can check that
/// a failed record's writes are discarded.
#[baton_sdk::processor(init = setup)]
fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
    if let Some(key) = msg.key {
        ctx.increment("counts", key, 1)?;
    }
    let poison = ctx.config().require("value")?.as_bytes().to_vec();
    if msg.value == Some(poison.as_slice()) {
        match ctx.config().get("mode").unwrap_or("error") {
            "trap" => panic!("fail-on: poison value at offset {}", msg.offset),
            _ => {
                return Err(Error::InvalidInput(format!(
                    "fail-on: poison value at offset {}",
                    msg.offset
                )));
            }
        }
    }
    Ok(())
}

fn setup(config: &Config) -> Result<()> {
    config.require("value")?;
    match config.get("mode").unwrap_or("error") {
        "error" | "trap" => Ok(()),
        other => Err(Error::InvalidInput(format!(
            "config `mode` must be \"error\" or \"trap\", not {other:?}"
        ))),
    }
}
