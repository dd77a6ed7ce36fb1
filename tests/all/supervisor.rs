//! The supervisor's side of a partition: the commands it sends a partition loop (drain,
//! flush, fence) and the assignments it runs, on the embedded log. Whatever a command
//! interrupts, a stopped partition's state holds exactly the records below its committed input
//! offsets, and once its partitions run again the counts are exact.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use baton::partition::supervisor::{Assignment, PartitionHandle, single_host_assignments};
use baton::partition::{Phase, input_offset_key};
use baton_tests::{Api, InProcess, wait_for, words};
use serde_json::json;

const SLOTS: u32 = 4;

async fn start(dir: &std::path::Path) -> anyhow::Result<InProcess> {
    let host = InProcess::start(dir).await?;
    host.api
        .upload_plugin("word-count", "word-count", "1")
        .await?;
    host.api
        .create_pipeline(json!({
            "name": "wc", "module": "word-count", "version": "1", "inputs": ["in"],
            "stores": ["counts"], "slots": SLOTS, "partitions": 2
        }))
        .await?;
    Ok(host)
}

fn handle(host: &InProcess, id: &str) -> Arc<PartitionHandle> {
    host.baton
        .partition_handles()
        .into_iter()
        .find(|h| h.id == id)
        .unwrap_or_else(|| panic!("partition {id} runs"))
}

/// Sum of the counts in a partition's state, and of its committed input offsets, read from
/// its database (where both commit together).
fn state_and_offsets(h: &PartitionHandle) -> anyhow::Result<(u64, u64)> {
    let mut counted = 0;
    let mut from = Vec::new();
    loop {
        let rows = h.db.scan(0, &from, &[0xff; 8], 1000)?;
        for (k, v) in &rows {
            counted += u64::from_be_bytes(v.as_slice().try_into()?);
            from = k.clone();
            from.push(0);
        }
        if rows.len() < 1000 {
            break;
        }
    }
    let mut offsets = 0;
    for slot in h.slots.clone() {
        offsets +=
            h.db.get_meta_u64(&input_offset_key("in", slot))?
                .unwrap_or(0);
    }
    Ok((counted, offsets))
}

/// Produces `chunks` chunks of 200 keyed records in the background; returns every key sent.
fn produce(
    api: &Api,
    chunks: usize,
    seed: u64,
) -> tokio::task::JoinHandle<anyhow::Result<Vec<String>>> {
    let api = api.clone();
    tokio::spawn(async move {
        let mut sent = Vec::new();
        for c in 0..chunks {
            let keys = words(200, 50, seed + c as u64);
            let recs: Vec<_> = keys
                .iter()
                .map(|k| (k.clone(), Some("x".to_string())))
                .collect();
            api.produce("in", &recs).await?;
            sent.extend(keys);
        }
        Ok(sent)
    })
}

async fn assert_exact(api: &Api, sent: &[String]) -> anyhow::Result<()> {
    api.wait_caught_up("wc", sent.len() as u64, Duration::from_secs(60))
        .await?;
    let mut want: BTreeMap<&str, i64> = BTreeMap::new();
    for k in sent {
        *want.entry(k).or_default() += 1;
    }
    for (k, n) in want {
        assert_eq!(
            api.counter("wc", "counts", k).await?,
            Some(n),
            "count of {k}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_and_flush_answer_with_what_is_committed() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = start(dir.path()).await?;
    let api = &host.api;
    let producer = produce(api, 60, 1);
    let p0 = handle(&host, "wc-0");
    wait_for("records in wc-0", Duration::from_secs(30), || async {
        Ok((p0.status.records.load(std::sync::atomic::Ordering::Relaxed) > 0).then_some(()))
    })
    .await?;

    // A flush answers with offsets committed, and the partition goes on.
    let first = p0.flush(Duration::from_secs(30)).expect("a flush answer");
    let first: u64 = first.iter().map(|s| s.offset).sum();
    assert!(first > 0, "the flush committed what was processed");
    let second = p0.flush(Duration::from_secs(30)).expect("a flush answer");
    let second: u64 = second.iter().map(|s| s.offset).sum();
    assert!(second >= first, "offsets only grow: {first} then {second}");

    // A drain stops it, with its state exactly at the offsets it answered.
    let drained = p0.drain(Duration::from_secs(30)).expect("a drain answer");
    p0.join();
    assert_eq!(*p0.status.phase.lock(), Phase::Stopped);
    let drained: u64 = drained.iter().map(|s| s.offset).sum();
    assert!(drained >= second);
    assert_eq!(state_and_offsets(&p0)?, (drained, drained));

    // Input keeps coming; wc-1 takes its share, wc-0 nothing.
    let sent = producer.await??;
    let p1 = handle(&host, "wc-1");
    wait_for("wc-1 to catch up", Duration::from_secs(60), || async {
        let (_, at) = state_and_offsets(&p1)?;
        let done = p1.status.progress.lock().iter().all(|s| s.offset >= s.end) && at > 0;
        Ok(done.then_some(()))
    })
    .await?;
    assert_eq!(
        state_and_offsets(&p0)?,
        (drained, drained),
        "a drained partition processes nothing"
    );

    // Assigned again, it resumes where it stopped: the counts are exact.
    let record = host.baton.pipeline("wc")?;
    host.baton.assign("wc", &single_host_assignments(&record))?;
    assert_exact(api, &sent).await?;
    host.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_partition_commits_nothing_more_and_a_new_loop_resumes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = start(dir.path()).await?;
    let api = &host.api;
    let producer = produce(api, 60, 7);
    let p0 = handle(&host, "wc-0");
    wait_for("records in wc-0", Duration::from_secs(30), || async {
        Ok((p0.status.records.load(std::sync::atomic::Ordering::Relaxed) > 0).then_some(()))
    })
    .await?;
    p0.fence();
    p0.join();
    assert_eq!(*p0.status.phase.lock(), Phase::Stopped);
    let (counted, offsets) = state_and_offsets(&p0)?;
    assert_eq!(
        counted, offsets,
        "state holds exactly the committed records"
    );
    let sent = producer.await??;
    assert_eq!(
        state_and_offsets(&p0)?,
        (counted, offsets),
        "a fenced partition writes nothing"
    );

    let record = host.baton.pipeline("wc")?;
    host.baton.assign("wc", &single_host_assignments(&record))?;
    assert_exact(api, &sent).await?;
    host.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_follow_their_assignments() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = start(dir.path()).await?;
    let api = &host.api;
    let sent = produce(api, 10, 3).await??;
    api.wait_caught_up("wc", sent.len() as u64, Duration::from_secs(60))
        .await?;
    let record = host.baton.pipeline("wc")?;
    let all = single_host_assignments(&record);
    assert_eq!(
        all.iter()
            .map(|a| (a.id.as_str(), a.slots.clone()))
            .collect::<Vec<_>>(),
        vec![("wc-0", 0..2), ("wc-1", 2..4)]
    );

    // Only wc-1 here: wc-0 drains and is gone from the table.
    host.baton.assign("wc", &all[1..])?;
    let ids = |v: serde_json::Value| -> Vec<(String, u64)> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                (
                    p["id"].as_str().unwrap().to_string(),
                    p["epoch"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(
        ids(api.get("/api/v1/partitions").await?.body),
        vec![("wc-1".into(), 1)]
    );

    // Both again, at epoch 2: wc-0 starts, wc-1 takes the new epoch without a restart.
    let before = handle(&host, "wc-1");
    let next: Vec<Assignment> = all
        .iter()
        .map(|a| Assignment {
            epoch: 2,
            ..a.clone()
        })
        .collect();
    host.baton.assign("wc", &next)?;
    assert!(
        Arc::ptr_eq(&before, &handle(&host, "wc-1")),
        "wc-1 kept its loop"
    );
    assert_eq!(
        ids(api.get("/api/v1/partitions").await?.body),
        vec![("wc-0".into(), 2), ("wc-1".into(), 2)]
    );
    // A shape that differs from what runs is refused, naming the partition.
    let odd = vec![Assignment {
        id: "wc-1".into(),
        slots: 1..4,
        epoch: 3,
    }];
    let err = host.baton.assign("wc", &odd).unwrap_err().to_string();
    assert!(err.contains("wc-1"), "{err}");

    let more = produce(api, 5, 11).await??;
    assert_exact(api, &[sent, more].concat()).await?;
    host.stop().await
}

/// Assignments that arrive at once (the control log's follower, a move, an admin call) start
/// one loop per partition, never two on one database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assignments_at_once_start_one_loop_per_partition() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // A name no other test's partitions share, for the threads' names.
    let host = baton_tests::word_count_host(dir.path(), "racy", 2, 2).await?;
    let api = &host.api;
    let record = host.baton.pipeline("racy")?;
    let all = single_host_assignments(&record);
    for round in 0..20 {
        // racy-0 stops; then eight callers assign both partitions at once.
        host.baton.assign("racy", &all[1..])?;
        assert_eq!(
            baton_tests::threads_named("baton-racy-0")?,
            0,
            "round {round}"
        );
        let baton = host.baton.clone();
        let all = all.clone();
        tokio::task::spawn_blocking(move || {
            let start = Arc::new(std::sync::Barrier::new(8));
            let callers: Vec<_> = (0..8)
                .map(|_| {
                    let (baton, all, start) = (baton.clone(), all.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        baton.assign("racy", &all)
                    })
                })
                .collect();
            for c in callers {
                c.join().expect("an assign panicked")?;
            }
            anyhow::Ok(())
        })
        .await??;
        // A new thread takes its name itself, once it runs: wait for the new loop to run.
        wait_for("racy-0 running again", Duration::from_secs(30), || async {
            let running = handle(&host, "racy-0").status.phase.lock().clone() == Phase::Running;
            Ok((running && baton_tests::threads_named("baton-racy-0")? > 0).then_some(()))
        })
        .await?;
        assert_eq!(
            baton_tests::threads_named("baton-racy-0")?,
            1,
            "round {round}"
        );
        assert_eq!(
            baton_tests::threads_named("baton-racy-1")?,
            1,
            "round {round}"
        );
    }
    // Both partitions still count exactly.
    let keys = words(2_000, 100, 5);
    let recs: Vec<_> = keys
        .iter()
        .map(|k| (k.clone(), Some("x".to_string())))
        .collect();
    api.produce("racy-in", &recs).await?;
    api.wait_caught_up("racy", keys.len() as u64, Duration::from_secs(60))
        .await?;
    let want = baton_tests::count(keys.iter().map(String::as_str));
    baton_tests::assert_counts(api, "racy", &want).await?;
    host.stop().await
}
