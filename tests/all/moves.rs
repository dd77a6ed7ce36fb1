//! Live moves: a partition moves to another host while records flow. The target warms up from
//! the changelog, the owner stops at a batch boundary and commits, the target takes over at the
//! next epoch; nothing is lost or counted twice, lookups are answered on any host throughout,
//! and no two hosts ever show two owners of a partition at one epoch.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use baton_tests::{
    InProcess, Owners, cluster_name, count_at, kafka_bootstrap, kafka_lock, member, wait_alive,
    wait_for,
};
use serde_json::{Value, json};

/// Asks `api` to move wc-0 to `to`; the move's id.
async fn move_wc0(api: &baton_tests::Api, to: &str) -> anyhow::Result<String> {
    let r = api
        .post_json("/api/v1/partitions/wc-0/move", &json!({"to": to}))
        .await?;
    assert_eq!(r.status, 202, "{r:?}");
    Ok(r.body["move"].as_str().unwrap_or_default().to_string())
}

/// Move `id` of wc-0 as `api` shows it, once it is abandoned, with a reason saying `why`.
async fn wait_abandoned(api: &baton_tests::Api, id: &str, why: &str) -> anyhow::Result<Value> {
    let abandoned = wait_for("the move abandoned", Duration::from_secs(60), || async {
        let p = api.partition("wc-0").await?;
        Ok(p["moves"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["id"] == id && m["phase"] == "abandoned")
            .cloned())
    })
    .await?;
    assert!(
        abandoned["reason"]
            .as_str()
            .unwrap_or_default()
            .contains(why),
        "{abandoned}"
    );
    Ok(abandoned)
}

/// Creates word-count over `input` as pipeline `wc` of one partition (wc-0) through `api`,
/// and waits until it runs: its owner.
async fn one_partition_word_count(api: &baton_tests::Api, input: &str) -> anyhow::Result<String> {
    api.upload_plugin("word-count", "word-count", "1").await?;
    api.create_pipeline(json!({
        "name": "wc", "module": "word-count", "version": "1", "inputs": [input],
        "stores": ["counts"], "slots": 2, "partitions": 1
    }))
    .await?;
    wait_for("the partition running", Duration::from_secs(60), || async {
        let p = api.partition("wc-0").await?;
        Ok((p["state"] == "running").then(|| p["owner"].as_str().unwrap_or_default().to_string()))
    })
    .await
}

/// Keyed records of `keys`, for a [`baton_tests::TestProducer`].
fn records(keys: &[String]) -> Vec<(String, String)> {
    keys.iter().map(|k| (k.clone(), "x".into())).collect()
}

/// Every key of `sent` counted exactly as `api` answers.
async fn assert_counted(api: &baton_tests::Api, sent: &[&[String]]) -> anyhow::Result<()> {
    let want = baton_tests::count(sent.iter().flat_map(|s| s.iter()).map(String::as_str));
    for (k, n) in &want {
        assert_eq!(count_at(api, k).await?, Some(*n), "count of {k}");
    }
    Ok(())
}

/// Pipeline wc (one partition of two slots) on `input`, created through `a` once both hosts
/// see each other; waits until host a runs wc-0 and has counted `keys`, sent to `input`.
async fn wc_on_a(
    a: &baton_tests::Api,
    b: &baton_tests::Api,
    input: &str,
    keys: &[String],
) -> anyhow::Result<()> {
    wait_alive(a, 2).await?;
    wait_alive(b, 2).await?;
    a.upload_plugin("word-count", "word-count", "1").await?;
    a.create_pipeline(json!({
        "name": "wc", "module": "word-count", "version": "1", "inputs": [input],
        "stores": ["counts"], "slots": 2, "partitions": 1
    }))
    .await?;
    // Both live and neither owning anything: a, the smaller id, owns it.
    wait_for("wc-0 running on a", Duration::from_secs(60), || async {
        let p = a.partition("wc-0").await?;
        Ok((p["owner"] == "a" && p["state"] == "running").then_some(()))
    })
    .await?;
    baton_tests::TestProducer::new()?
        .send(input, 2, &records(keys))
        .await?;
    a.wait_caught_up("wc", keys.len() as u64, Duration::from_secs(60))
        .await
}

/// Holds `target` at `step` of wc-0, asks `api` to move wc-0 there, and waits until the
/// target's move thread is held: the hold and the move's id.
async fn move_held_at(
    api: &baton_tests::Api,
    target: &InProcess,
    step: &str,
) -> anyhow::Result<(baton::steps::Hold, String)> {
    let hold = target.baton.steps().hold(step, Some("wc-0"));
    let id = move_wc0(api, "b").await?;
    let (hold, reached) = tokio::task::spawn_blocking(move || {
        let reached = hold.wait_reached(Duration::from_secs(90));
        (hold, reached)
    })
    .await?;
    assert!(reached, "the target never came to {step}");
    Ok((hold, id))
}

/// The ids of the partitions `host` owns and runs, as `api` shows them.
async fn running_on(api: &baton_tests::Api, host: &str) -> anyhow::Result<Vec<String>> {
    Ok(api
        .partitions()
        .await?
        .iter()
        .filter(|p| p["owner"] == host && p["state"] == "running")
        .map(|p| p["id"].as_str().unwrap_or_default().to_string())
        .collect())
}

/// Waits until `host`, back in the cluster, runs at least `share` partitions, the last of them
/// moved to it warm, with no partition shown with two owners at one epoch meanwhile.
async fn wait_fair_share(
    apis: &[baton_tests::Api],
    host: &str,
    share: usize,
    seen: &Owners,
) -> anyhow::Result<()> {
    let r = wait_for(
        &format!("{host} back with its fair share ({share} partitions), moved warm"),
        Duration::from_secs(120),
        || async {
            seen.check(apis).await?;
            let rows = apis[0].partitions().await?;
            let on: Vec<&Value> = rows
                .iter()
                .filter(|p| p["owner"] == host && p["state"] == "running")
                .collect();
            Ok((on.len() >= share
                && on.iter().all(|p| {
                    p["moves"]
                        .as_array()
                        .and_then(|m| m.last())
                        .is_some_and(|m| m["to"] == host && m["phase"] == "done")
                }))
            .then_some(()))
        },
    )
    .await;
    if r.is_err() {
        // What the cluster shows, to tell why.
        for p in apis[0].partitions().await.unwrap_or_default() {
            eprintln!(
                "{} owner {} epoch {} state {} moves {}",
                p["id"], p["owner"], p["epoch"], p["state"], p["moves"]
            );
        }
        if let Ok(h) = apis[0].get("/api/v1/hosts").await {
            eprintln!("hosts: {}", h.body);
        }
    }
    r
}

/// Continuous produce to two pipelines (word-count, and uppercase with an output topic) on
/// three hosts, while random partitions move live between them, one host stops with SIGTERM
/// and rejoins, and another is killed with `kill -9` and restarts. Counts are exact on every
/// host, every output is written exactly once (`read_committed`), lookups are answered exactly
/// on every host throughout, and no two hosts ever show two owners of a partition at one epoch.
/// `BATON_TEST_MOVES` sets the number of moves (6; `scripts/test --full`: 20).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_move_live_and_hosts_fail_and_rejoin_with_exact_counts_and_outputs()
-> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let moves: usize = std::env::var("BATON_TEST_MOVES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let dirs: Vec<_> = (0..3)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let cluster = cluster_name(dirs[0].path());
    // a in this process; b and c `baton` processes, so that one can get SIGTERM and the other
    // kill -9.
    let a = member(dirs[0].path(), &cluster, "a").await?;
    let mut b = baton_tests::child_member(dirs[1].path(), &cluster, "b").await?;
    let mut c = baton_tests::child_member(dirs[2].path(), &cluster, "c").await?;
    let mut apis: Vec<baton_tests::Api> = vec![a.api.clone(), b.api.clone(), c.api.clone()];
    for api in &apis {
        wait_alive(api, 3).await?;
    }

    let input = baton_tests::unique("mv-in");
    let output = baton_tests::unique("mv-out");
    apis[0]
        .upload_plugin("word-count", "word-count", "1")
        .await?;
    apis[0].upload_plugin("uppercase", "uppercase", "1").await?;
    apis[0]
        .create_pipeline(json!({
            "name": "wc", "module": "word-count", "version": "1", "inputs": [input],
            "stores": ["counts"], "slots": 6, "partitions": 3,
            "guarantee": "exactly-once"
        }))
        .await?;
    apis[1]
        .create_pipeline(json!({
            "name": "up", "module": "uppercase", "version": "1", "inputs": [input],
            "outputs": [output], "slots": 6, "partitions": 3,
            "guarantee": "exactly-once", "config": {"output": output}
        }))
        .await?;
    let parts: Vec<String> = ["wc", "up"]
        .iter()
        .flat_map(|p| (0..3).map(move |i| format!("{p}-{i}")))
        .collect();
    wait_for(
        "every partition running",
        Duration::from_secs(60),
        || async {
            let ps = apis[0].partitions().await?;
            Ok((ps.len() == 6 && ps.iter().all(|p| p["state"] == "running")).then_some(()))
        },
    )
    .await?;

    // Probe keys, produced once: their counts must be answered exactly on every host while
    // the partitions move.
    let producer = baton_tests::TestProducer::new()?;
    let probes: Vec<String> = (0..30).map(|i| format!("probe{i}")).collect();
    let mut probe_recs = Vec::new();
    for (i, p) in probes.iter().enumerate() {
        for _ in 0..(i % 4 + 1) {
            probe_recs.push((p.clone(), "x".to_string()));
        }
    }
    producer.send(&input, 6, &probe_recs).await?;
    let probe_counts = baton_tests::count(probe_recs.iter().map(|(k, _)| k.as_str()));
    let committed = |pipeline: &str, n: u64| {
        let (input, group) = (input.clone(), format!("{cluster}.{pipeline}"));
        async move {
            let done: u64 = baton_tests::group_offsets(&group, &input, 6)?.iter().sum();
            Ok((done >= n).then_some(()))
        }
    };
    wait_for("the probes committed", Duration::from_secs(60), || {
        committed("wc", probe_recs.len() as u64)
    })
    .await?;

    // Records flow the whole time, each with a value of its own.
    let stop = Arc::new(AtomicBool::new(false));
    let flow = {
        let (stop, input) = (stop.clone(), input.clone());
        tokio::spawn(async move {
            let producer = baton_tests::TestProducer::new()?;
            let mut sent = Vec::new();
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let keys = baton_tests::words(400, 300, 1000 + round);
                let recs: Vec<(String, String)> = keys
                    .into_iter()
                    .enumerate()
                    .map(|(i, k)| (k, format!("v{round}.{i}")))
                    .collect();
                producer.send(&input, 6, &recs).await?;
                sent.extend(recs);
                round += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(sent)
        })
    };

    // Bad requests are refused by name.
    let r = apis[1]
        .post_json("/api/v1/partitions/wc-0/move", &json!({"to": "nobody"}))
        .await?;
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.body.to_string().contains("nobody"), "{r:?}");
    let owner0 = apis[0].partition("wc-0").await?["owner"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let r = apis[1]
        .post_json("/api/v1/partitions/wc-0/move", &json!({"to": owner0}))
        .await?;
    assert_eq!(r.status, 409, "{r:?}");
    let r = apis[1]
        .post_json("/api/v1/partitions/wc-9/move", &json!({"to": "a"}))
        .await?;
    assert_eq!(r.status, 404, "{r:?}");

    let seen = Owners::default();
    let mut rng = baton_tests::test_seed("moves") | 1;
    let mut next = |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    let ids = ["a", "b", "c"];
    let mut pauses = Vec::new();
    for i in 0..moves {
        let part = parts[next(parts.len())].clone();
        let before = apis[0].partition(&part).await?;
        let owner = before["owner"].as_str().unwrap_or_default().to_string();
        let epoch = before["epoch"].as_u64().unwrap_or(0);
        let others: Vec<&str> = ids.iter().copied().filter(|h| *h != owner).collect();
        let to = others[next(others.len())].to_string();
        // Asked of any host.
        let r = apis[next(3)]
            .post_json(
                &format!("/api/v1/partitions/{part}/move"),
                &json!({"to": to}),
            )
            .await?;
        assert_eq!(r.status, 202, "move {i} of {part} to {to}: {r:?}");
        let id = r.body["move"].as_str().unwrap_or_default().to_string();
        assert!(!id.is_empty(), "{r:?}");
        // A second move of the same partition while this one is under way is refused.
        let again = apis[0]
            .post_json(
                &format!("/api/v1/partitions/{part}/move"),
                &json!({"to": owner}),
            )
            .await?;
        assert!(
            again.status == 409 || again.status == 202,
            "second move: {again:?}"
        );
        if again.status == 202 {
            anyhow::bail!("a second move of {part} was accepted while move {id} was under way");
        }
        let tick = std::sync::atomic::AtomicUsize::new(i);
        let done = wait_for(
            &format!("move {id} of {part} to {to} done on every host"),
            Duration::from_secs(90),
            || async {
                seen.check(&apis).await?;
                // Probes are answered exactly by every host, whoever owns what right now.
                let probe = &probes[tick.fetch_add(1, Ordering::Relaxed) % probes.len()];
                for api in &apis {
                    assert_eq!(
                        count_at(api, probe).await?,
                        Some(probe_counts[probe]),
                        "{probe} at {} during move {id}",
                        api.base()
                    );
                }
                let mut rows = Vec::new();
                for api in &apis {
                    rows.push(api.partition(&part).await?);
                }
                let finished = rows.iter().all(|r| {
                    r["owner"] == to.as_str()
                        && r["epoch"].as_u64() > Some(epoch)
                        && r["state"] == "running"
                        && r["moves"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|m| m["id"] == id.as_str() && m["phase"] == "done")
                });
                if let Some(abandoned) = rows[0]["moves"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|m| m["id"] == id.as_str() && m["phase"] == "abandoned")
                {
                    anyhow::bail!("move {id} abandoned: {abandoned}");
                }
                Ok(finished.then(|| rows[0].clone()))
            },
        )
        .await?;
        seen.check(&apis).await?;
        if let Some(m) = done["moves"].as_array().and_then(|m| m.last()) {
            eprintln!(
                "move {id}: pause {} ms, steps {}",
                m["pause_ms"], m["steps"]
            );
        }
        let pause = done["last_pause_ms"].as_f64();
        assert!(pause.is_some(), "a pause recorded: {done}");
        pauses.extend(pause);
        assert!(
            done["replicas"].as_array().is_some_and(|r| r.is_empty()),
            "no replica left after the move: {done}"
        );
    }

    // b stops cleanly (SIGTERM): its partitions move to a and c warm, each with a pause
    // recorded, before it exits. Then it comes back and is given its fair share again.
    if running_on(&apis[0], "b").await?.is_empty() {
        let r = apis[0]
            .post_json("/api/v1/partitions/wc-1/move", &json!({"to": "b"}))
            .await?;
        assert_eq!(r.status, 202, "{r:?}");
        wait_for("wc-1 on b", Duration::from_secs(60), || async {
            Ok(running_on(&apis[0], "b")
                .await?
                .contains(&"wc-1".to_string())
                .then_some(()))
        })
        .await?;
    }
    let b_had = running_on(&apis[0], "b").await?;
    tokio::task::spawn_blocking(move || b.terminate()).await??;
    let rest = vec![apis[0].clone(), apis[2].clone()];
    let after_term = wait_for(
        "b's partitions moved warm to a and c",
        Duration::from_secs(60),
        || async {
            seen.check(&rest).await?;
            let rows = rest[0].partitions().await?;
            let done = b_had.iter().all(|id| {
                rows.iter().any(|p| {
                    p["id"] == id.as_str()
                        && p["owner"] != "b"
                        && p["state"] == "running"
                        && p["moves"]
                            .as_array()
                            .and_then(|m| m.last())
                            .is_some_and(|m| {
                                m["from"] == "b"
                                    && m["phase"] == "done"
                                    && m["pause_ms"].is_number()
                            })
                })
            });
            Ok(done.then_some(rows))
        },
    )
    .await?;
    eprintln!(
        "SIGTERM moves: {:?}",
        after_term
            .iter()
            .filter(|p| b_had.iter().any(|id| p["id"] == id.as_str()))
            .map(|p| p["last_pause_ms"].clone())
            .collect::<Vec<_>>()
    );
    b = baton_tests::child_member(dirs[1].path(), &cluster, "b").await?;
    apis[1] = b.api.clone();
    wait_fair_share(&apis, "b", parts.len() / 3, &seen).await?;

    // c is killed (kill -9) while it runs partitions: the survivors take them over at the next
    // epoch, restored from the changelogs. It starts again and gets its fair share back.
    if running_on(&apis[0], "c").await?.is_empty() {
        let r = apis[0]
            .post_json("/api/v1/partitions/up-2/move", &json!({"to": "c"}))
            .await?;
        assert_eq!(r.status, 202, "{r:?}");
        wait_for("up-2 on c", Duration::from_secs(60), || async {
            Ok(running_on(&apis[0], "c")
                .await?
                .contains(&"up-2".to_string())
                .then_some(()))
        })
        .await?;
    }
    let c_had: BTreeMap<String, u64> = apis[0]
        .partitions()
        .await?
        .iter()
        .filter(|p| p["owner"] == "c")
        .map(|p| {
            (
                p["id"].as_str().unwrap_or_default().to_string(),
                p["epoch"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    c.kill9()?;
    let rest = vec![apis[0].clone(), apis[1].clone()];
    wait_for(
        "c's partitions taken over by a and b",
        Duration::from_secs(90),
        || async {
            seen.check(&rest).await?;
            let rows = rest[0].partitions().await?;
            Ok(c_had
                .iter()
                .all(|(id, epoch)| {
                    rows.iter().any(|p| {
                        p["id"] == id.as_str()
                            && p["owner"] != "c"
                            && p["epoch"].as_u64() > Some(*epoch)
                            && p["state"] == "running"
                    })
                })
                .then_some(()))
        },
    )
    .await?;
    c = baton_tests::child_member(dirs[2].path(), &cluster, "c").await?;
    apis[2] = c.api.clone();
    wait_fair_share(&apis, "c", parts.len() / 3, &seen).await?;

    stop.store(true, Ordering::Relaxed);
    let mut sent = flow.await??;
    sent.extend(probe_recs.iter().cloned());
    for p in ["wc", "up"] {
        wait_for(
            &format!("every record committed by {p}"),
            Duration::from_secs(120),
            || committed(p, sent.len() as u64),
        )
        .await?;
    }
    let want = baton_tests::count(sent.iter().map(|(k, _)| k.as_str()));
    let b_api = &apis[1];
    wait_for("exact counts at b", Duration::from_secs(120), || async {
        for (k, n) in &want {
            if count_at(b_api, k).await? != Some(*n) {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await?;
    // Once caught up nothing changes any more: every count is exact on the other hosts too,
    // which answer for the slots they own and ask the owners of the rest.
    for api in apis.iter().filter(|a| a.base() != b_api.base()) {
        for (k, n) in &want {
            assert_eq!(
                count_at(api, k).await?,
                Some(*n),
                "count of {k} at {}",
                api.base()
            );
        }
    }
    // Every output exactly once: one upper-cased record per record sent.
    let mut expected: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (k, v) in &sent {
        *expected.entry((k.clone(), v.to_uppercase())).or_default() += 1;
    }
    let mut got: BTreeMap<(String, String), usize> = BTreeMap::new();
    for kv in baton_tests::read_committed(&output, 6)? {
        *got.entry(kv).or_default() += 1;
    }
    let twice = got.values().filter(|n| **n > 1).count();
    assert_eq!(
        got.values().sum::<usize>(),
        sent.len(),
        "outputs, of {} records sent ({twice} repeated)",
        sent.len()
    );
    assert!(got == expected, "every output exactly once");

    // A hot swap asked of one host answers for every partition of the cluster.
    apis[1]
        .upload_plugin("word-count", "word-count", "2")
        .await?;
    let r = apis[1]
        .put_json("/api/v1/pipelines/wc/module", &json!({"version": "2"}))
        .await?;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["outcome"], "swapped", "{r:?}");
    let swapped: Vec<&str> = r.body["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["report"]["outcome"] == "swapped" && p["report"]["version"] == "2")
        .filter_map(|p| p["id"].as_str())
        .collect();
    assert_eq!(swapped, ["wc-0", "wc-1", "wc-2"], "{r:?}");
    // The pauses reach /metrics of the hosts that took partitions over.
    let mut in_metrics = 0;
    for api in &apis {
        let (status, text) = api.get_text("/metrics").await?;
        assert_eq!(status, 200);
        if text.contains("baton_move_pause_seconds_count")
            && !text.contains("baton_move_pause_seconds_count 0")
        {
            in_metrics += 1;
        }
    }
    assert!(in_metrics >= 1, "move pauses in /metrics");
    pauses.sort_by(f64::total_cmp);
    eprintln!("{} moves, pauses (ms): {pauses:?}", pauses.len());
    a.stop().await?;
    drop((b, c));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_is_kept_warm_and_promoted_on_failover_without_a_full_restore()
-> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let dirs: Vec<_> = (0..2)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let cluster = cluster_name(dirs[1].path());
    let a = member(dirs[0].path(), &cluster, "a").await?;
    let c = baton_tests::child_member(dirs[1].path(), &cluster, "c").await?;
    wait_alive(&a.api, 2).await?;
    let input = baton_tests::unique("sb-in");
    a.api.upload_plugin("word-count", "word-count", "1").await?;
    // More standbys than other hosts: as many as there are.
    let r = a
        .api
        .post_json(
            "/api/v1/pipelines",
            &json!({"name": "bad", "module": "word-count", "version": "1", "inputs": [input],
                    "stores": ["counts"], "slots": 4, "partitions": 2, "standbys": 9}),
        )
        .await?;
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.body.to_string().contains("standbys"), "{r:?}");
    a.api
        .create_pipeline(json!({
            "name": "wc", "module": "word-count", "version": "1", "inputs": [input],
            "stores": ["counts"], "slots": 4, "partitions": 2, "standbys": 1,
            "guarantee": "exactly-once"
        }))
        .await?;

    let producer = baton_tests::TestProducer::new()?;
    let keys = baton_tests::words(20_000, 3_000, 77);
    let recs: Vec<(String, String)> = keys.iter().map(|k| (k.clone(), "x".into())).collect();
    producer.send(&input, 4, &recs).await?;
    let group = format!("{cluster}.wc");
    let committed = |n: u64| {
        let (input, group) = (input.clone(), group.clone());
        async move {
            let done: u64 = baton_tests::group_offsets(&group, &input, 4)?.iter().sum();
            Ok((done >= n).then_some(()))
        }
    };
    wait_for("the records committed", Duration::from_secs(60), || {
        committed(20_000)
    })
    .await?;
    // Each partition runs on one host and is kept warm on the other, caught up.
    let on_c = wait_for(
        "a warm standby of each partition on the other host",
        Duration::from_secs(60),
        || async {
            let rows = a.api.partitions().await?;
            let warm = rows.len() == 2
                && rows.iter().all(|p| {
                    let other = if p["owner"] == "a" { "c" } else { "a" };
                    p["state"] == "running"
                        && p["replicas"].as_array().is_some_and(|r| {
                            r.len() == 1
                                && r[0]["host"] == other
                                && r[0]["role"] == "standby"
                                && r[0]["lag"] == 0
                        })
                });
            let on_c: Vec<String> = rows
                .iter()
                .filter(|p| p["owner"] == "c")
                .map(|p| p["id"].as_str().unwrap_or_default().to_string())
                .collect();
            Ok((warm && on_c.len() == 1).then_some(on_c))
        },
    )
    .await?;

    // kill -9 of c: its partition is promoted on a, whose standby had the state: the restore
    // reads only what the standby had not applied (nothing, here), not the whole changelog.
    c.kill9()?;
    let more = baton_tests::words(4_000, 3_000, 78);
    let recs: Vec<(String, String)> = more.iter().map(|k| (k.clone(), "x".into())).collect();
    producer.send(&input, 4, &recs).await?;
    let promoted = wait_for(
        "c's partition promoted on a",
        Duration::from_secs(60),
        || async {
            let rows = a.api.partitions().await?;
            Ok(rows.into_iter().find(|p| {
                p["id"] == on_c[0].as_str() && p["owner"] == "a" && p["state"] == "running"
            }))
        },
    )
    .await?;
    let restored = promoted["restore"]["total"].as_u64().unwrap_or(u64::MAX);
    assert!(
        restored < 100,
        "the promoted standby restored {restored} changelog records: {promoted}"
    );
    wait_for("every record committed", Duration::from_secs(90), || {
        committed(24_000)
    })
    .await?;
    let want = baton_tests::count(keys.iter().chain(&more).map(String::as_str));
    for (k, n) in &want {
        assert_eq!(count_at(&a.api, k).await?, Some(*n), "count of {k}");
    }
    a.stop().await?;
    Ok(())
}

/// Two hosts ask at once to move one partition, each to itself. The requests run on the
/// controller, and the second is checked before the first's `move` event is read back (it
/// takes effect only then) or after: either way the control log's order lets one move begin.
/// Exactly one request is accepted, the other refused with 409, one move is in every host's
/// history of the partition, and it ends done at its target with exact counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_move_requests_at_once_start_one_move_everywhere() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let dirs: Vec<_> = (0..3)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let cluster = cluster_name(dirs[0].path());
    let a = member(dirs[0].path(), &cluster, "a").await?;
    let b = member(dirs[1].path(), &cluster, "b").await?;
    let c = member(dirs[2].path(), &cluster, "c").await?;
    wait_alive(&a.api, 3).await?;
    let input = baton_tests::unique("race-in");
    let owner = one_partition_word_count(&a.api, &input).await?;
    assert_eq!(
        owner, "a",
        "created on a with no partition anywhere: a owns it"
    );
    let producer = baton_tests::TestProducer::new()?;
    let keys = baton_tests::words(2_000, 100, 7);
    producer.send(&input, 2, &records(&keys)).await?;
    a.api
        .wait_caught_up("wc", 2_000, Duration::from_secs(60))
        .await?;
    // Both hosts know the partition and its owner before they ask.
    for api in [&b.api, &c.api] {
        wait_for("the owner known", Duration::from_secs(30), || async {
            Ok((api.partition("wc-0").await?["owner"] == "a").then_some(()))
        })
        .await?;
    }
    let ask = |api: &baton_tests::Api, to: &'static str| {
        let api = api.clone();
        async move {
            api.post_json("/api/v1/partitions/wc-0/move", &json!({"to": to}))
                .await
        }
    };
    let (to_b, to_c) = tokio::join!(ask(&b.api, "b"), ask(&c.api, "c"));
    let (to_b, to_c) = (to_b?, to_c?);
    let mut statuses = [to_b.status, to_c.status];
    statuses.sort();
    assert_eq!(statuses, [202, 409], "b: {to_b:?}; c: {to_c:?}");
    let (winner, id) = if to_b.status == 202 {
        (
            "b",
            to_b.body["move"].as_str().unwrap_or_default().to_string(),
        )
    } else {
        (
            "c",
            to_c.body["move"].as_str().unwrap_or_default().to_string(),
        )
    };
    let done = wait_for("the move done", Duration::from_secs(60), || async {
        let p = a.api.partition("wc-0").await?;
        let ended = p["moves"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["id"] == id.as_str() && m["phase"] == "done");
        Ok((ended && p["owner"] == winner && p["state"] == "running").then_some(p))
    })
    .await?;
    // Every host's history holds the one move.
    for api in [&a.api, &b.api, &c.api] {
        let moves = wait_for(
            "the move in every history",
            Duration::from_secs(30),
            || async {
                let p = api.partition("wc-0").await?;
                let ms = p["moves"].as_array().cloned().unwrap_or_default();
                Ok(ms.iter().any(|m| m["phase"] == "done").then_some(ms))
            },
        )
        .await?;
        assert_eq!(moves.len(), 1, "{moves:?}");
        assert_eq!(moves[0]["id"], id.as_str(), "{moves:?}");
    }
    let more = baton_tests::words(500, 100, 8);
    producer.send(&input, 2, &records(&more)).await?;
    a.api
        .wait_caught_up("wc", 2_500, Duration::from_secs(60))
        .await?;
    assert_counted(&a.api, &[&keys, &more]).await?;
    assert_eq!(done["epoch"], 2, "{done}");
    for h in [c, b, a] {
        h.stop().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_to_a_host_over_its_disk_bound_is_abandoned_and_the_owner_goes_on()
-> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let dirs: Vec<_> = (0..2)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let cluster = cluster_name(dirs[0].path());
    let a = member(dirs[0].path(), &cluster, "a").await?;
    let b = {
        let cluster = cluster.clone();
        InProcess::start_configured(dirs[1].path(), Some(&kafka_bootstrap()), move |c| {
            c.cluster = cluster;
            c.host_id = Some("b".into());
            c.session_timeout = Duration::from_secs(6);
            c.state_disk = Some(1);
        })
        .await?
    };
    wait_alive(&a.api, 2).await?;
    let input = baton_tests::unique("disk-in");
    let owner = one_partition_word_count(&a.api, &input).await?;
    let producer = baton_tests::TestProducer::new()?;
    let keys = baton_tests::words(2_000, 100, 5);
    let recs: Vec<(String, String)> = keys.iter().map(|k| (k.clone(), "x".into())).collect();
    producer.send(&input, 2, &recs).await?;
    a.api
        .wait_caught_up("wc", 2_000, Duration::from_secs(60))
        .await?;
    // Created on a, with both hosts live and neither owning anything: a owns it (ties go to
    // the smaller id). Any replica of it breaks b's 1-byte bound once b knows the partition's
    // state from a's load reports: the move is abandoned, by name.
    assert_eq!(owner, "a");
    wait_for(
        "b to see the partition's state",
        Duration::from_secs(30),
        || async {
            let p = b.api.partition("wc-0").await?;
            Ok((p["state_bytes"].as_u64().unwrap_or(0) > 0).then_some(()))
        },
    )
    .await?;
    let id = move_wc0(&a.api, "b").await?;
    wait_abandoned(&a.api, &id, "--state-disk").await?;
    // The owner goes on: the partition stays on a at its epoch, and new records count.
    let more = baton_tests::words(500, 100, 6);
    producer.send(&input, 2, &records(&more)).await?;
    a.api
        .wait_caught_up("wc", 2_500, Duration::from_secs(60))
        .await?;
    let p = a.api.partition("wc-0").await?;
    assert_eq!(p["owner"], "a", "{p}");
    assert_eq!(p["epoch"], 1, "{p}");
    assert_counted(&a.api, &[&keys, &more]).await?;
    b.stop().await?;
    a.stop().await?;
    Ok(())
}

/// The owner dies while the target warms its replica, and the partition fails over to that
/// very target: the session it starts there is the only writer of the partition's database.
/// The warming replica, held mid-read until the session runs, writes nothing more and its move
/// is abandoned; counts stay exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_lost_mid_warm_up_leaves_its_target_one_writer() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let dirs: Vec<_> = (0..2)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let cluster = cluster_name(dirs[0].path());
    let a = baton_tests::child_member(dirs[0].path(), &cluster, "a").await?;
    let b = member(dirs[1].path(), &cluster, "b").await?;
    let input = baton_tests::unique("warm-in");
    let keys = baton_tests::words(2_000, 100, 15);
    wc_on_a(&a.api, &b.api, &input, &keys).await?;
    let producer = baton_tests::TestProducer::new()?;
    let (hold, id) = move_held_at(&b.api, &b, baton::steps::MOVE_WARMING).await?;
    // The owner dies mid-warm-up; the partition fails over to b, the move's own target.
    a.kill9()?;
    wait_for("wc-0 running on b", Duration::from_secs(90), || async {
        let p = b.api.partition("wc-0").await?;
        Ok((p["owner"] == "b" && p["state"] == "running").then_some(()))
    })
    .await?;
    let more = baton_tests::words(1_000, 100, 16);
    producer.send(&input, 2, &records(&more)).await?;
    b.api
        .wait_caught_up("wc", 3_000, Duration::from_secs(60))
        .await?;
    // The replica goes on from where it was held, behind the session.
    hold.release();
    wait_abandoned(
        &b.api,
        &id,
        "a session of the partition started on this host",
    )
    .await?;
    let last = baton_tests::words(500, 100, 17);
    producer.send(&input, 2, &records(&last)).await?;
    b.api
        .wait_caught_up("wc", 3_500, Duration::from_secs(60))
        .await?;
    assert_counted(&b.api, &[&keys, &more, &last]).await?;
    b.stop().await?;
    Ok(())
}

/// The target takes over just as the owner gives up holding the drained partition: the
/// control log's order decides, the same way on every host. Here the target is held before
/// its take-over until the owner has recorded the move abandoned and resumed; the take-over,
/// after the abandonment in the log, does not count. The owner stays the only writer (at the
/// epoch after the one it released), and counts stay exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_over_after_the_owner_resumed_does_not_count() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let dirs: Vec<_> = (0..2)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let cluster = cluster_name(dirs[0].path());
    let a = {
        let cluster = cluster.clone();
        InProcess::start_configured(dirs[0].path(), Some(&kafka_bootstrap()), move |c| {
            c.cluster = cluster;
            c.host_id = Some("a".into());
            c.session_timeout = Duration::from_secs(6);
            c.drained_hold = Duration::from_secs(2);
        })
        .await?
    };
    let b = member(dirs[1].path(), &cluster, "b").await?;
    let input = baton_tests::unique("late-in");
    let first = baton_tests::words(2_000, 100, 25);
    wc_on_a(&a.api, &b.api, &input, &first).await?;
    let producer = baton_tests::TestProducer::new()?;
    let (hold, id) = move_held_at(&a.api, &b, baton::steps::MOVE_TAKE_OVER).await?;
    // The owner drained, waited 2 s in vain, recorded the move abandoned and resumed.
    let abandoned = wait_for(
        "the owner to give up and resume",
        Duration::from_secs(60),
        || async {
            let p = a.api.partition("wc-0").await?;
            let m = p["moves"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|m| m["id"] == id.as_str() && m["phase"] == "abandoned")
                .cloned();
            Ok(m.filter(|_| p["owner"] == "a" && p["state"] == "running"))
        },
    )
    .await?;
    assert!(
        abandoned["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("nobody took the drained partition over"),
        "{abandoned}"
    );
    let second = baton_tests::words(1_000, 100, 26);
    producer.send(&input, 2, &records(&second)).await?;
    a.api
        .wait_caught_up("wc", 3_000, Duration::from_secs(60))
        .await?;

    // The target goes on: its take-over comes after the abandonment in the log.
    hold.release();
    wait_for(
        "the target's move to end",
        Duration::from_secs(60),
        || async { Ok((baton_tests::threads_named("baton-move-wc-0")? == 0).then_some(())) },
    )
    .await?;
    assert!(
        b.baton.partition_handles().iter().all(|h| h.id != "wc-0"),
        "the target runs the partition beside its owner"
    );
    // The owner released epoch 1 and went on at epoch 2.
    for api in [&a.api, &b.api] {
        let p = api.partition("wc-0").await?;
        assert_eq!(
            (p["owner"].clone(), p["epoch"].clone()),
            (json!("a"), json!(2)),
            "{p}"
        );
        let m = p["moves"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["id"] == id.as_str())
            .cloned()
            .unwrap_or_default();
        assert_eq!(m["phase"], "abandoned", "{m}");
    }
    let third = baton_tests::words(500, 100, 27);
    producer.send(&input, 2, &records(&third)).await?;
    a.api
        .wait_caught_up("wc", 3_500, Duration::from_secs(60))
        .await?;
    assert_counted(&a.api, &[&first, &second, &third]).await?;
    b.stop().await?;
    a.stop().await?;
    Ok(())
}

/// The target takes over only what the owner released, as the control log records it: the
/// owner's last transaction complete (every changelog readable to its released end), the
/// replica at exactly those ends, and the group's offsets at the released ones. A release that
/// does not match (injected here) gives the move up with the reason, and the owner goes on; a
/// release that matches moves the partition, with exact counts throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_over_checks_what_the_owner_released() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let dirs: Vec<_> = (0..2)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let cluster = cluster_name(dirs[0].path());
    let a = member(dirs[0].path(), &cluster, "a").await?;
    let b = member(dirs[1].path(), &cluster, "b").await?;
    let input = baton_tests::unique("release-in");
    let first = baton_tests::words(2_000, 100, 35);
    wc_on_a(&a.api, &b.api, &input, &first).await?;
    let producer = baton_tests::TestProducer::new()?;
    let mut sent = vec![first];
    let mut total = 2_000;
    let faults = [
        (
            baton::steps::RELEASE_OFFSETS_BEHIND,
            "a commit came after the release",
        ),
        (
            baton::steps::RELEASE_CHANGELOG_AHEAD,
            "but the owner released it at",
        ),
    ];
    for (i, (fault, why)) in faults.into_iter().enumerate() {
        let injected = a.baton.steps().inject(fault, Some("wc-0"));
        let id = move_wc0(&a.api, "b").await?;
        wait_abandoned(&a.api, &id, why).await?;
        drop(injected);
        // The owner goes on at its epoch; the target never ran the partition.
        let more = baton_tests::words(500, 100, 36 + i as u64);
        producer.send(&input, 2, &records(&more)).await?;
        total += 500;
        a.api
            .wait_caught_up("wc", total, Duration::from_secs(60))
            .await?;
        // Released at epoch 1 + i, the owner never processes at that epoch again: it went on
        // at the next.
        let p = a.api.partition("wc-0").await?;
        assert_eq!(
            (p["owner"].clone(), p["epoch"].clone()),
            (json!("a"), json!(2 + i)),
            "{p}"
        );
        assert!(
            b.baton.partition_handles().iter().all(|h| h.id != "wc-0"),
            "the target runs the partition after refusing the release"
        );
        sent.push(more);
    }
    // Nothing injected: the release matches, and the partition moves.
    let id = move_wc0(&a.api, "b").await?;
    let done = wait_for("the move done", Duration::from_secs(90), || async {
        let p = b.api.partition("wc-0").await?;
        Ok(p["moves"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["id"] == id.as_str() && m["phase"] == "done")
            .cloned()
            .filter(|_| p["owner"] == "b" && p["state"] == "running"))
    })
    .await?;
    assert!(
        done["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["step"] == "checked"),
        "the pause shows the release checked: {done}"
    );
    let last = baton_tests::words(500, 100, 39);
    producer.send(&input, 2, &records(&last)).await?;
    total += 500;
    b.api
        .wait_caught_up("wc", total, Duration::from_secs(60))
        .await?;
    sent.push(last);
    let sent: Vec<&[String]> = sent.iter().map(Vec::as_slice).collect();
    assert_counted(&b.api, &sent).await?;
    b.stop().await?;
    a.stop().await?;
    Ok(())
}

/// The target dies between the owner's release and its own take-over (a `baton` process held
/// there by `baton::steps::STEPS_ENV`, then killed with `kill -9`). The move is abandoned, and
/// the owner, who never processes at the epoch it released again, goes on at the next one;
/// counts stay exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_killed_between_release_and_take_over_leaves_the_owner_running()
-> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let dirs: Vec<_> = (0..2)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let cluster = cluster_name(dirs[0].path());
    let a = member(dirs[0].path(), &cluster, "a").await?;
    let b = baton_tests::child_member_held(
        dirs[1].path(),
        &cluster,
        "b",
        &format!("{}@wc-0=120s", baton::steps::MOVE_TAKE_OVER),
    )
    .await?;
    let input = baton_tests::unique("target-killed-in");
    let first = baton_tests::words(2_000, 100, 41);
    wc_on_a(&a.api, &b.api, &input, &first).await?;
    let id = move_wc0(&a.api, "b").await?;
    baton_tests::wait_held(
        dirs[1].path(),
        baton::steps::MOVE_TAKE_OVER,
        "wc-0",
        Duration::from_secs(90),
    )
    .await?;
    // Released at epoch 1: the owner holds the partition stopped.
    let p = a.api.partition("wc-0").await?;
    assert_eq!(
        (p["epoch"].clone(), p["state"].clone()),
        (json!(1), json!("stopped")),
        "{p}"
    );
    b.kill9()?;
    let more = baton_tests::words(1_000, 100, 42);
    baton_tests::TestProducer::new()?
        .send(&input, 2, &records(&more))
        .await?;
    wait_abandoned(&a.api, &id, "").await?;
    a.api
        .wait_caught_up("wc", 3_000, Duration::from_secs(90))
        .await?;
    let p = a.api.partition("wc-0").await?;
    assert_eq!(
        (p["owner"].clone(), p["epoch"].clone(), p["state"].clone()),
        (json!("a"), json!(2), json!("running")),
        "{p}"
    );
    assert_counted(&a.api, &[&first, &more]).await?;
    a.stop().await?;
    Ok(())
}

/// The owner dies (`kill -9`) after its release, while the target is held before its
/// take-over: what the owner released is all there is, and the target takes the partition
/// over with exact counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_killed_after_its_release_is_taken_over_with_exact_counts() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let dirs: Vec<_> = (0..2)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let cluster = cluster_name(dirs[0].path());
    let a = baton_tests::child_member(dirs[0].path(), &cluster, "a").await?;
    let b = member(dirs[1].path(), &cluster, "b").await?;
    let input = baton_tests::unique("owner-killed-in");
    let first = baton_tests::words(2_000, 100, 43);
    wc_on_a(&a.api, &b.api, &input, &first).await?;
    let (hold, id) = move_held_at(&a.api, &b, baton::steps::MOVE_TAKE_OVER).await?;
    a.kill9()?;
    hold.release();
    // Taken over by the move (not failed over), at the epoch after the released one.
    let p = wait_for("the move done", Duration::from_secs(90), || async {
        let p = b.api.partition("wc-0").await?;
        let done = p["moves"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["id"] == id.as_str() && m["phase"] == "done");
        Ok((done && p["owner"] == "b" && p["state"] == "running").then_some(p))
    })
    .await?;
    assert_eq!(p["epoch"], 2, "{p}");
    let more = baton_tests::words(1_000, 100, 44);
    baton_tests::TestProducer::new()?
        .send(&input, 2, &records(&more))
        .await?;
    b.api
        .wait_caught_up("wc", 3_000, Duration::from_secs(60))
        .await?;
    assert_counted(&b.api, &[&first, &more]).await?;
    b.stop().await?;
    Ok(())
}

/// The last value of each key of wc's `counts` changelog (both slots), as committed.
fn changelog_counts(cluster: &str) -> anyhow::Result<BTreeMap<String, i64>> {
    let topic = format!("{cluster}.wc.counts.changelog");
    let mut last = BTreeMap::new();
    for (_, k, v) in baton_tests::read_committed_raw(&topic, 2)? {
        let key = String::from_utf8_lossy(&k.unwrap_or_default()).into_owned();
        let v = v.ok_or_else(|| anyhow::anyhow!("a tombstone for {key}"))?;
        let n = <[u8; 8]>::try_from(v.as_slice())
            .map(i64::from_be_bytes)
            .map_err(|_| anyhow::anyhow!("a count of {} bytes for {key}", v.len()))?;
        last.insert(key, n);
    }
    Ok(last)
}

/// An at-least-once owner cut off in the middle of a commit (held before sending its first
/// batch, then stopped with SIGSTOP past its session) wakes up after the partition failed
/// over and the new owner counted more: a zombie with the changelog values of its old state
/// to write. The new owner's producer fenced it, so the broker refuses them: no count in the
/// changelog falls below what was sent. Without the fence those values land after the new
/// owner's and the next restore loses every update since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_at_least_once_owner_loses_no_update() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let dirs: Vec<_> = (0..2)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let cluster = cluster_name(dirs[0].path());
    let a = baton_tests::child_member_held(
        dirs[0].path(),
        &cluster,
        "a",
        &format!("{}@wc-0=20s", baton::steps::COMMIT_SEND),
    )
    .await?;
    let b = member(dirs[1].path(), &cluster, "b").await?;
    wait_alive(&a.api, 2).await?;
    wait_alive(&b.api, 2).await?;
    let input = baton_tests::unique("zombie-in");
    a.api.upload_plugin("word-count", "word-count", "1").await?;
    a.api
        .create_pipeline(json!({
            "name": "wc", "module": "word-count", "version": "1", "inputs": [input],
            "stores": ["counts"], "slots": 2, "partitions": 1, "guarantee": "at-least-once"
        }))
        .await?;
    wait_for("wc-0 running on a", Duration::from_secs(60), || async {
        let p = a.api.partition("wc-0").await?;
        Ok((p["owner"] == "a" && p["state"] == "running").then_some(()))
    })
    .await?;
    let producer = baton_tests::TestProducer::new()?;
    let first = baton_tests::words(2_000, 100, 51);
    producer.send(&input, 2, &records(&first)).await?;
    baton_tests::wait_held(
        dirs[0].path(),
        baton::steps::COMMIT_SEND,
        "wc-0",
        Duration::from_secs(60),
    )
    .await?;
    a.signal("-STOP")?;
    // The session expires: b takes wc-0 over from what was committed (nothing) and counts
    // everything, then more.
    wait_for("wc-0 failed over to b", Duration::from_secs(60), || async {
        let p = b.api.partition("wc-0").await?;
        Ok((p["owner"] == "b" && p["state"] == "running").then_some(()))
    })
    .await?;
    let more = baton_tests::words(1_000, 100, 52);
    producer.send(&input, 2, &records(&more)).await?;
    b.api
        .wait_caught_up("wc", 3_000, Duration::from_secs(60))
        .await?;
    a.signal("-CONT")?;
    // The zombie makes its commit once its hold ends, then learns that b owns wc-0 and stops.
    wait_for(
        "a's session of wc-0 ended",
        Duration::from_secs(90),
        || async {
            let (status, text) = a.api.get_text("/metrics").await?;
            anyhow::ensure!(status == 200, "/metrics: {status}");
            // A series of this host's own sessions (not the cluster's table).
            let running = text.lines().any(|l| {
                l.starts_with("baton_records_in_total{pipeline=\"wc\",partition=\"wc-0\"}")
            });
            Ok((!running).then_some(()))
        },
    )
    .await?;
    let want = baton_tests::count(first.iter().chain(&more).map(String::as_str));
    let logged = changelog_counts(&cluster)?;
    let short: Vec<_> = want
        .iter()
        .filter(|(k, n)| logged.get(*k).is_none_or(|l| l < n))
        .map(|(k, n)| format!("{k}: {:?} of {n}", logged.get(k)))
        .collect();
    assert!(
        short.is_empty(),
        "{} keys lost updates in the changelog: {}",
        short.len(),
        short.join(", ")
    );
    for (k, n) in &want {
        let got = count_at(&b.api, k).await?.unwrap_or(0);
        assert!(got >= *n, "count of {k} on b: {got}, sent {n}");
    }
    let p = b.api.partition("wc-0").await?;
    assert_eq!(p["owner"], "b", "{p}");
    b.stop().await?;
    Ok(())
}
