//! `scripts/release`: the tarball unpacked into an empty prefix is all a user needs. Its
//! checksums hold, it carries the license and the third-party notices, and its own `baton`
//! runs a host on the embedded log with its sample config, deploys its word-count and counts.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use serde_json::Value;

/// Runs `bin` with `args` and `stdin`; its stdout as JSON, or the failure with stderr.
fn run(bin: &Path, args: &[&str], stdin: &str) -> anyhow::Result<Value> {
    let (ok, out, err) = baton_tests::run_cli(Command::new(bin).args(args), stdin)?;
    ensure!(ok, "baton {}: {err}", args.join(" "));
    Ok(out)
}

#[test]
fn the_release_tarball_runs_word_count_from_its_own_files() -> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    // The binary of this build: `cargo build -p baton` alone would resolve features apart
    // from the workspace build and compile RocksDB again.
    let out = Command::new(baton_tests::repo_root().join("scripts/release"))
        .args(["--out"])
        .arg(work.path().join("dist"))
        .env("BATON_BIN", baton_tests::baton_bin())
        .output()?;
    ensure!(
        out.status.success(),
        "scripts/release: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tarball = String::from_utf8(out.stdout)?.trim().to_string();
    ensure!(
        tarball.ends_with(".tar.gz") && tarball.contains(&format!("baton-{}-", baton::VERSION)),
        "{tarball}"
    );

    // Unpacked into an empty prefix.
    let prefix = work.path().join("prefix");
    std::fs::create_dir(&prefix)?;
    let status = Command::new("tar")
        .args(["-xzf", &tarball, "--strip-components=1", "-C"])
        .arg(&prefix)
        .status()?;
    ensure!(status.success(), "tar: {status}");
    let check = Command::new("sha256sum")
        .args(["--check", "--quiet", "SHA256SUMS"])
        .current_dir(&prefix)
        .output()?;
    ensure!(
        check.status.success(),
        "SHA256SUMS: {}",
        String::from_utf8_lossy(&check.stdout)
    );
    let sums = std::fs::read_to_string(prefix.join("SHA256SUMS"))?;
    for file in [
        "bin/baton",
        "LICENSE",
        "THIRD-PARTY-NOTICES",
        "CHANGELOG.md",
        "README.md",
        "wit/world.wit",
        "sdk/Cargo.toml",
        "sdk/c/baton.h",
        "examples/word-count.wasm",
        "examples/word-count.toml",
        "examples/baton.toml",
        "deploy/prometheus/baton-alerts.yml",
    ] {
        ensure!(
            sums.lines().any(|l| l.ends_with(&format!("  {file}"))),
            "{file} is not in the tarball's SHA256SUMS"
        );
    }
    let notices = std::fs::read_to_string(prefix.join("THIRD-PARTY-NOTICES"))?;
    for part in ["librdkafka", "RocksDB", "wasmtime", "tokio"] {
        ensure!(
            notices.contains(part),
            "THIRD-PARTY-NOTICES does not name {part}"
        );
    }

    // Its own baton: a host on the embedded log with the sample config.
    let bin = prefix.join("bin/baton");
    let data = work.path().join("data");
    let mut host = Command::new(&bin)
        .args([
            "run",
            "--config",
            "examples/baton.toml",
            "--http",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(&data)
        .current_dir(&prefix)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(work.path().join("host.log"))?)
        .spawn()?;
    let result = (|| -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let addr = loop {
            if let Some(a) = std::fs::read_to_string(data.join("baton.addr"))
                .ok()
                .filter(|a| !a.is_empty())
            {
                break a;
            }
            ensure!(host.try_wait()?.is_none(), "the host exited");
            ensure!(Instant::now() < deadline, "no address in 60 s");
            std::thread::sleep(Duration::from_millis(50));
        };
        let url = format!("http://{}", addr.trim());
        let cli = |args: &[&str], stdin: &str| {
            let mut all = vec!["--url", url.as_str()];
            all.extend_from_slice(args);
            run(&bin, &all, stdin)
        };
        let wasm = prefix.join("examples/word-count.wasm");
        let spec = prefix.join("examples/word-count.toml");
        cli(
            &[
                "modules",
                "push",
                &wasm.to_string_lossy(),
                "--name",
                "word-count",
                "--version",
                "1",
            ],
            "",
        )?;
        cli(&["pipelines", "create", &spec.to_string_lossy()], "")?;
        let produced = cli(&["produce", "words"], "to\nbe\nor\nnot\nto\nbe\nto\n")?;
        ensure!(produced["produced"] == 7, "{produced}");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got = cli(&["get", "wc", "counts", "to"], "").unwrap_or(Value::Null);
            if got["value_i64"] == 3 {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "the count of `to` after 60 s: {got}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    })();
    let _ = host.kill();
    let _ = host.wait();
    result.with_context(|| {
        format!(
            "host log: {}",
            std::fs::read_to_string(work.path().join("host.log")).unwrap_or_default()
        )
    })
}
