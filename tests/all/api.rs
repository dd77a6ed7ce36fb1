//! The operational API: bearer-token auth on mutating calls, /readyz, /metrics, pipeline events,
//! key scans with cursors, and modules that come back from the log with their compiled code.

use std::collections::BTreeSet;
use std::time::Duration;

use baton_tests::{InProcess, count, wait_for, words};
use reqwest::Method;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_every_mutating_call_needs_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start_configured(dir.path(), None, |c| {
        c.token = Some("s3cret".into());
    })
    .await?;
    let api = &host.api;
    let spec = json!({"name": "wc", "module": "word-count", "version": "1", "inputs": ["w"],
                      "stores": ["counts"]});
    for token in [None, Some("wrong")] {
        let r = api
            .send_with_token(Method::POST, "/api/v1/pipelines", Some(&spec), token)
            .await?;
        assert_eq!(r.status, 401, "{token:?}: {}", r.body);
        assert!(!r.error().is_empty(), "{}", r.body);
        let r = api
            .send_with_token(
                Method::PUT,
                "/api/v1/pipelines/wc/module",
                Some(&json!({"version": "2"})),
                token,
            )
            .await?;
        assert_eq!(r.status, 401, "{}", r.body);
        let r = api
            .send_with_token(
                Method::POST,
                "/api/v1/topics/w/records",
                Some(&json!([{"key": "a"}])),
                token,
            )
            .await?;
        assert_eq!(r.status, 401, "{}", r.body);
    }
    // The server refuses before reading this large body and drops the connection: the upload
    // gets a client of its own, so that no later call lands on the dropped connection.
    let r = baton_tests::Api::new(api.base())
        .post_bytes(
            "/api/v1/modules?name=word-count&version=1",
            baton_tests::plugin_bytes("word-count"),
            "application/wasm",
        )
        .await?;
    assert_eq!(r.status, 401, "{}", r.body);
    assert!(r.error().contains("Bearer"), "{}", r.error());
    // Reads stay open; with the token the calls go through.
    assert_eq!(api.get("/api/v1/pipelines").await?.status, 200);
    assert_eq!(api.get("/healthz").await?.status, 200);
    let r = api
        .send_with_token(
            Method::POST,
            "/api/v1/pipelines",
            Some(&spec),
            Some("s3cret"),
        )
        .await?;
    // Past auth: the module is not uploaded, which the handler says.
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.error().contains("not uploaded"), "{}", r.error());
    host.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_metrics_events_and_scans() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    let api = &host.api;
    api.upload_plugin("fail-on", "fail-on", "1").await?;
    api.create_pipeline(json!({
        "name": "wc", "module": "fail-on", "version": "1", "inputs": ["words"],
        "stores": ["counts"], "slots": 4, "partitions": 2, "config": {"value": "boom"}
    }))
    .await?;
    wait_for("readyz", Duration::from_secs(30), || async {
        Ok((api.get("/readyz").await?.status == 200).then_some(()))
    })
    .await?;

    let keys = words(5_000, 400, 4);
    let mut recs: Vec<_> = keys.iter().map(|k| (k.clone(), None)).collect();
    recs[1234].1 = Some("boom".into());
    let positions = api.produce("words", &recs).await?;
    api.wait_caught_up("wc", 5_000, Duration::from_secs(60))
        .await?;

    // Events: the failed record, with where it came from.
    let events = api.get("/api/v1/pipelines/wc/events").await?.body;
    let errors: Vec<_> = events
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["kind"] == "error")
        .collect();
    assert_eq!(errors.len(), 1, "{events}");
    let (slot, offset) = positions[1234];
    assert_eq!(errors[0]["topic"], "words");
    assert_eq!(errors[0]["slot"], slot);
    assert_eq!(errors[0]["offset"], offset);
    assert!(
        errors[0]["message"]
            .as_str()
            .unwrap_or("")
            .contains("poison")
    );
    let seq = errors[0]["seq"].as_u64().unwrap_or(0);
    let after = api
        .get(&format!("/api/v1/pipelines/wc/events?after={seq}"))
        .await?
        .body;
    assert!(
        after
            .as_array()
            .is_some_and(|a| a.iter().all(|e| e["seq"].as_u64() > Some(seq)))
    );
    assert_eq!(api.get("/api/v1/pipelines/nope/events").await?.status, 404);

    // Metrics: every partition's records add up to what was processed.
    let (status, text) = api.get_text("/metrics").await?;
    assert_eq!(status, 200);
    let sum = |name: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{pipeline=\"wc\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(sum("baton_records_in_total"), 5_000.0, "{text}");
    assert_eq!(sum("baton_dead_letters_total"), 1.0, "{text}");
    assert_eq!(sum("baton_lag_records"), 0.0, "{text}");
    assert!(sum("baton_batches_total") >= 2.0, "{text}");
    assert!(sum("baton_state_bytes") > 0.0, "{text}");
    for family in [
        "baton_batch_seconds_bucket",
        "baton_guest_seconds_total",
        "baton_swaps_total",
        "baton_restore_records_done",
        "baton_block_cache_hits_total",
    ] {
        assert!(text.contains(family), "{family} missing:\n{text}");
    }
    assert!(
        text.contains("baton_batch_seconds_bucket{pipeline=\"wc\",partition=\"wc-0\",le=\"+Inf\"}"),
        "{text}"
    );
    assert_eq!(sum("baton_session_failures_total"), 0.0, "{text}");
    assert_eq!(sum("baton_partition_failed"), 0.0, "{text}");

    // Every metric the shipped alert rules and dashboard use is one this host exports.
    let exported = |name: &str| {
        text.lines().any(|l| {
            let l = l.strip_prefix("# TYPE ").unwrap_or(l);
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
    };
    for file in [
        "deploy/prometheus/baton-alerts.yml",
        "deploy/grafana/baton-dashboard.json",
    ] {
        let used = metric_names(&std::fs::read_to_string(
            baton_tests::repo_root().join(file),
        )?);
        assert!(used.len() >= 8, "{file} names only {used:?}");
        let missing: Vec<_> = used.iter().filter(|n| !exported(n)).collect();
        assert!(
            missing.is_empty(),
            "{file} uses metrics /metrics does not export: {missing:?}"
        );
    }

    // Scans: pages of 37 over prefix `w1` cover every such key exactly once, with its count.
    let mut expected = count(keys.iter().map(String::as_str));
    expected.retain(|k, _| k.starts_with("w1"));
    assert!(
        expected.len() > 2 * 37,
        "{} keys: too few to page through",
        expected.len()
    );
    let mut pages = 0;
    let mut seen = BTreeSet::new();
    let mut cursor: Option<String> = None;
    loop {
        let q = match &cursor {
            Some(c) => format!("?prefix=w1&limit=37&cursor={c}"),
            None => "?prefix=w1&limit=37".to_string(),
        };
        let page = api
            .get(&format!("/api/v1/pipelines/wc/stores/counts/keys{q}"))
            .await?;
        assert_eq!(page.status, 200, "{}", page.body);
        pages += 1;
        for item in page.body["items"].as_array().into_iter().flatten() {
            let key = item["key"].as_str().unwrap_or("").to_string();
            assert!(key.starts_with("w1"), "{item}");
            assert_eq!(
                item["value_i64"].as_i64(),
                expected.get(&key).copied(),
                "{item}"
            );
            assert!(seen.insert(key), "{item} seen twice");
        }
        assert_eq!(page.body["restoring"], false);
        match page.body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, expected.keys().cloned().collect::<BTreeSet<_>>());
    // A full page has a cursor, so an exact multiple of 37 ends with an empty page.
    assert_eq!(pages, expected.len() / 37 + 1, "pages of 37");
    for bad in ["?limit=0", "?limit=5000", "?cursor=nonsense", "?bogus=1"] {
        let r = api
            .get(&format!("/api/v1/pipelines/wc/stores/counts/keys{bad}"))
            .await?;
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
        assert!(!r.error().is_empty());
    }
    assert_eq!(
        api.get("/api/v1/pipelines/wc/stores/nope/keys")
            .await?
            .status,
        404
    );
    host.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modules_come_back_from_the_log_and_compiled_code_is_reused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    let m = host
        .api
        .upload_plugin("word-count", "word-count", "1")
        .await?;
    assert!(m["size"].as_u64() > Some(1000), "{m}");
    assert_eq!(m["wit"], "baton:processor@0.2.0");
    assert!(m["uploaded_at"].as_i64() > Some(0), "{m}");
    host.api
        .create_pipeline(json!({"name": "wc", "module": "word-count", "version": "1",
                                "inputs": ["w"], "stores": ["counts"], "slots": 2}))
        .await?;
    host.api
        .produce("w", &[("a".to_string(), None), ("a".to_string(), None)])
        .await?;
    host.api
        .wait_caught_up("wc", 2, Duration::from_secs(30))
        .await?;
    host.stop().await?;

    let compiled: Vec<_> = std::fs::read_dir(dir.path().join("compiled"))?
        .map(|e| {
            let e = e?;
            Ok((e.path(), e.metadata()?.modified()?))
        })
        .collect::<anyhow::Result<_>>()?;
    assert_eq!(compiled.len(), 1, "{compiled:?}");
    // The module's file is gone: the host reads it back from the log.
    std::fs::remove_dir_all(dir.path().join("modules"))?;
    let host = InProcess::start(dir.path()).await?;
    host.api.produce("w", &[("a".to_string(), None)]).await?;
    host.api
        .wait_caught_up("wc", 3, Duration::from_secs(30))
        .await?;
    assert_eq!(host.api.counter("wc", "counts", "a").await?, Some(3));
    // Not compiled again: the cached file is untouched.
    let after = std::fs::metadata(&compiled[0].0)?.modified()?;
    assert_eq!(after, compiled[0].1, "compiled code was rewritten");
    assert_eq!(std::fs::read_dir(dir.path().join("compiled"))?.count(), 1);
    host.stop().await
}

/// The `baton_*` metric names a rules or dashboard file uses.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("baton_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        // Not part of a longer word (a label value such as `job="baton"` has no underscore).
        if i == 0 || !rest.as_bytes()[i - 1].is_ascii_alphanumeric() {
            names.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    names
}

/// The shipped alert rules load in Prometheus, and each alert fires on the series that should
/// raise it and not before (`deploy/prometheus/baton-alerts.test.yml`); `scripts/setup`
/// installs `promtool` (Debian's prometheus).
#[test]
fn alert_rules_pass_promtool() -> anyhow::Result<()> {
    let dir = baton_tests::repo_root().join("deploy/prometheus");
    for args in [
        ["check", "rules", "baton-alerts.yml"],
        ["test", "rules", "baton-alerts.test.yml"],
    ] {
        let out = std::process::Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .map_err(|e| anyhow::anyhow!("promtool (scripts/setup installs it): {e}"))?;
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
