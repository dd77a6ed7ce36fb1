//! What a processor costs in each language: word-count built from Rust, C, Go, JavaScript and
//! Python (the SDKs' examples), against the same logic in native Rust over the same state layer. For each:
//! the per-record cost of `process` with batches of 100 records, the component's size, the
//! time to compile it to native code (once, at upload) and to instantiate it (at every
//! partition start).
//!
//! `cargo bench -p baton-tests --bench languages` prints a table (`BATON_BENCH_RECORDS`,
//! default 100,000 records per language).

use std::sync::Arc;
use std::time::{Duration, Instant};

/// The allocator of the `baton` binary, so that allocation costs are the production ones.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use baton::runtime::{Cursor, HostCtx, Message, Runtime};
use baton::state::{PartitionDb, StateEnv};

const BATCH: usize = 100;

fn batch(round: u64) -> Vec<Message> {
    baton_tests::bench::word_batch(BATCH, round)
}

fn host_ctx(db: &Arc<PartitionDb>) -> HostCtx {
    baton_tests::bench::host_ctx(db, 256 << 20)
}

/// Nanoseconds per record of `run` over `rounds` batches (after a warm-up of a tenth).
fn per_record(rounds: u64, mut run: impl FnMut(Vec<Message>)) -> f64 {
    for r in 0..rounds / 10 {
        run(batch(r));
    }
    let batches: Vec<Vec<Message>> = (0..rounds).map(batch).collect();
    let started = Instant::now();
    for b in batches {
        run(b);
    }
    started.elapsed().as_nanos() as f64 / (rounds * BATCH as u64) as f64
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn main() {
    let records: u64 = std::env::var("BATON_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let rounds = (records / BATCH as u64).max(10);
    let dir = tempfile::tempdir().unwrap();
    let env = StateEnv::new(256 << 20);
    let db = Arc::new(
        env.open_partition(&dir.path().join("db"), &["counts".to_string()])
            .unwrap(),
    );

    let mut ctx = host_ctx(&db);
    let counts = ctx.native_open("counts").unwrap();
    let native = per_record(rounds, |msgs| {
        ctx.begin_call(Cursor::default());
        // One `apply` of the batch's increments, as the SDK sends them.
        ctx.native_add_all(&counts, msgs.iter().filter_map(|m| m.key.as_deref()), 1)
            .unwrap();
        ctx.keep_call();
        ctx.overlay.take();
    });

    let mut rows = vec![format!("| native Rust | — | — | — | {native:.0} | 1.00 |")];
    for (lang, plugin) in [
        ("Rust", "word-count"),
        ("C", "c-word-count"),
        ("Go", "go-word-count"),
        ("JavaScript", "js-word-count"),
        ("Python", "python-word-count"),
    ] {
        let bytes = baton_tests::plugin_bytes(plugin);
        let cache = dir.path().join(format!("compiled-{plugin}"));
        let runtime = Runtime::new(cache).unwrap();
        let t = Instant::now();
        let module = runtime.load(&bytes).unwrap();
        let compile = t.elapsed();
        let t = Instant::now();
        let mut inst = runtime.instantiate(&module, host_ctx(&db)).unwrap();
        inst.init(&[]).unwrap();
        let instantiate = t.elapsed();
        let cost = per_record(rounds, |msgs| {
            inst.ctx().begin_call(Cursor::default());
            inst.process(&msgs, 100_000).unwrap();
            inst.ctx().keep_call();
            inst.ctx().overlay.take();
        });
        rows.push(format!(
            "| {lang} ({plugin}) | {:.2} MB | {} | {} | {cost:.0} | {:.2} |",
            bytes.len() as f64 / 1e6,
            ms(compile),
            ms(instantiate),
            cost / native
        ));
    }
    println!(
        "word-count per language ({} records per language, batches of {BATCH}, one run)",
        rounds * BATCH as u64
    );
    println!(
        "| language | component | compile ms | instantiate ms | ns per record | × native Rust |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for r in rows {
        println!("{r}");
    }
}
