//! Hot swap: `PUT /api/v1/pipelines/{p}/module` switches every partition at a batch boundary
//! under continuous load with exact counts (embedded log and Kafka), also between components of
//! contracts 0.1 and 0.2 over the same state; a version whose `init` fails or whose records fail
//! is rolled back by itself, and the reason is recorded.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use baton_tests::{
    Api, InProcess, count, kafka_bootstrap, kafka_lock, plugin_bytes, unique, wait_for,
    with_custom_section, words,
};
use serde_json::{Value, json};

/// Uploads word-count as version 1 and version 2: the same 0.2 component with another sha256,
/// or with `across_contracts` the 0.1 build of the same logic as version 1.
async fn two_versions(api: &Api, across_contracts: bool) -> anyhow::Result<()> {
    let v2 = plugin_bytes("word-count");
    let v1 = if across_contracts {
        plugin_bytes("word-count-v01")
    } else {
        with_custom_section(v2.clone(), "baton-test", b"version 1")
    };
    let m1 = api.upload_bytes(v1, "word-count", "1").await?;
    let m2 = api.upload_bytes(v2, "word-count", "2").await?;
    let contract = if across_contracts { "0.1.0" } else { "0.2.0" };
    assert_eq!(m1["wit"], format!("baton:processor@{contract}"), "{m1}");
    assert_eq!(m2["wit"], "baton:processor@0.2.0", "{m2}");
    Ok(())
}

async fn swap(api: &Api, pipeline: &str, version: &str) -> anyhow::Result<Value> {
    let r = api
        .put_json(
            &format!("/api/v1/pipelines/{pipeline}/module"),
            &json!({ "version": version }),
        )
        .await?;
    anyhow::ensure!(
        r.status == 200,
        "swap to {version}: {} {}",
        r.status,
        r.body
    );
    Ok(r.body)
}

fn percentile(sorted: &[u64], q: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// 20 swaps back and forth while records flow; every count exact afterwards. On the embedded
/// log the two versions are builds for contracts 0.1 and 0.2 counting into the same store.
async fn swaps_under_load(kafka: bool) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let bootstrap = kafka_bootstrap();
    let host = InProcess::start_with(dir.path(), kafka.then_some(bootstrap.as_str())).await?;
    let api = host.api.clone();
    two_versions(&api, !kafka).await?;
    let (name, input) = (unique("swap"), unique("words"));
    api.create_pipeline(json!({
        "name": name, "module": "word-count", "version": "1", "inputs": [input],
        "stores": ["counts"], "slots": 4, "partitions": 2
    }))
    .await?;

    // The producer sends until told to stop, so records flow during and after every swap.
    let vocabulary = words(60_000, 300, 21);
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (api, input, stop) = (api.clone(), input.clone(), stop.clone());
        tokio::spawn(async move {
            let mut sent = Vec::new();
            for chunk in vocabulary.chunks(500).cycle() {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                let recs: Vec<_> = chunk.iter().map(|k| (k.clone(), None)).collect();
                api.produce(&input, &recs).await?;
                sent.extend_from_slice(chunk);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            anyhow::Ok(sent)
        })
    };
    let processed = |api: Api| async move {
        let parts = api.partitions().await?;
        anyhow::Ok(
            parts
                .iter()
                .map(|p| p["records"].as_u64().unwrap_or(0))
                .sum::<u64>(),
        )
    };

    let mut pauses = Vec::new();
    for i in 0..20 {
        let version = if i % 2 == 0 { "2" } else { "1" };
        let r = swap(&api, &name, version).await?;
        assert_eq!(r["outcome"], "swapped", "{r}");
        assert_eq!(r["running"], version, "{r}");
        for p in r["partitions"].as_array().into_iter().flatten() {
            assert_eq!(p["report"]["outcome"], "swapped", "{r}");
            pauses.push(p["report"]["pause_us"].as_u64().unwrap_or(u64::MAX));
        }
    }
    // Records keep being processed after the last swap.
    let at_last_swap = processed(api.clone()).await?;
    wait_for(
        "records processed after the last swap",
        Duration::from_secs(30),
        || {
            let api = api.clone();
            async move { Ok((processed(api).await? >= at_last_swap + 2_000).then_some(())) }
        },
    )
    .await?;
    stop.store(true, Ordering::Release);
    let keys = producer.await??;
    assert!(keys.len() > 2_000, "only {} records were sent", keys.len());
    api.wait_caught_up(&name, keys.len() as u64, Duration::from_secs(180))
        .await?;
    for (key, n) in count(keys.iter().map(String::as_str)) {
        assert_eq!(
            api.counter(&name, "counts", &key).await?,
            Some(n),
            "count of {key}"
        );
    }
    let info = api.get(&format!("/api/v1/pipelines/{name}")).await?.body;
    assert_eq!(info["version"], "1", "{info}");
    assert_eq!(info["swaps"].as_array().map(Vec::len), Some(20), "{info}");

    pauses.sort_unstable();
    assert_eq!(pauses.len(), 40);
    eprintln!(
        "{} swaps under load ({}): pause p50 {} µs, p99 {} µs, max {} µs",
        pauses.len(),
        if kafka { "Kafka" } else { "embedded" },
        percentile(&pauses, 0.5),
        percentile(&pauses, 0.99),
        pauses[pauses.len() - 1]
    );
    assert!(
        percentile(&pauses, 0.99) < 1_000_000,
        "a swap paused a partition for over a second: {pauses:?}"
    );
    host.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_swaps_under_load_keep_counts_exact() -> anyhow::Result<()> {
    swaps_under_load(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_twenty_swaps_under_load_keep_counts_exact() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
    swaps_under_load(true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_whose_init_fails_is_rolled_back() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    let api = &host.api;
    api.upload_plugin("word-count", "word-count", "1").await?;
    // uppercase's init requires `config.output`, which this pipeline does not have.
    api.upload_plugin("uppercase", "word-count", "no-output")
        .await?;
    api.create_pipeline(json!({
        "name": "wc", "module": "word-count", "version": "1", "inputs": ["words"],
        "stores": ["counts"], "slots": 2, "partitions": 2
    }))
    .await?;
    let keys = words(2_000, 50, 5);
    let recs: Vec<_> = keys.iter().map(|k| (k.clone(), None)).collect();
    api.produce("words", &recs[..1_000]).await?;

    let r = api
        .put_json(
            "/api/v1/pipelines/wc/module",
            &json!({"version": "no-output"}),
        )
        .await?;
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(
        r.error().contains("rolled back") && r.error().contains("init"),
        "{}",
        r.error()
    );
    let info = api.get("/api/v1/pipelines/wc").await?.body;
    assert_eq!(info["version"], "1", "{info}");
    let last = &info["swaps"][1];
    assert_eq!(last["version"], "1", "{info}");
    assert!(
        last["rollback_reason"]
            .as_str()
            .is_some_and(|r| r.contains("init")),
        "{info}"
    );

    api.produce("words", &recs[1_000..]).await?;
    api.wait_caught_up("wc", 2_000, Duration::from_secs(60))
        .await?;
    for (key, n) in count(keys.iter().map(String::as_str)) {
        assert_eq!(api.counter("wc", "counts", &key).await?, Some(n), "{key}");
    }
    // Bad requests name the problem.
    let r = api
        .put_json("/api/v1/pipelines/wc/module", &json!({"version": "9"}))
        .await?;
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.error().contains("version `9`"), "{}", r.error());
    let r = api
        .put_json("/api/v1/pipelines/nope/module", &json!({"version": "1"}))
        .await?;
    assert_eq!(r.status, 404, "{}", r.body);
    let r = api
        .put_json("/api/v1/pipelines/wc/module", &json!({"ver": "1"}))
        .await?;
    assert!(r.status == 400 || r.status == 422, "{}", r.body);
    host.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_that_fails_its_first_batches_is_rolled_back_without_losing_records()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    let api = &host.api;
    api.upload_plugin("word-count", "word-count", "1").await?;
    // fail-on counts like word-count but fails every record whose value is `boom`.
    api.upload_plugin("fail-on", "word-count", "flaky").await?;
    api.create_pipeline(json!({
        "name": "wc", "module": "word-count", "version": "1", "inputs": ["words"],
        "stores": ["counts"], "slots": 2, "partitions": 1, "config": {"value": "boom"}
    }))
    .await?;
    let r = swap(api, "wc", "flaky").await?;
    assert_eq!(r["outcome"], "swapped", "{r}");

    let keys = words(600, 40, 8);
    let recs: Vec<_> = keys
        .iter()
        .map(|k| (k.clone(), Some("boom".to_string())))
        .collect();
    api.produce("words", &recs).await?;
    api.wait_caught_up("wc", 600, Duration::from_secs(60))
        .await?;
    // The failing batch was not committed: word-count processed it again.
    for (key, n) in count(keys.iter().map(String::as_str)) {
        assert_eq!(api.counter("wc", "counts", &key).await?, Some(n), "{key}");
    }
    let info = api.get("/api/v1/pipelines/wc").await?.body;
    assert_eq!(info["version"], "1", "{info}");
    let reason = info["swaps"][1]["rollback_reason"].as_str().unwrap_or("");
    assert!(reason.contains("records failed"), "{info}");
    let dlq = api
        .read_topic(info["dlq"].as_str().unwrap_or(""), 2)
        .await?;
    assert!(
        dlq.is_empty(),
        "dead letters of the rolled-back batch: {dlq:?}"
    );
    let parts = api.partitions().await?;
    assert_eq!(parts[0]["dead_letters"], 0, "{parts:?}");
    assert_eq!(parts[0]["last_swap"]["outcome"], "swapped", "{parts:?}");
    host.stop().await
}

/// A host with pipeline `wc` running word-count version 1; version 2 (fail-on) fails every
/// record whose value is `x`.
async fn word_count_then_fail_on(dir: &std::path::Path) -> anyhow::Result<InProcess> {
    let host = InProcess::start(dir).await?;
    let api = &host.api;
    api.upload_plugin("word-count", "word-count", "1").await?;
    api.upload_plugin("fail-on", "word-count", "2").await?;
    api.create_pipeline(json!({
        "name": "wc", "module": "word-count", "version": "1", "inputs": ["words"],
        "stores": ["counts"], "slots": 2, "partitions": 1, "config": {"value": "x"}
    }))
    .await?;
    Ok(host)
}

/// A partition that refuses a new version goes on processing at once: recording the rollback
/// waits for the control lock, which a long admin call may hold, on a thread of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_does_not_stall_the_partition_behind_an_admin_call() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = word_count_then_fail_on(dir.path()).await?;
    let api = &host.api;
    let keys = words(300, 20, 8);
    let recs: Vec<_> = keys
        .iter()
        .map(|k| (k.clone(), Some("x".to_string())))
        .collect();
    api.produce("words", &recs[..100]).await?;
    api.wait_caught_up("wc", 100, Duration::from_secs(30))
        .await?;
    let r = swap(api, "wc", "2").await?;
    assert_eq!(r["outcome"], "swapped", "{r}");

    // An admin call holds the control lock for as long as the test wants.
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (held, is_held) = std::sync::mpsc::channel::<()>();
    let baton = host.baton.clone();
    let holder = std::thread::spawn(move || {
        let _g = baton.hold_control_for_test();
        let _ = held.send(());
        let _ = released.recv_timeout(Duration::from_secs(60));
    });
    is_held.recv_timeout(Duration::from_secs(10))?;
    // Every record fails under version 2: the partition rolls back and processes them with
    // version 1, while the lock is held.
    api.produce("words", &recs[100..]).await?;
    let caught_up = api.wait_caught_up("wc", 300, Duration::from_secs(20)).await;
    let _ = release.send(());
    holder.join().expect("the lock holder");
    caught_up?;
    let parts = api.partitions().await?;
    assert_eq!(parts[0]["dead_letters"], 0, "{parts:?}");
    for (key, n) in count(keys.iter().map(String::as_str)) {
        assert_eq!(api.counter("wc", "counts", &key).await?, Some(n), "{key}");
    }
    // Once the lock is free, the rollback is recorded.
    let info = wait_for(
        "the rollback to be recorded",
        Duration::from_secs(10),
        || async {
            let info = api.get("/api/v1/pipelines/wc").await?.body;
            Ok((info["version"] == "1").then_some(info))
        },
    )
    .await?;
    let reason = info["swaps"][1]["rollback_reason"]
        .as_str()
        .unwrap_or_default();
    assert!(reason.contains("failed"), "{info}");
    host.stop().await
}

/// A rollback is the control log's or nobody's: while its record cannot be appended the
/// pipeline shows the version it was asked to run (and a restart would run it), the partitions
/// keep refusing it on their own, and once the log takes the record the rollback shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_the_control_log_refuses_changes_nothing_until_recorded() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = word_count_then_fail_on(dir.path()).await?;
    let api = &host.api;
    let r = swap(api, "wc", "2").await?;
    assert_eq!(r["outcome"], "swapped", "{r}");
    let failing = host
        .baton
        .steps()
        .inject(baton::steps::CONTROL_APPEND_FAILS, None);
    let keys = words(200, 10, 3);
    let recs: Vec<_> = keys
        .iter()
        .map(|k| (k.clone(), Some("x".to_string())))
        .collect();
    api.produce("words", &recs).await?;
    api.wait_caught_up("wc", 200, Duration::from_secs(30))
        .await?;
    let parts = api.partitions().await?;
    assert_eq!(parts[0]["last_swap"]["outcome"], "rolled-back", "{parts:?}");
    assert_eq!(
        parts[0]["version"], "1",
        "the partition runs the version it went back to"
    );
    let info = api.get("/api/v1/pipelines/wc").await?.body;
    assert_eq!(
        info["version"], "2",
        "not in the log, not in the catalog: {info}"
    );
    assert_eq!(info["swaps"].as_array().map(Vec::len), Some(1), "{info}");
    // A new session (here after a failed state read) starts on the version the partition went
    // back to, not on the one it refused, though the rollback is not recorded yet.
    host.baton.partition_handles()[0].db.faults().fail_reads(1);
    // Keys the partition has not seen: those it has are in its hot-key cache, not read from
    // RocksDB.
    let more: Vec<String> = words(100, 10, 4)
        .into_iter()
        .map(|w| format!("new-{w}"))
        .collect();
    let recs: Vec<_> = more
        .iter()
        .map(|k| (k.clone(), Some("x".to_string())))
        .collect();
    api.produce("words", &recs).await?;
    api.wait_caught_up("wc", 300, Duration::from_secs(30))
        .await?;
    let parts = api.partitions().await?;
    assert_eq!(parts[0]["dead_letters"], 0, "{parts:?}");
    assert_eq!(parts[0]["version"], "1", "{parts:?}");
    for (key, n) in count(keys.iter().chain(&more).map(String::as_str)) {
        assert_eq!(api.counter("wc", "counts", &key).await?, Some(n), "{key}");
    }
    drop(failing);
    let info = wait_for(
        "the rollback to be recorded",
        Duration::from_secs(10),
        || async {
            let info = api.get("/api/v1/pipelines/wc").await?.body;
            Ok((info["version"] == "1").then_some(info))
        },
    )
    .await?;
    assert!(info["swaps"][1]["rollback_reason"].is_string(), "{info}");
    host.stop().await
}
