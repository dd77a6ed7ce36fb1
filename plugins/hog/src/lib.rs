//! hog: counts records per key into `counts`, and on a record whose value is `hog` allocates
//! memory until it fails. A test plugin for the per-instance memory limit.
use baton_sdk::{Context, Message, Result};

#[baton_sdk::processor]
fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
    if let Some(key) = msg.key {
        ctx.increment("counts", key, 1)?;
    }
    if msg.value == Some(b"hog") {
        let mut held: Vec<Vec<u8>> = Vec::new();
        loop {
            // 16 MiB at a time, touched so that it is really used.
            held.push(vec![1u8; 16 << 20]);
            std::hint::black_box(&held);
        }
    }
    Ok(())
}
