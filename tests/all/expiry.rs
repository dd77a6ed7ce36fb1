//! Entries written with an expiry (contract 0.2's `set-expiring`), through the dedupe plugin on
//! Kafka: a key seen within the TTL is dropped, an expired entry is invisible and then removed,
//! and its removal reaches the store's changelog as a tombstone.

use std::collections::BTreeMap;
use std::time::Duration;

use baton_tests::{InProcess, cluster_name, kafka_bootstrap, kafka_lock, read_committed, unique};
use serde_json::{Value, json};

const TTL: i64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_entries_vanish_and_their_tombstones_reach_the_changelog() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
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

    let base = 1_700_000_000_000i64;
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
