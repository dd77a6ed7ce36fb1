//! `baton new` and `baton build`: a new Rust processor's project builds into a component of the
//! current contract, and its own test script (a local run against the state it must leave)
//! passes, as a new user would run it.

use std::path::Path;
use std::process::Command;

use baton_tests::baton_bin;

fn baton(args: &[&str], dir: &Path) -> anyhow::Result<(bool, String, String)> {
    let out = Command::new(baton_bin())
        .args(args)
        .current_dir(dir)
        .output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[test]
fn a_new_rust_processor_builds_and_passes_its_own_test() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (ok, out, err) = baton(&["new", "--lang", "rust", "my-counter"], dir.path())?;
    assert!(ok, "{err}");
    let project = dir.path().join("my-counter");
    for f in [
        "Cargo.toml",
        "src/lib.rs",
        "records.jsonl",
        "state.jsonl",
        "test.sh",
    ] {
        assert!(project.join(f).exists(), "{f} in {out}");
    }
    // Refused, each with its reason.
    let (ok, _, err) = baton(&["new", "--lang", "rust", "my-counter"], dir.path())?;
    assert!(!ok && err.contains("exists already"), "{err}");
    let (ok, _, err) = baton(&["new", "--lang", "cobol", "x"], dir.path())?;
    assert!(
        !ok && err.contains("unknown language") && err.contains("python"),
        "{err}"
    );
    let (ok, _, err) = baton(&["new", "--lang", "rust", "Bad_Name"], dir.path())?;
    assert!(!ok && err.contains("lowercase"), "{err}");

    // The example plugins' lock file pins the dependencies to versions built already.
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/Cargo.lock"),
        project.join("Cargo.lock"),
    )?;
    let bin_dir = baton_bin().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| bin_dir.parent().unwrap().to_path_buf())
        .join("plugins");
    let run = |cmd: &str, args: &[&str]| -> anyhow::Result<std::process::Output> {
        Ok(Command::new(cmd)
            .args(args)
            .current_dir(&project)
            .env("PATH", &path)
            .env("CARGO_TARGET_DIR", &target)
            .output()?)
    };
    let out = run(baton_bin().to_str().unwrap(), &["build"])?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fields: Vec<&str> = stdout.trim().split('\t').collect();
    assert_eq!(fields.len(), 3, "{stdout}");
    assert!(
        fields[0].ends_with("my_counter.wasm") && Path::new(fields[0]).exists(),
        "{stdout}"
    );
    assert!(fields[1].ends_with(" bytes"), "{stdout}");
    assert_eq!(fields[2], "baton:processor@0.2.0");

    let out = run("bash", &["test.sh"])?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("the state matches --expect"), "{stderr}");
    // Its timers fired on the records' time: each key's count went out once.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let sent: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|l| l.get("output").cloned())
        .collect();
    assert_eq!(sent.len(), 2, "{stdout}");
    assert!(
        sent.iter()
            .any(|o| o["key"] == "apple" && o["value"] == "3"),
        "{stdout}"
    );

    // Not a project: said so.
    let (ok, _, err) = baton(&["build"], dir.path())?;
    assert!(!ok && err.contains("no Cargo.toml"), "{err}");
    Ok(())
}
