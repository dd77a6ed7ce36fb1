//! word-count throughput on the embedded log: records/s with 1 and 4 partitions, from pipeline
//! creation over preloaded input until every record is committed. Prints a table.
//!
//! `cargo bench -p baton-tests --bench embedded_throughput` (BATON_BENCH_RECORDS to change N)

use std::time::{Duration, Instant};

use baton::control::PipelineSpec;
use baton::{Baton, HostConfig};

fn run(records: usize, partitions: u32) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let baton = Baton::open(HostConfig::new(dir.path())).unwrap();
    baton
        .upload_module("word-count", "1", &baton_tests::plugin_bytes("word-count"))
        .unwrap();
    baton
        .transport()
        .ensure_topic("words", 8, baton::transport::TopicKind::Data)
        .unwrap();
    let keys = baton_tests::words(records, 10_000, 1);
    for chunk in keys.chunks(50_000) {
        baton
            .produce("words", baton_tests::keyed_records(chunk))
            .unwrap();
    }
    let spec: PipelineSpec = serde_json::from_value(serde_json::json!({
        "name": "wc", "module": "word-count", "version": "1", "inputs": ["words"],
        "stores": ["counts"], "slots": 8, "partitions": partitions
    }))
    .unwrap();
    let started = Instant::now();
    baton.create_pipeline(spec).unwrap();
    let deadline = started + Duration::from_secs(600);
    loop {
        let done: u64 = baton.partitions().iter().map(|p| p.records).sum();
        if done >= records as u64 {
            break;
        }
        assert!(Instant::now() < deadline, "not done after 10 minutes");
        std::thread::sleep(Duration::from_millis(5));
    }
    let secs = started.elapsed().as_secs_f64();
    baton.shutdown();
    records as f64 / secs
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` would too: run only under bench.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let records: usize = std::env::var("BATON_BENCH_RECORDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    println!("\nword-count on the embedded log, {records} records over 8 slots (release build)\n");
    println!("| partitions | records/s |");
    println!("|---:|---:|");
    for p in [1u32, 4] {
        let rate = run(records, p);
        println!("| {p} | {rate:.0} |");
    }
}
