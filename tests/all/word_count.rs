//! word-count over the embedded log gives the exact count of every key.

use std::time::Duration;

use baton_tests::{InProcess, count, words};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn word_count_is_exact_over_100k_records_in_8_slots_and_4_partitions() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    let api = &host.api;
    api.upload_plugin("word-count", "word-count", "1").await?;
    api.create_pipeline(json!({
        "name": "wc", "module": "word-count", "version": "1",
        "inputs": ["words"], "stores": ["counts"], "slots": 8, "partitions": 4
    }))
    .await?;

    let keys = words(100_000, 2_000, 7);
    for chunk in keys.chunks(10_000) {
        let recs: Vec<_> = chunk
            .iter()
            .map(|k| (k.clone(), Some("x".to_string())))
            .collect();
        api.produce("words", &recs).await?;
    }
    api.wait_caught_up("wc", 100_000, Duration::from_secs(120))
        .await?;

    let parts = api.partitions().await?;
    assert_eq!(parts.len(), 4);
    let mut slots: Vec<_> = parts
        .iter()
        .map(|p| {
            (
                p["slots"][0].as_u64().unwrap(),
                p["slots"][1].as_u64().unwrap(),
            )
        })
        .collect();
    slots.sort();
    assert_eq!(slots, vec![(0, 2), (2, 4), (4, 6), (6, 8)]);
    assert_eq!(
        parts
            .iter()
            .map(|p| p["records"].as_u64().unwrap())
            .sum::<u64>(),
        100_000
    );

    let expected = count(keys.iter().map(String::as_str));
    assert!(expected.len() > 500, "the workload should touch many keys");
    for (key, n) in &expected {
        assert_eq!(
            api.counter("wc", "counts", key).await?,
            Some(*n),
            "count of {key}"
        );
    }
    assert_eq!(api.counter("wc", "counts", "never-produced").await?, None);
    host.stop().await
}
