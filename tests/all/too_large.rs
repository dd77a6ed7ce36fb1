//! Records Kafka cannot take never wedge a partition: the host checks keys, values and outputs
//! against `limits.max_key_bytes`, `limits.max_value_bytes` and each topic's
//! `max.message.bytes` before Kafka sees them. The guest gets a `too-large` error; returned, it
//! dead-letters the record with that reason, the record's writes are discarded, and the
//! partition goes on. A dead letter too large for its topic is cut, and says so.

use std::time::Duration;

use baton::transport::kafka::KafkaAdmin;
use baton_tests::{InProcess, kafka_bootstrap, kafka_shared, unique};
use serde_json::json;

/// Sends records with a producer that takes records of several MB.
async fn send_large(topic: &str, records: &[(Vec<u8>, Vec<u8>)]) -> anyhow::Result<()> {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("message.max.bytes", "8000000")
        .create()?;
    for (k, v) in records {
        let p = baton::transport::partitioner::partition_for_key(k, 2) as i32;
        producer
            .send(
                FutureRecord::to(topic).key(k).payload(v).partition(p),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| anyhow::anyhow!("producing to {topic}: {e}"))?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_over_a_limit_are_dead_lettered_and_the_partition_goes_on() -> anyhow::Result<()> {
    let _k = kafka_shared().await;
    let dir = tempfile::tempdir()?;
    let host = InProcess::start_with(dir.path(), Some(&kafka_bootstrap())).await?;
    let api = &host.api;
    let admin = KafkaAdmin::new(&kafka_bootstrap(), &[])?;
    let (input, output) = (unique("big-in"), unique("small-out"));
    admin
        .ensure_topic(&input, 2, 1, &[("max.message.bytes", "4194304")])
        .await?;
    admin
        .ensure_topic(&output, 2, 1, &[("max.message.bytes", "20000")])
        .await?;
    for (plugin, name) in [
        ("uppercase", "up"),
        ("latest", "latest"),
        ("word-count", "wc"),
    ] {
        api.upload_plugin(plugin, plugin, "1").await?;
        let mut spec = json!({
            "name": format!("{name}-{}", input), "module": plugin, "version": "1",
            "inputs": [input], "slots": 2
        });
        match plugin {
            "uppercase" => {
                spec["outputs"] = json!([output]);
                spec["config"] = json!({ "output": output });
            }
            "latest" => spec["stores"] = json!(["values", "changes"]),
            _ => spec["stores"] = json!(["counts"]),
        }
        api.create_pipeline(spec).await?;
    }
    let long_key = vec![b'x'; 5000];
    let mut records: Vec<(Vec<u8>, Vec<u8>)> = (0..20)
        .map(|i| (format!("k{}", i % 5).into_bytes(), b"v".to_vec()))
        .collect();
    records.insert(3, (b"big".to_vec(), vec![b'b'; 2_000_000]));
    records.insert(8, (long_key.clone(), b"v".to_vec()));
    records.insert(12, (b"medium".to_vec(), vec![b'm'; 30_000]));
    send_large(&input, &records).await?;
    // The partitions go on: later records are processed too.
    let more: Vec<_> = (0..10)
        .map(|i| (format!("k{i}").into_bytes(), b"w".to_vec()))
        .collect();
    send_large(&input, &more).await?;
    let total = (records.len() + more.len()) as u64;
    for name in ["up", "latest", "wc"] {
        api.wait_caught_up(&format!("{name}-{input}"), total, Duration::from_secs(60))
            .await?;
    }

    let dead = |name: &str| {
        let (api, topic) = (
            api.clone(),
            format!("{}.{name}-{input}.dlq", host.baton.config().cluster),
        );
        async move { api.read_topic(&topic, 2).await }
    };
    let reason =
        |d: &baton_tests::TopicRecord| d.headers.get("baton.error").cloned().unwrap_or_default();

    // uppercase: the 2 MB and 30 KB values are too large for its 20,000-byte output topic.
    let up = dead("up").await?;
    let mut keys: Vec<_> = up
        .iter()
        .map(|d| d.key.clone().unwrap_or_default())
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        ["big", "medium"],
        "{:?}",
        up.iter().map(reason).collect::<Vec<_>>()
    );
    for d in &up {
        let r = reason(d);
        assert!(r.contains("too-large") && r.contains(&output), "{r}");
    }
    let big = up
        .iter()
        .find(|d| d.key.as_deref() == Some("big"))
        .expect("big");
    assert!(
        big.headers.contains_key("baton.truncated"),
        "{:?}",
        big.headers
    );
    assert!(big.value.as_ref().is_some_and(|v| v.len() < 1_000_000));
    let medium = up
        .iter()
        .find(|d| d.key.as_deref() == Some("medium"))
        .expect("medium");
    assert_eq!(medium.value.as_ref().map(String::len), Some(30_000));
    assert!(!medium.headers.contains_key("baton.truncated"));
    let out = baton_tests::read_committed(&output, 2)?;
    assert_eq!(
        out.len() as u64,
        total - 2,
        "every other record reached the output"
    );

    // latest: the 2 MB value is over limits.max_value_bytes, the 5,000-byte key over
    // limits.max_key_bytes; the 30 KB value is stored.
    let latest = dead("latest").await?;
    assert_eq!(
        latest.len(),
        2,
        "{:?}",
        latest.iter().map(reason).collect::<Vec<_>>()
    );
    assert!(
        latest
            .iter()
            .any(|d| reason(d).contains("limits.max_value_bytes"))
    );
    assert!(
        latest
            .iter()
            .any(|d| reason(d).contains("limits.max_key_bytes"))
    );
    let r = api
        .get(&format!(
            "/api/v1/pipelines/latest-{input}/stores/values/keys/medium"
        ))
        .await?;
    assert_eq!(
        r.body["value"].as_str().map(str::len),
        Some(30_000),
        "{}",
        r.status
    );
    let r = api
        .get(&format!(
            "/api/v1/pipelines/latest-{input}/stores/changes/keys/big"
        ))
        .await?;
    assert_eq!(
        r.status, 404,
        "the refused record's other writes were discarded too"
    );

    // word-count: only the long key is refused.
    let wc = dead("wc").await?;
    assert_eq!(wc.len(), 1);
    assert!(
        reason(&wc[0]).contains("limits.max_key_bytes"),
        "{}",
        reason(&wc[0])
    );
    assert_eq!(
        api.counter(&format!("wc-{input}"), "counts", "big").await?,
        Some(1)
    );
    assert_eq!(
        api.counter(&format!("wc-{input}"), "counts", "k0").await?,
        Some(5)
    );
    let parts = api.partitions().await?;
    assert!(parts.iter().all(|p| p["state"] == "running"), "{parts:?}");
    host.stop().await
}

/// A record Kafka refuses for a reason no host check foresees (here an output whose timestamp
/// the output topic's `message.timestamp.before.max.ms` rejects) is found by committing the
/// batch's records one at a time, and dead-lettered with Kafka's reason; the partition goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_kafka_refuses_for_good_is_dead_lettered_not_retried_forever() -> anyhow::Result<()>
{
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let _k = kafka_shared().await;
    let dir = tempfile::tempdir()?;
    let host = InProcess::start_with(dir.path(), Some(&kafka_bootstrap())).await?;
    let api = &host.api;
    let admin = KafkaAdmin::new(&kafka_bootstrap(), &[])?;
    let (name, input, output) = (unique("up"), unique("in"), unique("recent-only"));
    admin
        .ensure_topic(
            &output,
            2,
            1,
            &[("message.timestamp.before.max.ms", "3600000")],
        )
        .await?;
    api.upload_plugin("uppercase", "uppercase", "1").await?;
    api.create_pipeline(json!({
        "name": name, "module": "uppercase", "version": "1", "inputs": [input],
        "outputs": [output], "config": {"output": output}, "slots": 2
    }))
    .await?;
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("linger.ms", "20")
        .create()?;
    let now = baton::control::now_ms();
    // One batch: a record from 2001, then 40 of now. Outputs take the timestamp of the first
    // record of a guest call, so at first the whole call's outputs are refused.
    let mut sends = Vec::new();
    for i in 0..41 {
        let (key, ts) = if i == 0 {
            ("old".to_string(), 1_000_000_000_000)
        } else {
            (format!("k{i}"), now)
        };
        let p = baton::transport::partitioner::partition_for_key(key.as_bytes(), 2) as i32;
        sends.push(
            producer
                .send_result(
                    FutureRecord::to(&input)
                        .key(key.as_bytes())
                        .payload("v")
                        .partition(p)
                        .timestamp(ts),
                )
                .map_err(|(e, _)| anyhow::anyhow!("{e}"))?,
        );
    }
    for s in sends {
        s.await?.map_err(|(e, _)| anyhow::anyhow!("{e}"))?;
    }
    api.wait_caught_up(&name, 41, Duration::from_secs(60))
        .await?;
    let out = baton_tests::read_committed(&output, 2)?;
    assert_eq!(out.len(), 40, "every other record reached the output");
    assert!(out.iter().all(|(k, v)| k != "old" && v == "V"));
    let dlq = api
        .read_topic(&format!("{}.{name}.dlq", host.baton.config().cluster), 2)
        .await?;
    assert_eq!(dlq.len(), 1, "{dlq:?}");
    assert_eq!(dlq[0].key.as_deref(), Some("old"));
    let reason = dlq[0]
        .headers
        .get("baton.error")
        .cloned()
        .unwrap_or_default();
    assert!(
        reason.contains("refused") && reason.to_lowercase().contains("timestamp"),
        "{reason}"
    );
    let parts = api.partitions().await?;
    assert!(parts.iter().all(|p| p["state"] == "running"), "{parts:?}");
    host.stop().await
}
