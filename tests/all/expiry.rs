//! Entries written with an expiry (contract 0.2's `set-expiring`), through the dedupe plugin:
//! a key seen within the TTL is dropped, an expired entry is invisible and then removed, and its
//! removal reaches the store's changelog as a tombstone. In event time on Kafka; in processing
//! time on the embedded log, where an idle partition still removes what expired.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use baton_tests::{
    InProcess, cluster_name, kafka_bootstrap, kafka_shared, read_committed, unique, wait_for,
};
use serde_json::{Value, json};

const TTL: i64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_entries_vanish_and_their_tombstones_reach_the_changelog() -> anyhow::Result<()> {
    let _k = kafka_shared().await;
    let dir = tempfile::tempdir()?;
    let host = InProcess::start_with(dir.path(), Some(&kafka_bootstrap())).await?;
    let api = &host.api;
    let (name, input, output) = (unique("dd"), unique("in"), unique("out"));
    api.upload_plugin("dedupe", "dedupe", "1").await?;
    api.create_pipeline(json!({
        "name": name, "module": "dedupe", "version": "1", "inputs": [input],
        "outputs": [output], "stores": ["seen"], "slots": 2, "partitions": 1,
        "config": {"ttl_ms": TTL, "output": output}
    }))
    .await?;

    let base = baton_tests::recent_base();
    let rec = |k: &str, v: &str, ts: i64| json!({"key": k, "value": v, "timestamp": ts});
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    // First sight of every key; half of them again within the TTL (dropped); then time moves
    // past the TTL in both slots, and the other half comes again (passed: expired).
    let mut first: Vec<Value> = keys.iter().map(|k| rec(k, "first", base)).collect();
    first.extend(keys[..20].iter().map(|k| rec(k, "again", base + TTL / 2)));
    let ticks: Vec<Value> = (0..20)
        .map(|i| rec(&format!("tick{i}"), "tick", base + 5 * TTL))
        .collect();
    let later: Vec<Value> = keys[20..]
        .iter()
        .map(|k| rec(k, "later", base + 5 * TTL))
        .collect();
    let mut sent = 0;
    for batch in [first, ticks, later] {
        sent += batch.len() as u64;
        let r = api
            .post_json(
                &format!("/api/v1/topics/{input}/records"),
                &Value::Array(batch),
            )
            .await?;
        assert_eq!(r.status, 200, "{r:?}");
        api.wait_caught_up(&name, sent, Duration::from_secs(60))
            .await?;
    }

    // Outputs: every first sight, the ticks and the later half; no "again".
    let mut want: BTreeMap<(String, String), usize> = BTreeMap::new();
    for k in &keys {
        *want.entry((k.clone(), "first".into())).or_default() += 1;
    }
    for i in 0..20 {
        *want.entry((format!("tick{i}"), "tick".into())).or_default() += 1;
    }
    for k in &keys[20..] {
        *want.entry((k.clone(), "later".into())).or_default() += 1;
    }
    let mut got: BTreeMap<(String, String), usize> = BTreeMap::new();
    for kv in read_committed(&output, 2)? {
        *got.entry(kv).or_default() += 1;
    }
    assert_eq!(got, want, "what dedupe let through");

    // The first half expired and was removed; the second half was written again at +5 TTL and
    // holds that time.
    for k in &keys[..20] {
        assert_eq!(api.counter(&name, "seen", k).await?, None, "{k} expired");
    }
    for k in &keys[20..] {
        assert_eq!(
            api.counter(&name, "seen", k).await?,
            Some(base + 5 * TTL),
            "{k} seen again"
        );
    }
    // Each removal went to the changelog: the last record of each expired key is a tombstone
    // (an empty value here; a live entry is 8 bytes, not empty).
    let changelog = format!("{}.{name}.seen.changelog", cluster_name(dir.path()));
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in read_committed(&changelog, 2)? {
        last.insert(k, v);
    }
    for k in &keys[..20] {
        assert_eq!(
            last.get(k).map(String::as_str),
            Some(""),
            "tombstone of {k}"
        );
    }
    for k in &keys[20..] {
        assert!(
            last.get(k).is_some_and(|v| !v.is_empty()),
            "live entry of {k}: {:?}",
            last.get(k)
        );
    }
    host.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processing_time_entries_expire_on_the_wall_clock_while_idle() -> anyhow::Result<()> {
    const TTL: u64 = 2_000;
    let _k = kafka_shared().await;
    let dir = tempfile::tempdir()?;
    let host = InProcess::start_with(dir.path(), Some(&kafka_bootstrap())).await?;
    let api = &host.api;
    let (name, input, output) = (unique("dp"), unique("in"), unique("out"));
    api.upload_plugin("dedupe", "dedupe", "1").await?;
    let config = |clock: &str| json!({"ttl_ms": TTL, "output": output, "clock": clock});
    api.create_pipeline(json!({
        "name": name, "module": "dedupe", "version": "1", "inputs": [input],
        "outputs": [output], "stores": ["seen"], "slots": 2, "partitions": 1,
        "config": config("processing-time")
    }))
    .await?;
    // A clock dedupe does not know is refused by its init, by name.
    let bad = api
        .send_with_token(
            reqwest::Method::PATCH,
            &format!("/api/v1/pipelines/{name}"),
            Some(&json!({"config": config("wall")})),
            None,
        )
        .await?;
    assert_eq!(bad.status, 400, "{bad:?}");
    assert!(bad.body.to_string().contains("`clock`"), "{bad:?}");

    // Record timestamps far in the past: only the wall clock decides.
    let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
    let post = |v: &'static str| {
        let batch: Vec<Value> = keys
            .iter()
            .map(|k| json!({"key": k, "value": v, "timestamp": 1_000}))
            .collect();
        let path = format!("/api/v1/topics/{input}/records");
        async move {
            let r = api.post_json(&path, &Value::Array(batch)).await?;
            anyhow::ensure!(r.status == 200, "{r:?}");
            anyhow::Ok(())
        }
    };
    let written = Instant::now();
    post("first").await?;
    api.wait_caught_up(&name, 10, Duration::from_secs(30))
        .await?;
    post("again").await?;
    api.wait_caught_up(&name, 20, Duration::from_secs(30))
        .await?;
    assert!(
        written.elapsed() < Duration::from_millis(TTL),
        "the second sight must come within the TTL for this test to mean anything"
    );

    // No more input: the partition idles, and each entry is removed once its TTL has passed,
    // with a tombstone (an empty record) to the changelog.
    let changelog = format!("{}.{name}.seen.changelog", cluster_name(dir.path()));
    wait_for(
        "tombstones of every expired entry",
        Duration::from_secs(30),
        || async {
            let mut last: BTreeMap<String, String> = BTreeMap::new();
            for (k, v) in read_committed(&changelog, 2)? {
                last.insert(k, v);
            }
            Ok(keys
                .iter()
                .all(|k| last.get(k).is_some_and(String::is_empty))
                .then_some(()))
        },
    )
    .await?;
    assert!(
        written.elapsed() >= Duration::from_millis(TTL),
        "entries were removed {:?} after they were written, before their TTL",
        written.elapsed()
    );
    for k in &keys {
        assert_eq!(api.lookup(&name, "seen", k).await?, None, "{k} expired");
    }

    // Seen again after the TTL: passed, and remembered again.
    post("later").await?;
    api.wait_caught_up(&name, 30, Duration::from_secs(30))
        .await?;
    let mut got: BTreeMap<(String, String), usize> = BTreeMap::new();
    for kv in read_committed(&output, 2)? {
        *got.entry(kv).or_default() += 1;
    }
    let want: BTreeMap<(String, String), usize> = keys
        .iter()
        .flat_map(|k| [(k.clone(), "first".into()), (k.clone(), "later".into())])
        .map(|kv| (kv, 1))
        .collect();
    assert_eq!(got, want, "what dedupe let through");
    for k in &keys {
        assert!(
            api.lookup(&name, "seen", k).await?.is_some(),
            "{k} is seen again"
        );
    }
    host.stop().await
}
