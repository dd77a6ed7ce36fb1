//! latest: keeps the latest value of every key in the store `values` (a table of the topic, as
//! Kafka Streams' `toTable()`), and counts in `changes` how often each key's value changed.
//! A record without a value deletes its key.
use baton_sdk::{Context, Message, Result};

#[baton_sdk::processor]
fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
    let Some(key) = msg.key else {
        return Ok(());
    };
    let old = ctx.get("values", key)?;
    match msg.value {
        Some(v) if old.as_deref() != Some(v) => {
            ctx.set("values", key, v)?;
            ctx.increment("changes", key, 1)?;
        }
        Some(_) => {}
        None => {
            if old.is_some() {
                ctx.delete("values", key)?;
                ctx.increment("changes", key, 1)?;
            }
        }
    }
    Ok(())
}
