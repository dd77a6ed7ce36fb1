//! An idle slot keeps its input offset: every transaction commits the offset of every owned slot,
//! so the broker never expires an idle slot's offset while the partition runs; and when the
//! group's offsets are gone anyway (a pipeline idle past `offsets.retention.minutes`), a restart
//! resumes from RocksDB's offsets instead of reprocessing the topic on top of restored state.
//!
//! The long version runs on a broker of its own with `offsets.retention.minutes=1` (its minimum;
//! a static broker setting) and a 1 s expiry check, for about two and a half minutes, so it runs
//! with `scripts/test --full`. The default run deletes the group's offsets while the host is
//! down, as the broker's expiry does, and checks the restart.

use std::time::{Duration, Instant};

use baton::transport::partitioner::partition_for_key;
use baton_tests::{
    InProcess, OwnBroker, count, group_offsets_on, kafka_bootstrap, kafka_shared, unique, wait_for,
};
use serde_json::json;

const RETENTION: Duration = Duration::from_secs(60);

/// Without the group's offsets (deleted while the host was down), a restart resumes from
/// RocksDB's input offsets: only the new records are processed, and every count is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_the_groups_offsets_resumes_from_rocksdbs() -> anyhow::Result<()> {
    let _shared = kafka_shared().await;
    let bootstrap = kafka_bootstrap();
    let dir = tempfile::tempdir()?;
    let topic = unique("idle-words");
    let host = InProcess::start_with(dir.path(), Some(&bootstrap)).await?;
    let api = host.api.clone();
    api.upload_plugin("word-count", "word-count", "1").await?;
    api.create_pipeline(json!({
        "name": "idle", "module": "word-count", "version": "1",
        "inputs": [topic], "stores": ["counts"], "slots": 2, "partitions": 1
    }))
    .await?;
    let group = format!("{}.idle", baton_tests::cluster_name(dir.path()));
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    let produced: Vec<String> = keys.iter().cycle().take(200).cloned().collect();
    let recs: Vec<_> = produced.iter().map(|k| (k.clone(), None)).collect();
    api.produce(&topic, &recs).await?;
    api.wait_caught_up("idle", 200, Duration::from_secs(60))
        .await?;
    let before = group_offsets_on(&bootstrap, &group, &topic, 2)?;
    assert_eq!(
        before.iter().flatten().sum::<u64>(),
        200,
        "the group's offsets before: {before:?}"
    );
    host.stop().await?;

    // What the broker's expiry does to an idle group: its offsets are gone. (Asked again while
    // the group's coordinator is busy or moving, as the shared broker's other tests may make it.)
    {
        use rdkafka::admin::{AdminClient, AdminOptions};
        use rdkafka::client::DefaultClientContext;
        use rdkafka::types::RDKafkaErrorCode;
        let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .create()?;
        let admin = &admin;
        let group = &group;
        wait_for(
            "the group deleted",
            Duration::from_secs(30),
            || async move {
                for r in admin
                    .delete_groups(&[group.as_str()], &AdminOptions::new())
                    .await?
                {
                    match r {
                        Ok(_) => {}
                        Err((
                            _,
                            RDKafkaErrorCode::CoordinatorLoadInProgress
                            | RDKafkaErrorCode::CoordinatorNotAvailable
                            | RDKafkaErrorCode::NotCoordinator,
                        )) => return Ok(None),
                        Err((g, e)) => anyhow::bail!("deleting group {g}: {e}"),
                    }
                }
                Ok(Some(()))
            },
        )
        .await?;
    }
    assert_eq!(
        group_offsets_on(&bootstrap, &group, &topic, 2)?,
        vec![None, None],
        "the group's offsets are deleted"
    );

    let last: Vec<String> = keys.iter().rev().cycle().take(100).cloned().collect();
    restart_and_count(dir.path(), &bootstrap, &topic, last, produced).await
}

/// Starts the host on `dir` again and produces `last` (100 records) to `topic`: only they are
/// processed, and every count of everything `produced` before and since is exact.
async fn restart_and_count(
    dir: &std::path::Path,
    bootstrap: &str,
    topic: &str,
    last: Vec<String>,
    mut produced: Vec<String>,
) -> anyhow::Result<()> {
    let host = InProcess::start_with(dir, Some(bootstrap)).await?;
    let api = host.api.clone();
    let recs: Vec<_> = last.iter().map(|k| (k.clone(), None)).collect();
    api.produce(topic, &recs).await?;
    produced.extend(last);
    api.wait_caught_up("idle", produced.len() as u64, Duration::from_secs(60))
        .await?;
    let parts = api.partitions().await?;
    assert_eq!(
        parts[0]["records"], 100,
        "after the restart only the new records are processed: {parts:?}"
    );
    for (key, n) in count(produced.iter().map(String::as_str)) {
        assert_eq!(
            api.counter("idle", "counts", &key).await?,
            Some(n),
            "count of {key}"
        );
    }
    host.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "two and a half minutes on a broker of its own: scripts/test --full runs it"]
async fn idle_slots_keep_their_offsets_past_the_group_offset_retention() -> anyhow::Result<()> {
    let broker = tokio::task::spawn_blocking(|| {
        OwnBroker::start(
            19092,
            &[
                "offsets.retention.minutes=1",
                "offsets.retention.check.interval.ms=1000",
            ],
        )
    })
    .await??;
    let bootstrap = broker.bootstrap();
    let dir = tempfile::tempdir()?;
    let host = InProcess::start_with(dir.path(), Some(&bootstrap)).await?;
    let api = host.api.clone();
    api.upload_plugin("word-count", "word-count", "1").await?;
    let created = api
        .create_pipeline(json!({
            "name": "idle", "module": "word-count", "version": "1",
            "inputs": ["idle-words"], "stores": ["counts"], "slots": 2, "partitions": 1
        }))
        .await?;
    let group = format!("{}.idle", baton_tests::cluster_name(dir.path()));
    assert!(
        created["dlq"]
            .as_str()
            .unwrap_or_default()
            .starts_with(&group)
    );
    let key_in = |slot: u32| {
        (0..)
            .map(move |i| format!("k{slot}-{i}"))
            .filter(move |k| partition_for_key(k.as_bytes(), 2) == slot)
    };
    let slot0: Vec<String> = key_in(0).take(20).collect();
    let slot1: Vec<String> = key_in(1).take(20).collect();
    let mut produced: Vec<String> = Vec::new();
    let produce = |keys: Vec<String>| {
        let api = api.clone();
        async move {
            let recs: Vec<_> = keys.iter().map(|k| (k.clone(), None)).collect();
            api.produce("idle-words", &recs).await?;
            anyhow::Ok(keys)
        }
    };

    // Both slots get records; then only slot 0 does, for longer than the retention.
    let first: Vec<String> = slot0
        .iter()
        .chain(&slot1)
        .cycle()
        .take(200)
        .cloned()
        .collect();
    produced.extend(produce(first).await?);
    api.wait_caught_up("idle", 200, Duration::from_secs(60))
        .await?;
    let slot1_end = produced
        .iter()
        .filter(|k| partition_for_key(k.as_bytes(), 2) == 1)
        .count() as u64;
    let busy_until = Instant::now() + RETENTION + Duration::from_secs(10);
    let mut i = 0;
    while Instant::now() < busy_until {
        produced.extend(produce(vec![slot0[i % slot0.len()].clone()]).await?);
        i += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    api.wait_caught_up("idle", produced.len() as u64, Duration::from_secs(60))
        .await?;
    let offsets = group_offsets_on(&bootstrap, &group, "idle-words", 2)?;
    eprintln!("after {i} records to slot 0 only: group offsets {offsets:?}");
    assert_eq!(
        offsets[1],
        Some(slot1_end),
        "slot 1 was idle for longer than offsets.retention.minutes: its offset must still be \
         committed"
    );

    // Now the whole pipeline idles until the broker expires its offsets.
    wait_for(
        "the broker to expire the idle group's offsets",
        RETENTION + Duration::from_secs(60),
        || {
            let (b, g) = (bootstrap.clone(), group.clone());
            async move {
                let o = group_offsets_on(&b, &g, "idle-words", 2)?;
                Ok(o.iter().all(Option::is_none).then_some(()))
            }
        },
    )
    .await?;
    host.stop().await?;

    // A restart resumes from RocksDB's offsets: nothing is counted twice.
    let last: Vec<String> = slot1
        .iter()
        .chain(&slot0)
        .cycle()
        .take(100)
        .cloned()
        .collect();
    restart_and_count(dir.path(), &bootstrap, "idle-words", last, produced).await?;
    drop(broker);
    Ok(())
}
