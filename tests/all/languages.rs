//! Processors in other languages: the Python, JavaScript, C and Go versions of word-count and
//! windowed-count (each language's SDK and toolchain) leave byte-identical state and outputs to
//! the Rust versions on the same input, run by `baton test-plugin`.

use std::process::Command;

use baton_tests::{baton_bin, plugin, words};
use serde_json::{Value, json};

/// `baton test-plugin COMPONENT ARGS`'s JSON lines (logs left out), in order.
fn run(component: &str, args: &[&str]) -> anyhow::Result<Vec<Value>> {
    let out = Command::new(baton_bin())
        .arg("test-plugin")
        .arg(plugin(component))
        .args(args)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "{component}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = String::from_utf8(out.stdout)?
        .lines()
        .map(serde_json::from_str::<Value>)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(lines
        .into_iter()
        .filter(|l| l.get("log").is_none())
        .collect())
}

/// Records with skewed keys, a few without a key, some with headers, timestamps that mostly
/// move on with some late ones.
fn input(dir: &std::path::Path, n: usize, seed: u64) -> anyhow::Result<String> {
    let keys = words(n, 200, seed);
    let mut t = 1_000i64;
    let mut text = String::new();
    for (i, k) in keys.iter().enumerate() {
        let r = (i as i64 * 7919 + seed as i64) % 1_000;
        t += r % 40;
        let ts = if r % 13 == 0 { t - 1_500 } else { t };
        let mut line = json!({"value": format!("v{i}"), "timestamp": ts});
        if r % 97 != 0 {
            line["key"] = json!(k);
        }
        if r % 7 == 0 {
            line["headers"] = json!({"trace": format!("t{i}")});
        }
        text.push_str(&format!("{line}\n"));
    }
    let path = dir.join(format!("in-{seed}.jsonl"));
    std::fs::write(&path, text)?;
    Ok(path.to_string_lossy().into_owned())
}

/// `<lang>-word-count` and `<lang>-windowed-count` against the Rust ones, on an input of its own.
fn same_as_rust(lang: &str) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let seed = baton_tests::test_seed(&format!("languages-{lang}"));
    let records = input(dir.path(), 4_000, seed)?;

    let args = ["--input", &records, "--slots", "4", "--store", "counts"];
    let rust = run("word-count", &args)?;
    let other = run(&format!("{lang}-word-count"), &args)?;
    let state = rust.iter().filter(|l| l.get("state").is_some()).count();
    assert!(state > 100, "word-count left {state} entries");
    assert_eq!(other, rust, "word-count: {lang} and Rust differ");

    let args = [
        "--input",
        &records,
        "--slots",
        "3",
        "--store",
        "windows",
        "--config",
        "window_ms=1000",
        "--config",
        "grace_ms=200",
        "--config",
        "output=counts-out",
        "--config",
        "late=late-out",
    ];
    let rust = run("windowed-count", &args)?;
    let other = run(&format!("{lang}-windowed-count"), &args)?;
    let topic = |t: &str| rust.iter().filter(|l| l["output"]["topic"] == t).count();
    assert!(
        topic("counts-out") > 100 && topic("late-out") > 10,
        "windowed-count: {} final counts, {} late records",
        topic("counts-out"),
        topic("late-out")
    );
    assert_eq!(other, rust, "windowed-count: {lang} and Rust differ");
    Ok(())
}

#[test]
fn python_processors_leave_the_same_state_and_outputs_as_rust_ones() -> anyhow::Result<()> {
    same_as_rust("python")
}

#[test]
fn javascript_processors_leave_the_same_state_and_outputs_as_rust_ones() -> anyhow::Result<()> {
    same_as_rust("js")
}

#[test]
fn c_processors_leave_the_same_state_and_outputs_as_rust_ones() -> anyhow::Result<()> {
    same_as_rust("c")
}

#[test]
fn go_processors_leave_the_same_state_and_outputs_as_rust_ones() -> anyhow::Result<()> {
    same_as_rust("go")
}

/// `baton_module_compiles_total` of a host.
async fn compiles(api: &baton_tests::Api) -> anyhow::Result<u64> {
    let (status, text) = api.get_text("/metrics").await?;
    anyhow::ensure!(status == 200, "/metrics: {status}");
    text.lines()
        .find_map(|l| l.strip_prefix("baton_module_compiles_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .ok_or_else(|| anyhow::anyhow!("no baton_module_compiles_total in /metrics"))
}

/// A large component (Python, ~19 MB) compiles once, at upload: not again for the same bytes
/// under another version, not at the hot swap to it, not when the host starts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_component_compiles_once_at_upload_not_at_swap_or_restart() -> anyhow::Result<()> {
    use std::collections::BTreeMap;
    use std::time::Duration;

    let dir = tempfile::tempdir()?;
    let host = baton_tests::ChildHost::start(dir.path(), &[]).await?;
    let api = host.api.clone();
    assert_eq!(compiles(&api).await?, 0);
    api.upload_plugin("word-count", "wc", "1").await?;
    assert_eq!(compiles(&api).await?, 1);
    let m = api.upload_plugin("python-word-count", "wc", "2").await?;
    assert!(
        m["size"].as_u64() > Some(10 << 20),
        "a large component: {m}"
    );
    assert_eq!(compiles(&api).await?, 2, "compiled at upload");
    api.upload_plugin("python-word-count", "wc", "3").await?;
    assert_eq!(
        compiles(&api).await?,
        2,
        "the same bytes again: not compiled"
    );

    api.create_pipeline(json!({
        "name": "wc", "module": "wc", "version": "1", "inputs": ["lang-in"],
        "stores": ["counts"], "slots": 2, "partitions": 1
    }))
    .await?;
    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    fn send(want: &mut BTreeMap<String, i64>, keys: Vec<String>) -> Vec<(String, Option<String>)> {
        for k in &keys {
            *want.entry(k.clone()).or_default() += 1;
        }
        keys.into_iter()
            .map(|k| (k, Some("x".to_string())))
            .collect()
    }
    api.produce("lang-in", &send(&mut want, words(500, 40, 1)))
        .await?;
    baton_tests::wait_counts(&api, "wc", "counts", &want, Duration::from_secs(60)).await?;
    let r = api
        .put_json("/api/v1/pipelines/wc/module", &json!({"version": "3"}))
        .await?;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["outcome"], "swapped", "{r:?}");
    assert_eq!(compiles(&api).await?, 2, "the swap compiled nothing");
    api.produce("lang-in", &send(&mut want, words(500, 40, 2)))
        .await?;
    baton_tests::wait_counts(&api, "wc", "counts", &want, Duration::from_secs(60)).await?;

    // Started again on the same data dir: the compiled code is kept, nothing compiles, and the
    // pipeline goes on with the Python version.
    tokio::task::spawn_blocking(move || host.terminate()).await??;
    let host = baton_tests::ChildHost::start(dir.path(), &[]).await?;
    let api = host.api.clone();
    api.produce("lang-in", &send(&mut want, words(500, 40, 3)))
        .await?;
    baton_tests::wait_counts(&api, "wc", "counts", &want, Duration::from_secs(60)).await?;
    assert_eq!(compiles(&api).await?, 0, "a restart compiled nothing");
    let r = api.get("/api/v1/pipelines/wc").await?;
    assert_eq!(r.body["version"], "3", "{}", r.body);
    Ok(())
}
