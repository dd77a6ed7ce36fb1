//! A pipeline's life: deleted (its partitions stop, the name stays taken while its state
//! exists), purged (state gone, name free), and not started again after a restart; a module
//! version cannot be deleted while a pipeline runs it; control events of a newer host replay.

use std::time::Duration;

use baton::transport::kafka::KafkaAdmin;
use baton_tests::{InProcess, count, kafka_bootstrap, kafka_shared, unique, words};
use serde_json::json;

async fn delete(api: &baton_tests::Api, path: &str) -> anyhow::Result<baton_tests::Reply> {
    api.send_with_token(reqwest::Method::DELETE, path, None, None)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_is_deleted_then_purged_and_its_module_version_freed() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    let api = host.api.clone();
    api.upload_plugin("word-count", "word-count", "1").await?;
    api.upload_plugin("word-count", "word-count", "2").await?;
    let spec = json!({
        "name": "wc", "module": "word-count", "version": "1", "inputs": ["words"],
        "stores": ["counts"], "slots": 2, "partitions": 2
    });
    api.create_pipeline(spec.clone()).await?;
    let keys = words(100, 10, 1);
    let recs: Vec<_> = keys.iter().map(|k| (k.clone(), None)).collect();
    api.produce("words", &recs).await?;
    api.wait_caught_up("wc", 100, Duration::from_secs(30))
        .await?;

    // A module version in use cannot go; one that is not can.
    let r = delete(&api, "/api/v1/modules/word-count/1").await?;
    assert_eq!(r.status, 409, "{r:?}");
    assert!(r.error().contains("[wc]"), "{}", r.error());
    assert_eq!(
        delete(&api, "/api/v1/modules/word-count/2").await?.status,
        200
    );
    assert_eq!(
        delete(&api, "/api/v1/modules/word-count/2").await?.status,
        404
    );
    let modules = api.get("/api/v1/modules").await?.body;
    assert_eq!(modules.as_array().map(Vec::len), Some(1), "{modules}");

    // Deleted: its partitions stop and go, its name stays taken.
    let r = delete(&api, "/api/v1/pipelines/wc").await?;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["purge"], false);
    assert_eq!(api.get("/api/v1/pipelines/wc").await?.status, 404);
    assert!(api.partitions().await?.is_empty());
    let r = api.post_json("/api/v1/pipelines", &spec).await?;
    assert_eq!(r.status, 409, "{r:?}");
    assert!(r.error().contains("purge=true"), "{}", r.error());
    let r = delete(&api, "/api/v1/pipelines/wc").await?;
    assert_eq!(r.status, 409, "deleting twice without purge: {r:?}");
    assert_eq!(delete(&api, "/api/v1/pipelines/nope").await?.status, 404);
    host.stop().await?;

    // A restart does not bring it back.
    let host = InProcess::start(dir.path()).await?;
    let api = host.api.clone();
    assert_eq!(api.get("/api/v1/pipelines").await?.body, json!([]));
    assert!(api.partitions().await?.is_empty());
    assert_eq!(api.post_json("/api/v1/pipelines", &spec).await?.status, 409);

    // Purged: the state is gone and the name is free. The new pipeline starts from nothing
    // and counts the whole topic once.
    let r = delete(&api, "/api/v1/pipelines/wc?purge=true").await?;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(!dir.path().join("state").join("wc").exists());
    api.create_pipeline(spec.clone()).await?;
    let more = words(10, 10, 2);
    let recs: Vec<_> = more.iter().map(|k| (k.clone(), None)).collect();
    api.produce("words", &recs).await?;
    api.wait_caught_up("wc", 110, Duration::from_secs(30))
        .await?;
    for (key, n) in count(keys.iter().chain(&more).map(String::as_str)) {
        assert_eq!(api.counter("wc", "counts", &key).await?, Some(n), "{key}");
    }
    host.stop().await
}

/// A pipeline purged and created again under the same name writes every output: its outputs
/// are not mistaken for the re-sent outbox of its predecessor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_created_again_after_a_purge_loses_no_output() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    let api = host.api.clone();
    api.upload_plugin("uppercase", "uppercase", "1").await?;
    let spec = json!({
        "name": "up", "module": "uppercase", "version": "1", "inputs": ["in"],
        "outputs": ["out"], "config": {"output": "out"}, "slots": 1
    });
    api.create_pipeline(spec.clone()).await?;
    let recs: Vec<_> = (0..20)
        .map(|i| (format!("k{i}"), Some(format!("v{i}"))))
        .collect();
    for chunk in recs.chunks(2) {
        api.produce("in", chunk).await?;
    }
    api.wait_caught_up("up", 20, Duration::from_secs(30))
        .await?;
    assert_eq!(api.read_topic("out", 1).await?.len(), 20);
    let r = delete(&api, "/api/v1/pipelines/up?purge=true").await?;
    assert_eq!(r.status, 200, "{r:?}");
    // Created again, it starts from the first input record: 20 more outputs.
    api.create_pipeline(spec).await?;
    api.wait_caught_up("up", 20, Duration::from_secs(30))
        .await?;
    let out = baton_tests::wait_for("40 outputs", Duration::from_secs(10), || async {
        let out = api.read_topic("out", 1).await?;
        Ok((out.len() >= 40).then_some(out))
    })
    .await?;
    assert_eq!(out.len(), 40);
    host.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_a_purge_deletes_changelogs_dead_letters_and_offsets() -> anyhow::Result<()> {
    let _k = kafka_shared().await;
    let dir = tempfile::tempdir()?;
    let host = InProcess::start_with(dir.path(), Some(&kafka_bootstrap())).await?;
    let api = &host.api;
    api.upload_plugin("word-count", "word-count", "1").await?;
    let (name, input) = (unique("wc"), unique("words"));
    let spec = json!({
        "name": name, "module": "word-count", "version": "1", "inputs": [input],
        "stores": ["counts"], "slots": 2
    });
    api.create_pipeline(spec.clone()).await?;
    let recs: Vec<_> = (0..50).map(|i| (format!("k{}", i % 5), None)).collect();
    api.produce(&input, &recs).await?;
    api.wait_caught_up(&name, 50, Duration::from_secs(60))
        .await?;
    let cluster = host.baton.config().cluster.clone();
    let changelog = format!("{cluster}.{name}.counts.changelog");
    let dlq = format!("{cluster}.{name}.dlq");
    let group = format!("{cluster}.{name}");
    let admin = KafkaAdmin::new(&kafka_bootstrap(), &[])?;
    assert!(admin.topic(&changelog)?.is_some());
    assert_eq!(
        baton_tests::group_offsets(&group, &input, 2)?
            .iter()
            .sum::<u64>(),
        50
    );

    let r = delete(api, &format!("/api/v1/pipelines/{name}?purge=true")).await?;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        admin.topic(&changelog)?.is_none(),
        "the changelog is deleted"
    );
    assert!(admin.topic(&dlq)?.is_none(), "the dead letters are deleted");
    assert_eq!(baton_tests::group_offsets(&group, &input, 2)?, vec![0, 0]);
    // The name is free: a new pipeline of that name counts the topic from the start, once.
    api.create_pipeline(spec).await?;
    api.wait_caught_up(&name, 50, Duration::from_secs(60))
        .await?;
    assert_eq!(api.counter(&name, "counts", "k1").await?, Some(10));
    host.stop().await
}

/// An input topic that gains partitions after the pipeline was created fails the pipeline with
/// that reason, instead of the pipeline silently never reading the new partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_topic_that_gains_partitions_fails_the_pipeline() -> anyhow::Result<()> {
    let _k = kafka_shared().await;
    let dir = tempfile::tempdir()?;
    let host = InProcess::start_with(dir.path(), Some(&kafka_bootstrap())).await?;
    let api = &host.api;
    api.upload_plugin("word-count", "word-count", "1").await?;
    let (name, input) = (unique("wc"), unique("words"));
    api.create_pipeline(json!({
        "name": name, "module": "word-count", "version": "1", "inputs": [input],
        "stores": ["counts"], "slots": 2
    }))
    .await?;
    let admin = KafkaAdmin::new(&kafka_bootstrap(), &[])?;
    admin.grow_partitions(&input, 3)?;
    let info = baton_tests::wait_for("the pipeline to fail", Duration::from_secs(60), || async {
        let info = api.get(&format!("/api/v1/pipelines/{name}")).await?.body;
        Ok((info["phase"] == "failed").then_some(info))
    })
    .await?;
    let reason = info["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&input) && reason.contains("now has 3 partitions"),
        "{info}"
    );
    host.stop().await
}

/// `PATCH` changes a running pipeline's config (and limits, swap policy, grants) at a batch
/// boundary, without re-creating it; a change the module's `init` refuses changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_is_changed_in_place_by_patch() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    let api = host.api.clone();
    api.upload_plugin("fail-on", "fail-on", "1").await?;
    api.create_pipeline(json!({
        "name": "f", "module": "fail-on", "version": "1", "inputs": ["in"],
        "stores": ["counts"], "slots": 2, "partitions": 2, "config": {"value": "x"}
    }))
    .await?;
    // The guarantee's default interval is recorded at creation.
    let info = api.get("/api/v1/pipelines/f").await?.body;
    assert_eq!(info["commit_interval_ms"], 10, "{info}");
    api.create_pipeline(json!({
        "name": "g", "module": "fail-on", "version": "1", "inputs": ["in-g"],
        "stores": ["counts"], "guarantee": "at-least-once"
    }))
    .await?;
    let info = api.get("/api/v1/pipelines/g").await?.body;
    assert_eq!(info["commit_interval_ms"], 100, "{info}");
    let batch = |v: &str| -> Vec<(String, Option<String>)> {
        (0..10)
            .map(|i| (format!("k{i}"), Some(v.to_string())))
            .collect()
    };
    api.produce("in", &batch("x")).await?;
    api.wait_caught_up("f", 10, Duration::from_secs(30)).await?;
    assert_eq!(api.dead_letters().await?, 10);

    let patch = |body: serde_json::Value| {
        let api = api.clone();
        async move {
            api.send_with_token(
                reqwest::Method::PATCH,
                "/api/v1/pipelines/f",
                Some(&body),
                None,
            )
            .await
        }
    };
    for (bad, why) in [
        (json!({"config": {"mode": "error"}}), "init"),
        (json!({"limits": {"cpu_ms": 1}}), "cpu_ms"),
        (
            json!({"commit_interval_ms": 3_600_000}),
            "commit_interval_ms",
        ),
        (json!({"colour": "red"}), "colour"),
        (json!({}), "nothing to change"),
    ] {
        let r = patch(bad.clone()).await?;
        assert_eq!(r.status, 400, "{bad}: {r:?}");
        assert!(r.error().contains(why), "{bad}: {}", r.error());
    }
    // Without probation: a batch in which every record fails would otherwise take the change
    // back, as after a swap. A commit interval of a minute: records commit anyway as soon as
    // the input runs dry, well within the 30 s waited below.
    let r = patch(json!({
        "config": {"value": "y"}, "limits": {"cpu_ms": 500}, "swap": {"probation_batches": 0},
        "commit_interval_ms": 60_000
    }))
    .await?;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["commit_interval_ms"], 60_000, "{}", r.body);
    assert_eq!(r.body["swap"]["probation_batches"], 0, "{}", r.body);
    assert_eq!(r.body["config"]["value"], "y", "{}", r.body);
    assert_eq!(r.body["limits"]["cpu_ms"], 500, "{}", r.body);
    // Now `x` is counted and `y` fails.
    api.produce("in", &batch("x")).await?;
    api.produce("in", &batch("y")).await?;
    api.wait_caught_up("f", 30, Duration::from_secs(30)).await?;
    assert_eq!(api.dead_letters().await?, 20);
    assert_eq!(api.counter("f", "counts", "k3").await?, Some(1));
    host.stop().await?;

    // The change is in the control log: a restart keeps it.
    let host = InProcess::start(dir.path()).await?;
    let info = host.api.get("/api/v1/pipelines/f").await?.body;
    assert_eq!(info["config"]["value"], "y", "{info}");
    assert_eq!(info["limits"]["cpu_ms"], 500, "{info}");
    assert_eq!(info["commit_interval_ms"], 60_000, "{info}");
    host.stop().await
}
