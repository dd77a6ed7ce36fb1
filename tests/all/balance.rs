//! Auto-balance on a skewed workload: one hot range of two slots. The balancer splits (or
//! moves) the hot partition, says why with the numbers, and then leaves it alone while the skew
//! holds: nothing merged back, at most one decision per partition per cooldown. Counts exact.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use baton_tests::{cluster_name, count_at, kafka_lock, member, wait_alive, wait_for};
use serde_json::{Value, json};

/// The balancer's decisions as `api` answers them (the controller's log).
async fn decisions(api: &baton_tests::Api) -> anyhow::Result<Vec<Value>> {
    let r = api.get("/api/v1/balancer/log").await?;
    anyhow::ensure!(r.status == 200, "{r:?}");
    Ok(r.body.as_array().cloned().unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hot_range_is_split_or_moved_with_its_reason_and_nothing_flaps() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
    // How long the skew is held after the first decision (the default run is short).
    let hold = Duration::from_secs(
        std::env::var("BATON_TEST_BALANCE_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(60),
    );
    let cooldown_s = 20u64;
    let dirs: Vec<_> = (0..3)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let cluster = cluster_name(dirs[0].path());
    let mut hosts = Vec::new();
    for (dir, id) in dirs.iter().zip(["a", "b", "c"]) {
        hosts.push(member(dir.path(), &cluster, id).await?);
    }
    let apis: Vec<baton_tests::Api> = hosts.iter().map(|h| h.api.clone()).collect();
    for api in &apis {
        wait_alive(api, 3).await?;
    }
    let input = baton_tests::unique("bal-in");
    apis[0]
        .upload_plugin("word-count", "word-count", "1")
        .await?;
    let r = apis[0]
        .post_json(
            "/api/v1/pipelines",
            &json!({
                "name": "wc", "module": "word-count", "version": "1", "inputs": [input],
                "stores": ["counts"], "slots": 8, "partitions": 2, "guarantee": "exactly-once",
                "balance": {"enabled": true, "split_records_per_s": 500.0,
                            "merge_records_per_s": 20.0, "cooldown_s": cooldown_s,
                            "window_s": 4}
            }),
        )
        .await?;
    anyhow::ensure!(r.status == 201 || r.status == 200, "{r:?}");
    wait_for(
        "both partitions running",
        Duration::from_secs(60),
        || async {
            let ps = apis[0].partitions().await?;
            Ok((ps.len() == 2 && ps.iter().all(|p| p["state"] == "running")).then_some(()))
        },
    )
    .await?;
    // A setting out of range is refused by name.
    let r = apis[1]
        .send_with_token(
            reqwest::Method::PATCH,
            "/api/v1/pipelines/wc",
            Some(&json!({"balance": {"enabled": true, "window_s": 0}})),
            None,
        )
        .await?;
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.error().contains("window_s"), "{r:?}");

    // Hot keys in slots 0 and 1 (wc-0 holds 0..4), about 1,200 records/s; a trickle over every
    // slot, about 240 records/s (30 a slot, above merge_records_per_s).
    let hot: Vec<String> = (0..)
        .map(|i| format!("hot{i}"))
        .filter(|k| baton::partitioner::partition_for_key(k.as_bytes(), 8) < 2)
        .take(50)
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let flow = {
        let (stop, input, hot) = (stop.clone(), input.clone(), hot.clone());
        tokio::spawn(async move {
            let producer = baton_tests::TestProducer::new()?;
            let mut sent: Vec<String> = Vec::new();
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut recs: Vec<(String, String)> = (0..60)
                    .map(|i| {
                        (
                            hot[(round as usize * 60 + i) % hot.len()].clone(),
                            "x".into(),
                        )
                    })
                    .collect();
                recs.extend(
                    baton_tests::words(12, 200, 500 + round)
                        .into_iter()
                        .map(|k| (k, "x".to_string())),
                );
                producer.send(&input, 8, &recs).await?;
                sent.extend(recs.into_iter().map(|(k, _)| k));
                round += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(sent)
        })
    };

    // The first decision is about the hot partition, with its reason and inputs.
    let first = wait_for(
        "the balancer's first decision",
        Duration::from_secs(90),
        || async { Ok(decisions(&apis[2]).await?.first().cloned()) },
    )
    .await?;
    eprintln!("first decision: {first}");
    assert!(
        first["action"] == "split" || first["action"] == "move",
        "{first}"
    );
    assert_eq!(first["partitions"], json!(["wc-0"]), "{first}");
    let reason = first["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("records/s") && reason.contains("split_records_per_s"),
        "{first}"
    );
    let hot_row = first["inputs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["id"] == "wc-0")
        .cloned()
        .unwrap_or_default();
    assert!(hot_row["records_per_s"].as_f64() >= Some(500.0), "{first}");

    // The skew holds: the decisions go on only as the rules say.
    let started = Instant::now();
    while started.elapsed() < hold {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let log = decisions(&apis[1]).await?;
    for d in &log {
        eprintln!(
            "decision: {} {} {} ({}) -> {}",
            d["action"], d["partitions"], d["to"], d["reason"], d["outcome"]
        );
    }
    assert!(
        log.iter().all(|d| d["action"] != "merge"),
        "nothing is merged back while the skew holds: {log:?}"
    );
    assert!(
        log.iter()
            .all(|d| !d["outcome"].as_str().unwrap_or("").starts_with("failed")),
        "every decision carried out: {log:?}"
    );
    // At most one decision per partition per cooldown (a split's halves are new partitions,
    // and their slots were touched by the split).
    let mut last: BTreeMap<u64, i64> = BTreeMap::new();
    for d in &log {
        let at = d["at"].as_i64().unwrap_or(0);
        for s in d["inputs"].as_array().into_iter().flatten().filter(|s| {
            d["partitions"]
                .as_array()
                .is_some_and(|p| p.contains(&s["id"]))
        }) {
            for slot in s["slots"][0].as_u64().unwrap_or(0)..s["slots"][1].as_u64().unwrap_or(0) {
                if let Some(before) = last.insert(slot, at) {
                    assert!(
                        at - before >= cooldown_s as i64 * 1000,
                        "slot {slot} decided on twice within the cooldown: {log:?}"
                    );
                }
            }
        }
    }
    // The controller counts its decisions in /metrics.
    let hosts_now = apis[0].get("/api/v1/hosts").await?;
    let controller = hosts_now
        .body
        .as_array()
        .into_iter()
        .flatten()
        .find(|h| h["controller"] == true)
        .and_then(|h| h["id"].as_str())
        .unwrap_or("a")
        .to_string();
    let ci = ["a", "b", "c"]
        .iter()
        .position(|h| *h == controller)
        .unwrap_or(0);
    let (status, metrics) = apis[ci].get_text("/metrics").await?;
    assert_eq!(status, 200);
    let counted = format!(
        "baton_balancer_decisions_total{{pipeline=\"wc\",action=\"{}\"}}",
        first["action"].as_str().unwrap_or_default()
    );
    assert!(
        metrics.contains(&counted),
        "{counted} in the controller's /metrics"
    );

    stop.store(true, Ordering::Relaxed);
    let sent = flow.await??;
    let group = format!("{cluster}.wc");
    let n = sent.len() as u64;
    wait_for("every record committed", Duration::from_secs(120), || {
        let (group, input) = (group.clone(), input.clone());
        async move {
            let done: u64 = baton_tests::group_offsets(&group, &input, 8)?.iter().sum();
            Ok((done >= n).then_some(()))
        }
    })
    .await?;
    let want = baton_tests::count(sent.iter().map(String::as_str));
    wait_for("exact counts", Duration::from_secs(120), || async {
        for (k, n) in &want {
            if count_at(&apis[0], k).await? != Some(*n) {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await?;
    // The decisions outlive their controller: it stops, and the next one answers them all.
    let before = decisions(&apis[ci]).await?;
    let ats = |log: &[Value]| -> Vec<i64> { log.iter().filter_map(|d| d["at"].as_i64()).collect() };
    hosts.remove(ci).stop().await?;
    let rest: Vec<baton_tests::Api> = hosts.iter().map(|h| h.api.clone()).collect();
    let after = wait_for(
        "a new controller with the decisions",
        Duration::from_secs(60),
        || async {
            let hs = rest[0].get("/api/v1/hosts").await?.body;
            let new =
                hs.as_array().into_iter().flatten().any(|h| {
                    h["controller"] == true && h["alive"] == true && h["id"] != controller
                });
            if !new {
                return Ok(None);
            }
            let log = decisions(&rest[0]).await?;
            Ok((!log.is_empty()).then_some(log))
        },
    )
    .await?;
    let (had, has) = (ats(&before), ats(&after));
    assert!(
        had.iter().all(|a| has.contains(a)),
        "the new controller's log {after:?} holds the old one's {before:?}"
    );
    let kept = after
        .iter()
        .find(|d| d["at"] == first["at"])
        .cloned()
        .unwrap_or_default();
    assert_eq!(kept["reason"], first["reason"], "{kept}");
    assert!(
        kept["outcome"]
            .as_str()
            .is_some_and(|o| o.starts_with("done")),
        "{kept}"
    );
    for h in hosts {
        h.stop().await?;
    }
    Ok(())
}
