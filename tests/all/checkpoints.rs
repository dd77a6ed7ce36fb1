//! Incremental checkpoints (`POST /api/v1/partitions/{id}/checkpoint`, `--checkpoints`,
//! `--checkpoint-retain`): files shared between checkpoints, retention and garbage collection,
//! and restores on a host with no state of its own from the newest valid checkpoint, then the
//! changelog's tail, with a corrupted checkpoint skipped for an older one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use baton_tests::{
    ChildHost, TestProducer, cluster_name, kafka_bootstrap, kafka_shared, wait_for, wait_host,
    words,
};
use serde_json::{Value, json};

/// The objects under the store's `files/` of partition `wc-0`, by name.
fn stored_files(store: &Path) -> anyhow::Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    let Ok(dirs) = std::fs::read_dir(store.join("wc")) else {
        return Ok(out);
    };
    for pipeline_dir in dirs {
        let files = pipeline_dir?.path().join("wc-0").join("files");
        let Ok(entries) = std::fs::read_dir(&files) else {
            continue;
        };
        for f in entries {
            out.insert(f?.file_name().to_string_lossy().into_owned());
        }
    }
    Ok(out)
}

/// The directory of partition `wc-0` in the store.
fn partition_dir(store: &Path) -> anyhow::Result<PathBuf> {
    let created = std::fs::read_dir(store.join("wc"))?
        .next()
        .ok_or_else(|| anyhow::anyhow!("no checkpoints of wc"))??;
    Ok(created.path().join("wc-0"))
}

/// Uploads word-count as version 1 and makes it the pipeline `wc` over `input` (2 slots, one
/// partition, exactly-once, checkpoints only on demand), with the spec's fields in `more`.
async fn deploy_wc(api: &baton_tests::Api, input: &str, more: Value) -> anyhow::Result<()> {
    api.upload_plugin("word-count", "word-count", "1").await?;
    let mut spec = json!({
        "name": "wc", "module": "word-count", "version": "1", "inputs": [input],
        "stores": ["counts"], "slots": 2, "partitions": 1, "guarantee": "exactly-once",
        "checkpoint_interval_s": 0
    });
    for (k, v) in more.as_object().cloned().unwrap_or_default() {
        spec[k] = v;
    }
    api.create_pipeline(spec).await?;
    Ok(())
}

/// Waits until `host` runs wc-0, as `api` shows it: its row.
async fn running_on(api: &baton_tests::Api, host: &str) -> anyhow::Result<Value> {
    wait_for(
        &format!("wc-0 running on {host}"),
        Duration::from_secs(90),
        || async {
            let p = api.partition("wc-0").await?;
            Ok((p["owner"] == host && p["state"] == "running").then_some(p))
        },
    )
    .await
}

/// Sends `batch` to `input` and waits until `api`'s host processed everything sent so far.
async fn send(
    producer: &TestProducer,
    input: &str,
    sent: &mut Vec<String>,
    batch: Vec<String>,
    api: &baton_tests::Api,
) -> anyhow::Result<()> {
    let records: Vec<(String, String)> = batch.iter().map(|w| (w.clone(), "x".into())).collect();
    producer.send(input, 2, &records).await?;
    sent.extend(batch);
    api.wait_caught_up("wc", sent.len() as u64, Duration::from_secs(90))
        .await
}

async fn checkpoint(api: &baton_tests::Api) -> anyhow::Result<Value> {
    let r = api
        .post_json("/api/v1/partitions/wc-0/checkpoint", &json!({}))
        .await?;
    anyhow::ensure!(r.status == 200, "checkpoint: {r:?}");
    Ok(r.body)
}

/// Every word's count on `api` equals how often it was sent.
async fn assert_counts(api: &baton_tests::Api, sent: &[String]) -> anyhow::Result<()> {
    let mut want: BTreeMap<&str, i64> = BTreeMap::new();
    for w in sent {
        *want.entry(w.as_str()).or_default() += 1;
    }
    for (w, n) in want {
        assert_eq!(
            api.counter("wc", "counts", w).await?,
            Some(n),
            "count of {w}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_share_files_are_collected_and_restore_a_new_host_exactly_with_a_fallback()
-> anyhow::Result<()> {
    let _k = kafka_shared().await;
    let dir = tempfile::tempdir()?;
    let cluster = cluster_name(dir.path());
    let bootstrap = kafka_bootstrap();
    // One store for every host, as an object store would be.
    let store = dir.path().join("store");
    let store_flag = store.to_string_lossy().into_owned();
    let start = |id: &str| {
        let (dir, cluster, bootstrap, store) = (
            dir.path().join(id),
            cluster.clone(),
            bootstrap.clone(),
            store_flag.clone(),
        );
        let id = id.to_string();
        async move {
            let extra = ["--checkpoints", &store, "--checkpoint-retain", "2"];
            baton_tests::child_member_on(&dir, &cluster, &id, &bootstrap, &extra, &[]).await
        }
    };
    let a = start("a").await?;
    let input = baton_tests::unique("checkpointed-words");
    deploy_wc(&a.api, &input, json!({})).await?;
    let producer = TestProducer::new()?;
    let mut sent: Vec<String> = Vec::new();
    // The first checkpoint uploads every file.
    send(&producer, &input, &mut sent, words(3000, 400, 1), &a.api).await?;
    let first = checkpoint(&a.api).await?;
    assert_eq!(first["seq"], 1, "{first}");
    assert!(first["files_uploaded"].as_u64() > Some(0), "{first}");
    assert_eq!(first["files_reused"], 0, "{first}");
    assert_eq!(first["uploaded_bytes"], first["size_bytes"], "{first}");

    // The next ones share the SST files that did not change.
    send(&producer, &input, &mut sent, words(500, 20, 2), &a.api).await?;
    let second = checkpoint(&a.api).await?;
    assert_eq!(second["seq"], 2, "{second}");
    assert!(second["files_reused"].as_u64() > Some(0), "{second}");
    assert!(
        second["uploaded_bytes"].as_u64() < second["size_bytes"].as_u64(),
        "{second}"
    );
    send(&producer, &input, &mut sent, words(500, 20, 3), &a.api).await?;
    let third = checkpoint(&a.api).await?;
    assert_eq!(third["seq"], 3, "{third}");
    assert_eq!(third["retained"], 2, "{third}");
    assert!(third["files_deleted"].as_u64() > Some(0), "{third}");
    let shown = a.api.partition("wc-0").await?;
    assert_eq!(shown["last_checkpoint"]["seq"], 3, "{shown}");
    let metrics = a.api.get_text("/metrics").await?.1;
    let metric = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")) && l.contains("partition=\"wc-0\""))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    assert_eq!(metric("baton_checkpoints_total"), Some(3.0), "{metrics}");
    let uploaded = ["first", "second", "third"]
        .iter()
        .zip([&first, &second, &third])
        .map(|(_, c)| c["uploaded_bytes"].as_f64().unwrap_or(0.0))
        .sum::<f64>();
    assert_eq!(
        metric("baton_checkpoint_uploaded_bytes_total"),
        Some(uploaded)
    );

    // Retention: checkpoints 2 and 3, and exactly the files they name.
    let listed = a.api.get("/api/v1/partitions/wc-0/checkpoints").await?;
    assert_eq!(listed.status, 200, "{listed:?}");
    let manifests = listed.body.as_array().cloned().unwrap_or_default();
    let seqs: Vec<u64> = manifests.iter().filter_map(|m| m["seq"].as_u64()).collect();
    assert_eq!(seqs, vec![2, 3]);
    let named: BTreeSet<String> = manifests
        .iter()
        .flat_map(|m| m["files"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f["object"].as_str().map(str::to_string))
        .collect();
    assert_eq!(stored_files(&store)?, named);
    for m in &manifests {
        let offsets = m["changelog_offsets"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        assert!(
            offsets.contains_key("counts/0") && offsets.contains_key("counts/1"),
            "{m}"
        );
        assert!(
            !m["input_offsets"].as_object().is_none_or(|o| o.is_empty()),
            "{m}"
        );
    }

    // Records after the last checkpoint: the changelog's tail. Then the owner dies with its
    // disk, and a new host takes the partition over.
    send(&producer, &input, &mut sent, words(1000, 400, 4), &a.api).await?;
    a.kill9()?;
    let b = start("b").await?;
    let restored = running_on(&b.api, "b").await?;
    assert_eq!(restored["restored_from"]["seq"], 3, "{restored}");
    // The newest checkpoint in the store shows until this host takes one.
    wait_for("b shows checkpoint 3", Duration::from_secs(10), || async {
        let p = b.api.partition("wc-0").await?;
        Ok((p["last_checkpoint"]["seq"] == 3).then_some(()))
    })
    .await?;
    assert_eq!(
        restored["restored_from"]["skipped"]
            .as_array()
            .map(Vec::len),
        Some(0),
        "{restored}"
    );
    // Only the tail came from the changelog: not the 4,000 updates before the checkpoint.
    let tail = restored["restore"]["done"].as_u64().unwrap_or(u64::MAX);
    assert!(tail <= 1000, "changelog records restored: {restored}");
    b.api
        .wait_caught_up("wc", sent.len() as u64, Duration::from_secs(90))
        .await?;
    assert_counts(&b.api, &sent).await?;

    // A checkpoint file that fails its CRC: the restore falls back to checkpoint 2, and the
    // changelog restores the rest from its offsets.
    let part = partition_dir(&store)?;
    let m3: Value = serde_json::from_slice(&std::fs::read(
        part.join("manifests").join(format!("{:020}.json", 3)),
    )?)?;
    let victim = m3["files"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| {
            f["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("MANIFEST-"))
        })
        .and_then(|f| f["object"].as_str())
        .ok_or_else(|| anyhow::anyhow!("no MANIFEST in {m3}"))?
        .to_string();
    let path = part.join("files").join(&victim);
    let mut bytes = std::fs::read(&path)?;
    bytes[0] ^= 0xff;
    std::fs::remove_file(&path)?;
    std::fs::write(&path, bytes)?;
    send(&producer, &input, &mut sent, words(500, 400, 5), &b.api).await?;
    b.kill9()?;
    let c = start("c").await?;
    let fell_back = running_on(&c.api, "c").await?;
    assert_eq!(fell_back["restored_from"]["seq"], 2, "{fell_back}");
    let skipped = fell_back["restored_from"]["skipped"].to_string();
    assert!(
        skipped.contains("checkpoint 3") && skipped.contains("CRC-32"),
        "{skipped}"
    );
    c.api
        .wait_caught_up("wc", sent.len() as u64, Duration::from_secs(90))
        .await?;
    assert_counts(&c.api, &sent).await?;

    // On an interval, changed in place.
    let patched = c
        .api
        .send_with_token(
            reqwest::Method::PATCH,
            "/api/v1/pipelines/wc",
            Some(&json!({"checkpoint_interval_s": 1})),
            None,
        )
        .await?;
    assert_eq!(patched.status, 200, "{patched:?}");
    wait_for(
        "a checkpoint on the interval",
        Duration::from_secs(30),
        || async {
            let p = c.api.partition("wc-0").await?;
            Ok(p["last_checkpoint"]["seq"].as_u64().filter(|s| *s >= 5))
        },
    )
    .await?;

    // Asked of another host, a checkpoint and a rewind run on the owner, and its errors come
    // back as it gave them.
    let d = start("d").await?;
    wait_host(&d.api, "d knows c's address", |h| {
        h["id"] == "c" && h["address"].as_str().is_some_and(|a| !a.is_empty())
    })
    .await?;
    let remote = checkpoint(&d.api).await?;
    assert!(remote["seq"].as_u64() > Some(4), "{remote}");
    let gone = d
        .api
        .post_json("/api/v1/partitions/wc-0/rewind", &json!({"seq": 1}))
        .await?;
    assert_eq!(gone.status, 404, "{gone:?}");
    assert!(
        gone.body.to_string().contains("no checkpoint 1"),
        "{gone:?}"
    );

    // A move's target with no state of the partition warms from the newest checkpoint in the
    // shared store, then the changelogs' tail after it. The owner checks that the target is a
    // live member: it must have seen d join first.
    wait_host(&c.api, "c sees d alive", |h| {
        h["id"] == "d" && h["alive"] == true
    })
    .await?;
    send(&producer, &input, &mut sent, words(300, 400, 6), &c.api).await?;
    let asked = d
        .api
        .post_json("/api/v1/partitions/wc-0/move", &json!({"to": "d"}))
        .await?;
    assert_eq!(asked.status, 202, "{asked:?}");
    let moved = running_on(&d.api, "d").await?;
    let from = moved["restored_from"]["seq"].as_u64();
    assert!(
        from >= remote["seq"].as_u64(),
        "the target restored the newest checkpoint, at least {}: {moved}",
        remote["seq"]
    );
    // The target runs before the move's last record is read back: it is done soon after.
    wait_for("the move is done", Duration::from_secs(30), || async {
        let p = d.api.partition("wc-0").await?;
        let done = p["moves"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["to"] == "d" && m["phase"] == "done");
        Ok(done.then_some(()))
    })
    .await?;
    send(&producer, &input, &mut sent, words(300, 400, 7), &d.api).await?;
    d.api
        .wait_caught_up("wc", sent.len() as u64, Duration::from_secs(90))
        .await?;
    assert_counts(&d.api, &sent).await?;

    // A purge deletes the pipeline's checkpoints.
    let purged = c
        .api
        .send_with_token(
            reqwest::Method::DELETE,
            "/api/v1/pipelines/wc?purge=true",
            None,
            None,
        )
        .await?;
    assert_eq!(purged.status, 200, "{purged:?}");
    let left = stored_files(&store)?;
    let log = std::fs::read_to_string(dir.path().join("c").join("baton.log")).unwrap_or_default();
    assert!(
        left.is_empty(),
        "files left after the purge: {left:?}\n{log}"
    );
    c.terminate()?;
    d.terminate()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_in_an_s3_compatible_store_restore_on_another_host_after_a_kill_mid_checkpoint()
-> anyhow::Result<()> {
    let _k = kafka_shared().await;
    let s3 = baton_tests::S3Server::start("checkpoints").await?;
    let dir = tempfile::tempdir()?;
    let cluster = cluster_name(dir.path());
    let bootstrap = kafka_bootstrap();
    let url = format!("s3://{}/cluster-1", s3.bucket);
    let reached = dir.path().join("steps.log");
    let env = s3.env();
    let start = |id: &str, env: Vec<(&'static str, String)>| {
        let (dir, cluster, bootstrap, url) = (
            dir.path().join(id),
            cluster.clone(),
            bootstrap.clone(),
            url.clone(),
        );
        let id = id.to_string();
        async move {
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let extra = ["--checkpoints", &url];
            baton_tests::child_member_on(&dir, &cluster, &id, &bootstrap, &extra, &env).await
        }
    };
    // Host a is held in its third checkpoint of wc-0, after the uploads and before the
    // manifest.
    let mut env_a = env.clone();
    env_a.push((
        baton::steps::STEPS_ENV,
        "checkpoint.upload@wc-0/3=120s".into(),
    ));
    env_a.push((
        baton::steps::STEPS_LOG_ENV,
        reached.to_string_lossy().into_owned(),
    ));
    let a = start("a", env_a).await?;
    let input = baton_tests::unique("s3-checkpointed-words");
    deploy_wc(&a.api, &input, json!({})).await?;
    let producer = TestProducer::new()?;
    let mut sent = Vec::new();
    send(&producer, &input, &mut sent, words(3000, 400, 11), &a.api).await?;
    let first = checkpoint(&a.api).await?;
    assert_eq!(first["seq"], 1, "{first}");
    send(&producer, &input, &mut sent, words(500, 20, 12), &a.api).await?;
    let second = checkpoint(&a.api).await?;
    assert_eq!(second["seq"], 2, "{second}");
    assert!(second["files_reused"].as_u64() > Some(0), "{second}");

    // In the bucket, under the URL's prefix: the two manifests and the files they name.
    let keys = s3.keys("cluster-1/wc/").await?;
    let manifests = keys
        .iter()
        .filter(|k| k.contains("/wc-0/manifests/"))
        .count();
    assert_eq!(manifests, 2, "{keys:?}");
    let listed = a.api.get("/api/v1/partitions/wc-0/checkpoints").await?;
    for m in listed.body.as_array().into_iter().flatten() {
        for f in m["files"].as_array().into_iter().flatten() {
            let object = f["object"].as_str().unwrap_or_default();
            assert!(
                keys.iter()
                    .any(|k| k.ends_with(&format!("/wc-0/files/{object}"))),
                "{object} is not in the bucket: {keys:?}"
            );
        }
    }

    // The third checkpoint is killed with its host after its uploads, before its manifest.
    send(&producer, &input, &mut sent, words(500, 400, 13), &a.api).await?;
    let held = {
        let api = a.api.clone();
        tokio::spawn(async move { checkpoint(&api).await })
    };
    wait_for("checkpoint 3 held", Duration::from_secs(60), || async {
        let log = std::fs::read_to_string(&reached).unwrap_or_default();
        Ok(log.contains("checkpoint.upload wc-0/3").then_some(()))
    })
    .await?;
    let partial = s3.keys("cluster-1/wc/").await?;
    assert!(
        partial.len() > keys.len(),
        "the held checkpoint uploaded its files"
    );
    a.kill9()?;
    assert!(
        held.await?.is_err(),
        "a checkpoint whose host died answers no success"
    );

    // Another host, with no state of the partition, restores it from the bucket: checkpoint
    // 2, the last with a manifest.
    let b = start("b", env.clone()).await?;
    let restored = running_on(&b.api, "b").await?;
    assert_eq!(restored["restored_from"]["seq"], 2, "{restored}");
    assert!(
        restored["restore"]["done"].as_u64().unwrap_or(u64::MAX) <= 500,
        "{restored}"
    );
    b.api
        .wait_caught_up("wc", sent.len() as u64, Duration::from_secs(90))
        .await?;
    assert_counts(&b.api, &sent).await?;

    // b's checkpoints go on from 3; once the three retained are all b's, garbage collection
    // has deleted the files of the one that never got its manifest.
    for seq in 3..=5 {
        send(
            &producer,
            &input,
            &mut sent,
            words(200, 50, 20 + seq),
            &b.api,
        )
        .await?;
        let c = checkpoint(&b.api).await?;
        assert_eq!(c["seq"], seq, "{c}");
    }
    let listed = b.api.get("/api/v1/partitions/wc-0/checkpoints").await?;
    let manifests = listed.body.as_array().cloned().unwrap_or_default();
    let seqs: Vec<u64> = manifests.iter().filter_map(|m| m["seq"].as_u64()).collect();
    assert_eq!(seqs, vec![3, 4, 5]);
    let named: BTreeSet<String> = manifests
        .iter()
        .flat_map(|m| m["files"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f["object"].as_str().map(str::to_string))
        .collect();
    let stored: BTreeSet<String> = s3
        .keys("cluster-1/wc/")
        .await?
        .iter()
        .filter_map(|k| k.split("/wc-0/files/").nth(1).map(str::to_string))
        .collect();
    assert_eq!(stored, named);
    assert_counts(&b.api, &sent).await?;
    b.terminate()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewind_after_a_bad_version_leaves_the_checkpoint_plus_the_input_processed_again()
-> anyhow::Result<()> {
    let _k = kafka_shared().await;
    let dir = tempfile::tempdir()?;
    let flags = ["--kafka", &kafka_bootstrap(), "--host-id", "a"];
    let a = ChildHost::start_with(
        &dir.path().join("a"),
        &cluster_name(dir.path()),
        "64MiB",
        &flags,
        &[],
    )
    .await?;
    let input = baton_tests::unique("rewound-words");
    // The bad version: counts, but fails the records whose value is `x` (dead letters).
    a.api.upload_plugin("fail-on", "word-count", "2").await?;
    deploy_wc(
        &a.api,
        &input,
        json!({"config": {"value": "x"}, "swap": {"max_failure_share": 1.0}}),
    )
    .await?;
    let producer = TestProducer::new()?;
    let mut sent = Vec::new();
    send(&producer, &input, &mut sent, words(2000, 200, 31), &a.api).await?;
    let good = checkpoint(&a.api).await?;
    assert_eq!(good["seq"], 1, "{good}");

    // The bad version counts the `y` records and drops the `x` ones.
    let swapped = a
        .api
        .put_json("/api/v1/pipelines/wc/module", &json!({"version": "2"}))
        .await?;
    assert_eq!(swapped.status, 200, "{swapped:?}");
    let after: Vec<(String, String)> = words(1000, 200, 32)
        .into_iter()
        .enumerate()
        .map(|(i, w)| (w, if i % 2 == 0 { "x" } else { "y" }.to_string()))
        .collect();
    producer.send(&input, 2, &after).await?;
    sent.extend(after.iter().map(|(w, _)| w.clone()));
    a.api
        .wait_caught_up("wc", sent.len() as u64, Duration::from_secs(90))
        .await?;
    let first = &after[0].0;
    let want_all = sent.iter().filter(|w| *w == first).count() as i64;
    assert!(
        a.api.counter("wc", "counts", first).await? < Some(want_all),
        "the bad version dropped records"
    );

    // Back to the good version, and back to the checkpoint taken before the bad one.
    let back = a
        .api
        .put_json("/api/v1/pipelines/wc/module", &json!({"version": "1"}))
        .await?;
    assert_eq!(back.status, 200, "{back:?}");
    let missing = a
        .api
        .post_json("/api/v1/pipelines/wc/rewind", &json!({"checkpoints": {}}))
        .await?;
    assert_eq!(missing.status, 400, "{missing:?}");
    assert!(missing.body.to_string().contains("wc-0"), "{missing:?}");
    let unknown = a
        .api
        .post_json(
            "/api/v1/pipelines/wc/rewind",
            &json!({"checkpoints": {"wc-0": 9}}),
        )
        .await?;
    assert_eq!(unknown.status, 404, "{unknown:?}");
    let rewound = a
        .api
        .post_json(
            "/api/v1/pipelines/wc/rewind",
            &json!({"checkpoints": {"wc-0": 1}}),
        )
        .await?;
    assert_eq!(rewound.status, 200, "{rewound:?}");
    let report = &rewound.body[0];
    assert_eq!(report["seq"], 1, "{report}");
    // The `y` records' counts were put back.
    assert!(report["keys"].as_u64() > Some(0), "{report}");
    assert_eq!(
        report["input_offsets"],
        good_offsets(&a.api).await?,
        "{report}"
    );
    // Every record after the checkpoint is processed again, by the good version: each counted
    // once.
    wait_for(
        "the input processed again",
        Duration::from_secs(90),
        || async {
            Ok((a.api.counter("wc", "counts", first).await? == Some(want_all)).then_some(()))
        },
    )
    .await?;
    a.api
        .wait_caught_up("wc", sent.len() as u64, Duration::from_secs(90))
        .await?;
    assert_counts(&a.api, &sent).await?;
    a.terminate()?;
    Ok(())
}

/// The input offsets of checkpoint 1 of `wc-0`.
async fn good_offsets(api: &baton_tests::Api) -> anyhow::Result<Value> {
    let listed = api.get("/api/v1/partitions/wc-0/checkpoints").await?;
    listed
        .body
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["seq"] == 1)
        .map(|m| m["input_offsets"].clone())
        .ok_or_else(|| anyhow::anyhow!("no checkpoint 1: {listed:?}"))
}
