//! `baton new` and `baton build`: a processor's project from a template, and its component.
//! Rust is the language built here; the others are named with what they need.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The languages `baton new` knows of.
pub const LANGUAGES: &[&str] = &["rust", "js", "python", "c", "go"];

/// The version of the Rust SDK (`baton-sdk`) this host's contract matches: a new Rust project
/// requires it, so that a later SDK that breaks its source API (a new minor while 0.x) is a
/// build error naming the version, not a surprise.
pub const RUST_SDK_VERSION: &str = "0.2.0";

/// The SDKs of this baton: `sdk/` beside the binary's `bin/` in a release (scripts/release),
/// else `guest-sdk` of the checkout it was built from.
pub fn default_sdk() -> PathBuf {
    let shipped = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("sdk")))
        .filter(|sdk| sdk.join("Cargo.toml").is_file());
    shipped.unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-sdk"))
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
    if dir.exists() {
        return Err(format!(
            "{} exists already; pick a new directory",
            dir.display()
        ));
    }
    match lang {
        "rust" => {}
        "python" => return write_files(dir, name, "Python", python_files(name, sdk)?),
        "go" => return write_files(dir, name, "Go", go_files(name, sdk)?),
        "c" => return write_files(dir, name, "C", c_files(name, sdk)?),
        "js" => return write_files(dir, name, "JavaScript", js_files(name, sdk)?),
        other => {
            return Err(format!(
                "unknown language `{other}`; choose one of: {}",
                LANGUAGES.join(", ")
            ));
        }
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
baton-sdk = {{ version = "{RUST_SDK_VERSION}", path = "{}" }}

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
    ];
    write_files(dir, name, "Rust", files)
}

/// Writes a new project's files, with those every template gets (a sample input, the state it
/// must leave, `test.sh`, executable, and a README); returns their paths.
fn write_files(
    dir: &Path,
    name: &str,
    lang: &str,
    files: Vec<(&str, String)>,
) -> Result<Vec<PathBuf>, String> {
    let [records, state] = samples();
    let common = [
        records,
        state,
        ("test.sh", TEST_SCRIPT.to_string()),
        ("README.md", project_readme(name, lang)),
    ];
    let mut written = Vec::new();
    for (rel, text) in files.into_iter().chain(common) {
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

/// The sample input every template gets, and the state the template's processor leaves.
fn samples() -> [(&'static str, String); 2] {
    [
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
    ]
}

const TEST_SCRIPT: &str = r#"#!/usr/bin/env bash
# Builds the component and runs it over records.jsonl; fails when the state differs from
# state.jsonl.
set -euo pipefail
cd "$(dirname "$0")"
wasm=$(baton build | cut -f1)
baton test-plugin "$wasm" --input records.jsonl --expect state.jsonl --config output=out
"#;

/// A Python project: `app.py` on the Python SDK (`<sdk>/python`), built with componentize-py
/// over the WIT at `<sdk>/../wit`, both named in `pyproject.toml`'s `[tool.baton]`.
fn python_files(name: &str, sdk: &Path) -> Result<Vec<(&'static str, String)>, String> {
    let py = sdk.join("python").canonicalize().map_err(|e| {
        format!(
            "the Python SDK at {}/python: {e}; pass --sdk PATH",
            sdk.display()
        )
    })?;
    if !py.join("baton_sdk/__init__.py").exists() {
        return Err(format!(
            "no Python SDK at {} (no baton_sdk/__init__.py); pass --sdk PATH to baton's guest-sdk",
            py.display()
        ));
    }
    let wit = sdk
        .join("../wit")
        .canonicalize()
        .map_err(|e| format!("the WIT next to the SDK ({}/../wit): {e}", sdk.display()))?;
    Ok(vec![
        (
            "pyproject.toml",
            format!(
                r#"[project]
name = "{name}"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["baton-sdk"]

# What `baton build` gives componentize-py: the module with the processor, and where the SDK
# and the WIT of baton:processor@0.2.0 are.
[tool.baton]
app = "app"
sdk = "{}"
wit = "{}"
"#,
                py.display(),
                wit.display()
            ),
        ),
        (
            "app.py",
            r#""""A baton processor: counts records per key into the store `counts`, and sends each
key's count to the topic named by `config.output` (when set) once a minute of event time has
passed since its first record."""

from baton_sdk import on_timer, processor


@processor
def process(msg, ctx):
    if msg.key is None:
        return
    if ctx.increment("counts", msg.key, 1) == 1:
        ctx.schedule(msg.timestamp + 60_000, msg.key)


@on_timer
def report(timer, ctx):
    output = ctx.config.get("output")
    if output is not None:
        n = ctx.counter("counts", timer.key)
        ctx.send(output, timer.key, str(n).encode())
"#
            .to_string(),
        ),
    ])
}

/// The SDK of a language under baton's `guest-sdk` (`<sdk>/<sub>`), checked by a file it holds.
fn lang_sdk(sdk: &Path, sub: &str, marker: &str, lang: &str) -> Result<PathBuf, String> {
    let dir = sdk.join(sub).canonicalize().map_err(|e| {
        format!(
            "the {lang} SDK at {}/{sub}: {e}; pass --sdk PATH to baton's guest-sdk",
            sdk.display()
        )
    })?;
    if !dir.join(marker).exists() {
        return Err(format!(
            "no {lang} SDK at {} (no {marker}); pass --sdk PATH to baton's guest-sdk",
            dir.display()
        ));
    }
    Ok(dir)
}

/// The README of a new project.
fn project_readme(name: &str, lang: &str) -> String {
    format!(
        "# {name}\n\nA baton processor in {lang}.\n\n```sh\nbaton build                 # → the component's path, size and contract\n./test.sh                   # build, then run records.jsonl against state.jsonl\nbaton modules push <component> --name {name} --version 1   # deploy to a host\n```\n"
    )
}

/// A Go project: a `main` package on the Go SDK (`<sdk>/go`, module `baton/sdk`, through a
/// `replace`), built for `wasip1` as a reactor.
fn go_files(name: &str, sdk: &Path) -> Result<Vec<(&'static str, String)>, String> {
    let go = lang_sdk(sdk, "go", "go.mod", "Go")?;
    Ok(vec![
        (
            "go.mod",
            format!(
                "module {name}\n\ngo 1.24\n\nrequire baton/sdk v0.0.0\n\nreplace baton/sdk => {}\n",
                go.display()
            ),
        ),
        (
            "main.go",
            r#"// A baton processor: counts records per key into the store `counts`, and sends each key's
// count to the topic named by `config.output` (when set) once a minute of event time has
// passed since its first record.
package main

import (
	"strconv"

	baton "baton/sdk"
)

func init() {
	baton.Register(baton.Processor{Process: process, OnTimer: report})
}

func process(msg *baton.Message, ctx *baton.Context) error {
	if msg.Key == nil {
		return nil
	}
	n, err := ctx.Increment("counts", msg.Key, 1)
	if err != nil {
		return err
	}
	if n == 1 {
		return ctx.Schedule(baton.EventTime, msg.Timestamp+60_000, msg.Key, nil)
	}
	return nil
}

func report(timer *baton.Timer, ctx *baton.Context) error {
	output, ok := ctx.Config().Get("output")
	if !ok {
		return nil
	}
	n, err := ctx.Counter("counts", timer.Key)
	if err != nil {
		return err
	}
	return ctx.Send(output, timer.Key, []byte(strconv.FormatInt(n, 10)))
}

func main() {}
"#
            .to_string(),
        ),
    ])
}

/// A C project: `processor.c` on the C SDK (`<sdk>/c`), built by a `Makefile` that includes the
/// SDK's `baton.mk`.
fn c_files(name: &str, sdk: &Path) -> Result<Vec<(&'static str, String)>, String> {
    let c = lang_sdk(sdk, "c", "baton.mk", "C")?;
    Ok(vec![
        (
            "Makefile",
            format!(
                "# `make` (or `baton build`) builds target/{name}.wasm with the C SDK's rules.\nSDK = {}\ninclude $(SDK)/baton.mk\n",
                c.display()
            ),
        ),
        ("processor.c", C_TEMPLATE.to_string()),
    ])
}

/// A JavaScript project: `processor.js` on the JavaScript SDK (`<sdk>/js`), named with the SDK
/// and the WIT in `package.json`'s `baton` field.
fn js_files(name: &str, sdk: &Path) -> Result<Vec<(&'static str, String)>, String> {
    let js = lang_sdk(sdk, "js", "build.mjs", "JavaScript")?;
    let wit = sdk
        .join("../wit")
        .canonicalize()
        .map_err(|e| format!("the WIT next to the SDK ({}/../wit): {e}", sdk.display()))?;
    let package = serde_json::json!({
        "name": name,
        "version": "0.1.0",
        "private": true,
        "type": "module",
        "main": "processor.js",
        "dependencies": {"baton-sdk": format!("file:{}", js.display())},
        "baton": {"entry": "processor.js", "sdk": js.display().to_string(), "wit": wit.display().to_string()},
    });
    Ok(vec![
        (
            "package.json",
            serde_json::to_string_pretty(&package).map_err(|e| e.to_string())? + "\n",
        ),
        ("processor.js", JS_TEMPLATE.to_string()),
    ])
}

/// The C template's processor (`baton new --lang c`).
const C_TEMPLATE: &str = r#"/*
 * A baton processor: counts records per key into the store `counts`, and sends each key's
 * count to the topic named by `config.output` (when set) once a minute of event time has
 * passed since its first record.
 */
#include <stdio.h>

#include "baton.h"

static baton_status process(const baton_message *msg, baton_ctx *ctx) {
    if (!baton_some(msg->key)) return BATON_OK;
    int64_t n;
    BATON_TRY(baton_increment(ctx, "counts", msg->key, 1, &n));
    if (n == 1) {
        return baton_schedule(ctx, BATON_EVENT_TIME, msg->timestamp + 60000, msg->key,
                              BATON_NONE);
    }
    return BATON_OK;
}

static baton_status report(const baton_timer *timer, baton_ctx *ctx) {
    const char *output = baton_config_get(baton_config_of(ctx), "output");
    if (output == NULL) return BATON_OK;
    int64_t n;
    BATON_TRY(baton_counter(ctx, "counts", timer->key, &n));
    char text[24];
    snprintf(text, sizeof text, "%lld", (long long)n);
    return baton_send(ctx, output, timer->key, baton_str(text));
}

BATON_PROCESSOR(process, .on_timer = report);
"#;

/// The JavaScript template's processor (`baton new --lang js`).
const JS_TEMPLATE: &str = r#"// A baton processor: counts records per key into the store `counts`, and sends each key's
// count to the topic named by `config.output` (when set) once a minute of event time has
// passed since its first record.
import { processor } from "baton-sdk";

export const handler = processor({
  process(msg, ctx) {
    if (msg.key === null) return;
    if (ctx.increment("counts", msg.key, 1) === 1) {
      ctx.schedule(msg.timestamp + 60_000, msg.key);
    }
  },

  onTimer(timer, ctx) {
    const output = ctx.config.get("output");
    if (output !== null) {
      ctx.send(output, timer.key, String(ctx.counter("counts", timer.key)));
    }
  },
});
"#;

/// componentize-py: `$BATON_COMPONENTIZE_PY`, else the one `scripts/setup` installs
/// (`$BATON_CACHE/py`, `~/.cache/baton/py`), else the one on `PATH`.
fn componentize_py() -> PathBuf {
    if let Some(p) = std::env::var_os("BATON_COMPONENTIZE_PY") {
        return p.into();
    }
    let caches = [
        std::env::var_os("BATON_CACHE").map(PathBuf::from),
        std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/baton")),
    ];
    for c in caches.into_iter().flatten() {
        let p = c.join("py/bin/componentize-py");
        if p.exists() {
            return p;
        }
    }
    "componentize-py".into()
}

/// True when `out` is newer than every file under `inputs` (a build to skip).
fn fresh(out: &Path, inputs: &[&Path]) -> bool {
    fn newest(p: &Path) -> Option<std::time::SystemTime> {
        let meta = std::fs::metadata(p).ok()?;
        if meta.is_dir() {
            let mut t = None;
            for e in std::fs::read_dir(p).ok()? {
                let path = e.ok()?.path();
                let name = path.file_name()?.to_str()?;
                if name.starts_with('.') || name == "target" || name == "__pycache__" {
                    continue;
                }
                t = t.max(newest(&path));
            }
            t
        } else {
            meta.modified().ok()
        }
    }
    let Some(built) = std::fs::metadata(out).and_then(|m| m.modified()).ok() else {
        return false;
    };
    inputs.iter().all(|i| newest(i).is_none_or(|t| t < built))
}

/// Builds a Python project (`pyproject.toml` with `[tool.baton]`) with componentize-py into
/// `target/<name>.wasm`; skipped when that is newer than the project, the SDK and the WIT.
fn build_python(dir: &Path) -> Result<PathBuf, String> {
    let text = std::fs::read_to_string(dir.join("pyproject.toml"))
        .map_err(|e| format!("{}/pyproject.toml: {e}", dir.display()))?;
    let doc: toml::Value =
        toml::from_str(&text).map_err(|e| format!("{}/pyproject.toml: {e}", dir.display()))?;
    let name = doc
        .get("project")
        .and_then(|p| p.get("name"))
        .and_then(|n| n.as_str())
        .ok_or("pyproject.toml has no [project] name")?;
    let tool = doc
        .get("tool")
        .and_then(|t| t.get("baton"))
        .ok_or("pyproject.toml has no [tool.baton] (app, sdk, wit): make one with `baton new --lang python`")?;
    let field = |k: &str| -> Result<String, String> {
        tool.get(k)
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .ok_or(format!("pyproject.toml: [tool.baton] has no `{k}`"))
    };
    let (app, sdk, wit) = (field("app")?, field("sdk")?, field("wit")?);
    let (sdk, wit) = (dir.join(sdk), dir.join(wit));
    let out = dir.join("target").join(format!("{name}.wasm"));
    if fresh(&out, &[dir, &sdk, &wit]) {
        return Ok(out);
    }
    std::fs::create_dir_all(dir.join("target")).map_err(|e| e.to_string())?;
    let tool = componentize_py();
    let output = Command::new(&tool)
        .arg("-d")
        .arg(&wit)
        .args(["-w", "processor", "componentize", "-p"])
        .arg(&sdk)
        .arg("-p")
        .arg(dir)
        .arg(&app)
        .arg("-o")
        .arg(&out)
        .current_dir(dir)
        .output()
        .map_err(|e| {
            format!(
                "running {}: {e}; install it with `pip install componentize-py==0.25.1` (scripts/setup does)",
                tool.display()
            )
        })?;
    if !output.status.success() {
        let _ = std::fs::remove_file(&out);
        return Err(format!(
            "componentize-py failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(out)
}

/// Builds the project in `dir` and returns its component's path: a Rust crate (`Cargo.toml`),
/// Python (`pyproject.toml` with `[tool.baton]`), JavaScript (`package.json` with a `baton`
/// field), Go (`go.mod`) or C (a `Makefile` on the C SDK's `baton.mk`).
pub fn build(dir: &Path) -> Result<PathBuf, String> {
    let abs = dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let dir = abs.as_path();
    if dir.join("pyproject.toml").exists() {
        return build_python(dir);
    }
    if dir.join("package.json").exists() {
        return build_js(dir);
    }
    if dir.join("go.mod").exists() {
        return build_go(dir);
    }
    if dir.join("Makefile").exists() && !dir.join("Cargo.toml").exists() {
        return build_c(dir);
    }
    if !dir.join("Cargo.toml").exists() {
        return Err(format!(
            "{}: nothing to build (no Cargo.toml, pyproject.toml, package.json, go.mod or \
             Makefile); make a project with `baton new --lang rust|js|python|c|go NAME`",
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

/// The name of the project in `dir` (a canonical path): its directory's name.
fn dir_name(dir: &Path) -> Result<String, String> {
    dir.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .ok_or_else(|| format!("{}: no name", dir.display()))
}

/// Runs `cmd`; on failure, an error with what it printed.
fn run(mut cmd: Command, what: &str, hint: &str) -> Result<(), String> {
    let output = cmd
        .output()
        .map_err(|e| format!("running {what}: {e}; {hint}"))?;
    if !output.status.success() {
        return Err(format!(
            "{what} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(())
}

/// Builds a JavaScript project: `package.json` names the processor's module and where the SDK
/// and the WIT are (`"baton": {"entry", "sdk", "wit"}`); the SDK's `build.mjs` bundles it and
/// runs componentize-js into `target/<name>.wasm`. Skipped when that is newer than the
/// project, the SDK and the WIT.
fn build_js(dir: &Path) -> Result<PathBuf, String> {
    let text = std::fs::read_to_string(dir.join("package.json"))
        .map_err(|e| format!("{}/package.json: {e}", dir.display()))?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}/package.json: {e}", dir.display()))?;
    let name = doc["name"]
        .as_str()
        .ok_or("package.json has no `name`")?
        .to_string();
    check_name(&name)?;
    let field = |k: &str| -> Result<String, String> {
        doc["baton"][k].as_str().map(str::to_string).ok_or(format!(
            "package.json has no `baton.{k}` (entry, sdk, wit): make one with `baton new --lang js`"
        ))
    };
    let (entry, sdk, wit) = (field("entry")?, field("sdk")?, field("wit")?);
    let (sdk, wit) = (dir.join(sdk), dir.join(wit));
    let out = dir.join("target").join(format!("{name}.wasm"));
    if fresh(&out, &[dir, &sdk, &wit]) {
        return Ok(out);
    }
    std::fs::create_dir_all(dir.join("target")).map_err(|e| e.to_string())?;
    let mut cmd = Command::new("node");
    cmd.arg(sdk.join("build.mjs"))
        .arg("--entry")
        .arg(dir.join(entry))
        .arg("--wit")
        .arg(&wit)
        .arg("--out")
        .arg(&out)
        .current_dir(dir);
    run(
        cmd,
        "the JavaScript build (node build.mjs)",
        "install Node.js 18 or newer (scripts/setup checks it)",
    )
    .inspect_err(|_| {
        let _ = std::fs::remove_file(&out);
    })?;
    Ok(out)
}

/// Builds a Go project (`go.mod`, a `main` package on the Go SDK) with the standard toolchain
/// for `wasip1` as a reactor (`-buildmode=c-shared`), then makes the core module a component
/// with the contract's WIT: `target/<name>.wasm`.
fn build_go(dir: &Path) -> Result<PathBuf, String> {
    let name = dir_name(dir)?;
    let target = dir.join("target");
    std::fs::create_dir_all(&target).map_err(|e| format!("{}: {e}", target.display()))?;
    let core = target.join(format!("{name}.core.wasm"));
    let mut cmd = Command::new("go");
    cmd.args(["build", "-buildmode=c-shared", "-o"])
        .arg(&core)
        .arg(".")
        .env("GOOS", "wasip1")
        .env("GOARCH", "wasm")
        .current_dir(dir);
    run(
        cmd,
        "go build",
        "install Go 1.24 or newer (GOOS=wasip1 with go:wasmexport)",
    )?;
    componentize_file(&core, &target.join(format!("{name}.wasm")))
}

/// Builds a C project with `make` (its `Makefile` includes the C SDK's `baton.mk`, which
/// compiles for wasm32-wasi with clang and makes the component with `baton componentize`):
/// `target/<name>.wasm`.
fn build_c(dir: &Path) -> Result<PathBuf, String> {
    let name = dir_name(dir)?;
    let mut cmd = Command::new("make");
    cmd.arg("-C").arg(dir);
    if let Ok(exe) = std::env::current_exe() {
        cmd.arg(format!("BATON={}", exe.display()));
    }
    run(
        cmd,
        "make",
        "install make, clang, lld and wasi-libc (scripts/setup does)",
    )?;
    let out = dir.join("target").join(format!("{name}.wasm"));
    if !out.exists() {
        return Err(format!(
            "make succeeded but made no {}: does the Makefile include the C SDK's baton.mk?",
            out.display()
        ));
    }
    Ok(out)
}

/// `core` made into a component at `out`.
fn componentize_file(core: &Path, out: &Path) -> Result<PathBuf, String> {
    let bytes = std::fs::read(core).map_err(|e| format!("{}: {e}", core.display()))?;
    let component = crate::componentize::componentize(&bytes, None)
        .map_err(|e| format!("{}: {e}", core.display()))?;
    std::fs::write(out, component).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(out.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The version a file states after `prefix` on one of its lines, unquoted.
    fn stated(text: &str, prefix: &str) -> String {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .map(|v| v.trim().trim_matches(|c| c == '"' || c == ',').to_string())
            .unwrap_or_else(|| panic!("no line starts with `{prefix}`"))
    }

    #[test]
    fn the_changelog_states_each_sdk_version_as_its_sources_do() {
        let changelog = include_str!("../../CHANGELOG.md");
        let row = |part: &str| {
            stated(changelog, &format!("| {part} | "))
                .split(' ')
                .next()
                .unwrap()
                .to_string()
        };
        let sources = [
            (
                "Rust SDK",
                stated(include_str!("../../guest-sdk/Cargo.toml"), "version = "),
            ),
            (
                "JavaScript SDK",
                stated(
                    include_str!("../../guest-sdk/js/package.json"),
                    "\"version\": ",
                ),
            ),
            (
                "Python SDK",
                stated(
                    include_str!("../../guest-sdk/python/pyproject.toml"),
                    "version = ",
                ),
            ),
            (
                "C SDK",
                stated(
                    include_str!("../../guest-sdk/c/baton.h"),
                    "#define BATON_SDK_VERSION ",
                ),
            ),
            ("host", crate::VERSION.to_string()),
            ("contract", crate::runtime::WIT_VERSION.to_string()),
        ];
        for (part, version) in sources {
            assert_eq!(row(part), version, "CHANGELOG.md's row of the {part}");
        }
        assert_eq!(
            stated(
                include_str!("../../guest-sdk/c/baton.h"),
                "#define BATON_CONTRACT_VERSION "
            ),
            crate::runtime::WIT_VERSION
        );
    }

    #[test]
    fn a_new_rust_project_requires_the_sdk_version_in_the_tree() {
        let manifest = include_str!("../../guest-sdk/Cargo.toml");
        let version = manifest
            .lines()
            .find_map(|l| l.strip_prefix("version = "))
            .map(|v| v.trim().trim_matches('"'))
            .expect("guest-sdk/Cargo.toml names its version");
        assert_eq!(version, RUST_SDK_VERSION);
        let dir = tempfile::tempdir().unwrap();
        new_project("rust", &dir.path().join("p"), &default_sdk()).unwrap();
        let cargo = std::fs::read_to_string(dir.path().join("p/Cargo.toml")).unwrap();
        assert!(
            cargo.contains(&format!("baton-sdk = {{ version = \"{RUST_SDK_VERSION}\"")),
            "{cargo}"
        );
    }
}
