//! Online splits and merges: a partition becomes two on its owner while records flow, with no
//! state copied; the halves run at once, may move like any partition, and split again; then
//! neighbours merge, on one host or across two. Nothing is lost or counted twice, outputs are
//! sent exactly once, and no two hosts ever show two owners of a partition at one epoch.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use baton_tests::{Owners, cluster_name, count_at, kafka_lock, member, wait_alive, wait_for};
use serde_json::{Value, json};

/// The partitions of `pipeline` as `api` shows them: id → row.
async fn rows_of(
    api: &baton_tests::Api,
    pipeline: &str,
) -> anyhow::Result<BTreeMap<String, Value>> {
    Ok(api
        .partitions()
        .await?
        .into_iter()
        .filter(|p| p["pipeline"] == pipeline)
        .map(|p| (p["id"].as_str().unwrap_or_default().to_string(), p))
        .collect())
}

/// Waits until every host shows `ids` running (and nothing else of their pipelines but
/// `others`), checking owners meanwhile.
async fn wait_running(
    apis: &[baton_tests::Api],
    seen: &Owners,
    ids: &[String],
    what: &str,
) -> anyhow::Result<()> {
    wait_for(what, Duration::from_secs(90), || async {
        seen.check(apis).await?;
        for api in apis {
            let rows = api.partitions().await?;
            for id in ids {
                if !rows
                    .iter()
                    .any(|p| p["id"] == id.as_str() && p["state"] == "running")
                {
                    return Ok(None);
                }
            }
        }
        Ok(Some(()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitions_split_move_and_merge_under_load_with_exact_counts_and_outputs()
-> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let steps: usize = std::env::var("BATON_TEST_SPLITS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let merges = steps * 2 / 3;
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
    let input = baton_tests::unique("sp-in");
    let output = baton_tests::unique("sp-out");
    apis[0]
        .upload_plugin("word-count", "word-count", "1")
        .await?;
    apis[0].upload_plugin("uppercase", "uppercase", "1").await?;
    apis[0]
        .create_pipeline(json!({
            "name": "wc", "module": "word-count", "version": "1", "inputs": [input],
            "stores": ["counts"], "slots": 8, "partitions": 1, "guarantee": "exactly-once"
        }))
        .await?;
    apis[1]
        .create_pipeline(json!({
            "name": "up", "module": "uppercase", "version": "1", "inputs": [input],
            "outputs": [output], "slots": 8, "partitions": 1,
            "guarantee": "exactly-once", "config": {"output": output}
        }))
        .await?;
    let seen = Owners::default();
    wait_running(
        &apis,
        &seen,
        &["wc-0".into(), "up-0".into()],
        "both pipelines running",
    )
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
                let keys = baton_tests::words(300, 400, 7000 + round);
                let recs: Vec<(String, String)> = keys
                    .into_iter()
                    .enumerate()
                    .map(|(i, k)| (k, format!("v{round}.{i}")))
                    .collect();
                producer.send(&input, 8, &recs).await?;
                sent.extend(recs);
                round += 1;
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            anyhow::Ok(sent)
        })
    };

    // Refused by name: a slot outside, a body that is not one.
    let r = apis[2]
        .post_json("/api/v1/partitions/wc-0/split", &json!({"at": 8}))
        .await?;
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.error().contains("strictly inside"), "{r:?}");
    let r = apis[2]
        .post_json("/api/v1/partitions/wc-0/split", &json!({"slot": 2}))
        .await?;
    assert_eq!(r.status, 400, "{r:?}");
    let r = apis[2]
        .post_json("/api/v1/partitions/wc-9/split", &json!({}))
        .await?;
    assert_eq!(r.status, 404, "{r:?}");

    let mut rng = baton_tests::test_seed("split") | 1;
    let mut next = |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    let mut retired = Vec::new();
    let mut pauses = Vec::new();
    for i in 0..steps {
        let pipeline = ["wc", "up"][i % 2];
        let rows = rows_of(&apis[0], pipeline).await?;
        // Split the widest partition of the pipeline (asked of any host), the load choosing
        // the slot every other time; then move one half to another host.
        let (id, row) = rows
            .iter()
            .max_by_key(|(_, r)| {
                r["slots"][1].as_u64().unwrap_or(0) - r["slots"][0].as_u64().unwrap_or(0)
            })
            .map(|(id, r)| (id.clone(), r.clone()))
            .expect("a partition");
        let [start, end] = [
            row["slots"][0].as_u64().unwrap_or(0),
            row["slots"][1].as_u64().unwrap_or(0),
        ];
        let body = if i % 2 == 0 {
            json!({})
        } else {
            json!({"at": (start + end) / 2})
        };
        let r = apis[next(3)]
            .post_json(&format!("/api/v1/partitions/{id}/split"), &body)
            .await?;
        assert_eq!(r.status, 200, "split {i} of {id}: {r:?}");
        assert_eq!(r.body["phase"], "done", "{r:?}");
        let halves: Vec<String> = r.body["halves"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| h.as_str().map(str::to_string))
            .collect();
        assert_eq!(halves.len(), 2, "{r:?}");
        let slot = r.body["slot"].as_u64().unwrap_or(0);
        assert!(slot > start && slot < end, "{r:?}");
        let pause = r.body["pause_ms"].as_f64();
        assert!(pause.is_some(), "a pause measured: {r:?}");
        pauses.extend(pause);
        eprintln!(
            "split {i} of {id} at {slot}: pause {:?} ms, steps {}",
            pause, r.body["steps"]
        );
        retired.push(id.clone());
        wait_running(
            &apis,
            &seen,
            &halves,
            &format!("the halves of {id} running"),
        )
        .await?;
        for api in &apis {
            let rows = rows_of(api, pipeline).await?;
            assert!(
                !rows.contains_key(&id),
                "{id} retired at {}: {rows:?}",
                api.base()
            );
            assert_eq!(rows[&halves[0]]["slots"], json!([start, slot]));
            assert_eq!(rows[&halves[1]]["slots"], json!([slot, end]));
        }
        // Splitting it again is refused: it is retired.
        let r = apis[0]
            .post_json(&format!("/api/v1/partitions/{id}/split"), &json!({}))
            .await?;
        assert_eq!(r.status, 404, "{r:?}");

        let half = &halves[next(2)];
        let owner = rows_of(&apis[0], pipeline).await?[half]["owner"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let to = ["a", "b", "c"]
            .into_iter()
            .filter(|h| *h != owner)
            .nth(next(2))
            .unwrap_or("a");
        let r = apis[next(3)]
            .post_json(
                &format!("/api/v1/partitions/{half}/move"),
                &json!({"to": to}),
            )
            .await?;
        assert_eq!(r.status, 202, "move of {half} to {to}: {r:?}");
        let move_id = r.body["move"].as_str().unwrap_or_default().to_string();
        wait_for(
            &format!("{half} moved to {to}"),
            Duration::from_secs(90),
            || async {
                seen.check(&apis).await?;
                let row = apis[0].partition(half).await?;
                if let Some(m) = row["moves"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|m| m["id"] == move_id.as_str() && m["phase"] == "abandoned")
                {
                    anyhow::bail!("move of {half} abandoned: {m}");
                }
                Ok((row["owner"] == to && row["state"] == "running").then_some(()))
            },
        )
        .await?;
    }

    // A partition of one slot cannot split: it is one input partition.
    let one = rows_of(&apis[0], "wc").await?.into_iter().find(|(_, r)| {
        r["slots"][1].as_u64().unwrap_or(0) - r["slots"][0].as_u64().unwrap_or(0) == 1
    });
    if let Some((id, _)) = one {
        let r = apis[1]
            .post_json(&format!("/api/v1/partitions/{id}/split"), &json!({}))
            .await?;
        assert_eq!(r.status, 409, "{r:?}");
        assert!(r.error().contains("move it"), "{r:?}");
    }

    // Merges of neighbours, on one host or across two (the right side moves first), asked of
    // any host.
    let mut merge_pauses = Vec::new();
    for i in 0..merges {
        let pipeline = ["wc", "up"][i % 2];
        let rows: Vec<Value> = rows_of(&apis[0], pipeline).await?.into_values().collect();
        let mut by_slot = rows.clone();
        by_slot.sort_by_key(|r| r["slots"][0].as_u64());
        // Neighbours on two hosts when there are such, else on one.
        let pairs: Vec<(Value, Value)> = by_slot
            .windows(2)
            .map(|w| (w[0].clone(), w[1].clone()))
            .collect();
        let (l, r) = pairs
            .iter()
            .find(|(l, r)| l["owner"] != r["owner"])
            .or(pairs.first())
            .cloned()
            .expect("two partitions");
        let (l, r) = (
            l["id"].as_str().unwrap_or_default().to_string(),
            r["id"].as_str().unwrap_or_default().to_string(),
        );
        let across = rows_of(&apis[0], pipeline).await?[&l]["owner"]
            != rows_of(&apis[0], pipeline).await?[&r]["owner"];
        let r2 = apis[next(3)]
            .post_json("/api/v1/partitions/merge", &json!({"left": r, "right": l}))
            .await?;
        assert_eq!(r2.status, 200, "merge {i} of {l} and {r}: {r2:?}");
        assert_eq!(r2.body["phase"], "done", "{r2:?}");
        let merged = r2.body["merged"].as_str().unwrap_or_default().to_string();
        let pause = r2.body["pause_ms"].as_f64();
        assert!(pause.is_some(), "a pause measured: {r2:?}");
        merge_pauses.extend(pause);
        eprintln!(
            "merge {i} of {l} and {r} ({}): pause {pause:?} ms, steps {}",
            if across { "across hosts" } else { "one host" },
            r2.body["steps"]
        );
        retired.extend([l.clone(), r.clone()]);
        wait_running(
            &apis,
            &seen,
            std::slice::from_ref(&merged),
            &format!("{merged} running"),
        )
        .await?;
        for api in &apis {
            let rows = rows_of(api, pipeline).await?;
            assert!(!rows.contains_key(&l) && !rows.contains_key(&r), "{rows:?}");
        }
    }

    stop.store(true, Ordering::Relaxed);
    let sent = flow.await??;
    for p in ["wc", "up"] {
        let group = format!("{cluster}.{p}");
        let input = input.clone();
        let n = sent.len() as u64;
        wait_for(
            &format!("every record committed by {p}"),
            Duration::from_secs(120),
            || {
                let (group, input) = (group.clone(), input.clone());
                async move {
                    let done: u64 = baton_tests::group_offsets(&group, &input, 8)?.iter().sum();
                    Ok((done >= n).then_some(()))
                }
            },
        )
        .await?;
    }
    let want = baton_tests::count(sent.iter().map(|(k, _)| k.as_str()));
    wait_for("exact counts at a", Duration::from_secs(120), || async {
        for (k, n) in &want {
            if count_at(&apis[0], k).await? != Some(*n) {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await?;
    for api in &apis[1..] {
        for (k, n) in &want {
            assert_eq!(
                count_at(api, k).await?,
                Some(*n),
                "count of {k} at {}",
                api.base()
            );
        }
    }
    let mut expected: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (k, v) in &sent {
        *expected.entry((k.clone(), v.to_uppercase())).or_default() += 1;
    }
    let mut got: BTreeMap<(String, String), usize> = BTreeMap::new();
    for kv in baton_tests::read_committed(&output, 8)? {
        *got.entry(kv).or_default() += 1;
    }
    assert_eq!(
        got.values().sum::<usize>(),
        sent.len(),
        "outputs of {} records",
        sent.len()
    );
    assert!(got == expected, "every output exactly once");

    // The retired partitions stay readable, with the split that retired them.
    for api in &apis {
        let r = api.get("/api/v1/partitions?retired=true").await?;
        assert_eq!(r.status, 200, "{r:?}");
        let ids: Vec<&str> = r
            .body
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["id"].as_str())
            .collect();
        for id in &retired {
            assert!(
                ids.contains(&id.as_str()),
                "{id} retired at {}: {ids:?}",
                api.base()
            );
        }
        assert!(
            r.body
                .as_array()
                .into_iter()
                .flatten()
                .all(|p| p["into"].as_array().is_some_and(|i| !i.is_empty())),
            "{r:?}"
        );
    }
    pauses.sort_by(f64::total_cmp);
    eprintln!("{} splits, pauses (ms): {pauses:?}", pauses.len());
    merge_pauses.sort_by(f64::total_cmp);
    eprintln!(
        "{} merges, pauses (ms): {merge_pauses:?}",
        merge_pauses.len()
    );
    for h in hosts {
        h.stop().await?;
    }
    Ok(())
}
