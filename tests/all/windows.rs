//! Time in contract 0.2: windowed-count over the embedded log, against a model computed here.
//! Records arrive out of order and late; the host is stopped and opened again mid-window, so
//! pending timers and each slot's event time must come back from state. Every closed window is
//! sent exactly once with its exact count, late records go to the late topic, and open windows
//! are not sent.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use baton_tests::{InProcess, words};
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
            let base = 1_700_000_000_000 + (i as i64) * 7;
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
