//! spin: counts records per key into `counts`. A test plugin for the CPU limit:
//! - a record whose value is `loop` never returns;
//! - a record whose value is `busy:<ms>` keeps the CPU busy for that many milliseconds of the
//!   wall clock (the pipeline must grant `wasi.clocks`, or the clock never moves and the record
//!   loops like `loop`).
use baton_sdk::{Context, Message, Result};

#[baton_sdk::processor]
fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
    if let Some(key) = msg.key {
        ctx.increment("counts", key, 1)?;
    }
    let value = msg.value.unwrap_or_default();
    if value == b"loop" {
        spin_forever(msg.offset);
    }
    if let Some(ms) = value
        .strip_prefix(b"busy:")
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        let until = std::time::Instant::now() + std::time::Duration::from_millis(ms);
        let mut x = msg.offset;
        while std::time::Instant::now() < until {
            for _ in 0..1000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
    }
    Ok(())
}

fn spin_forever(seed: u64) -> ! {
    let mut x = seed;
    loop {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
}
