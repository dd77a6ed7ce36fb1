//! Traces over OTLP/HTTP (`--otlp-endpoint`): a minimal OTLP/HTTP receiver (JSON at
//! `/v1/traces`, as an OpenTelemetry Collector takes it) gets spans of batches, commits and
//! every step of a move from two hosts, and they agree with what the hosts report.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::post;
use baton_tests::{
    TestProducer, cluster_name, kafka_bootstrap, kafka_lock, wait_alive, wait_for, words,
};
use serde_json::{Value, json};

/// A span as received, with its resource's `service.instance.id`.
#[derive(Debug, Clone)]
struct Got {
    host: String,
    span: Value,
}

impl Got {
    fn attr(&self, key: &str) -> Option<&Value> {
        self.span["attributes"]
            .as_array()?
            .iter()
            .find(|a| a["key"] == key)
            .map(|a| &a["value"])
    }
    fn str_attr(&self, key: &str) -> Option<&str> {
        self.attr(key)?["stringValue"].as_str()
    }
    fn int_attr(&self, key: &str) -> Option<u64> {
        self.attr(key)?["intValue"].as_str()?.parse().ok()
    }
    fn nanos(&self, field: &str) -> u64 {
        self.span[field]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }
}

/// Starts the receiver on 127.0.0.1: its URL and what it got.
async fn receiver() -> anyhow::Result<(String, Arc<Mutex<Vec<Got>>>)> {
    let got: Arc<Mutex<Vec<Got>>> = Arc::default();
    let sink = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: axum::Json<Value>| {
            let sink = sink.clone();
            async move {
                for rs in body["resourceSpans"].as_array().into_iter().flatten() {
                    let host = rs["resource"]["attributes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|a| a["key"] == "service.instance.id")
                        .and_then(|a| a["value"]["stringValue"].as_str())
                        .unwrap_or_default()
                        .to_string();
                    assert!(
                        rs["resource"]["attributes"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|a| a["key"] == "service.name"
                                && a["value"]["stringValue"] == "baton"),
                        "{rs}"
                    );
                    for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                        for span in ss["spans"].as_array().into_iter().flatten() {
                            sink.lock().unwrap().push(Got {
                                host: host.clone(),
                                span: span.clone(),
                            });
                        }
                    }
                }
                axum::Json(json!({}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((format!("http://{addr}"), got))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_commits_and_each_step_of_a_move_are_exported_over_otlp_http() -> anyhow::Result<()>
{
    let _k = kafka_lock().await;
    let (endpoint, got) = receiver().await?;
    let dir = tempfile::tempdir()?;
    let cluster = cluster_name(dir.path());
    let bootstrap = kafka_bootstrap();
    let start = |id: &'static str| {
        let (dir, cluster, bootstrap, endpoint) = (
            dir.path().join(id),
            cluster.clone(),
            bootstrap.clone(),
            endpoint.clone(),
        );
        async move {
            let extra = ["--otlp-endpoint", &endpoint];
            baton_tests::child_member_on(&dir, &cluster, id, &bootstrap, &extra, &[]).await
        }
    };
    let a = start("a").await?;
    let b = start("b").await?;
    wait_alive(&a.api, 2).await?;
    wait_alive(&b.api, 2).await?;
    let input = baton_tests::unique("traced-words");
    a.api.upload_plugin("word-count", "word-count", "1").await?;
    a.api
        .create_pipeline(json!({
            "name": "wc", "module": "word-count", "version": "1", "inputs": [input],
            "stores": ["counts"], "slots": 2, "partitions": 1, "guarantee": "exactly-once"
        }))
        .await?;
    let owner = wait_for("wc-0 running", Duration::from_secs(90), || async {
        let p = a.api.partition("wc-0").await?;
        Ok((p["state"] == "running").then(|| p["owner"].as_str().unwrap_or_default().to_string()))
    })
    .await?;
    let (target, owner_api, target_api) = if owner == "a" {
        ("b", &a.api, &b.api)
    } else {
        ("a", &b.api, &a.api)
    };
    // Records before the move, during it, and after it (so that both hosts commit some).
    let sent = words(6000, 300, 7);
    let records: Vec<(String, String)> = sent.iter().map(|w| (w.clone(), "x".into())).collect();
    let producer = TestProducer::new()?;
    producer.send(&input, 2, &records[..2000]).await?;
    owner_api
        .wait_caught_up("wc", 2000, Duration::from_secs(60))
        .await?;
    let moved = a
        .api
        .post_json("/api/v1/partitions/wc-0/move", &json!({"to": target}))
        .await?;
    assert_eq!(moved.status, 202, "{moved:?}");
    let move_id = moved.body["move"].as_str().unwrap_or_default().to_string();
    producer.send(&input, 2, &records[2000..4000]).await?;
    let done = wait_for("the move done", Duration::from_secs(120), || async {
        let p = a.api.partition("wc-0").await?;
        Ok(p["moves"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["id"] == move_id.as_str() && m["phase"] == "done")
            .cloned())
    })
    .await?;
    producer.send(&input, 2, &records[4000..]).await?;
    target_api
        .wait_caught_up("wc", sent.len() as u64, Duration::from_secs(120))
        .await?;

    // The move's trace: a root span, and a child for warming, the drain and each step of the
    // pause the move recorded, in that order, the pause's steps adding up to its pause.
    let trace = wait_for("the move's trace", Duration::from_secs(30), || async {
        let spans = got.lock().unwrap().clone();
        let Some(root) = spans.iter().find(|g| {
            g.span["name"] == "move" && g.str_attr("baton.move") == Some(move_id.as_str())
        }) else {
            return Ok(None);
        };
        let children: Vec<Got> = spans
            .iter()
            .filter(|g| g.span["parentSpanId"] == root.span["spanId"])
            .cloned()
            .collect();
        let steps = done["steps"].as_array().map_or(0, Vec::len);
        Ok((children.len() == steps + 2).then(|| (root.clone(), children)))
    })
    .await?;
    let (root, mut children) = trace;
    assert_eq!(root.host, target, "the target traces the move");
    assert_eq!(root.str_attr("baton.outcome"), Some("done"));
    assert_eq!(root.str_attr("baton.from"), Some(owner.as_str()));
    assert!(root.span.get("parentSpanId").is_none());
    children.sort_by_key(|c| c.nanos("startTimeUnixNano"));
    let names: Vec<&str> = children
        .iter()
        .map(|c| c.span["name"].as_str().unwrap_or_default())
        .collect();
    let mut want = vec!["move.warming".to_string(), "move.drain".to_string()];
    for s in done["steps"].as_array().into_iter().flatten() {
        want.push(format!("move.{}", s["step"].as_str().unwrap_or_default()));
    }
    assert_eq!(names, want, "{done}");
    for c in &children {
        assert_eq!(c.span["traceId"], root.span["traceId"]);
        assert!(c.nanos("startTimeUnixNano") >= root.nanos("startTimeUnixNano"));
        assert!(c.nanos("endTimeUnixNano") <= root.nanos("endTimeUnixNano"));
    }
    let pause_ns: u64 = children[2..]
        .iter()
        .map(|c| c.nanos("endTimeUnixNano") - c.nanos("startTimeUnixNano"))
        .sum();
    let pause_ms = done["pause_ms"].as_f64().unwrap_or(-1.0);
    assert!(
        (pause_ns as f64 / 1e6 - pause_ms).abs() < 1.0,
        "steps add up to {} ms, the move paused {pause_ms} ms",
        pause_ns as f64 / 1e6
    );

    // Commits: every record committed once, on one host or the other; batches: every record
    // processed at least once.
    let sums = wait_for(
        "every record in a commit span",
        Duration::from_secs(30),
        || async {
            let spans = got.lock().unwrap().clone();
            let sum = |name: &str| {
                let mut by_host: BTreeMap<String, u64> = BTreeMap::new();
                for g in spans.iter().filter(|g| {
                    g.span["name"] == name && g.str_attr("baton.partition") == Some("wc-0")
                }) {
                    *by_host.entry(g.host.clone()).or_default() +=
                        g.int_attr("baton.records").unwrap_or(0);
                }
                by_host
            };
            let (commits, batches) = (sum("commit"), sum("batch"));
            let committed: u64 = commits.values().sum();
            Ok((committed >= sent.len() as u64).then_some((commits, batches)))
        },
    )
    .await?;
    let (commits, batches) = sums;
    assert_eq!(
        commits.values().sum::<u64>(),
        sent.len() as u64,
        "{commits:?}"
    );
    assert_eq!(commits.len(), 2, "both hosts committed: {commits:?}");
    assert!(
        batches.values().sum::<u64>() >= sent.len() as u64,
        "{batches:?}"
    );

    let metrics = a.api.get_text("/metrics").await?.1;
    let exported = metrics
        .lines()
        .find_map(|l| l.strip_prefix("baton_otlp_spans_exported_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(exported > 0.0, "{metrics}");
    a.terminate()?;
    b.terminate()?;
    Ok(())
}
