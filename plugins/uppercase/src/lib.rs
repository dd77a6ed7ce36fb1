//! uppercase: sends each record's value in upper case to the output topic named by `config.output`.
use baton_sdk::{Config, Context, Message, Result};

/// Upper-cases the value (UTF-8, lossily) and sends it with the same key and headers.
#[baton_sdk::processor(init = setup)]
fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
    let topic = ctx.config().require("output")?.to_string();
    let value = msg
        .value
        .as_ref()
        .map(|v| String::from_utf8_lossy(v).to_uppercase().into_bytes());
    ctx.send_with_headers(&topic, msg.key, value.as_deref(), msg.headers())
}

fn setup(config: &Config) -> Result<()> {
    config.require("output")?;
    Ok(())
}
