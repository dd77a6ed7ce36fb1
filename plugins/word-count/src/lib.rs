//! word-count: counts records per key into the store `counts` (`groupByKey().count()`).
use baton_sdk::{Context, Message, Result};

/// Adds one to the count of the record's key; records without a key are skipped, as
/// Kafka Streams' `groupByKey` drops them.
#[baton_sdk::processor]
fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
    if let Some(key) = msg.key {
        ctx.add("counts", key, 1)?;
    }
    Ok(())
}
