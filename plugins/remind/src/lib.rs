//! remind: a processing-time timer per record. Each record with a key schedules a timer
//! `config.delay_ms` after the host's wall clock; when it fires, the record's value goes to
//! `config.output` under its key. The partition may be idle by then: it still fires.
use std::cell::RefCell;

use baton_sdk::{Config, Context, Error, Message, Result, TimeKind, Timer};

thread_local! {
    static SETTINGS: RefCell<(i64, String)> = const { RefCell::new((0, String::new())) };
}

#[baton_sdk::processor(init = setup, on_timer = fire)]
fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
    let Some(key) = msg.key else {
        return Ok(());
    };
    let delay = SETTINGS.with(|s| s.borrow().0);
    let at = ctx.processing_time() + delay;
    ctx.schedule(TimeKind::ProcessingTime, at, key, msg.value)
}

fn fire(timer: &Timer, ctx: &mut Context) -> Result<()> {
    let output = SETTINGS.with(|s| s.borrow().1.clone());
    ctx.send(&output, Some(timer.key), timer.payload)
}

fn setup(config: &Config) -> Result<()> {
    let delay = config.require_i64("delay_ms")?;
    if delay < 0 {
        return Err(Error::InvalidInput(
            "config `delay_ms` must not be negative".into(),
        ));
    }
    let output = config.require("output")?.to_string();
    SETTINGS.with(|s| *s.borrow_mut() = (delay, output));
    Ok(())
}
