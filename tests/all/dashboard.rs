//! The dashboard in a real browser: `tests/dashboard/ui.mjs` drives Debian's headless Chromium
//! (playwright-core) against three `baton` processes on Kafka that run with a token. Through
//! the page only, it gives the token, uploads word-count (by drag and drop), creates a pipeline
//! from the form, produces records, looks counts up, moves partitions (by drag and drop and
//! from a menu), splits one and merges the halves back across hosts, takes a checkpoint,
//! hot-swaps and rolls back, checks the page with axe-core at two widths, and follows the
//! cluster to another host when its own is killed. This test then checks through the API that
//! everything the page showed happened: exact counts, the layout, the versions, the history.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use baton_tests::{
    baton_bin, child_member_on, cluster_name, kafka_bootstrap, kafka_lock, repo_root, unique,
    wait_alive, wait_for,
};
use serde_json::Value;

/// Where the screenshots and the page's results go: `$CARGO_TARGET_DIR/dashboard-artifacts`.
fn artifacts() -> PathBuf {
    baton_bin()
        .parent()
        .and_then(|p| p.parent())
        .map(|t| t.join("dashboard-artifacts"))
        .unwrap_or_else(|| std::env::temp_dir().join("baton-dashboard-artifacts"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dashboard_manages_a_three_host_cluster_in_a_real_browser() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let script = repo_root().join("tests/dashboard/ui.mjs");
    let dirs: Vec<_> = (0..3)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let cluster = cluster_name(dirs[0].path());
    let token = format!("dash-{}", unique("t"));
    let ids = ["a", "b", "c"];
    let mut hosts = Vec::new();
    for (dir, id) in dirs.iter().zip(ids) {
        hosts.push(
            child_member_on(
                dir.path(),
                &cluster,
                id,
                &kafka_bootstrap(),
                &["--token", &token],
                &[],
            )
            .await?,
        );
    }
    for h in &hosts {
        wait_alive(&h.api, 3).await?;
    }
    let urls: Vec<String> = hosts.iter().map(|h| h.api.base().to_string()).collect();
    let topic = unique("dash-in");
    // A pipeline that dead-letters the value `boom`, made through the API: the page shows its
    // dead letters, replays them and deletes it.
    let dl_topic = unique("dash-dl");
    let admin = baton_tests::Api::with_token(urls[1].clone(), &token);
    admin.upload_plugin("fail-on", "fail-on", "1").await?;
    admin
        .create_pipeline(serde_json::json!({
            "name": "dl", "module": "fail-on", "version": "1", "inputs": [dl_topic],
            "stores": ["counts"], "slots": 2, "partitions": 1, "config": {"value": "boom"}
        }))
        .await?;
    let out = artifacts();
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    let kill = out.join("kill");

    let mut node = tokio::process::Command::new("node")
        .arg(&script)
        .env("BATON_URLS", urls.join(","))
        .env("BATON_HOSTS", ids.join(","))
        .env("BATON_TOKEN", &token)
        .env("BATON_WASM", baton_tests::plugin("word-count"))
        .env("BATON_TOPIC", &topic)
        .env("BATON_DL_TOPIC", &dl_topic)
        .env("BATON_ARTIFACTS", &out)
        .env("BATON_KILL", &kill)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("running node (scripts/setup installs Node.js and the test's tools)")?;
    let stdout = node.stdout.take().context("node's stdout")?;
    let stderr = node.stderr.take().context("node's stderr")?;
    let said = tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let (mut a, mut b) = (String::new(), String::new());
        let (mut o, mut e) = (stdout, stderr);
        let _ = tokio::join!(o.read_to_string(&mut a), e.read_to_string(&mut b));
        format!("{a}{b}")
    });

    // The page asks for its host to die once it has done everything else.
    let mut first = Some(hosts.remove(0));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    let status = loop {
        if let Some(status) = node.try_wait()? {
            break status;
        }
        if kill.exists()
            && let Some(a) = first.take()
        {
            a.kill9()?;
        }
        if tokio::time::Instant::now() > deadline {
            node.kill().await?;
            bail!("the browser test ran over 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let log = said.await?;
    println!("{log}");
    let results: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("results.json"))
            .with_context(|| format!("the page's results in {}: {log}", out.display()))?,
    )?;
    ensure!(
        status.success() && results["ok"] == true,
        "the browser test failed: {}\n{log}",
        results["error"]
    );
    ensure!(first.is_none(), "the page never asked for its host to die");

    // What the page did, through the API of a host that lives.
    let api = &hosts[0].api;
    let expected: BTreeMap<String, i64> = serde_json::from_value(results["expected"].clone())?;
    ensure!(
        expected.len() > 30,
        "the page produced records: {expected:?}"
    );
    for (key, want) in &expected {
        let got = wait_for(
            &format!("the count of {key}"),
            Duration::from_secs(30),
            || async {
                let r = api
                    .get(&format!("/api/v1/pipelines/wc/stores/counts/keys/{key}"))
                    .await?;
                Ok((r.status == 200)
                    .then(|| r.body["value_i64"].as_i64())
                    .flatten())
            },
        )
        .await?;
        ensure!(got == *want, "{key}: counted {got}, produced {want}");
    }
    let rows = api.partitions().await?;
    let mut wc: Vec<&Value> = rows.iter().filter(|p| p["pipeline"] == "wc").collect();
    wc.sort_by_key(|p| p["slots"][0].as_u64());
    let mut next = 0;
    for p in &wc {
        ensure!(p["slots"][0] == next, "the slots are covered once: {wc:?}");
        ensure!(
            p["owner"] != "a",
            "nothing stays on the killed host: {wc:?}"
        );
        next = p["slots"][1].as_u64().unwrap_or(0);
    }
    ensure!(next == 8, "the slots are covered once: {wc:?}");
    let merged = results["merged"].as_str().unwrap_or_default();
    ensure!(
        wc.iter()
            .any(|p| p["id"] == merged && p["slots"] == serde_json::json!([0, 4])),
        "the merge the page showed, {merged} of slots 0..4: {wc:?}"
    );
    let retired = api.get("/api/v1/partitions?retired=true").await?.body;
    let retired_ids: Vec<&str> = retired
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["id"].as_str())
        .collect();
    ensure!(
        retired_ids.contains(&"wc-0"),
        "wc-0 retired by the split: {retired_ids:?}"
    );
    for half in results["halves"].as_array().into_iter().flatten() {
        ensure!(
            retired_ids.contains(&half.as_str().unwrap_or_default()),
            "{half} retired by the merge: {retired_ids:?}"
        );
    }
    let dl = api.get("/api/v1/pipelines/dl").await?;
    ensure!(
        dl.status == 404,
        "dl deleted from the page: {} {}",
        dl.status,
        dl.body
    );
    let pipe = api.get("/api/v1/pipelines/wc").await?.body;
    ensure!(
        pipe["version"] == "1",
        "wc runs version 1 after the rollback: {pipe}"
    );
    let swaps: Vec<(String, String)> = pipe["swaps"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| (s["from"].to_string(), s["version"].to_string()))
        .collect();
    ensure!(
        swaps
            == [
                ("\"1\"".into(), "\"2\"".into()),
                ("\"2\"".into(), "\"1\"".into())
            ],
        "the swap and the rollback: {swaps:?}"
    );
    let modules = api.get("/api/v1/modules").await?.body;
    let versions: Vec<&str> = modules
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["name"] == "word-count")
        .filter_map(|m| m["version"].as_str())
        .collect();
    ensure!(
        versions == ["1"],
        "the uploads, the refused one, the deletes (one cancelled, one refused): {versions:?}"
    );
    for shot in results["screenshots"].as_array().into_iter().flatten() {
        let bytes = std::fs::read(shot.as_str().unwrap_or_default())?;
        ensure!(
            bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000,
            "screenshot {shot}"
        );
    }
    println!(
        "dashboard: live data {} ms after opening; files {}; {:.2} stream messages/s under load; screenshots in {}",
        results["load_ms"],
        results["bundle"],
        results["stream_rate"].as_f64().unwrap_or(0.0),
        out.display()
    );
    Ok(())
}

/// The events of an SSE body read so far: (id, event, data) of each complete one.
fn sse_events(buf: &str) -> Vec<(String, String, Value)> {
    buf.split("\n\n")
        .filter_map(|block| {
            let (mut id, mut event, mut data) = (String::new(), String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.to_string();
                } else if let Some(v) = line.strip_prefix("event: ") {
                    event = v.to_string();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            let data = serde_json::from_str(&data).ok()?;
            Some((id, event, data))
        })
        .collect()
}

/// Reads `GET /api/v1/stream` of `base` (with `last` as `Last-Event-ID`) for `secs` seconds or
/// until `enough` holds for the messages read; answers them.
async fn read_stream(
    base: &str,
    last: Option<&str>,
    secs: f64,
    enough: impl Fn(&[(String, String, Value)]) -> bool,
) -> anyhow::Result<Vec<(String, String, Value)>> {
    let mut req = reqwest::Client::new().get(format!("{base}/api/v1/stream"));
    if let Some(id) = last {
        req = req.header("last-event-id", id);
    }
    let mut resp = req.send().await?;
    ensure!(
        resp.status() == 200,
        "the stream answered {}",
        resp.status()
    );
    let kind = resp.headers()["content-type"].to_str()?.to_string();
    ensure!(kind.starts_with("text/event-stream"), "content type {kind}");
    let end = tokio::time::Instant::now() + Duration::from_secs_f64(secs);
    let mut buf = String::new();
    loop {
        let msgs = sse_events(&buf);
        if enough(&msgs) {
            return Ok(msgs);
        }
        match tokio::time::timeout_at(end, resp.chunk()).await {
            Err(_) => return Ok(msgs),
            Ok(chunk) => match chunk? {
                Some(c) => buf.push_str(&String::from_utf8_lossy(&c)),
                None => return Ok(sse_events(&buf)),
            },
        }
    }
}

/// The events (guest errors here) a message carries, by their pipeline seq.
fn seqs(msgs: &[(String, String, Value)]) -> Vec<u64> {
    msgs.iter()
        .flat_map(|(_, _, d)| d["events"].as_array().cloned().unwrap_or_default())
        .filter_map(|e| e["seq"].as_u64())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_event_stream_is_coalesced_resumes_after_its_last_event_and_checks_tokens()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = baton_tests::InProcess::start_configured(dir.path(), None, |c| {
        c.token = Some("stream-token".into());
    })
    .await?;
    let base = host.api.base().to_string();
    let api = baton_tests::Api::with_token(base.clone(), "stream-token");

    // The token check: 204 for the right one, 401 naming the problem otherwise.
    let r = api.post_json("/api/v1/auth/check", &Value::Null).await?;
    ensure!(r.status == 204, "the right token: {} {}", r.status, r.body);
    let wrong = baton_tests::Api::with_token(base.clone(), "not-it");
    let r = wrong.post_json("/api/v1/auth/check", &Value::Null).await?;
    ensure!(
        r.status == 401 && r.error().contains("wrong"),
        "a wrong token: {} {}",
        r.status,
        r.body
    );
    let r = host
        .api
        .post_json("/api/v1/auth/check", &Value::Null)
        .await?;
    ensure!(
        r.status == 401 && r.error().contains("Authorization"),
        "no token: {} {}",
        r.status,
        r.body
    );

    // Dead letters make events: three poison records, then three more.
    api.upload_plugin("fail-on", "fail-on", "1").await?;
    api.create_pipeline(serde_json::json!({
        "name": "ev", "module": "fail-on", "version": "1", "inputs": ["ev-in"],
        "stores": ["counts"], "slots": 4, "partitions": 2, "config": {"value": "boom"}
    }))
    .await?;
    let poison = |n: usize, tag: &str| -> Vec<(String, Option<String>)> {
        (0..n)
            .map(|i| (format!("{tag}{i}"), Some("boom".to_string())))
            .collect()
    };
    api.produce("ev-in", &poison(3, "p")).await?;
    let first = read_stream(&base, None, 30.0, |m| seqs(m).len() >= 3).await?;
    let seen = seqs(&first);
    ensure!(
        seen.len() == 3,
        "the first messages carry the 3 dead letters: {seen:?}"
    );
    let (id, event, data) = first.last().context("a message")?.clone();
    ensure!(event == "snapshot", "event {event}");
    ensure!(
        data["state"]["partitions"].as_array().map(Vec::len) == Some(2)
            && data["state"]["partitions"][0]["records_per_s"].is_number()
            && data["state"]["pipelines"][0]["name"] == "ev",
        "the state: {data}"
    );
    for e in first
        .iter()
        .flat_map(|(_, _, d)| d["events"].as_array().cloned().unwrap_or_default())
    {
        ensure!(
            e["kind"] == "error"
                && e["topic"] == "ev-in"
                && e["offset"].is_u64()
                && e["message"].as_str().unwrap_or_default().contains("poison"),
            "a dead letter names its error and record: {e}"
        );
    }

    // A client that comes back with its last id gets only what it missed.
    api.produce("ev-in", &poison(3, "q")).await?;
    let again = read_stream(&base, Some(&id), 30.0, |m| seqs(m).len() >= 3).await?;
    let resumed = seqs(&again);
    ensure!(
        resumed.len() == 3 && resumed.iter().all(|s| !seen.contains(s)),
        "after {id}: only the 3 new dead letters, not {seen:?}: {resumed:?}"
    );
    // An id of another host or boot gets everything kept.
    let fresh = read_stream(&base, Some("other-9"), 30.0, |m| seqs(m).len() >= 6).await?;
    ensure!(
        seqs(&fresh).len() == 6,
        "a stranger's id: {:?}",
        seqs(&fresh)
    );

    // A client away longer than the feed waits for one (it stops 10 s after its last client
    // and starts again with the next) resumes after its last event all the same.
    let last = again.last().context("a message")?.0.clone();
    tokio::time::sleep(Duration::from_secs(12)).await;
    api.produce("ev-in", &poison(2, "r")).await?;
    let back = read_stream(&base, Some(&last), 30.0, |m| seqs(m).len() >= 2).await?;
    let after_pause = seqs(&back);
    ensure!(
        after_pause.len() == 2
            && after_pause
                .iter()
                .all(|s| !seen.contains(s) && !resumed.contains(s)),
        "after a pause, from {last}: only the 2 new dead letters: {after_pause:?}"
    );

    // Coalesced: records flow all the time, and a client gets at most 4 messages a second.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flow = {
        let (api, stop) = (api.clone(), stop.clone());
        tokio::spawn(async move {
            let mut sent = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let recs: Vec<_> = (0..500)
                    .map(|i| (format!("k{i}"), Some("ok".to_string())))
                    .collect();
                api.produce("ev-in", &recs).await?;
                sent += recs.len();
            }
            anyhow::Ok(sent)
        })
    };
    let started = std::time::Instant::now();
    let msgs = read_stream(&base, None, 3.0, |_| false).await?;
    let secs = started.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = flow.await??;
    ensure!(sent > 0, "records flowed");
    ensure!(
        msgs.len() >= 3 && msgs.len() as f64 <= 4.0 * secs + 1.0,
        "{} messages in {secs:.1} s while {sent} records flowed",
        msgs.len()
    );

    // CORS for the cluster's own origins only.
    let http = reqwest::Client::new();
    let own = http
        .request(
            reqwest::Method::OPTIONS,
            format!("{base}/api/v1/auth/check"),
        )
        .header("origin", &base)
        .header("access-control-request-method", "POST")
        .send()
        .await?;
    ensure!(
        own.status() == 204
            && own
                .headers()
                .get("access-control-allow-origin")
                .map(|v| v.as_bytes())
                == Some(base.as_bytes()),
        "a preflight from a cluster host's origin: {:?}",
        own.headers()
    );
    let other = http
        .get(format!("{base}/api/v1/partitions"))
        .header("origin", "http://elsewhere.invalid")
        .send()
        .await?;
    ensure!(
        other.headers().get("access-control-allow-origin").is_none(),
        "no CORS for another origin"
    );
    host.stop().await?;
    Ok(())
}
