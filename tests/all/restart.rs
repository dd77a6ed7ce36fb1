//! Restarts on the same data dir keep every count exact: drop-and-reopen in process, and a real
//! `kill -9` of a `baton` child process while records flow.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use baton_tests::{Api, ChildHost, InProcess, count, wait_for, words};
use serde_json::json;
use tokio::sync::Mutex;

fn spec() -> serde_json::Value {
    json!({
        "name": "wc", "module": "word-count", "version": "1",
        "inputs": ["words"], "stores": ["counts"], "slots": 8, "partitions": 3
    })
}

/// Compares every count with the counts of the input topic as it is, and checks that every
/// acknowledged record is in the topic.
async fn check_exact(api: &Api, acked: &[((u32, u64), String)]) -> anyhow::Result<()> {
    let topic = api.read_topic("words", 8).await?;
    let by_pos: std::collections::HashMap<(u32, u64), &str> = topic
        .iter()
        .map(|r| ((r.slot, r.offset), r.key.as_deref().unwrap_or("")))
        .collect();
    for (pos, key) in acked {
        assert_eq!(
            by_pos.get(pos).copied(),
            Some(key.as_str()),
            "acknowledged record at {pos:?} is missing"
        );
    }
    let expected = count(topic.iter().filter_map(|r| r.key.as_deref()));
    for (key, n) in &expected {
        assert_eq!(
            api.counter("wc", "counts", key).await?,
            Some(*n),
            "count of {key}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_and_reopen_keeps_counts_exact() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    host.api
        .upload_plugin("word-count", "word-count", "1")
        .await?;
    host.api.create_pipeline(spec()).await?;
    let keys = words(40_000, 500, 11);
    let mut acked = Vec::new();
    for chunk in keys[..20_000].chunks(5_000) {
        let recs: Vec<_> = chunk.iter().map(|k| (k.clone(), None)).collect();
        let pos = host.api.produce("words", &recs).await?;
        acked.extend(pos.into_iter().zip(chunk.iter().cloned()));
    }
    host.stop().await?;

    // Reopen: modules, pipeline and offsets come back from the data dir.
    let host = InProcess::start(dir.path()).await?;
    let pipelines = host.api.get("/api/v1/pipelines").await?;
    assert_eq!(pipelines.body[0]["name"], "wc");
    let modules = host.api.get("/api/v1/modules").await?;
    assert_eq!(modules.body[0]["name"], "word-count");
    for chunk in keys[20_000..].chunks(5_000) {
        let recs: Vec<_> = chunk.iter().map(|k| (k.clone(), None)).collect();
        let pos = host.api.produce("words", &recs).await?;
        acked.extend(pos.into_iter().zip(chunk.iter().cloned()));
    }
    host.api
        .wait_caught_up("wc", 40_000, Duration::from_secs(60))
        .await?;
    check_exact(&host.api, &acked).await?;
    let expected = count(keys.iter().map(String::as_str));
    assert_eq!(
        host.api.counter("wc", "counts", "w0").await?,
        expected.get("w0").copied()
    );
    host.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_stream_three_times_keeps_counts_exact() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // Small batches, so that a kill lands between many commits.
    let flags = ["--max-batch", "300", "--max-call", "100"];
    let host = ChildHost::start(dir.path(), &flags).await?;
    host.api
        .upload_plugin("word-count", "word-count", "1")
        .await?;
    host.api.create_pipeline(spec()).await?;

    // A producer sends chunks without pause; a chunk whose reply is lost to a kill may or may
    // not be in the log, so the expected counts come from the topic itself at the end, and
    // every acknowledged record must be in it.
    let api = Arc::new(Mutex::new(host.api.clone()));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (api, acked, stop) = (api.clone(), acked.clone(), stop.clone());
        tokio::spawn(async move {
            let keys = words(400_000, 3_000, 5);
            let mut sent = 0usize;
            for chunk in keys.chunks(1_000) {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let recs: Vec<_> = chunk
                    .iter()
                    .map(|k| (k.clone(), Some("v".to_string())))
                    .collect();
                let client = api.lock().await.clone();
                match client.produce("words", &recs).await {
                    Ok(pos) => {
                        acked
                            .lock()
                            .await
                            .extend(pos.into_iter().zip(chunk.iter().cloned()));
                        sent += chunk.len();
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
            sent
        })
    };

    let mut host = host;
    let seed = baton_tests::test_seed("kill_9_mid_stream");
    for round in 0..3u64 {
        // Let records flow, and wait until this incarnation has processed some of them.
        let progress = wait_for("progress before the kill", Duration::from_secs(60), || {
            let api = host.api.clone();
            async move {
                let parts = api.partitions().await?;
                let done: u64 = parts
                    .iter()
                    .map(|p| p["records"].as_u64().unwrap_or(0))
                    .sum();
                let lag: u64 = parts.iter().map(|p| p["lag"].as_u64().unwrap_or(0)).sum();
                Ok((done > 2_000 && lag > 0).then_some((done, lag)))
            }
        })
        .await?;
        baton_tests::kill9_at_random(host, seed, round, progress.0, progress.1).await?;
        host = ChildHost::start(dir.path(), &flags).await?;
        *api.lock().await = host.api.clone();
    }
    // Let the last incarnation work a little under load, then stop producing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let sent = producer.await?;
    assert!(sent >= 10_000, "the producer sent only {sent} records");
    let total: u64 = host.api.read_topic("words", 8).await?.len() as u64;
    host.api
        .wait_caught_up("wc", total, Duration::from_secs(120))
        .await?;
    // The last incarnation resumed from the committed offsets: it processed only what the
    // earlier ones had not committed, not the whole topic again.
    let parts = host.api.partitions().await?;
    let by_last: u64 = parts
        .iter()
        .map(|p| p["records"].as_u64().unwrap_or(0))
        .sum();
    assert!(
        by_last < total,
        "the last incarnation processed {by_last} of {total} records: it started over"
    );
    check_exact(&host.api, &acked.lock().await).await?;
    host.terminate()
}
