//! probe: records what the guest can see of its host, for the WASI-grant tests. For a record
//! with key `k` it writes into the store `probe`, under `k`, a JSON object: `time` (seconds
//! since the Unix epoch by the wall clock), `hash` (a hash under a randomly seeded
//! `RandomState`), `file` (whether `/etc/hostname` could be read) and `env` (the number of
//! environment variables).
use std::hash::{BuildHasher, Hasher};

use baton_sdk::{Context, Message, Result};

#[baton_sdk::processor]
fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
    let Some(key) = msg.key else {
        return Ok(());
    };
    let time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write(b"baton");
    let file = std::fs::read("/etc/hostname").is_ok();
    let env = std::env::vars().count();
    let seen = format!(
        r#"{{"time":{time},"hash":"{}","file":{file},"env":{env}}}"#,
        h.finish()
    );
    ctx.set("probe", key, seen.as_bytes())
}
