//! The per-record cost of calling `process` on word-count with batches of 1, 100 and 1000
//! records, against the same logic in native Rust over the same state layer (the Wasm tax):
//! `wasm-0.2` is the word-count plugin on contract 0.2 (the batch ABI: one buffer per batch,
//! the counts added in one `apply` call), `wasm-0.1` the same logic built for contract 0.1 (a
//! list of records, an `increment` host call per record).
//!
//! `cargo bench -p baton-tests --bench wasm_call`

use std::sync::Arc;

/// The allocator of the `baton` binary, so that allocation costs are the production ones.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use baton::runtime::{Cursor, HostCtx, Instance, Message, Runtime};
use baton::state::{PartitionDb, StateEnv};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

fn batch(n: usize, round: u64) -> Vec<Message> {
    baton_tests::bench::word_batch(n, round)
}

/// A host context over `db`, as a partition's instance gets.
fn host_ctx(db: &Arc<PartitionDb>) -> HostCtx {
    baton_tests::bench::host_ctx(db, 64 << 20)
}

/// An instance of a plugin over `db`, initialised.
fn instance(runtime: &Runtime, db: &Arc<PartitionDb>, plugin: &str) -> Instance {
    let module = runtime.load(&baton_tests::plugin_bytes(plugin)).unwrap();
    let ctx = host_ctx(db);
    let mut inst = runtime.instantiate(&module, ctx).unwrap();
    inst.init(&[]).unwrap();
    inst
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let env = StateEnv::new(256 << 20);
    let db = Arc::new(
        env.open_partition(&dir.path().join("db"), &["counts".to_string()])
            .unwrap(),
    );
    let runtime = Runtime::new(dir.path().join("compiled")).unwrap();
    let mut wasm = [
        ("wasm-0.2", instance(&runtime, &db, "word-count")),
        ("wasm-0.1", instance(&runtime, &db, "word-count-v01")),
    ];

    let mut group = c.benchmark_group("process");
    for n in [1usize, 100, 1000] {
        group.throughput(Throughput::Elements(n as u64));
        // The same logic in native Rust, through the same host calls over the same overlay.
        let mut ctx = host_ctx(&db);
        let counts = ctx.native_open("counts").unwrap();
        let mut round = 0u64;
        group.bench_with_input(BenchmarkId::new("native", n), &n, |b, &n| {
            b.iter_batched(
                || {
                    round += 1;
                    batch(n, round)
                },
                |msgs| {
                    ctx.begin_call(Cursor::default());
                    // One `apply` of the batch's increments, as the SDK sends them.
                    ctx.native_add_all(&counts, msgs.iter().filter_map(|m| m.key.as_deref()), 1)
                        .unwrap();
                    ctx.keep_call();
                    ctx.overlay.take()
                },
                criterion::BatchSize::SmallInput,
            )
        });
        for (name, inst) in &mut wasm {
            let mut round = 0u64;
            group.bench_with_input(BenchmarkId::new(*name, n), &n, |b, &n| {
                b.iter_batched(
                    || {
                        round += 1;
                        batch(n, round)
                    },
                    |msgs| {
                        inst.ctx().begin_call(Cursor::default());
                        inst.process(&msgs, 1000).unwrap();
                        inst.ctx().keep_call();
                        // Keep the overlay batch-sized, as the partition loop does at each
                        // commit.
                        inst.ctx().overlay.take()
                    },
                    criterion::BatchSize::SmallInput,
                )
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
