//! Failures of the host itself, injected at the state layer: a failed state read is the host's
//! fault, so the batch is processed again and nothing is dead-lettered; a panic in a partition
//! thread marks the partition failed with the reason, takes /readyz down, and the partition
//! restarts with back-off and goes on with exact counts.

use std::time::Duration;

use baton_tests::{InProcess, count, wait_for, words};
use serde_json::json;

/// A host with a word-count pipeline of one partition over 4 slots that has processed `n`
/// records; returns the host and the keys produced.
async fn word_count(dir: &std::path::Path, n: usize) -> anyhow::Result<(InProcess, Vec<String>)> {
    let host = InProcess::start(dir).await?;
    let api = &host.api;
    api.upload_plugin("word-count", "word-count", "1").await?;
    api.create_pipeline(json!({
        "name": "wc", "module": "word-count", "version": "1",
        "inputs": ["words"], "stores": ["counts"], "slots": 4, "partitions": 1
    }))
    .await?;
    let keys = words(n, 50, 3);
    produce(api, &keys).await?;
    api.wait_caught_up("wc", n as u64, Duration::from_secs(60))
        .await?;
    Ok((host, keys))
}

async fn produce(api: &baton_tests::Api, keys: &[String]) -> anyhow::Result<()> {
    let recs: Vec<_> = keys.iter().map(|k| (k.clone(), None)).collect();
    api.produce("words", &recs).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_state_read_retries_the_batch_and_dead_letters_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (host, mut keys) = word_count(dir.path(), 200).await?;
    let api = &host.api;
    let db = host.baton.partition_handles()[0].db.clone();
    // The next two reads fail: two sessions end, the third processes the batch.
    db.faults().fail_reads(2);
    // Keys the partition has not seen: those it has are in its hot-key cache, not read from
    // RocksDB.
    let more: Vec<String> = words(300, 50, 4)
        .into_iter()
        .map(|w| format!("new-{w}"))
        .collect();
    produce(api, &more).await?;
    keys.extend(more);
    api.wait_caught_up("wc", 500, Duration::from_secs(60))
        .await?;
    let parts = api.partitions().await?;
    assert_eq!(parts[0]["dead_letters"], 0, "{parts:?}");
    assert_eq!(parts[0]["records"], 500, "{parts:?}");
    assert_eq!(parts[0]["state"], "running", "{parts:?}");
    let last = parts[0]["last_error"].as_str().unwrap_or_default();
    assert!(
        last.contains("injected state fault"),
        "the failure is reported: {last}"
    );
    baton_tests::assert_counts(api, "wc", &count(keys.iter().map(String::as_str))).await?;
    let info = api.get("/api/v1/pipelines/wc").await?.body;
    let dlq_topic = info["dlq"].as_str().unwrap_or_default().to_string();
    assert!(!dlq_topic.is_empty(), "{info}");
    assert_eq!(api.read_topic(&dlq_topic, 4).await?.len(), 0);
    host.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_partition_is_marked_failed_then_restarts() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (host, mut keys) = word_count(dir.path(), 100).await?;
    let api = &host.api;
    assert_eq!(api.get("/readyz").await?.status, 200);
    let db = host.baton.partition_handles()[0].db.clone();
    // Three sessions in a row panic: back-offs of 100, 200 and 400 ms.
    db.faults().panic_reads(3);
    let more = words(400, 50, 5);
    produce(api, &more).await?;
    keys.extend(more);
    let waiting = wait_for(
        "/readyz to report the panicked partition",
        Duration::from_secs(30),
        || async {
            let r = api.get("/readyz").await?;
            Ok((r.status == 503).then_some(r.body))
        },
    )
    .await?;
    let error = waiting["waiting"][0]["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(waiting["waiting"][0]["state"], "failed", "{waiting}");
    assert!(
        error.contains("panicked") && error.contains("injected panic"),
        "{error}"
    );
    // `failed` is not final here (wait_caught_up would give up on it): wait for the restart.
    let parts = wait_for(
        "the partition to restart and catch up",
        Duration::from_secs(60),
        || async {
            let parts = api.partitions().await?;
            let p = &parts[0];
            let caught_up = p["offsets"]
                .as_array()
                .is_some_and(|o| o.iter().all(|o| o["offset"] == o["end"]));
            Ok((p["state"] == "running" && caught_up).then_some(parts))
        },
    )
    .await?;
    assert_eq!(parts[0]["records"], 500, "{parts:?}");
    assert_eq!(parts[0]["dead_letters"], 0, "{parts:?}");
    baton_tests::assert_counts(api, "wc", &count(keys.iter().map(String::as_str))).await?;
    wait_for(
        "/readyz to be ready again",
        Duration::from_secs(10),
        || async { Ok((api.get("/readyz").await?.status == 200).then_some(())) },
    )
    .await?;
    host.stop().await
}
