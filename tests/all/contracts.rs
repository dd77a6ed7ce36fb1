//! Components of both contracts the host serves: a 0.1 component (built straight on the 0.1
//! bindings, no SDK) and the 0.2 build of the same logic (baton-sdk, batch ABI) leave the same
//! state and send the same outputs, headers included, for the same input.

use std::collections::BTreeMap;
use std::time::Duration;

use baton_tests::{InProcess, count, words};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn components_of_both_contracts_count_and_send_the_same() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    let api = &host.api;
    for (plugin, contract) in [
        ("word-count", "0.2.0"),
        ("word-count-v01", "0.1.0"),
        ("uppercase", "0.2.0"),
        ("uppercase-v01", "0.1.0"),
    ] {
        let m = api.upload_plugin(plugin, plugin, "1").await?;
        assert_eq!(m["wit"], format!("baton:processor@{contract}"), "{m}");
    }
    for v in ["", "-v01"] {
        api.create_pipeline(json!({
            "name": format!("wc{v}"), "module": format!("word-count{v}"), "version": "1",
            "inputs": ["words"], "stores": ["counts"], "slots": 4, "partitions": 2
        }))
        .await?;
        api.create_pipeline(json!({
            "name": format!("up{v}"), "module": format!("uppercase{v}"), "version": "1",
            "inputs": ["words"], "outputs": [format!("out{v}")],
            "config": {"output": format!("out{v}")}, "slots": 4, "partitions": 2
        }))
        .await?;
    }

    // Keys, values, tombstones, records without a key, and headers (none, one, two).
    let keys = words(6_000, 400, 5);
    let mut sent = Vec::new();
    for (c, chunk) in keys.chunks(500).enumerate() {
        let body: Vec<Value> = chunk
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let key = if i % 50 == 7 { Value::Null } else { json!(k) };
                let value = if i % 40 == 3 {
                    Value::Null
                } else {
                    json!(format!("v{c}-{i} ünïcode"))
                };
                let headers = match i % 3 {
                    0 => json!({}),
                    1 => json!({"trace": format!("t{i}")}),
                    _ => json!({"trace": format!("t{i}"), "ßource": "test"}),
                };
                json!({"key": key, "value": value, "headers": headers})
            })
            .collect();
        let r = api
            .post_json("/api/v1/topics/words/records", &Value::Array(body.clone()))
            .await?;
        assert_eq!(r.status, 200, "{r:?}");
        sent.extend(body);
    }
    let n = sent.len() as u64;
    for p in ["wc", "wc-v01", "up", "up-v01"] {
        api.wait_caught_up(p, n, Duration::from_secs(120)).await?;
    }

    let expected = count(sent.iter().filter_map(|r| r["key"].as_str()));
    for (key, want) in &expected {
        assert_eq!(
            api.counter("wc", "counts", key).await?,
            Some(*want),
            "0.2 count of {key}"
        );
        assert_eq!(
            api.counter("wc-v01", "counts", key).await?,
            Some(*want),
            "0.1 count of {key}"
        );
    }

    // Outputs: the upper-cased value with the input's key and headers, once per input record.
    let mut want = BTreeMap::new();
    for r in &sent {
        let headers: BTreeMap<String, String> = r["headers"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect();
        let out = (
            r["key"].as_str().map(str::to_string),
            r["value"].as_str().map(str::to_uppercase),
            headers,
        );
        *want.entry(out).or_insert(0usize) += 1;
    }
    for topic in ["out", "out-v01"] {
        let got = baton_tests::wait_for(
            &format!("{n} records in {topic}"),
            Duration::from_secs(30),
            || async {
                let recs = api.read_topic(topic, 4).await?;
                Ok((recs.len() as u64 >= n).then_some(recs))
            },
        )
        .await?;
        let mut multiset = BTreeMap::new();
        for r in got {
            *multiset
                .entry((r.key, r.value, r.headers))
                .or_insert(0usize) += 1;
        }
        assert_eq!(multiset, want, "the outputs of {topic}");
    }
    host.stop().await
}
