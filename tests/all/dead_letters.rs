//! A record whose processing errors or traps goes to the dead-letter topic with its error; its
//! state writes are discarded and every other record is processed.

use std::time::Duration;

use baton_tests::{InProcess, count, kafka_bootstrap, kafka_lock, unique, wait_for, words};
use serde_json::json;

async fn poison_run(mode: &str, kafka: bool) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let bootstrap = kafka_bootstrap();
    let host = InProcess::start_with(dir.path(), kafka.then_some(bootstrap.as_str())).await?;
    let api = &host.api;
    api.upload_plugin("fail-on", "fail-on", "1").await?;
    let name = unique(&format!("poison-{mode}"));
    let input = unique("in");
    api.create_pipeline(json!({
        "name": name, "module": "fail-on", "version": "1",
        "inputs": [input], "stores": ["counts"], "slots": 4, "partitions": 2,
        "config": {"value": "boom", "mode": mode}
    }))
    .await?;
    let keys = words(3_000, 100, 3);
    let poison_at = [17usize, 1_500, 2_999];
    let recs: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            (
                k.clone(),
                Some(if poison_at.contains(&i) { "boom" } else { "ok" }.to_string()),
            )
        })
        .collect();
    let positions = api.produce(&input, &recs).await?;
    api.wait_caught_up(&name, 3_000, Duration::from_secs(60))
        .await?;

    // Counts exclude the poison records: their increments were rolled back.
    let good = count(
        keys.iter()
            .enumerate()
            .filter(|(i, _)| !poison_at.contains(i))
            .map(|(_, k)| k.as_str()),
    );
    for (k, n) in &good {
        assert_eq!(
            api.counter(&name, "counts", k).await?,
            Some(*n),
            "count of {k}"
        );
    }
    // Exactly the poison records are dead letters, with the error and their origin. On Kafka a
    // committed transaction's markers reach the partitions shortly after the commit returns, so
    // wait until read_committed sees at least three; then there must be exactly three.
    let info = api.get(&format!("/api/v1/pipelines/{name}")).await?.body;
    let topic = info["dlq"].as_str().unwrap_or_default().to_string();
    assert!(topic.ends_with(&format!(".{name}.dlq")), "{info}");
    let dlq = wait_for("three dead letters", Duration::from_secs(30), || {
        let (api, topic) = (api.clone(), topic.clone());
        async move {
            let d = api.read_topic(&topic, 4).await?;
            Ok((d.len() >= 3).then_some(d))
        }
    })
    .await?;
    assert_eq!(dlq.len(), 3, "{dlq:?}");
    for i in poison_at {
        let (slot, offset) = positions[i];
        let d = dlq
            .iter()
            .find(|d| {
                d.headers.get("baton.offset") == Some(&offset.to_string())
                    && d.headers.get("baton.slot") == Some(&slot.to_string())
            })
            .unwrap_or_else(|| panic!("no dead letter for record {i} at {slot}/{offset}: {dlq:?}"));
        assert_eq!(d.key.as_deref(), Some(keys[i].as_str()));
        assert_eq!(d.value.as_deref(), Some("boom"));
        assert_eq!(d.headers["baton.topic"], input);
        let err = &d.headers["baton.error"];
        assert!(err.contains("poison value"), "{err}");
        let kind = if mode == "trap" {
            "trapped"
        } else {
            "processor error"
        };
        assert!(err.contains(kind), "{err}");
    }
    let parts = api.partitions().await?;
    assert_eq!(
        parts
            .iter()
            .map(|p| p["dead_letters"].as_u64().unwrap())
            .sum::<u64>(),
        3
    );
    assert!(parts.iter().all(|p| p["state"] == "running"));
    host.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erroring_record_goes_to_the_dlq_and_the_rest_is_processed() -> anyhow::Result<()> {
    poison_run("error", false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_an_erroring_record_goes_to_the_dlq_topic() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
    poison_run("error", true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_a_trapping_record_goes_to_the_dlq_topic() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
    poison_run("trap", true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trapping_record_goes_to_the_dlq_and_the_rest_is_processed() -> anyhow::Result<()> {
    poison_run("trap", false).await
}
