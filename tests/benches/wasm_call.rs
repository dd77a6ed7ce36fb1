//! The per-record cost of calling `process` on word-count with batches of 1 and 100 records,
//! against the same logic in native Rust over the same state layer (the Wasm tax).
//!
//! `cargo bench -p baton-tests --bench wasm_call`

use std::sync::Arc;

use baton::runtime::{Cursor, HostCtx, Message, Runtime};
use baton::state::{Overlay, PartitionDb, StateEnv, slot_key};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

fn batch(n: usize, round: u64) -> Vec<Message> {
    (0..n)
        .map(|i| Message {
            topic: "words".into(),
            slot: 0,
            offset: round * n as u64 + i as u64,
            timestamp: 0,
            key: Some(format!("key-{:08}", (round as usize * n + i) % 10_000).into_bytes()),
            value: Some(b"x".to_vec()),
            headers: vec![],
        })
        .collect()
}

/// What the host's `increment` does, called natively.
fn native_increment(db: &PartitionDb, overlay: &mut Overlay, slot: u32, key: &[u8]) {
    let k = slot_key(slot, key);
    let current = match overlay.get(0, &k) {
        Some(v) => v
            .map(|b| i64::from_be_bytes(b.try_into().unwrap()))
            .unwrap_or(0),
        None => db
            .get(0, &k)
            .unwrap()
            .map(|b| i64::from_be_bytes(b.as_slice().try_into().unwrap()))
            .unwrap_or(0),
    };
    overlay.put(0, k, Some((current + 1).to_be_bytes().to_vec()));
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let env = StateEnv::new(256 << 20);
    let db = Arc::new(
        env.open_partition(&dir.path().join("db"), &["counts".to_string()])
            .unwrap(),
    );
    let runtime = Runtime::new(dir.path().join("compiled")).unwrap();
    let module = runtime
        .load(&baton_tests::plugin_bytes("word-count"))
        .unwrap();
    let ctx = HostCtx::new(
        "bench".into(),
        db.clone(),
        Arc::new(baton::runtime::WriteLimits::default()),
        64 << 20,
        Default::default(),
    );
    let mut inst = runtime.instantiate(&module, ctx).unwrap();
    inst.init(&[]).unwrap();

    let mut group = c.benchmark_group("process");
    for n in [1usize, 100] {
        group.throughput(Throughput::Elements(n as u64));
        let mut round = 0u64;
        group.bench_with_input(BenchmarkId::new("wasm", n), &n, |b, &n| {
            b.iter_batched(
                || {
                    round += 1;
                    batch(n, round)
                },
                |msgs| {
                    inst.ctx().begin_call(Cursor::default());
                    inst.process(&msgs, 1000).unwrap();
                    inst.ctx().keep_call();
                    // Keep the overlay batch-sized, as the partition loop does at each commit.
                    if inst.ctx().overlay.take().len() > 1 << 20 {
                        unreachable!()
                    }
                },
                criterion::BatchSize::SmallInput,
            )
        });
        let mut overlay = Overlay::default();
        let mut round = 0u64;
        group.bench_with_input(BenchmarkId::new("native", n), &n, |b, &n| {
            b.iter_batched(
                || {
                    round += 1;
                    batch(n, round)
                },
                |msgs| {
                    for m in &msgs {
                        if let Some(k) = &m.key {
                            native_increment(&db, &mut overlay, m.slot, k);
                        }
                    }
                    overlay.keep_call();
                    overlay.take()
                },
                criterion::BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
