//! Timers of contract 0.2 beyond windows: processing-time timers that fire on the wall clock
//! while the partition is idle (remind), and event-time sessions closed by timers
//! (session-count), against a model.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use baton_tests::{InProcess, wait_for, words};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processing_time_timers_fire_on_the_wall_clock_in_an_idle_partition() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    let api = &host.api;
    api.upload_plugin("remind", "remind", "1").await?;
    api.create_pipeline(json!({
        "name": "r", "module": "remind", "version": "1", "inputs": ["todo"],
        "outputs": ["due"], "slots": 2, "config": {"delay_ms": 1500, "output": "due"}
    }))
    .await?;
    let records: Vec<Value> = (0..20)
        .map(|i| json!({"key": format!("task{i}"), "value": format!("do {i}")}))
        .collect();
    let sent = Instant::now();
    let r = api
        .post_json("/api/v1/topics/todo/records", &Value::Array(records))
        .await?;
    assert_eq!(r.status, 200, "{r:?}");
    // No more input: the partition is idle when the timers fall due.
    let due = wait_for("20 reminders", Duration::from_secs(30), || async {
        let due = api.read_topic("due", 2).await?;
        Ok((due.len() >= 20).then_some(due))
    })
    .await?;
    assert!(
        sent.elapsed() >= Duration::from_millis(1500),
        "reminders came {:?} after the records, before their delay",
        sent.elapsed()
    );
    let got: BTreeMap<String, String> = due
        .into_iter()
        .map(|r| (r.key.unwrap(), r.value.unwrap()))
        .collect();
    let want: BTreeMap<String, String> = (0..20)
        .map(|i| (format!("task{i}"), format!("do {i}")))
        .collect();
    assert_eq!(got, want);
    host.stop().await
}

const GAP: i64 = 500;

/// Sessions session-count must have sent, given each slot's records in offset order: a
/// record joins (and merges) the key's sessions it is less than a gap from that are still open
/// at the slot's event time, and is dropped when its session would already have closed.
fn sessions(
    per_slot: &BTreeMap<u32, Vec<(String, i64)>>,
) -> BTreeMap<(String, i64, i64, i64), usize> {
    let mut sent = BTreeMap::new();
    for records in per_slot.values() {
        let mut now = i64::MIN;
        let mut all: BTreeMap<String, Vec<(i64, i64, i64)>> = BTreeMap::new();
        for (k, ts) in records {
            now = now.max(*ts);
            let list = all.entry(k.clone()).or_default();
            let (mut s, mut e, mut n) = (*ts, *ts, 1);
            let mut rest = Vec::new();
            for (a, b, c) in list.drain(..) {
                if a - GAP < *ts && *ts < b + GAP && now < b + GAP {
                    (s, e, n) = (s.min(a), e.max(b), n + c);
                } else {
                    rest.push((a, b, c));
                }
            }
            if now < e + GAP {
                rest.push((s, e, n));
            }
            *list = rest;
        }
        for (k, list) in all {
            for (s, e, n) in list {
                if now >= e + GAP {
                    *sent.entry((k.clone(), s, e, n)).or_default() += 1;
                }
            }
        }
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_close_after_their_gap_with_exact_counts() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    let api = &host.api;
    api.upload_plugin("session-count", "session-count", "1")
        .await?;
    api.create_pipeline(json!({
        "name": "s", "module": "session-count", "version": "1", "inputs": ["clicks"],
        "outputs": ["sessions"], "stores": ["sessions"], "slots": 2, "partitions": 2,
        "config": {"gap_ms": GAP, "output": "sessions"}
    }))
    .await?;
    // Bursts of activity per key with pauses longer than the gap between some of them.
    let keys = words(6_000, 40, 3);
    let mut t = 1_700_000_000_000i64;
    let mut per_slot: BTreeMap<u32, Vec<(String, i64)>> = BTreeMap::new();
    for (c, chunk) in keys.chunks(500).enumerate() {
        let body: Vec<Value> = chunk
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let n = c * 500 + i;
                t += if n % 97 == 0 { 3 * GAP } else { 3 };
                // Some records out of order: a little (they join or grow a session backwards)
                // or a lot (late, or a session of their own between others).
                let ts = match n % 101 {
                    0 => t - 4 * GAP,
                    x if x % 7 == 0 => t - 300,
                    _ => t,
                };
                json!({"key": k, "value": "c", "timestamp": ts})
            })
            .collect();
        let r = api
            .post_json("/api/v1/topics/clicks/records", &Value::Array(body.clone()))
            .await?;
        assert_eq!(r.status, 200, "{r:?}");
        for (rec, placed) in body.iter().zip(r.body.as_array().unwrap()) {
            per_slot
                .entry(placed["slot"].as_u64().unwrap() as u32)
                .or_default()
                .push((
                    rec["key"].as_str().unwrap().to_string(),
                    rec["timestamp"].as_i64().unwrap(),
                ));
        }
    }
    api.wait_caught_up("s", keys.len() as u64, Duration::from_secs(60))
        .await?;
    let want = sessions(&per_slot);
    assert!(want.len() > 100, "only {} sessions", want.len());
    let mut got: BTreeMap<(String, i64, i64, i64), usize> = BTreeMap::new();
    for r in api.read_topic("sessions", 2).await? {
        let v: Value = serde_json::from_str(r.value.as_deref().unwrap_or("null"))?;
        let s = (
            r.key.unwrap(),
            v["start"].as_i64().unwrap(),
            v["end"].as_i64().unwrap(),
            v["count"].as_i64().unwrap(),
        );
        *got.entry(s).or_default() += 1;
    }
    assert_eq!(got, want);
    host.stop().await
}
