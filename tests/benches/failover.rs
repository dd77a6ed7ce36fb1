//! Failover on a cluster of two `baton` processes on Kafka: word-count in 2 partitions, one on
//! each host, under a steady input of about 5,000 records/s. One host is taken away, by
//! `kill -9` (noticed when its group session of 6 s times out) or by SIGTERM (it leaves the
//! group at once), and the table shows, from that moment, when its partition runs on the other
//! host (`takeover`) and when that host first commits the partition's input (`first commit`).
//! After `kill -9` without a standby the new owner restores the partition from its changelog;
//! with one (`"standbys": 1`) it promotes its warm copy; on SIGTERM the host moves its
//! partitions away warm before it exits.
//!
//! `cargo bench -p baton-tests --bench failover` (part of `bench/run`); BATON_BENCH_ROUNDS sets
//! the rounds per way (default 3).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use baton_tests::{
    ChildHost, TestProducer, cluster_name, group_offsets, kafka_bootstrap, wait_for,
};
use serde_json::json;

const SLOTS: u32 = 4;

/// (id, owner, epoch, state) of every partition, as `api` shows them.
async fn table(api: &baton_tests::Api) -> anyhow::Result<Vec<(String, String, u64, String)>> {
    Ok(api
        .partitions()
        .await?
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap_or_default().to_string(),
                p["owner"].as_str().unwrap_or_default().to_string(),
                p["epoch"].as_u64().unwrap_or(0),
                p["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect())
}

/// One round: returns (takeover, first commit) after the host is taken away.
async fn round(kill: bool, standbys: u32) -> anyhow::Result<(Duration, Duration)> {
    let dirs: Vec<_> = (0..2)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let bootstrap = kafka_bootstrap();
    // Both processes join one cluster, named after the first one's data dir.
    let cluster = cluster_name(dirs[0].path());
    let flags = |id: &'static str| {
        vec![
            "--kafka".to_string(),
            bootstrap.clone(),
            "--host-id".into(),
            id.into(),
            "--session-timeout".into(),
            "6s".into(),
        ]
    };
    let fa = flags("a");
    let a = ChildHost::start_in(
        dirs[0].path(),
        &cluster,
        &fa.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await?;
    let fb = flags("b");
    let b = ChildHost::start_in(
        dirs[1].path(),
        &cluster,
        &fb.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await?;
    baton_tests::wait_alive(&a.api, 2).await?;
    let input = baton_tests::unique("failover-in");
    a.api.upload_plugin("word-count", "word-count", "1").await?;
    a.api
        .create_pipeline(json!({
            "name": "wc", "module": "word-count", "version": "1", "inputs": [input],
            "stores": ["counts"], "slots": SLOTS, "partitions": 2, "standbys": standbys
        }))
        .await?;
    let placed = wait_for(
        "one partition on each host",
        Duration::from_secs(60),
        || async {
            let t = table(&a.api).await?;
            let running = t.iter().filter(|p| p.3 == "running").count() == 2;
            let spread = t.iter().any(|p| p.1 == "a") && t.iter().any(|p| p.1 == "b");
            Ok((running && spread).then_some(t))
        },
    )
    .await?;
    let moved = placed
        .iter()
        .find(|p| p.1 == "b")
        .context("b's partition")?
        .0
        .clone();
    let b_slots: Vec<u32> = if moved.ends_with("-0") {
        (0..SLOTS / 2).collect()
    } else {
        (SLOTS / 2..SLOTS).collect()
    };

    // A steady input, about 5,000 records/s.
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (stop, input) = (stop.clone(), input.clone());
        tokio::spawn(async move {
            let p = TestProducer::new()?;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let recs: Vec<(String, String)> = (0..250)
                    .map(|j| (format!("k{}", (i * 250 + j) % 5000), "x".into()))
                    .collect();
                p.send(&input, SLOTS, &recs).await?;
                i += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(())
        })
    };
    let group = format!("{cluster}.wc");
    let committed_on = |slots: &[u32]| -> anyhow::Result<u64> {
        let all = group_offsets(&group, &input, SLOTS)?;
        Ok(slots.iter().map(|s| all[*s as usize]).sum())
    };
    // Steady: b has committed for a while.
    let first = committed_on(&b_slots)?;
    wait_for("b committing", Duration::from_secs(60), || async {
        Ok((committed_on(&b_slots)? > first + 5_000).then_some(()))
    })
    .await?;
    let before = committed_on(&b_slots)?;
    let t0 = Instant::now();
    if kill {
        b.kill9()?;
    } else {
        b.terminate()?;
    }
    let takeover = wait_for("the takeover", Duration::from_secs(120), || async {
        let t = table(&a.api).await?;
        let done = t
            .iter()
            .any(|p| p.0 == moved && p.1 == "a" && p.3 == "running");
        Ok(done.then(|| t0.elapsed()))
    })
    .await?;
    let at_kill = committed_on(&b_slots)?.max(before);
    let first_commit = wait_for("the first commit", Duration::from_secs(120), || async {
        Ok((committed_on(&b_slots)? > at_kill).then(|| t0.elapsed()))
    })
    .await?;
    stop.store(true, Ordering::Relaxed);
    producer.await??;
    a.terminate()?;
    Ok((takeover, first_commit))
}

fn main() -> anyhow::Result<()> {
    let rounds: usize = std::env::var("BATON_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!("failover of a word-count partition (2 hosts, ~5,000 records/s, 6 s sessions)\n");
    println!("| how the owner goes | round | takeover s | first commit s |");
    println!("|---|---:|---:|---:|");
    for (kill, standbys, how) in [
        (true, 0, "kill -9, no standby"),
        (true, 1, "kill -9, 1 standby"),
        (false, 0, "SIGTERM (warm moves)"),
    ] {
        for r in 0..rounds {
            let (takeover, first) = rt.block_on(round(kill, standbys))?;
            println!(
                "| {how} | {} | {:.2} | {:.2} |",
                r + 1,
                takeover.as_secs_f64(),
                first.as_secs_f64()
            );
        }
    }
    Ok(())
}
