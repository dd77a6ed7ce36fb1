//! The `baton` client subcommands against a host with a token: push, create, produce, get,
//! list, swap, partitions, update and delete; and a clear failure without the token.

use std::process::{Command, Stdio};
use std::time::Duration;

use baton_tests::{InProcess, baton_bin, plugin, with_custom_section};
use serde_json::Value;

struct Cli {
    url: String,
    token: Option<String>,
}

impl Cli {
    /// Runs `baton ARGS` with `stdin`; returns (success, stdout JSON, stderr).
    fn run(&self, args: &[&str], stdin: &str) -> anyhow::Result<(bool, Value, String)> {
        let mut cmd = Command::new(baton_bin());
        cmd.args(["--url", &self.url]).args(args);
        cmd.env_remove("BATON_TOKEN").env_remove("BATON_URL");
        if let Some(t) = &self.token {
            cmd.args(["--token", t]);
        }
        baton_tests::run_cli(&mut cmd, stdin)
    }

    fn ok(&self, args: &[&str], stdin: &str) -> anyhow::Result<Value> {
        let (ok, out, err) = self.run(args, stdin)?;
        anyhow::ensure!(ok, "baton {args:?} failed: {err}");
        Ok(out)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_drives_a_host() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start_configured(dir.path(), None, |c| {
        c.token = Some("t0ken".into());
    })
    .await?;
    let cli = Cli {
        url: host.api.base().to_string(),
        token: Some("t0ken".into()),
    };
    let v2 = dir.path().join("v2.wasm");
    std::fs::write(
        &v2,
        with_custom_section(std::fs::read(plugin("word-count"))?, "v", b"2"),
    )?;
    let spec = dir.path().join("wc.toml");
    std::fs::write(
        &spec,
        "name = \"wc\"\nmodule = \"word-count\"\nversion = \"1\"\ninputs = [\"words\"]\nstores = [\"counts\"]\nslots = 4\npartitions = 2\n",
    )?;
    let result = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let wc = plugin("word-count");
        let m = cli.ok(
            &[
                "modules",
                "push",
                wc.to_str().unwrap_or(""),
                "--name",
                "word-count",
                "--version",
                "1",
            ],
            "",
        )?;
        assert_eq!(m["version"], "1", "{m}");
        cli.ok(
            &[
                "modules",
                "push",
                v2.to_str().unwrap_or(""),
                "--name",
                "word-count",
                "--version",
                "2",
            ],
            "",
        )?;
        let listed = cli.ok(&["modules", "list"], "")?;
        assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
        let p = cli.ok(&["pipelines", "create", spec.to_str().unwrap_or("")], "")?;
        assert_eq!(p["name"], "wc", "{p}");
        let produced = cli.ok(&["produce", "words"], "a\nb\ta-value\na\nc\na\n")?;
        assert_eq!(produced["produced"], 5, "{produced}");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (ok, got, _) = cli.run(&["get", "wc", "counts", "a"], "")?;
            if ok && got["value_i64"] == 3 {
                break;
            }
            anyhow::ensure!(std::time::Instant::now() < deadline, "count of a: {got}");
            std::thread::sleep(Duration::from_millis(50));
        }
        let swapped = cli.ok(&["pipelines", "swap", "wc", "--version", "2"], "")?;
        assert_eq!(swapped["outcome"], "swapped", "{swapped}");
        let pipelines = cli.ok(&["pipelines", "list"], "")?;
        assert_eq!(pipelines[0]["version"], "2", "{pipelines}");
        let parts = cli.ok(&["partitions"], "")?;
        assert_eq!(parts.as_array().map(Vec::len), Some(2), "{parts}");

        // A split on the embedded log: the halves get the next ids and keep the counts.
        let split = cli.ok(&["partitions", "split", "wc-0", "--at", "1"], "")?;
        assert_eq!(split["phase"], "done", "{split}");
        assert_eq!(
            split["halves"],
            serde_json::json!(["wc-2", "wc-3"]),
            "{split}"
        );
        let parts = cli.ok(&["partitions"], "")?;
        let shapes: Vec<(String, Value)> = parts
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                (
                    p["id"].as_str().unwrap_or("").to_string(),
                    p["slots"].clone(),
                )
            })
            .collect();
        assert_eq!(
            shapes,
            vec![
                ("wc-1".into(), serde_json::json!([2, 4])),
                ("wc-2".into(), serde_json::json!([0, 1])),
                ("wc-3".into(), serde_json::json!([1, 2]))
            ],
            "{parts}"
        );
        let retired = cli.ok(&["partitions", "retired"], "")?;
        assert_eq!(retired[0]["id"], "wc-0", "{retired}");
        let (ok, _, err) = cli.run(&["partitions", "merge", "wc-2", "wc-1"], "")?;
        assert!(
            !ok && err.contains("409") && err.contains("adjacent"),
            "{err}"
        );
        let (ok, _, err) = cli.run(&["partitions", "split", "wc-2"], "")?;
        assert!(
            !ok && err.contains("409") && err.contains("one slot"),
            "{err}"
        );
        cli.ok(&["produce", "words"], "a\nb\nc\nd\n")?;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        for (key, want) in [("a", 4), ("b", 2), ("c", 2), ("d", 1)] {
            loop {
                let (ok, got, _) = cli.run(&["get", "wc", "counts", key], "")?;
                if ok && got["value_i64"] == want {
                    break;
                }
                anyhow::ensure!(
                    std::time::Instant::now() < deadline,
                    "count of {key} after the split: {got}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // Merged back (named in either order): the next id, the counts kept.
        let merged = cli.ok(&["partitions", "merge", "wc-3", "wc-2"], "")?;
        assert_eq!(merged["phase"], "done", "{merged}");
        assert_eq!(merged["merged"], "wc-4", "{merged}");
        let parts = cli.ok(&["partitions"], "")?;
        let ids: Vec<&str> = parts
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["id"].as_str())
            .collect();
        assert_eq!(ids, ["wc-1", "wc-4"], "{parts}");
        cli.ok(&["produce", "words"], "a\nd\n")?;
        for (key, want) in [("a", 5), ("b", 2), ("c", 2), ("d", 2)] {
            loop {
                let (ok, got, _) = cli.run(&["get", "wc", "counts", key], "")?;
                if ok && got["value_i64"] == want {
                    break;
                }
                anyhow::ensure!(
                    std::time::Instant::now() < deadline + Duration::from_secs(30),
                    "count of {key} after the merge: {got}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }

        // The merged partition gets a checkpoint of its own soon after it starts (a failover
        // of it then restores from it); the others wait for their interval.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let parts = cli.ok(&["partitions"], "")?;
            let row = |id: &str| {
                parts
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|p| p["id"] == id)
                    .cloned()
                    .unwrap_or_default()
            };
            if row("wc-4")["last_checkpoint"]["seq"] == 1 {
                assert!(row("wc-1")["last_checkpoint"].is_null(), "{parts}");
                break;
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "no first checkpoint of wc-4: {parts}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }

        // Errors: the API's message, a non-zero exit.
        let anonymous = Cli {
            url: cli.url.clone(),
            token: None,
        };
        let (ok, _, err) = anonymous.run(&["pipelines", "swap", "wc", "--version", "1"], "")?;
        assert!(!ok);
        assert!(err.contains("401") && err.contains("Bearer"), "{err}");
        let (ok, _, err) = cli.run(&["get", "wc", "counts", "never-seen"], "")?;
        assert!(!ok);
        assert!(err.contains("404"), "{err}");

        // Lifecycle: change in place, delete a module version in use (refused), delete and
        // purge the pipeline, then the version.
        let (ok, _, err) = cli.run(&["modules", "delete", "word-count", "2"], "")?;
        assert!(!ok && err.contains("409") && err.contains("[wc]"), "{err}");
        let updated = cli.ok(
            &["pipelines", "update", "wc", "-"],
            r#"{"limits": {"cpu_ms": 700}}"#,
        )?;
        assert_eq!(updated["limits"]["cpu_ms"], 700, "{updated}");
        let deleted = cli.ok(&["pipelines", "delete", "wc", "--purge"], "")?;
        assert_eq!(deleted["purge"], true, "{deleted}");
        let deleted = cli.ok(&["modules", "delete", "word-count", "2"], "")?;
        assert_eq!(deleted["version"], "2", "{deleted}");
        assert_eq!(cli.ok(&["pipelines", "list"], "")?, serde_json::json!([]));

        let nowhere = Cli {
            url: "http://127.0.0.1:9".into(),
            token: None,
        };
        let (ok, _, err) = nowhere.run(&["partitions"], "")?;
        assert!(!ok);
        assert!(err.contains("cannot reach baton"), "{err}");
        Ok(())
    })
    .await?;
    result?;
    host.stop().await
}

#[test]
fn version_names_the_host_and_every_contract_it_serves() -> anyhow::Result<()> {
    let out = Command::new(baton_bin()).arg("--version").output()?;
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout)?;
    assert!(
        text.starts_with(&format!("baton {}", baton::VERSION)),
        "{text}"
    );
    for v in baton::runtime::WIT_VERSIONS {
        assert!(
            text.contains(&format!("baton:processor@{v}")),
            "`{}` does not name contract {v}",
            text.trim()
        );
    }
    Ok(())
}

#[test]
fn kafka_settings_baton_relies_on_are_refused_at_start() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let out = Command::new(baton_bin())
        .args(["run", "--data-dir"])
        .arg(dir.path())
        .args([
            "--http",
            "127.0.0.1:0",
            "--kafka",
            "127.0.0.1:1",
            "--kafka-config",
            "isolation.level=read_uncommitted",
        ])
        .output()?;
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("isolation.level") && err.contains("cannot be overridden"),
        "{err}"
    );
    Ok(())
}

#[test]
fn logs_are_json_lines_with_log_format_json() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut child = Command::new(baton_bin())
        .args([
            "--log-format",
            "json",
            "run",
            "--http",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Every line up to the host's open is one JSON object with a level and a message.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut lines = 0;
    let opened = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            break false;
        };
        lines += 1;
        let v: Value = serde_json::from_str(&line)
            .map_err(|e| anyhow::anyhow!("not a JSON line ({e}): {line}"))?;
        assert!(
            v["level"].is_string() && v["timestamp"].is_string(),
            "{line}"
        );
        if v["fields"]["message"] == "baton host open" {
            assert!(v["fields"]["data_dir"].is_string(), "{line}");
            break true;
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        opened,
        "no `baton host open` line among {lines} lines in 60 s"
    );
    Ok(())
}
