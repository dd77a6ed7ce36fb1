//! spin: counts records per key into `counts`, and never returns from a record whose value is
//! `loop`. A test plugin for the per-batch CPU limit.
use baton_sdk::{Context, Message, Result};

#[baton_sdk::processor]
fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
    if let Some(key) = &msg.key {
        ctx.increment("counts", key, 1)?;
    }
    if msg.value.as_deref() == Some(b"loop") {
        let mut x: u64 = msg.offset;
        loop {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    Ok(())
}
