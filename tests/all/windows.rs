//! Time in contract 0.2: windowed-count over the embedded log, against a model computed here.
//! Records arrive out of order and late; the host is stopped and opened again mid-window, so
//! pending timers and each slot's event time must come back from state. Every closed window is
//! sent exactly once with its exact count, late records go to the late topic, and open windows
//! are not sent.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use baton::transport::partitioner::partition_for_key;
use baton_tests::{
    ChildHost, InProcess, TestProducer, kafka_bootstrap, kafka_lock, read_committed, unique,
    wait_for, words,
};
use serde_json::{Value, json};

const WINDOW: i64 = 1_000;
const GRACE: i64 = 300;

/// Input records: (key, value, timestamp), time moving forward with jitter and some very late;
/// the second half starts with a run of very late records, which only a slot's event time
/// brought back from state recognises as late.
fn input(n: usize) -> Vec<(String, String, i64)> {
    let keys = words(n, 30, 17);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    keys.into_iter()
        .enumerate()
        .map(|(i, k)| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let base = baton_tests::recent_base() + (i as i64) * 7;
            let ts = match x % 20 {
                _ if (n / 2..n / 2 + 200).contains(&i) => base - 4_000,
                0 => base - 4_000,                // very late: its window closed
                1..=5 => base - (x % 900) as i64, // out of order, mostly still open
                _ => base,
            };
            (k, format!("v{i}"), ts)
        })
        .collect()
}

/// A closed window: key, start, count.
type Window = (String, i64, i64);

/// What windowed-count must have sent, per slot in offset order: the closed windows and the
/// late records (key, value).
fn model(
    per_slot: &BTreeMap<u32, Vec<(String, String, i64)>>,
) -> (BTreeSet<Window>, BTreeSet<(String, String)>) {
    let (mut closed, mut late) = (BTreeSet::new(), BTreeSet::new());
    for records in per_slot.values() {
        let mut event_time = i64::MIN;
        let mut open: BTreeMap<(String, i64), i64> = BTreeMap::new();
        for (k, v, ts) in records {
            event_time = event_time.max(*ts);
            let start = ts.div_euclid(WINDOW) * WINDOW;
            if event_time >= start + WINDOW + GRACE {
                late.insert((k.clone(), v.clone()));
                continue;
            }
            *open.entry((k.clone(), start)).or_insert(0) += 1;
        }
        for ((k, start), n) in open {
            if event_time >= start + WINDOW + GRACE {
                closed.insert((k, start, n));
            }
        }
    }
    (closed, late)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windowed_counts_are_exact_and_each_window_is_sent_once_across_a_restart()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut host = InProcess::start(dir.path()).await?;
    host.api
        .upload_plugin("windowed-count", "windowed-count", "1")
        .await?;
    host.api
        .create_pipeline(json!({
            "name": "wc", "module": "windowed-count", "version": "1", "inputs": ["events"],
            "outputs": ["counts", "late"], "stores": ["windows"], "slots": 4, "partitions": 2,
            "config": {"window_ms": WINDOW, "grace_ms": GRACE, "output": "counts", "late": "late"}
        }))
        .await?;

    let records = input(8_000);
    let mut per_slot: BTreeMap<u32, Vec<(String, String, i64)>> = BTreeMap::new();
    let halves = records.chunks(records.len() / 2).collect::<Vec<_>>();
    for (h, half) in halves.iter().enumerate() {
        for chunk in half.chunks(500) {
            let body: Vec<Value> = chunk
                .iter()
                .map(|(k, v, ts)| json!({"key": k, "value": v, "timestamp": ts}))
                .collect();
            let r = host
                .api
                .post_json("/api/v1/topics/events/records", &Value::Array(body))
                .await?;
            assert_eq!(r.status, 200, "{r:?}");
            for (rec, placed) in chunk.iter().zip(r.body.as_array().unwrap()) {
                let slot = placed["slot"].as_u64().unwrap() as u32;
                per_slot.entry(slot).or_default().push(rec.clone());
            }
        }
        let sent: usize = per_slot.values().map(Vec::len).sum();
        host.api
            .wait_caught_up("wc", sent as u64, Duration::from_secs(120))
            .await?;
        if h == 0 {
            // Windows are open and timers pending: they must survive the host going away.
            host.stop().await?;
            host = InProcess::start(dir.path()).await?;
        }
    }
    let (closed, late) = model(&per_slot);
    assert!(
        closed.len() > 100 && late.len() > 100,
        "{} closed, {} late",
        closed.len(),
        late.len()
    );

    let sent_counts = host.api.read_topic("counts", 4).await?;
    let mut got = BTreeMap::new();
    for r in &sent_counts {
        let v: Value = serde_json::from_str(r.value.as_deref().unwrap_or("null"))?;
        let start = v["start"].as_i64().unwrap();
        assert_eq!(v["end"].as_i64(), Some(start + WINDOW), "{v}");
        let w = (r.key.clone().unwrap(), start, v["count"].as_i64().unwrap());
        *got.entry(w).or_insert(0usize) += 1;
    }
    let twice: Vec<_> = got.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "windows sent more than once: {twice:?}");
    let got: BTreeSet<_> = got.into_keys().collect();
    assert_eq!(got, closed, "the closed windows and their counts");

    let late_sent: BTreeSet<_> = host
        .api
        .read_topic("late", 4)
        .await?
        .into_iter()
        .map(|r| (r.key.unwrap(), r.value.unwrap()))
        .collect();
    assert_eq!(late_sent, late, "the late records");
    host.stop().await
}

/// The window a `counts` record names, checking its shape.
fn window_of(key: &str, value: &str) -> anyhow::Result<Window> {
    let v: Value = serde_json::from_str(value)?;
    let start = v["start"].as_i64().unwrap();
    anyhow::ensure!(v["end"].as_i64() == Some(start + WINDOW), "{v}");
    Ok((key.to_string(), start, v["count"].as_i64().unwrap()))
}

/// Processed and waiting records of `pipeline`'s partitions.
async fn progress(api: &baton_tests::Api, pipeline: &str) -> anyhow::Result<(u64, u64)> {
    let parts = api.partitions().await?;
    let mine = parts.iter().filter(|p| p["pipeline"] == pipeline);
    Ok(mine.fold((0, 0), |(d, l), p| {
        (
            d + p["records"].as_u64().unwrap_or(0),
            l + p["lag"].as_u64().unwrap_or(0),
        )
    }))
}

/// windowed-count on Kafka under exactly-once, killed with -9 three times while records flow,
/// then started again on an empty data dir: timers and event time come back from the
/// changelog. Records that move time far ahead close every window at the end: each one is sent
/// exactly once (read_committed) with its exact count, and every late record once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_each_window_is_sent_once_across_kill_9_and_a_restore() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let dir = tempfile::tempdir()?;
    let bootstrap = kafka_bootstrap();
    let flags = ["--kafka", bootstrap.as_str(), "--max-batch", "500"];
    let mut host = ChildHost::start(dir.path(), &flags).await?;
    let (name, topic, output, late) = (
        unique("win"),
        unique("ev"),
        unique("counts"),
        unique("late"),
    );
    host.api
        .upload_plugin("windowed-count", "windowed-count", "1")
        .await?;
    host.api
        .create_pipeline(json!({
            "name": name, "module": "windowed-count", "version": "1", "inputs": [topic],
            "outputs": [output, late], "stores": ["windows"], "slots": 4, "partitions": 2,
            "guarantee": "exactly-once",
            "config": {"window_ms": WINDOW, "grace_ms": GRACE, "output": output, "late": late}
        }))
        .await?;

    // A producer in the background, chunk by chunk; records keep their order per slot.
    // More than the test can send before it stops the producer: input never runs dry between
    // kills, whatever the speed of the restarts.
    let records = input(400_000);
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (topic, stop, records) = (topic.clone(), stop.clone(), records.clone());
        tokio::spawn(async move {
            let producer = TestProducer::new()?;
            let mut sent = 0;
            for chunk in records.chunks(1_000) {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                producer.send_timed(&topic, 4, chunk).await?;
                sent += chunk.len();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(sent)
        })
    };
    let seed = baton_tests::test_seed("windows_kill_three_times");
    for round in 0..3u64 {
        // Mid-stream: processing while records flow (a host that keeps up shows little lag).
        let before = std::sync::atomic::AtomicU64::new(u64::MAX);
        let (done, lag) = wait_for(
            "progress while records flow",
            Duration::from_secs(120),
            || {
                let (api, name, before) = (host.api.clone(), name.clone(), &before);
                async move {
                    let (done, lag) = progress(&api, &name).await?;
                    let moving = done > before.swap(done, Ordering::Relaxed);
                    Ok((done > 1_000 && moving).then_some((done, lag)))
                }
            },
        )
        .await?;
        baton_tests::kill9_at_random(host, seed, round, done, lag).await?;
        host = ChildHost::start(dir.path(), &flags).await?;
    }
    stop.store(true, Ordering::Relaxed);
    let mut sent = records[..producer.await??].to_vec();
    host.api
        .wait_caught_up(&name, sent.len() as u64, Duration::from_secs(180))
        .await?;

    // Lose the data dir: state, timers and event time come back from the changelogs.
    host.terminate()?;
    std::fs::remove_dir_all(dir.path())?;
    let host = ChildHost::start(dir.path(), &flags).await?;
    host.api
        .wait_caught_up(&name, sent.len() as u64, Duration::from_secs(180))
        .await?;
    // Time moves far ahead in every slot: every window closes.
    let last = sent.iter().map(|r| r.2).max().unwrap_or(0);
    let mut flush = Vec::new();
    for i in 0.. {
        let k = format!("flush-{i}");
        let slot = partition_for_key(k.as_bytes(), 4);
        if !flush
            .iter()
            .any(|(f, _, _): &(String, String, i64)| partition_for_key(f.as_bytes(), 4) == slot)
        {
            flush.push((k, "flush".to_string(), last + 100 * WINDOW));
        }
        if flush.len() == 4 {
            break;
        }
    }
    TestProducer::new()?.send_timed(&topic, 4, &flush).await?;
    sent.extend(flush);
    host.api
        .wait_caught_up(&name, sent.len() as u64, Duration::from_secs(180))
        .await?;

    let mut per_slot: BTreeMap<u32, Vec<(String, String, i64)>> = BTreeMap::new();
    for r in &sent {
        per_slot
            .entry(partition_for_key(r.0.as_bytes(), 4))
            .or_default()
            .push(r.clone());
    }
    let (closed, late_want) = model(&per_slot);
    let mut got: BTreeMap<Window, usize> = BTreeMap::new();
    for (k, v) in read_committed(&output, 4)? {
        *got.entry(window_of(&k, &v)?).or_default() += 1;
    }
    let twice: Vec<_> = got.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "windows sent more than once: {twice:?}");
    let got: BTreeSet<_> = got.into_keys().collect();
    assert_eq!(got.len(), closed.len(), "how many windows closed");
    assert_eq!(got, closed, "the closed windows and their counts");
    let mut late_got: BTreeMap<(String, String), usize> = BTreeMap::new();
    for kv in read_committed(&late, 4)? {
        *late_got.entry(kv).or_default() += 1;
    }
    assert!(
        late_got.values().all(|n| *n == 1),
        "a late record sent twice"
    );
    assert_eq!(
        late_got.into_keys().collect::<BTreeSet<_>>(),
        late_want,
        "the late records"
    );
    host.terminate()
}

/// A swap to a version built for contract 0.1 (which has no timers) leaves the timers pending,
/// and says so; after the swap back to 0.2 they fire, each window once. (windowed-count keeps
/// one timer per window and slot.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_wait_out_a_0_1_version_and_fire_after_the_swap_back() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    let api = &host.api;
    api.upload_plugin("windowed-count", "windowed-count", "1")
        .await?;
    api.upload_bytes(
        baton_tests::plugin_bytes("word-count-v01"),
        "windowed-count",
        "2",
    )
    .await?;
    api.create_pipeline(json!({
        "name": "w", "module": "windowed-count", "version": "1", "inputs": ["ev"],
        "outputs": ["out", "late"], "stores": ["windows", "counts"], "slots": 2,
        "config": {"window_ms": WINDOW, "grace_ms": GRACE, "output": "out", "late": "late"}
    }))
    .await?;
    // Produces; returns the slots the records went to.
    let produce = |records: Vec<Value>| async move {
        let r = api
            .post_json("/api/v1/topics/ev/records", &Value::Array(records))
            .await?;
        anyhow::ensure!(r.status == 200, "{r:?}");
        let slots: BTreeSet<u64> = r
            .body
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["slot"].as_u64())
            .collect();
        anyhow::Ok(slots)
    };
    // Ten keys, each with records in one window that stays open.
    let base = baton_tests::recent_base();
    let first: Vec<Value> = (0..30)
        .map(|i| json!({"key": format!("k{}", i % 10), "value": "x", "timestamp": base + i}))
        .collect();
    // One window, open in each slot the keys went to: one timer each.
    let slots = produce(first).await?;
    api.wait_caught_up("w", 30, Duration::from_secs(30)).await?;

    let swap = |v: &'static str| async move {
        let r = api
            .put_json("/api/v1/pipelines/w/module", &json!({ "version": v }))
            .await?;
        anyhow::ensure!(r.status == 200 && r.body["outcome"] == "swapped", "{r:?}");
        anyhow::Ok(r.body)
    };
    let answer = swap("2").await?;
    let warning = answer["warnings"][0].as_str().unwrap_or_default();
    assert!(
        warning.starts_with(&format!("{} timers are pending", slots.len()))
            && warning.contains("0.1.0"),
        "{answer}"
    );
    // Time moves past every window's close under 0.1: nothing fires.
    let later: Vec<Value> = (0..10)
        .map(|i| json!({"key": format!("k{i}"), "value": "y", "timestamp": base + 10 * WINDOW}))
        .collect();
    produce(later).await?;
    api.wait_caught_up("w", 40, Duration::from_secs(30)).await?;
    assert!(
        api.read_topic("out", 2).await?.is_empty(),
        "a timer fired under 0.1"
    );

    let answer = swap("1").await?;
    assert!(answer.get("warnings").is_none(), "{answer}");
    let out = wait_for("the windows", Duration::from_secs(30), || async {
        let out = api.read_topic("out", 2).await?;
        Ok((out.len() >= 10).then_some(out))
    })
    .await?;
    let got: BTreeSet<Window> = out
        .iter()
        .map(|r| window_of(r.key.as_deref().unwrap(), r.value.as_deref().unwrap()))
        .collect::<anyhow::Result<_>>()?;
    let start = base.div_euclid(WINDOW) * WINDOW;
    let want: BTreeSet<Window> = (0..10).map(|k| (format!("k{k}"), start, 3)).collect();
    assert_eq!(out.len(), 10, "each window once");
    assert_eq!(got, want);
    host.stop().await
}
