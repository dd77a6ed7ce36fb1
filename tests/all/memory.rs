//! RocksDB memory is bounded per host, not per partition: 64 partitions of the `latest` plugin
//! write and re-read far more state than `--state-memory`, and the `baton` process's peak RSS
//! stays under the bound plus a fixed overhead; the block cache reports its hit rate.

use std::time::Duration;

use baton_tests::ChildHost;
use serde_json::json;

/// `--state-memory` of [`ChildHost`].
const STATE_MEMORY: u64 = 64 << 20;
/// Everything that is not RocksDB: the binary and its code, wasmtime's compiled module, tokio and
/// HTTP, and per partition a thread, an instance's linear memory and an in-flight batch.
const FIXED_OVERHEAD: u64 = 320 << 20;
const PARTITIONS: u32 = 64;
const KEYS: usize = 96_000;
const VALUE: usize = 1024;

/// A peak and a current figure (kB) from `/proc/<pid>/status`.
fn rss_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("{field} missing from /proc/{pid}/status"))
}

/// A value of `VALUE` bytes that does not compress: the cache holds what disk holds.
fn value(key: usize, round: u64) -> String {
    let mut x = (key as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ round;
    (0..VALUE / 16)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("{x:016x}")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_partitions_stay_within_the_state_memory_bound() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = ChildHost::start(dir.path(), &[]).await?;
    host.api.upload_plugin("latest", "latest", "1").await?;
    host.api
        .create_pipeline(json!({
            "name": "mem", "module": "latest", "version": "1", "inputs": ["kv"],
            "stores": ["values", "changes"], "slots": PARTITIONS, "partitions": PARTITIONS
        }))
        .await?;
    let started = rss_kib(host.pid(), "VmRSS:")? << 10;
    // The cache's usage is sampled while the rounds run: at the end, compactions have dropped
    // the blocks of obsolete files, so the end state says little about how full it got.
    let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (api, sampling) = (host.api.clone(), sampling.clone());
        tokio::spawn(async move {
            let (mut max_usage, mut max_sample) = (0u64, 0u64);
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(r) = api.get("/api/v1/host").await
                    && let Some(u) = r.body["state_memory"]["block_cache_usage"].as_u64()
                {
                    max_usage = max_usage.max(u);
                    max_sample += 1;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (max_usage, max_sample)
        })
    };

    // Two rounds over the same keys: the first writes ~94 MiB of values (flushed to many SST
    // files by the shared write-buffer manager), the second reads every one of them back through
    // the block cache before overwriting it.
    let mut total = 0u64;
    for round in 0..2u64 {
        for chunk in (0..KEYS).collect::<Vec<_>>().chunks(4_000) {
            let recs: Vec<_> = chunk
                .iter()
                .map(|&k| (format!("key-{k}"), Some(value(k, round))))
                .collect();
            host.api.produce("kv", &recs).await?;
            total += recs.len() as u64;
        }
        host.api
            .wait_caught_up("mem", total, Duration::from_secs(300))
            .await?;
    }

    for k in [0, 1, KEYS / 2, KEYS - 1] {
        let r = host
            .api
            .get(&format!("/api/v1/pipelines/mem/stores/values/keys/key-{k}"))
            .await?;
        assert_eq!(r.status, 200, "key-{k}: {}", r.body);
        assert_eq!(r.body["value"], value(k, 1), "latest value of key-{k}");
        let changes = host
            .api
            .counter("mem", "changes", &format!("key-{k}"))
            .await?;
        assert_eq!(changes, Some(2), "changes of key-{k}");
    }

    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let (max_usage, samples) = sampler.await?;
    let stats = host.api.get("/api/v1/host").await?.body;
    let mem = &stats["state_memory"];
    let usage = mem["block_cache_usage"].as_u64().unwrap_or(0);
    let hits = mem["block_cache"]["hits"].as_u64().unwrap_or(0);
    let misses = mem["block_cache"]["misses"].as_u64().unwrap_or(0);
    let peak = rss_kib(host.pid(), "VmHWM:")? << 10;
    let now = rss_kib(host.pid(), "VmRSS:")? << 10;
    eprintln!(
        "64 partitions, {} MiB of values written: RSS at start {} MiB, now {} MiB, peak {} MiB; \
         block cache {} MiB used of {} MiB (at most {} MiB), {hits} hits, {misses} misses, hit rate {}; {mem}",
        (2 * KEYS * VALUE) >> 20,
        started >> 20,
        now >> 20,
        peak >> 20,
        usage >> 20,
        STATE_MEMORY >> 20,
        max_usage >> 20,
        mem["block_cache"]["hit_rate"]
    );
    // The workload must have filled the cache, or the bound proves nothing.
    assert!(
        max_usage * 4 >= STATE_MEMORY * 3,
        "the block cache held at most {max_usage} bytes of {STATE_MEMORY} over {samples} \
         samples: the workload did not fill it"
    );
    // Settled, the cache is within its bound (while it fills, blocks pinned by readers and
    // memtable reservations may take it past the bound for a moment; the RSS bound below is
    // what holds throughout).
    assert!(
        usage <= STATE_MEMORY + (STATE_MEMORY / 10),
        "block cache holds {usage} bytes, over the bound of {STATE_MEMORY}"
    );
    assert!(misses > 0 && hits > 0, "cache counters: {mem}");
    let rate = mem["block_cache"]["hit_rate"].as_f64().unwrap_or(-1.0);
    assert!(
        (rate - hits as f64 / (hits + misses) as f64).abs() < 1e-9,
        "hit rate {rate} does not match {hits} hits and {misses} misses"
    );
    // The heap is the whole process's, RocksDB's allocations included (jemalloc is malloc): it
    // holds at least the cache's blocks, and what it has allocated is resident.
    let heap = &stats["heap"];
    let allocated = heap["allocated"].as_u64().unwrap_or(0);
    let resident = heap["resident"].as_u64().unwrap_or(0);
    assert!(
        allocated >= usage / 2 && allocated <= heap["active"].as_u64().unwrap_or(0),
        "heap {heap} against a block cache of {usage} bytes"
    );
    assert!(
        resident >= allocated && resident <= peak + (16 << 20),
        "heap {heap} against a peak RSS of {peak} bytes"
    );
    assert!(
        peak <= STATE_MEMORY + FIXED_OVERHEAD,
        "peak RSS {} MiB is over the bound of {} MiB + {} MiB of fixed overhead",
        peak >> 20,
        STATE_MEMORY >> 20,
        FIXED_OVERHEAD >> 20
    );
    host.terminate()?;
    Ok(())
}
