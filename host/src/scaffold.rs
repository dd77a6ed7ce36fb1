//! `baton new` and `baton build`: a processor's project from a template, and its component.
//! Rust is the language built here; the others are named with what they need.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The languages `baton new` knows of.
pub const LANGUAGES: &[&str] = &["rust", "js", "python", "c", "go"];

/// The Rust SDK of this build of baton, when its sources are where they were built.
pub fn default_sdk() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-sdk")
}

fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}`: a processor's name is 1 to 64 lowercase letters, digits and '-', starting \
             with a letter"
        ))
    }
}

/// Creates the project `dir` (named by its last component) for `lang`: source, build setup, a
/// sample input, the state it must leave, and a test script. Returns the files written.
pub fn new_project(lang: &str, dir: &Path, sdk: &Path) -> Result<Vec<PathBuf>, String> {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("{}: no name", dir.display()))?;
    check_name(name)?;
    match lang {
        "rust" => {}
        "js" | "python" | "c" | "go" => {
            return Err(format!(
                "`--lang {lang}` is not available yet: this baton builds Rust processors (the \
                 SDKs of other languages are planned); use --lang rust"
            ));
        }
        other => {
            return Err(format!(
                "unknown language `{other}`; choose one of: {}",
                LANGUAGES.join(", ")
            ));
        }
    }
    if dir.exists() {
        return Err(format!(
            "{} exists already; pick a new directory",
            dir.display()
        ));
    }
    let sdk = sdk
        .canonicalize()
        .map_err(|e| format!("the Rust SDK at {}: {e}; pass --sdk PATH", sdk.display()))?;
    if !sdk.join("Cargo.toml").exists() {
        return Err(format!(
            "no Rust SDK at {} (no Cargo.toml); pass --sdk PATH to baton's guest-sdk",
            sdk.display()
        ));
    }
    let files: Vec<(&str, String)> = vec![
        (
            "Cargo.toml",
            format!(
                r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
baton-sdk = {{ path = "{}" }}

[profile.release]
opt-level = 3
lto = true
codegen-units = 1
strip = true
panic = "abort"
"#,
                sdk.display()
            ),
        ),
        (
            "src/lib.rs",
            r#"//! A baton processor: counts records per key into the store `counts`, and sends each
//! key's count to the topic named by `config.output` (when set) once a minute of event time
//! has passed since its first record.
use baton_sdk::{Context, Message, Result, TimeKind, Timer};

#[baton_sdk::processor(on_timer = report)]
fn process(msg: &Message, ctx: &mut Context) -> Result<()> {
    let Some(key) = msg.key else {
        return Ok(());
    };
    if ctx.increment("counts", key, 1)? == 1 {
        ctx.schedule(TimeKind::EventTime, msg.timestamp + 60_000, key, None)?;
    }
    Ok(())
}

fn report(timer: &Timer, ctx: &mut Context) -> Result<()> {
    if let Some(output) = ctx.config().get("output").map(str::to_string) {
        let n = ctx.counter("counts", timer.key)?;
        ctx.send(&output, Some(timer.key), Some(n.to_string().as_bytes()))?;
    }
    Ok(())
}
"#
            .to_string(),
        ),
        (
            "records.jsonl",
            [
                r#"{"key":"apple","value":"1","timestamp":1000}"#,
                r#"{"key":"pear","value":"1","timestamp":2000}"#,
                r#"{"key":"apple","value":"1","timestamp":3000}"#,
                r#"{"key":"apple","value":"1","timestamp":90000}"#,
            ]
            .join("\n")
                + "\n",
        ),
        (
            "state.jsonl",
            [
                // Counts are 8-byte big-endian numbers: 3 and 1.
                r#"{"store":"counts","slot":0,"key":"apple","value_base64":"AAAAAAAAAAM="}"#,
                r#"{"store":"counts","slot":0,"key":"pear","value_base64":"AAAAAAAAAAE="}"#,
            ]
            .join("\n")
                + "\n",
        ),
        (
            "test.sh",
            r#"#!/usr/bin/env bash
# Builds the component and runs it over records.jsonl; fails when the state differs from
# state.jsonl.
set -euo pipefail
cd "$(dirname "$0")"
wasm=$(baton build | cut -f1)
baton test-plugin "$wasm" --input records.jsonl --expect state.jsonl --config output=out
"#
            .to_string(),
        ),
        (
            "README.md",
            format!(
                "# {name}\n\nA baton processor.\n\n```sh\nbaton build                 # → the component's path, size and contract\n./test.sh                   # build, then run records.jsonl against state.jsonl\nbaton modules push <component> --name {name} --version 1   # deploy to a host\n```\n"
            ),
        ),
    ];
    let mut written = Vec::new();
    for (rel, text) in files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(path);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let script = dir.join("test.sh");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("{}: {e}", script.display()))?;
    }
    Ok(written)
}

/// Builds the project in `dir` and returns its component's path.
pub fn build(dir: &Path) -> Result<PathBuf, String> {
    if !dir.join("Cargo.toml").exists() {
        for (file, what) in [
            ("package.json", "JavaScript"),
            ("pyproject.toml", "Python"),
            ("go.mod", "Go"),
            ("Makefile", "C"),
        ] {
            if dir.join(file).exists() {
                return Err(format!(
                    "{} looks like a {what} project: this baton builds Rust processors only",
                    dir.display()
                ));
            }
        }
        return Err(format!(
            "{}: no Cargo.toml, so nothing to build",
            dir.display()
        ));
    }
    let meta = Command::new("cargo")
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(dir)
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !meta.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&meta.stderr)
        ));
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&meta.stdout).map_err(|e| format!("cargo metadata: {e}"))?;
    let target_dir = meta["target_directory"]
        .as_str()
        .ok_or("cargo metadata names no target directory")?;
    let manifest = dir
        .join("Cargo.toml")
        .canonicalize()
        .map_err(|e| e.to_string())?;
    let name = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["manifest_path"].as_str().map(Path::new) == Some(manifest.as_path()))
        .and_then(|p| p["name"].as_str())
        .ok_or("cargo metadata does not list the package")?
        .to_string();
    let status = Command::new("cargo")
        .args(["build", "--release", "--target", "wasm32-wasip2"])
        .current_dir(dir)
        .status()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build failed ({status})"));
    }
    let wasm = Path::new(target_dir)
        .join("wasm32-wasip2/release")
        .join(format!("{}.wasm", name.replace('-', "_")));
    if !wasm.exists() {
        return Err(format!(
            "{} was not built: is the crate a cdylib?",
            wasm.display()
        ));
    }
    Ok(wasm)
}
