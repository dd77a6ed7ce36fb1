//! A record whose processing errors or traps goes to the dead-letter topic with its error; its
//! state writes are discarded and every other record is processed.

use std::time::Duration;

use baton_tests::{InProcess, count, kafka_bootstrap, kafka_shared, unique, wait_for, words};
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
    let _k = kafka_shared().await;
    poison_run("error", true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_a_trapping_record_goes_to_the_dlq_topic() -> anyhow::Result<()> {
    let _k = kafka_shared().await;
    poison_run("trap", true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trapping_record_goes_to_the_dlq_and_the_rest_is_processed() -> anyhow::Result<()> {
    poison_run("trap", false).await
}

/// Dead letters are processed again, through the version that fixed them, exactly once: a
/// second request replays nothing, an overlapping range is refused, and a restart does not
/// replay them again.
async fn replay_run(kafka: bool) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let bootstrap = kafka_bootstrap();
    let kafka_at = kafka.then_some(bootstrap.as_str());
    let host = InProcess::start_with(dir.path(), kafka_at).await?;
    let api = host.api.clone();
    // Version 1 fails records whose value is `bad`; version 2 (word-count) counts them all.
    api.upload_plugin("fail-on", "p", "1").await?;
    api.upload_plugin("word-count", "p", "2").await?;
    let (name, input) = (unique("replay"), unique("in"));
    api.create_pipeline(json!({
        "name": name, "module": "p", "version": "1", "inputs": [input],
        "stores": ["counts"], "slots": 4, "partitions": 2, "config": {"value": "bad"}
    }))
    .await?;
    let keys = words(300, 20, 6);
    let recs: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            (
                k.clone(),
                Some(if i % 7 == 3 { "bad" } else { "ok" }.to_string()),
            )
        })
        .collect();
    let bad = recs
        .iter()
        .filter(|(_, v)| v.as_deref() == Some("bad"))
        .count() as u64;
    api.produce(&input, &recs).await?;
    api.wait_caught_up(&name, 300, Duration::from_secs(60))
        .await?;
    assert_eq!(api.dead_letters().await?, bad);
    let r = api
        .put_json(
            &format!("/api/v1/pipelines/{name}/module"),
            &json!({"version": "2"}),
        )
        .await?;
    assert_eq!(r.status, 200, "{r:?}");

    let path = format!("/api/v1/pipelines/{name}/dead-letters/replay");
    let r = api.post_json(&path, &json!({})).await?;
    assert_eq!(r.status, 202, "{r:?}");
    let requested: u64 = r.body["ranges"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| x["to"].as_u64().unwrap_or(0) - x["from"].as_u64().unwrap_or(0))
        .sum();
    assert!(requested >= bad, "{}", r.body);
    let expected = count(keys.iter().map(String::as_str));
    baton_tests::wait_counts(&api, &name, "counts", &expected, Duration::from_secs(60)).await?;
    assert_eq!(api.dead_letters().await?, bad, "no record failed again");

    // More dead letters (version 1 again for a while), then a second replay of the same
    // partitions: it starts where the first ended.
    let swap_to = |v: &'static str| {
        let (api, name) = (api.clone(), name.clone());
        async move {
            let r = api
                .put_json(
                    &format!("/api/v1/pipelines/{name}/module"),
                    &json!({"version": v}),
                )
                .await?;
            anyhow::ensure!(r.status == 200, "swap to {v}: {r:?}");
            anyhow::Ok(())
        }
    };
    swap_to("1").await?;
    let keys2 = words(140, 20, 7);
    let recs2: Vec<_> = keys2
        .iter()
        .enumerate()
        .map(|(i, k)| {
            (
                k.clone(),
                Some(if i % 5 == 1 { "bad" } else { "ok" }.to_string()),
            )
        })
        .collect();
    let bad2 = recs2
        .iter()
        .filter(|(_, v)| v.as_deref() == Some("bad"))
        .count() as u64;
    api.produce(&input, &recs2).await?;
    api.wait_caught_up(&name, 440, Duration::from_secs(60))
        .await?;
    assert_eq!(api.dead_letters().await?, bad + bad2);
    swap_to("2").await?;
    let r = api.post_json(&path, &json!({})).await?;
    assert_eq!(r.status, 202, "{r:?}");
    assert!(
        r.body["ranges"].as_array().is_some_and(|a| !a.is_empty()),
        "{}",
        r.body
    );
    let expected = count(keys.iter().chain(&keys2).map(String::as_str));
    baton_tests::wait_counts(&api, &name, "counts", &expected, Duration::from_secs(60)).await?;
    // Nothing is replayed twice.
    let r = api.post_json(&path, &json!({})).await?;
    assert_eq!(r.status, 202, "{r:?}");
    assert_eq!(r.body["ranges"], json!([]), "{}", r.body);
    let r = api.post_json(&path, &json!({"slot": 0, "from": 0})).await?;
    assert_eq!(r.status, 409, "{r:?}");
    assert_eq!(api.post_json(&path, &json!({"from": 0})).await?.status, 400);
    host.stop().await?;
    let host = InProcess::start_with(dir.path(), kafka_at).await?;
    host.api
        .wait_caught_up(&name, 440, Duration::from_secs(60))
        .await?;
    for (key, n) in &expected {
        assert_eq!(
            host.api.counter(&name, "counts", key).await?,
            Some(*n),
            "{key}"
        );
    }
    host.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_replayed_exactly_once() -> anyhow::Result<()> {
    replay_run(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_dead_letters_are_replayed_exactly_once() -> anyhow::Result<()> {
    let _k = kafka_shared().await;
    replay_run(true).await
}
