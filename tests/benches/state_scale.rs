//! The state layer alone at scale: word-count's host calls (an increment per record) over one
//! partition's RocksDB with millions of distinct keys, committed a batch at a time as the
//! partition loop commits them, without Kafka or Wasm in the way. Each key comes three times,
//! spread over the run as `bench/state_scale.py` spreads them. Prints the rate of every tenth
//! of the run, so that a slowdown shows where it starts, and the host's RocksDB memory figures
//! at the end: the tool to profile the state layer with (`perf record -g`).
//!
//! `BATON_BENCH_SCALE_KEYS` (default 10,000,000), `BATON_BENCH_SCALE_BATCH` (records per
//! commit, default 5,000), `BATON_BENCH_SCALE_MEMORY` (MiB of `--state-memory`, default 512),
//! `BATON_BENCH_SCALE_PER_KEY` (set: one host call per increment instead of one per call).
//!
//! `cargo bench -p baton-tests --bench state_scale`

use std::time::Instant;

/// The allocator of the `baton` binary, so that allocation costs are the production ones.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use baton::runtime::Cursor;
use baton::state::StateEnv;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn main() -> anyhow::Result<()> {
    let keys = env_usize("BATON_BENCH_SCALE_KEYS", 10_000_000) as u64;
    let batch = env_usize("BATON_BENCH_SCALE_BATCH", 5_000) as u64;
    let memory = env_usize("BATON_BENCH_SCALE_MEMORY", 512) << 20;
    let dir = tempfile::tempdir()?;
    let env = StateEnv::new(memory);
    let db = env.open_shared(&dir.path().join("db"), &["counts".to_string()])?;
    let mut ctx = baton_tests::bench::host_ctx(&db, 64 << 20);
    let counts = ctx.native_open("counts").map_err(anyhow::Error::msg)?;
    let n = 3 * keys;
    let mut step = 2_654_435_761u64;
    while keys.is_multiple_of(step) {
        step += 2;
    }
    // The SDKs send a call's increments in one `apply`, whose counters the host reads in one
    // batched lookup; `BATON_BENCH_SCALE_PER_KEY` makes one host call per increment instead.
    let per_key = std::env::var_os("BATON_BENCH_SCALE_PER_KEY").is_some();
    let started = Instant::now();
    let mut mark = (Instant::now(), 0u64);
    let mut slots: Vec<Vec<Vec<u8>>> = vec![Vec::new(); 4];
    let mut i = 0u64;
    while i < n {
        let end = (i + batch).min(n);
        for s in &mut slots {
            s.clear();
        }
        for j in i..end {
            let k = (j * step) % keys;
            slots[(k % 4) as usize].push(format!("user-{k:012}").into_bytes());
        }
        // One call per slot of the batch, as the partition loop makes them (4 slots).
        for (slot, keys) in slots.iter().enumerate() {
            ctx.begin_call(Cursor {
                slot: slot as u32,
                ..Cursor::default()
            });
            if per_key {
                for key in keys {
                    ctx.native_increment(&counts, key, 1)
                        .map_err(anyhow::Error::msg)?;
                }
            } else {
                ctx.native_add_all(&counts, keys.iter().map(Vec::as_slice), 1)
                    .map_err(anyhow::Error::msg)?;
            }
            ctx.keep_call();
        }
        let writes = ctx.overlay.take();
        db.commit(
            writes.sorted(),
            &[("seq".to_string(), Some(end.to_be_bytes().to_vec()))],
        )?;
        drop(writes);
        ctx.overlay.settle();
        if end * 20 / n > i * 20 / n {
            let secs = mark.0.elapsed().as_secs_f64();
            println!(
                "{:>3}% {:>12} records  {:>10.0} records/s  ({:.1} s in all)",
                end * 20 / n * 5,
                end,
                (end - mark.1) as f64 / secs,
                started.elapsed().as_secs_f64()
            );
            mark = (Instant::now(), end);
        }
        i = end;
    }
    let secs = started.elapsed().as_secs_f64();
    // User + system CPU of the whole process (compactions included), per million records.
    let cpu = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let f: Vec<u64> = s
                .rsplit(')')
                .next()?
                .split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|x| x.parse().ok())
                .collect();
            (f.len() == 2).then(|| (f[0] + f[1]) as f64 / 100.0)
        })
        .unwrap_or(f64::NAN);
    println!(
        "state_scale keys {keys} records {n} secs {secs:.1} rate {:.0} cpu_s_per_m {:.2}",
        n as f64 / secs,
        cpu / (n as f64 / 1e6)
    );
    println!("memory: {}", serde_json::to_string(&env.report())?);
    if std::env::var_os("BATON_BENCH_SCALE_STATS").is_some() {
        for prop in ["rocksdb.block-cache-entry-stats", "rocksdb.levelstats"] {
            println!("{prop}:\n{}", db.property_text(prop).unwrap_or_default());
        }
    }
    Ok(())
}
