//! baton on a real Apache Kafka broker (started by `scripts/kafka`): exact counts, `kill -9`,
//! loss of the data dir, a broker restart, and at-least-once. Kafka tests hold `kafka_lock`
//! (alone: one of them restarts the broker) or, the light ones, `kafka_shared`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use baton::transport::TransportError;
use baton::transport::kafka::{KafkaAdmin, KafkaError};
use baton_tests::{
    Api, ChildHost, InProcess, TestProducer, assert_counts, count, kafka_bootstrap, kafka_lock,
    kafka_script, kafka_shared, read_committed, unique, wait_for, words,
};
use serde_json::json;
use tokio::sync::Mutex;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_client_creates_and_lists_a_topic() -> anyhow::Result<()> {
    let _k = kafka_shared().await;
    let admin = KafkaAdmin::new(&kafka_bootstrap(), &[])?;
    let name = unique("baton-test");
    assert!(
        admin
            .ensure_topic(&name, 3, 1, &[("cleanup.policy", "compact")])
            .await?,
        "created"
    );
    assert!(
        !admin.ensure_topic(&name, 3, 1, &[]).await?,
        "already there"
    );
    let listed = admin.topics()?;
    let t = listed
        .iter()
        .find(|t| t.name == name)
        .expect("the new topic is listed");
    assert_eq!(t.partitions, 3);
    match admin.ensure_topic(&name, 5, 1, &[]).await {
        Err(KafkaError::Topic(TransportError::PartitionCountMismatch {
            actual: 3,
            wanted: 5,
            ..
        })) => {}
        other => panic!("expected a partition count mismatch, got {other:?}"),
    }
    admin.delete_topics(&[&name]).await?;
    Ok(())
}

/// A topic is used the moment it is created, as a host's first start does with its control
/// log's snapshot topic: while the broker elects the new partitions' leaders, the watermarks,
/// appends and reads wait that out instead of failing with "not leader" or "no leader".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_are_read_and_written_the_moment_they_are_created() -> anyhow::Result<()> {
    use baton::transport::kafka::{KafkaConfig, KafkaTransport};
    use baton::transport::{Record, TopicKind, Transport};
    let _k = kafka_shared().await;
    tokio::task::spawn_blocking(|| -> anyhow::Result<()> {
        let t = KafkaTransport::connect(KafkaConfig::new(kafka_bootstrap()))?;
        let mut made = Vec::new();
        for round in 0..8u32 {
            let topic = unique("fresh");
            assert!(
                t.ensure_topic(&topic, 3, TopicKind::Forever)?,
                "{topic} is new"
            );
            made.push(topic.clone());
            for p in 0..3 {
                assert_eq!(t.end_offset(&topic, p)?, 0, "{topic}/{p} starts empty");
                let rec = Record {
                    key: Some(format!("k{round}").into_bytes()),
                    value: Some(format!("v{round}.{p}").into_bytes()),
                    headers: vec![],
                    timestamp: 1_700_000_000_000,
                };
                assert_eq!(t.append(&topic, p, std::slice::from_ref(&rec))?, 0);
                let (read, next) = t.read_from(&topic, p, 0, 10)?;
                assert_eq!(next, 1, "{topic}/{p}");
                assert_eq!(read.len(), 1, "{topic}/{p}");
                assert_eq!(read[0].record.value, rec.value, "{topic}/{p}");
            }
        }
        t.delete_topics(&made)?;
        Ok(())
    })
    .await?
}

/// A commit's changelog records go to librdkafka in one call per partition (`send_many`):
/// they land in order with their keys and values (a missing value stays a tombstone), on a
/// topic the producer has no metadata of yet; a queue far smaller than the batch is waited out;
/// the offsets a flush reports are the last ones written; a record Kafka can never take fails
/// the call, named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_sent_in_one_call_land_in_their_partition_and_a_refusal_is_named()
-> anyhow::Result<()> {
    use baton::transport::kafka::{KafkaConfig, KafkaTransport};
    use baton::transport::{TopicKind, Transport};
    let _k = kafka_shared().await;
    tokio::task::spawn_blocking(|| -> anyhow::Result<()> {
        let mut config = KafkaConfig::new(kafka_bootstrap());
        // A queue of 100 records, for calls of up to 334: they wait for room.
        config.settings = vec![("queue.buffering.max.messages".into(), "100".into())];
        let t = KafkaTransport::connect(config)?;
        let topic = unique("send-many");
        t.ensure_topic(&topic, 3, TopicKind::Data)?;
        let keys: Vec<Vec<u8>> = (0..1000).map(|i| format!("k{i}").into_bytes()).collect();
        let values: Vec<Vec<u8>> = (0..1000).map(|i| format!("v{i}").into_bytes()).collect();
        let value = |i: usize| (i % 7 != 3).then(|| values[i].as_slice());
        let of = |p: u32| -> Vec<usize> { (0..1000).filter(|i| i % 3 == p as usize).collect() };
        let producer = t.batch_producer(&unique("send-many-txn"))?;
        producer.init_transactions()?;
        let group = t.input_consumer(&unique("send-many-group"))?;
        producer.begin()?;
        for p in 0..3u32 {
            producer.send_many(
                &topic,
                p,
                of(p).into_iter().map(|i| (keys[i].as_slice(), value(i))),
            )?;
        }
        let written = producer.flush()?;
        producer.commit(&[(topic.clone(), 0, 0)], &group.group_metadata()?)?;
        let text =
            |b: &Option<Vec<u8>>| b.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
        let read = baton_tests::read_committed_raw(&topic, 3)?;
        for p in 0..3u32 {
            let sent = of(p);
            assert_eq!(
                written.get(&(topic.clone(), p)),
                Some(&(sent.len() as u64 - 1)),
                "the last offset written to {topic}/{p}: {written:?}"
            );
            let got: Vec<(Option<String>, Option<String>)> = read
                .iter()
                .filter(|(at, _, _)| *at == p)
                .map(|(_, k, v)| (text(k), text(v)))
                .collect();
            let want: Vec<(Option<String>, Option<String>)> = sent
                .iter()
                .map(|&i| (Some(format!("k{i}")), value(i).map(|_| format!("v{i}"))))
                .collect();
            assert!(
                got == want,
                "{topic}/{p} holds its records in order: {} of {} read, the first {:?}",
                got.len(),
                want.len(),
                got.first()
            );
        }

        // Over librdkafka's largest record (1,000,000 bytes): refused for good, named.
        let huge = vec![b'x'; 2_000_000];
        producer.begin()?;
        let err = producer
            .send_many(
                &topic,
                2,
                [
                    (b"small".as_slice(), Some(b"v".as_slice())),
                    (b"huge", Some(&huge)),
                ],
            )
            .expect_err("a record over the size limit is refused");
        producer.abort();
        assert!(
            matches!(&err, TransportError::Refused(m) if m.contains(&format!("{topic}/2"))),
            "{err:?}"
        );
        t.delete_topics(&[topic])?;
        Ok(())
    })
    .await?
}

/// The input consumer reads in batches but hands over what is there: one record on a quiet
/// topic comes back as soon as it is fetched, not when a full batch would be (or the wait ends);
/// records of several partitions, headers and timestamps come back as they were produced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_input_consumer_hands_over_what_is_there_without_waiting_for_a_full_batch()
-> anyhow::Result<()> {
    use baton::transport::kafka::{KafkaConfig, KafkaTransport};
    use baton::transport::{Record, TopicKind, Transport};
    let _k = kafka_lock().await;
    tokio::task::spawn_blocking(|| -> anyhow::Result<()> {
        let t = KafkaTransport::connect(KafkaConfig::new(kafka_bootstrap()))?;
        let topic = unique("batch-read");
        t.ensure_topic(&topic, 2, TopicKind::Data)?;
        let c = t.input_consumer(&unique("batch-read-group"))?;
        // In two steps (slot 0, then slot 1), as a take-over assigns the slots with records
        // waiting first: the records of the second step come through too.
        c.assign(&[(topic.clone(), 0, 0), (topic.clone(), 1, 0)], 1)?;
        let record = |k: &str, ts: i64| Record {
            key: Some(k.as_bytes().to_vec()),
            value: Some(format!("v-{k}").into_bytes()),
            headers: vec![("h".into(), k.as_bytes().to_vec())],
            timestamp: ts,
        };
        t.append(&topic, 1, &[record("first", 1_700_000_000_001)])?;
        // A wait far longer than a fetch takes: a read that waited for a full batch of 1,000
        // would sit out all of it.
        let wait = Duration::from_secs(30);
        let started = std::time::Instant::now();
        let got = c.fetch(1000, wait);
        assert!(
            started.elapsed() < wait / 2,
            "one record took {:?}: the read waited for a full batch",
            started.elapsed()
        );
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].topic.as_str(), got[0].partition),
            (topic.as_str(), 1)
        );
        assert_eq!(got[0].records.len(), 1);
        assert_eq!(got[0].records[0].offset, 0);
        assert_eq!(got[0].records[0].record, record("first", 1_700_000_000_001));

        t.append(&topic, 0, &[record("a", 5), record("b", 6)])?;
        t.append(&topic, 1, &[record("c", 7)])?;
        let mut seen: BTreeMap<u32, Vec<(u64, Record)>> = BTreeMap::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while seen.values().map(Vec::len).sum::<usize>() < 3 {
            assert!(
                std::time::Instant::now() < deadline,
                "only {seen:?} came back"
            );
            for f in c.fetch(1000, Duration::from_millis(200)) {
                seen.entry(f.partition)
                    .or_default()
                    .extend(f.records.into_iter().map(|r| (r.offset, r.record)));
            }
        }
        assert_eq!(
            seen[&0],
            vec![(0, record("a", 5)), (1, record("b", 6))],
            "partition 0 in order"
        );
        assert_eq!(seen[&1], vec![(1, record("c", 7))]);
        t.delete_topics(&[topic])?;
        Ok(())
    })
    .await?
}

/// A fetch waiting on a quiet input ends when its waker is called from another thread (a
/// partition told to stop or commit acts at once, not after its wait): a wake before the fetch
/// ends its wait too (librdkafka's yield flag alone would be cleared by the read without a wait
/// that comes first), one during the wait ends it, and a waker outlives its consumer harmlessly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_waiting_for_input_ends_when_woken() -> anyhow::Result<()> {
    use baton::transport::kafka::{KafkaConfig, KafkaTransport};
    use baton::transport::{Record, TopicKind, Transport};
    use std::time::Instant;
    let _k = kafka_lock().await;
    tokio::task::spawn_blocking(|| -> anyhow::Result<()> {
        let t = KafkaTransport::connect(KafkaConfig::new(kafka_bootstrap()))?;
        let topic = unique("woken");
        t.ensure_topic(&topic, 1, TopicKind::Data)?;
        let c = t.input_consumer(&unique("woken-group"))?;
        c.assign(&[(topic.clone(), 0, 0)], 1)?;
        // The partition is read: one record comes back.
        t.append(
            &topic,
            0,
            &[Record {
                key: Some(b"k".to_vec()),
                value: Some(b"v".to_vec()),
                headers: Vec::new(),
                timestamp: 1,
            }],
        )?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while c.fetch(10, Duration::from_millis(200)).is_empty() {
            assert!(Instant::now() < deadline, "the record never came back");
        }
        // Unwoken, a fetch on the quiet partition waits (a fetch that ends early for another
        // reason, such as an error on its queue, is given two more tries).
        let short = Duration::from_millis(300);
        let waited = (0..3).any(|_| {
            let started = Instant::now();
            c.fetch(10, short).is_empty() && started.elapsed() >= short * 3 / 4
        });
        assert!(waited, "an unwoken fetch on a quiet input did not wait");
        // Woken once before it: it does not wait.
        let waker = c.waker();
        waker.wake();
        let long = Duration::from_secs(60);
        let started = Instant::now();
        let got = c.fetch(10, long);
        assert!(got.is_empty(), "nothing was produced since");
        assert!(
            started.elapsed() < long / 2,
            "a fetch woken before it waited out its wait: {:?}",
            started.elapsed()
        );
        // Woken while it waits, from another thread: it returns.
        let (tx, rx) = std::sync::mpsc::channel();
        let fetching = std::thread::spawn(move || {
            tx.send(()).ok();
            let got = c.fetch(10, long);
            (got.len(), c)
        });
        rx.recv()?;
        let deadline = Instant::now() + long / 2;
        while !fetching.is_finished() {
            assert!(
                Instant::now() < deadline,
                "the fetch did not end when woken"
            );
            waker.wake();
            std::thread::sleep(Duration::from_millis(10));
        }
        let (got, c) = fetching.join().expect("the fetching thread");
        assert_eq!(got, 0, "nothing was produced since");
        drop(c);
        waker.wake();
        t.delete_topics(&[topic])?;
        Ok(())
    })
    .await?
}

/// An in-process host on Kafka running word-count over a new input topic; returns the host,
/// the pipeline and the input topic.
async fn word_count_on_kafka(
    dir: &std::path::Path,
    slots: u32,
    partitions: u32,
) -> anyhow::Result<(InProcess, String, String)> {
    word_count_on_kafka_configured(dir, slots, partitions, |_| {}).await
}

/// Like [`word_count_on_kafka`], with a last word on the host's config.
async fn word_count_on_kafka_configured(
    dir: &std::path::Path,
    slots: u32,
    partitions: u32,
    configure: impl FnOnce(&mut baton::HostConfig),
) -> anyhow::Result<(InProcess, String, String)> {
    let host = InProcess::start_configured(dir, Some(&kafka_bootstrap()), configure).await?;
    let (name, input) = (unique("wc"), unique("words"));
    host.api
        .upload_plugin("word-count", "word-count", "1")
        .await?;
    host.api
        .create_pipeline(json!({
            "name": name, "module": "word-count", "version": "1", "inputs": [input],
            "stores": ["counts"], "slots": slots, "partitions": partitions
        }))
        .await?;
    Ok((host, name, input))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn word_count_is_exact_over_200k_records_in_16_slots() -> anyhow::Result<()> {
    let _k = kafka_shared().await;
    let dir = tempfile::tempdir()?;
    let (host, name, input) = word_count_on_kafka(dir.path(), 16, 4).await?;
    let keys = words(200_000, 5_000, 9);
    let producer = TestProducer::new()?;
    for chunk in keys.chunks(20_000) {
        let recs: Vec<_> = chunk.iter().map(|k| (k.clone(), "1".to_string())).collect();
        producer.send(&input, 16, &recs).await?;
    }
    host.api
        .wait_caught_up(&name, 200_000, Duration::from_secs(180))
        .await?;
    assert_counts(&host.api, &name, &count(keys.iter().map(String::as_str))).await?;

    // The changelog is a compacted topic with a partition per slot, and the input offsets are
    // the consumer group's, so standard tools show the pipeline's lag.
    let admin = KafkaAdmin::new(&kafka_bootstrap(), &[])?;
    let prefix = host.baton.config().cluster.clone();
    let changelog = admin
        .topic(&format!("{prefix}.{name}.counts.changelog"))?
        .expect("changelog topic");
    assert_eq!(changelog.partitions, 16);
    let committed = baton_tests::group_offsets(&format!("{prefix}.{name}"), &input, 16)?;
    assert_eq!(committed.iter().sum::<u64>(), 200_000, "{committed:?}");
    host.stop().await
}

/// Keys produced by a librdkafka client with its default partitioner (CRC32, not Java's
/// murmur2) are found by a lookup; a key in two slots (produced both ways) lists both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_find_keys_whatever_partitioner_produced_them() -> anyhow::Result<()> {
    use baton::transport::partitioner::{crc32_partition_for_key, partition_for_key};
    let _k = kafka_shared().await;
    let dir = tempfile::tempdir()?;
    let (host, name, input) = word_count_on_kafka(dir.path(), 8, 2).await?;
    let api = &host.api;
    let keys: Vec<String> = (0..300).map(|i| format!("user-{i}")).collect();
    let elsewhere = keys
        .iter()
        .filter(|k| partition_for_key(k.as_bytes(), 8) != crc32_partition_for_key(k.as_bytes(), 8))
        .count();
    assert!(
        elsewhere > 200,
        "only {elsewhere} keys change slot: the test proves little"
    );
    let producer = TestProducer::new()?;
    let recs: Vec<_> = keys
        .iter()
        .flat_map(|k| std::iter::repeat_n((k.clone(), "x".to_string()), 3))
        .collect();
    producer.send_librdkafka_default(&input, &recs).await?;
    // The same key from a Java-style producer (baton's produce API uses murmur2) lands in
    // another slot: the lookup lists both, the murmur2 slot first.
    let both = keys
        .iter()
        .find(|k| partition_for_key(k.as_bytes(), 8) != crc32_partition_for_key(k.as_bytes(), 8))
        .cloned()
        .expect("a key whose slots differ");
    api.produce(&input, &[(both.clone(), None)]).await?;
    api.wait_caught_up(&name, 901, Duration::from_secs(60))
        .await?;
    for k in &keys {
        let r = api
            .get(&format!("/api/v1/pipelines/{name}/stores/counts/keys/{k}"))
            .await?;
        assert_eq!(r.status, 200, "lookup of {k}: {}", r.body);
        let crc = crc32_partition_for_key(k.as_bytes(), 8);
        let m = r.body["matches"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .find(|m| m["slot"] == crc)
            .unwrap_or_else(|| panic!("{k}: no match in its CRC32 slot {crc}: {}", r.body));
        assert_eq!(m["value_i64"], 3, "{k}: {}", r.body);
    }
    let r = api
        .get(&format!(
            "/api/v1/pipelines/{name}/stores/counts/keys/{both}"
        ))
        .await?;
    let murmur = partition_for_key(both.as_bytes(), 8);
    let crc = crc32_partition_for_key(both.as_bytes(), 8);
    assert_eq!(r.body["slot"], murmur, "{}", r.body);
    assert_eq!(r.body["value_i64"], 1, "{}", r.body);
    let slots: Vec<_> = r.body["matches"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| (m["slot"].as_u64(), m["value_i64"].as_i64()))
        .collect();
    assert_eq!(
        slots,
        vec![(Some(murmur as u64), Some(1)), (Some(crc as u64), Some(3))],
        "{}",
        r.body
    );
    let r = api
        .get(&format!(
            "/api/v1/pipelines/{name}/stores/counts/keys/{both}?slot={crc}"
        ))
        .await?;
    assert_eq!(r.body["value_i64"], 3, "{}", r.body);
    assert_eq!(r.body["matches"].as_array().map(Vec::len), Some(1));
    let r = api
        .get(&format!(
            "/api/v1/pipelines/{name}/stores/counts/keys/{both}?slot=99"
        ))
        .await?;
    assert_eq!(r.status, 400, "{}", r.body);
    host.stop().await
}

/// Input, two pipelines over it (word-count and uppercase), and what the test sent.
struct Flow {
    input: String,
    output: String,
    wc: String,
    up: String,
    sent: Arc<Mutex<Vec<(String, String)>>>,
}

/// Deploys word-count and uppercase built for `contract` ("0.2" or "0.1").
async fn deploy(api: &Api, guarantee: &str, contract: &str) -> anyhow::Result<Flow> {
    let flow = Flow {
        input: unique("in"),
        output: unique("out"),
        wc: unique("wc"),
        up: unique("up"),
        sent: Arc::new(Mutex::new(Vec::new())),
    };
    let suffix = if contract == "0.1" { "-v01" } else { "" };
    for plugin in ["word-count", "uppercase"] {
        let m = api
            .upload_plugin(&format!("{plugin}{suffix}"), plugin, "1")
            .await?;
        assert_eq!(m["wit"], format!("baton:processor@{contract}.0"), "{m}");
    }
    api.create_pipeline(json!({
        "name": flow.wc, "module": "word-count", "version": "1", "inputs": [flow.input],
        "stores": ["counts"], "slots": 8, "partitions": 3, "guarantee": guarantee
    }))
    .await?;
    api.create_pipeline(json!({
        "name": flow.up, "module": "uppercase", "version": "1", "inputs": [flow.input],
        "outputs": [flow.output], "slots": 8, "partitions": 2, "guarantee": guarantee,
        "config": {"output": flow.output}
    }))
    .await?;
    Ok(flow)
}

/// Sends chunks of records until `stop`; every record has a unique value.
fn produce_until(
    flow: &Flow,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    let (input, sent) = (flow.input.clone(), flow.sent.clone());
    tokio::spawn(async move {
        let producer = TestProducer::new()?;
        let keys = words(400_000, 2_000, 13);
        for (c, chunk) in keys.chunks(2_000).enumerate() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let recs: Vec<_> = chunk
                .iter()
                .enumerate()
                .map(|(i, k)| (k.clone(), format!("v{}-{i}", c)))
                .collect();
            producer.send(&input, 8, &recs).await?;
            sent.lock().await.extend(recs);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    })
}

/// Input records that may be processed again after the kills, per pipeline (wc, up): for each
/// kill, those between the group's offsets read just before it and the input's end just after.
#[derive(Debug, Default)]
struct Redo {
    wc: u64,
    up: u64,
}

/// The sum of the committed offsets over `topic` of `pipeline`'s group (`<cluster>.<pipeline>`)
/// of the host on `dir`.
fn committed_sum(dir: &std::path::Path, pipeline: &str, topic: &str) -> anyhow::Result<u64> {
    let group = format!("{}.{pipeline}", baton_tests::cluster_name(dir));
    Ok(baton_tests::group_offsets(&group, topic, 8)?.iter().sum())
}

/// Kills the host 3 times while records flow, each time while it makes progress; answers the
/// last host and what the kills may have had processed again.
async fn kill_three_times(
    dir: &std::path::Path,
    flags: &[&str],
    mut host: ChildHost,
    flow: &Flow,
) -> anyhow::Result<(ChildHost, Redo)> {
    let mut redo = Redo::default();
    let seed = baton_tests::test_seed("kill_three_times");
    for round in 0..3u64 {
        // Mid-stream: processing while records flow (a host that keeps up shows little lag).
        let before = std::sync::atomic::AtomicU64::new(u64::MAX);
        let (done, lag) = wait_for(
            "progress while records flow, before the kill",
            Duration::from_secs(120),
            || {
                let api = host.api.clone();
                let wc = flow.wc.clone();
                let before = &before;
                async move {
                    let parts = api.partitions().await?;
                    let mine: Vec<_> = parts
                        .iter()
                        .filter(|p| p["pipeline"] == wc.as_str())
                        .collect();
                    let done: u64 = mine
                        .iter()
                        .map(|p| p["records"].as_u64().unwrap_or(0))
                        .sum();
                    let lag: u64 = mine.iter().map(|p| p["lag"].as_u64().unwrap_or(0)).sum();
                    let moving = done > before.swap(done, std::sync::atomic::Ordering::Relaxed);
                    Ok((done > 1_000 && moving).then_some((done, lag)))
                }
            },
        )
        .await?;
        let (wc, up) = (
            committed_sum(dir, &flow.wc, &flow.input)?,
            committed_sum(dir, &flow.up, &flow.input)?,
        );
        baton_tests::kill9_at_random(host, seed, round, done, lag).await?;
        let end: u64 = baton_tests::end_offsets(&flow.input, 8)?.iter().sum();
        redo.wc += end.saturating_sub(wc);
        redo.up += end.saturating_sub(up);
        host = ChildHost::start(dir, flags).await?;
    }
    Ok((host, redo))
}

async fn wait_both(api: &Api, flow: &Flow, total: u64) -> anyhow::Result<()> {
    api.wait_caught_up(&flow.wc, total, Duration::from_secs(180))
        .await?;
    api.wait_caught_up(&flow.up, total, Duration::from_secs(180))
        .await
}

fn expected_outputs(sent: &[(String, String)]) -> BTreeMap<(String, String), usize> {
    multiset(
        sent.iter()
            .map(|(k, v)| (k.clone(), v.to_uppercase()))
            .collect(),
    )
}

/// The `baton` flags of the kill tests: Kafka, small batches so kills land between commits.
fn kill_flags(bootstrap: &str) -> [&str; 4] {
    ["--kafka", bootstrap, "--max-batch", "500"]
}

/// Starts a child host with both pipelines under `guarantee`, built for `contract`, produces
/// while killing it 3 times, then stops producing; returns the last host, the flow and every
/// record sent.
async fn run_with_three_kills(
    dir: &std::path::Path,
    guarantee: &str,
    contract: &str,
) -> anyhow::Result<(ChildHost, Flow, Vec<(String, String)>, Redo)> {
    let bootstrap = kafka_bootstrap();
    let flags = kill_flags(&bootstrap);
    let host = ChildHost::start(dir, &flags).await?;
    let flow = deploy(&host.api, guarantee, contract).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let producer = produce_until(&flow, stop.clone());
    let (host, redo) = kill_three_times(dir, &flags, host, &flow).await?;
    stop.store(true, Ordering::Relaxed);
    producer.await??;
    let sent = flow.sent.lock().await.clone();
    Ok((host, flow, sent, redo))
}

/// How many times each (key, value) occurs.
fn multiset(records: Vec<(String, String)>) -> BTreeMap<(String, String), usize> {
    let mut m = BTreeMap::new();
    for kv in records {
        *m.entry(kv).or_insert(0usize) += 1;
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_survives_three_kill_9_and_the_loss_of_the_data_dir() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let dir = tempfile::tempdir()?;
    let (host, flow, sent, _) = run_with_three_kills(dir.path(), "exactly-once", "0.2").await?;
    assert!(sent.len() >= 4_000, "only {} records were sent", sent.len());
    wait_both(&host.api, &flow, sent.len() as u64).await?;

    let expected = count(sent.iter().map(|(k, _)| k.as_str()));
    assert_counts(&host.api, &flow.wc, &expected).await?;
    // Each expected output record is in the output topic exactly once (read_committed).
    let out = read_committed(&flow.output, 8)?;
    let got = multiset(out);
    assert_eq!(got.len(), sent.len(), "distinct output records");
    assert_eq!(got, expected_outputs(&sent), "every output exactly once");

    // Lose the data dir: state comes back from the changelog, modules and pipelines from Kafka.
    host.terminate()?;
    std::fs::remove_dir_all(dir.path())?;
    let bootstrap = kafka_bootstrap();
    let host = ChildHost::start(dir.path(), &kill_flags(&bootstrap)).await?;
    wait_both(&host.api, &flow, sent.len() as u64).await?;
    // A new data dir is a new host id: the partitions come back here once the controller gives
    // them to it, and then restore.
    let me = host.api.get("/api/v1/host").await?.body["id"].clone();
    let parts = wait_for(
        "the partitions restored here",
        Duration::from_secs(60),
        || async {
            let parts = host.api.partitions().await?;
            let mine: Vec<_> = parts
                .iter()
                .filter(|p| p["pipeline"] == flow.wc.as_str())
                .collect();
            let done = !mine.is_empty()
                && mine.iter().all(|p| {
                    p["owner"] == me && p["state"] == "running" && p["restore"]["finished"] == true
                });
            Ok(done.then_some(parts))
        },
    )
    .await?;
    let restored: u64 = parts
        .iter()
        .filter(|p| p["pipeline"] == flow.wc.as_str())
        .map(|p| p["restore"]["done"].as_u64().unwrap_or(0))
        .sum();
    // Every key has at least one changelog record; batches write a key's last value once each.
    assert!(
        restored as usize >= expected.len(),
        "restored {restored} changelog records for {} keys",
        expected.len()
    );
    assert_counts(&host.api, &flow.wc, &expected).await?;
    host.terminate()
}

/// With components built for contract 0.1, which the host keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_loses_nothing_across_three_kill_9() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let dir = tempfile::tempdir()?;
    let (host, flow, sent, redo) = run_with_three_kills(dir.path(), "at-least-once", "0.1").await?;
    wait_both(&host.api, &flow, sent.len() as u64).await?;
    // Everything committed at last, under the group names the bounds were read with.
    let total = sent.len() as u64;
    wait_for(
        "both groups committed to the end",
        Duration::from_secs(60),
        || async {
            let done = committed_sum(dir.path(), &flow.wc, &flow.input)? == total
                && committed_sum(dir.path(), &flow.up, &flow.input)? == total;
            Ok(done.then_some(()))
        },
    )
    .await?;

    // Nothing lost; a record counted or written again only if it was after the last commit
    // before a kill.
    let expected = count(sent.iter().map(|(k, _)| k.as_str()));
    let mut counted_twice = 0u64;
    for (key, n) in &expected {
        let got = host
            .api
            .counter(&flow.wc, "counts", key)
            .await?
            .unwrap_or(0);
        assert!(got >= *n, "count of {key}: {got} < {n}: a record was lost");
        counted_twice += (got - n) as u64;
    }
    let out = read_committed(&flow.output, 8)?;
    let got = multiset(out);
    let want = expected_outputs(&sent);
    for kv in want.keys() {
        assert!(got.contains_key(kv), "output {kv:?} is missing");
    }
    assert!(
        got.keys().all(|kv| want.contains_key(kv)),
        "an output that no input record makes"
    );
    let outputs_twice: u64 = got.values().map(|n| (n - 1) as u64).sum();
    assert!(
        counted_twice <= redo.wc,
        "{counted_twice} counted twice, over the {} records after the last commits before the kills",
        redo.wc
    );
    assert!(
        outputs_twice <= redo.up,
        "{outputs_twice} outputs written twice, over the {} records after the last commits before \
         the kills",
        redo.up
    );
    host.terminate()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_is_survived_with_exact_counts() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let dir = tempfile::tempdir()?;
    let (host, name, input) = word_count_on_kafka(dir.path(), 8, 2).await?;
    let keys = words(60_000, 1_000, 21);
    let producer = TestProducer::new()?;
    let recs: Vec<_> = keys.iter().map(|k| (k.clone(), "1".to_string())).collect();
    producer.send(&input, 8, &recs[..30_000]).await?;
    // Restart the broker while baton works on the first half.
    tokio::task::spawn_blocking(|| kafka_script("stop").and_then(|_| kafka_script("start")))
        .await??;
    producer.send(&input, 8, &recs[30_000..]).await?;
    host.api
        .wait_caught_up(&name, 60_000, Duration::from_secs(240))
        .await?;
    assert_counts(&host.api, &name, &count(keys.iter().map(String::as_str))).await?;
    host.stop().await
}

/// An input consumer that stops delivering without an error (as librdkafka's assigned
/// consumers have been seen to after a broker restart) is noticed: the session fails with a
/// reason naming the slot, a new one makes new clients, and the counts stay exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_consumer_that_stops_delivering_is_made_again() -> anyhow::Result<()> {
    let _k = kafka_shared().await;
    let dir = tempfile::tempdir()?;
    let (host, name, input) = word_count_on_kafka_configured(dir.path(), 2, 1, |c| {
        if let Some(k) = c.kafka.as_mut() {
            k.input_stall = Some(Duration::from_secs(2));
        }
    })
    .await?;
    let producer = TestProducer::new()?;
    let keys = words(4_000, 200, 31);
    let recs: Vec<_> = keys.iter().map(|k| (k.clone(), "1".to_string())).collect();
    producer.send(&input, 2, &recs[..2_000]).await?;
    host.api
        .wait_caught_up(&name, 2_000, Duration::from_secs(60))
        .await?;

    let stalled = host.baton.steps().inject(baton::steps::INPUT_STALL, None);
    producer.send(&input, 2, &recs[2_000..]).await?;
    let error = wait_for(
        "the stalled consumer noticed",
        Duration::from_secs(60),
        || async {
            let parts = host.api.partitions().await?;
            Ok(parts
                .iter()
                .filter(|p| p["pipeline"] == name.as_str())
                .find_map(|p| p["last_error"].as_str().map(str::to_string)))
        },
    )
    .await?;
    assert!(
        error.contains("delivered nothing") && error.contains(&input),
        "{error}"
    );
    drop(stalled);
    host.api
        .wait_caught_up(&name, 4_000, Duration::from_secs(60))
        .await?;
    assert_counts(&host.api, &name, &count(keys.iter().map(String::as_str))).await?;
    host.stop().await
}

/// A commit that never returns (librdkafka's `send_offsets_to_transaction` can wait for ever
/// for a group coordinator it lost after a broker restart; here a hold at the commit's first
/// step stands in for it) is given up after the commit bound: the session fails with a reason
/// naming it, the next one makes new clients (whose producer fences the stuck one), nothing the
/// stuck commit does later reaches RocksDB, and the counts stay exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_never_returns_is_given_up() -> anyhow::Result<()> {
    let _k = kafka_shared().await;
    let dir = tempfile::tempdir()?;
    let (host, name, input) = word_count_on_kafka_configured(dir.path(), 2, 1, |c| {
        if let Some(k) = c.kafka.as_mut() {
            k.commit_hang = Some(Duration::from_secs(3));
        }
    })
    .await?;
    let producer = TestProducer::new()?;
    let keys = words(4_000, 200, 41);
    let recs: Vec<_> = keys.iter().map(|k| (k.clone(), "1".to_string())).collect();
    producer.send(&input, 2, &recs[..2_000]).await?;
    host.api
        .wait_caught_up(&name, 2_000, Duration::from_secs(60))
        .await?;

    let stuck = host.baton.steps().hold(baton::steps::COMMIT_SEND, None);
    producer.send(&input, 2, &recs[2_000..]).await?;
    let error = wait_for(
        "the stuck commit given up",
        Duration::from_secs(60),
        || async {
            let parts = host.api.partitions().await?;
            Ok(parts
                .iter()
                .filter(|p| p["pipeline"] == name.as_str())
                .find_map(|p| p["last_error"].as_str().map(str::to_string))
                .filter(|e| e.contains("did not finish within")))
        },
    )
    .await?;
    assert!(error.contains("given up"), "{error}");
    drop(stuck);
    host.api
        .wait_caught_up(&name, 4_000, Duration::from_secs(60))
        .await?;
    assert_counts(&host.api, &name, &count(keys.iter().map(String::as_str))).await?;
    host.stop().await
}

/// A new pipeline whose changelog topic already holds records (left by an earlier pipeline of
/// the same name) is refused instead of starting from someone else's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_pipeline_refuses_a_changelog_with_records() -> anyhow::Result<()> {
    let _k = kafka_shared().await;
    let dir = tempfile::tempdir()?;
    let host = InProcess::start_with(dir.path(), Some(&kafka_bootstrap())).await?;
    let (name, input) = (unique("wc"), unique("words"));
    let changelog = format!("{}.{name}.counts.changelog", host.baton.config().cluster);
    let admin = KafkaAdmin::new(&kafka_bootstrap(), &[])?;
    admin
        .ensure_topic(&changelog, 2, 1, &[("cleanup.policy", "compact")])
        .await?;
    TestProducer::new()?
        .send(&changelog, 2, &[("w1".into(), "stale".into())])
        .await?;
    host.api
        .upload_plugin("word-count", "word-count", "1")
        .await?;
    let r = host
        .api
        .post_json(
            "/api/v1/pipelines",
            &json!({
                "name": name, "module": "word-count", "version": "1", "inputs": [input],
                "stores": ["counts"], "slots": 2
            }),
        )
        .await?;
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(
        r.error().contains(&changelog) && r.error().contains("already holds records"),
        "{}",
        r.error()
    );
    assert_eq!(host.api.get("/api/v1/pipelines").await?.body, json!([]));
    host.stop().await
}

/// Topics baton creates get the replication factor asked for (the broker's default otherwise),
/// and its own topics `min.insync.replicas`; a factor the cluster cannot meet is refused with a
/// clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_topics_are_replicated_as_configured() -> anyhow::Result<()> {
    let _k = kafka_shared().await;
    let dir = tempfile::tempdir()?;
    let (host, name, input) = word_count_on_kafka(dir.path(), 2, 1).await?;
    let admin = KafkaAdmin::new(&kafka_bootstrap(), &[])?;
    let cluster = host.baton.config().cluster.clone();
    for internal in [
        format!("{cluster}.control"),
        format!("{cluster}.modules"),
        format!("{cluster}.{name}.counts.changelog"),
        format!("{cluster}.{name}.dlq"),
    ] {
        let o = admin.topic_overrides(&internal)?;
        // One broker: min(2, replication factor 1) = 1.
        assert_eq!(
            o.get("min.insync.replicas").map(String::as_str),
            Some("1"),
            "{internal}: {o:?}"
        );
    }
    let o = admin.topic_overrides(&input)?;
    assert!(!o.contains_key("min.insync.replicas"), "{input}: {o:?}");
    host.stop().await?;

    // Two replicas on a one-broker cluster: refused before anything is created.
    let dir = tempfile::tempdir()?;
    let refused = InProcess::start_configured(dir.path(), Some(&kafka_bootstrap()), |c| {
        if let Some(k) = c.kafka.as_mut() {
            k.replication_factor = Some(2);
        }
    })
    .await;
    let e = format!(
        "{:#}",
        refused.err().expect("a replication factor of 2 is refused")
    );
    assert!(e.to_lowercase().contains("replication"), "{e}");
    let dir = tempfile::tempdir()?;
    let refused = InProcess::start_configured(dir.path(), Some(&kafka_bootstrap()), |c| {
        if let Some(k) = c.kafka.as_mut() {
            k.min_insync_replicas = Some(2);
        }
    })
    .await;
    let e = format!(
        "{:#}",
        refused
            .err()
            .expect("min.insync.replicas 2 > RF 1 is refused")
    );
    assert!(e.contains("--min-insync-replicas 2"), "{e}");
    Ok(())
}

/// A changelog that is not compacted loses keys on restore: a new pipeline refuses one that
/// exists with another policy, and a running pipeline whose changelog was changed stops with
/// the reason instead of running on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changelog_that_is_not_compacted_is_refused() -> anyhow::Result<()> {
    let _k = kafka_shared().await;
    let dir = tempfile::tempdir()?;
    let host = InProcess::start_with(dir.path(), Some(&kafka_bootstrap())).await?;
    let api = &host.api;
    api.upload_plugin("word-count", "word-count", "1").await?;
    let admin = KafkaAdmin::new(&kafka_bootstrap(), &[])?;
    let cluster = host.baton.config().cluster.clone();
    let (name, input) = (unique("wc"), unique("words"));
    let changelog = format!("{cluster}.{name}.counts.changelog");
    admin
        .ensure_topic(&changelog, 2, 1, &[("cleanup.policy", "delete")])
        .await?;
    let spec = json!({
        "name": name, "module": "word-count", "version": "1", "inputs": [input],
        "stores": ["counts"], "slots": 2
    });
    let r = api.post_json("/api/v1/pipelines", &spec).await?;
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(
        r.error().contains(&changelog) && r.error().contains("cleanup.policy=delete"),
        "{}",
        r.error()
    );

    // A running pipeline whose changelog's policy is changed behind its back.
    let (name, input) = (unique("wc"), unique("words"));
    api.create_pipeline(json!({
        "name": name, "module": "word-count", "version": "1", "inputs": [input],
        "stores": ["counts"], "slots": 2
    }))
    .await?;
    TestProducer::new()?
        .send(&input, 2, &[("a".into(), "1".into())])
        .await?;
    api.wait_caught_up(&name, 1, Duration::from_secs(60))
        .await?;
    host.stop().await?;
    let changelog = format!("{cluster}.{name}.counts.changelog");
    admin.set_topic_configs(&changelog, &[("cleanup.policy", "delete")])?;
    let host = InProcess::start_with(dir.path(), Some(&kafka_bootstrap())).await?;
    let part = wait_for("the partition to fail", Duration::from_secs(60), || async {
        let parts = host.api.partitions().await?;
        Ok(parts
            .into_iter()
            .find(|p| p["pipeline"] == name.as_str() && p["state"] == "failed"))
    })
    .await?;
    let error = part["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&changelog) && error.contains("cleanup.policy=compact"),
        "{error}"
    );
    host.stop().await
}

/// State ahead of its changelog (the changelog was deleted and recreated, or truncated) is
/// wiped and restored from the changelog, as Kafka Streams does; stale counts never come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_ahead_of_a_recreated_changelog_is_wiped_and_restored() -> anyhow::Result<()> {
    let _k = kafka_shared().await;
    let dir = tempfile::tempdir()?;
    let (host, name, input) = word_count_on_kafka(dir.path(), 2, 1).await?;
    let producer = TestProducer::new()?;
    let old: Vec<_> = (0..100)
        .map(|i| (format!("old-{}", i % 10), "1".to_string()))
        .collect();
    producer.send(&input, 2, &old).await?;
    host.api
        .wait_caught_up(&name, 100, Duration::from_secs(60))
        .await?;
    assert_eq!(host.api.counter(&name, "counts", "old-3").await?, Some(10));
    let changelog = format!("{}.{name}.counts.changelog", host.baton.config().cluster);
    host.stop().await?;

    let admin = KafkaAdmin::new(&kafka_bootstrap(), &[])?;
    admin.delete_topics(&[&changelog]).await?;
    // Deletion completes in the background: retry the creation until the name is free.
    wait_for(
        "the changelog to be recreated",
        Duration::from_secs(60),
        || {
            let (admin, changelog) = (&admin, &changelog);
            async move {
                Ok(admin
                    .ensure_topic(changelog, 2, 1, &[("cleanup.policy", "compact")])
                    .await
                    .ok()
                    .filter(|created| *created))
            }
        },
    )
    .await?;

    let host = InProcess::start_with(dir.path(), Some(&kafka_bootstrap())).await?;
    let new: Vec<_> = (0..30)
        .map(|i| (format!("old-{}", i % 3), "1".to_string()))
        .collect();
    producer.send(&input, 2, &new).await?;
    host.api
        .wait_caught_up(&name, 130, Duration::from_secs(60))
        .await?;
    // The state restored from the (empty) new changelog, then counted the new records only.
    assert_eq!(host.api.counter(&name, "counts", "old-0").await?, Some(10));
    assert_eq!(host.api.counter(&name, "counts", "old-3").await?, None);
    host.stop().await
}
