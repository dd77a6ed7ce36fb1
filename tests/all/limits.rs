//! Guest limits per pipeline: a guest that loops forever or allocates without end is stopped,
//! its record goes to the DLQ with the reason, every other record is processed, and the host
//! stays healthy.

use std::time::Duration;

use baton_tests::{InProcess, wait_for};
use serde_json::json;

async fn misbehaving_record(
    plugin: &str,
    value: &str,
    limits: serde_json::Value,
    expect: &str,
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    let api = &host.api;
    api.upload_plugin(plugin, plugin, "1").await?;
    api.create_pipeline(json!({
        "name": "p", "module": plugin, "version": "1", "inputs": ["in"],
        "stores": ["counts"], "slots": 2, "partitions": 1, "limits": limits
    }))
    .await?;
    let mut recs: Vec<_> = (0..200)
        .map(|i| (format!("k{}", i % 10), Some("ok".to_string())))
        .collect();
    recs.insert(100, ("bad".to_string(), Some(value.to_string())));
    let started = std::time::Instant::now();
    api.produce("in", &recs).await?;
    api.wait_caught_up("p", 201, Duration::from_secs(60))
        .await?;
    let took = started.elapsed();
    for i in 0..10 {
        assert_eq!(
            api.counter("p", "counts", &format!("k{i}")).await?,
            Some(20)
        );
    }
    // The misbehaving record's own increment was discarded with it.
    assert_eq!(api.counter("p", "counts", "bad").await?, None);
    let info = api.get("/api/v1/pipelines/p").await?.body;
    let dlq_topic = info["dlq"].as_str().unwrap_or("").to_string();
    let dlq = wait_for("the dead letter", Duration::from_secs(10), || {
        let (api, t) = (api.clone(), dlq_topic.clone());
        async move {
            let d = api.read_topic(&t, 2).await?;
            Ok((!d.is_empty()).then_some(d))
        }
    })
    .await?;
    assert_eq!(dlq.len(), 1, "{dlq:?}");
    let error = dlq[0]
        .headers
        .get("baton.error")
        .cloned()
        .unwrap_or_default();
    assert!(error.contains(expect), "DLQ error: {error}");
    eprintln!("{plugin}: stopped and dead-lettered in {took:?}: {error}");

    // The host is healthy and the partition goes on.
    assert_eq!(api.get("/healthz").await?.status, 200);
    api.produce("in", &[("k0".to_string(), Some("ok".to_string()))])
        .await?;
    api.wait_caught_up("p", 202, Duration::from_secs(30))
        .await?;
    assert_eq!(api.counter("p", "counts", "k0").await?, Some(21));
    let parts = api.partitions().await?;
    assert_eq!(parts[0]["state"], "running", "{parts:?}");
    host.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_infinite_loop_is_stopped_by_the_cpu_limit() -> anyhow::Result<()> {
    misbehaving_record("spin", "loop", json!({"cpu_ms": 300}), "CPU time limit").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_hog_is_stopped_by_the_memory_limit() -> anyhow::Result<()> {
    misbehaving_record(
        "hog",
        "hog",
        json!({"memory_bytes": 64 << 20}),
        "memory allocation",
    )
    .await
}

/// Reads what the probe plugin saw for key `k`.
async fn probe(
    api: &baton_tests::Api,
    pipeline: &str,
    k: &str,
    what: &str,
) -> anyhow::Result<String> {
    let r = api
        .get(&format!(
            "/api/v1/pipelines/{pipeline}/stores/probe/keys/{k}"
        ))
        .await?;
    anyhow::ensure!(r.status == 200, "{k}: {}", r.body);
    let seen: serde_json::Value = serde_json::from_str(r.body["value"].as_str().unwrap_or(""))?;
    Ok(match &seen[what] {
        serde_json::Value::String(s) => s.clone(),
        v => v.to_string(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guests_get_no_clock_randomness_files_or_environment_unless_granted() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    let api = &host.api;
    api.upload_plugin("probe", "probe", "1").await?;
    let slot = |k: &str| baton::transport::partitioner::partition_for_key(k.as_bytes(), 2);
    let a = "a".to_string();
    let b = (0..)
        .map(|i| format!("b{i}"))
        .find(|k| slot(k) != slot(&a))
        .expect("a key in the other slot");
    for (name, wasi) in [
        ("sealed", json!({})),
        ("granted", json!({"clocks": true, "random": true})),
    ] {
        api.create_pipeline(json!({
            "name": name, "module": "probe", "version": "1", "inputs": [format!("{name}-in")],
            "stores": ["probe"], "slots": 2, "partitions": 2, "wasi": wasi
        }))
        .await?;
        // Keys a and b land in different slots, so in different partitions (instances).
        let positions = api
            .produce(
                &format!("{name}-in"),
                &[(a.clone(), None), (b.clone(), None)],
            )
            .await?;
        assert_ne!(positions[0].0, positions[1].0, "{a} and {b} share a slot");
        api.wait_caught_up(name, 2, Duration::from_secs(30)).await?;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    // Not granted: the clock is frozen at the epoch, the "random" seeds are the same in every
    // instance, and there is no file system or environment.
    assert_eq!(probe(api, "sealed", "a", "time").await?, "0");
    assert_eq!(
        probe(api, "sealed", "a", "hash").await?,
        probe(api, "sealed", &b, "hash").await?
    );
    for p in ["sealed", "granted"] {
        assert_eq!(probe(api, p, "a", "file").await?, "false");
        assert_eq!(probe(api, p, "a", "env").await?, "0");
    }
    // Granted: the real clock, and real randomness.
    let t: u64 = probe(api, "granted", "a", "time").await?.parse()?;
    assert!(
        t + 60 >= now && t <= now + 60,
        "granted clock says {t}, now is {now}"
    );
    assert_ne!(
        probe(api, "granted", "a", "hash").await?,
        probe(api, "granted", &b, "hash").await?
    );
    host.stop().await
}

/// `cpu_ms` is the budget of one guest call, not of a batch: a batch of slow but valid records
/// (about 3 ms each, 500 per call, several calls in one batch) runs longer than `cpu_ms` in
/// total, and still nothing is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_batch_of_slow_records_stays_within_the_budget_per_call() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start_configured(dir.path(), None, |c| c.task.max_call = 500).await?;
    let api = &host.api;
    api.upload_plugin("spin", "spin", "1").await?;
    api.create_pipeline(json!({
        "name": "slow", "module": "spin", "version": "1", "inputs": ["slow-in"],
        "stores": ["counts"], "slots": 1, "partitions": 1,
        "limits": {"cpu_ms": 2500}, "wasi": {"clocks": true}
    }))
    .await?;
    // 1,200 records of 3 ms: about 3.6 s in one batch, three calls of at most 1.5 s each.
    let recs: Vec<_> = (0..1200)
        .map(|i| (format!("k{}", i % 10), Some("busy:3".to_string())))
        .collect();
    let started = std::time::Instant::now();
    api.produce("slow-in", &recs).await?;
    api.wait_caught_up("slow", 1200, Duration::from_secs(120))
        .await?;
    let took = started.elapsed();
    let parts = api.partitions().await?;
    assert_eq!(parts[0]["dead_letters"], 0, "{parts:?}");
    assert_eq!(parts[0]["records"], 1200, "{parts:?}");
    for i in 0..10 {
        assert_eq!(
            api.counter("slow", "counts", &format!("k{i}")).await?,
            Some(120)
        );
    }
    assert!(
        took > Duration::from_millis(2500),
        "the batch took {took:?}, not longer than one call's budget: the test proves nothing"
    );
    host.stop().await
}
