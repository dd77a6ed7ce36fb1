//! Builds every plugin to wasm32-wasip2 (release) so that no plugin goes untested, and tells the
//! tests where the components are (`BATON_PLUGIN_DIR`).
//!
//! The plugins build in `<target dir>/plugins`, a target dir of their own: this script runs
//! while the outer cargo holds the lock on the main one.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let root =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR")).join("..");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    // OUT_DIR = <target>/<profile>/build/<pkg>-<hash>/out
    let target = out
        .ancestors()
        .nth(4)
        .expect("target dir above OUT_DIR")
        .to_path_buf();
    let plugin_target = std::env::var("PLUGIN_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| target.join("plugins"));

    for p in [
        "wit",
        "guest-sdk/src",
        "guest-sdk/macros/src",
        "guest-sdk/Cargo.toml",
        "plugins/Cargo.toml",
        "plugins/Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    for entry in std::fs::read_dir(root.join("plugins")).expect("plugins/") {
        let dir = entry.expect("plugins/ entry").path();
        if dir.join("Cargo.toml").exists() {
            println!("cargo:rerun-if-changed={}", dir.join("src").display());
            println!(
                "cargo:rerun-if-changed={}",
                dir.join("Cargo.toml").display()
            );
        }
    }
    println!("cargo:rerun-if-env-changed=PLUGIN_TARGET_DIR");

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "--release",
        "--target",
        "wasm32-wasip2",
        "--manifest-path",
    ])
    .arg(root.join("plugins/Cargo.toml"))
    .arg("--target-dir")
    .arg(&plugin_target);
    // Nothing of the outer build may leak into the guest build.
    for (k, _) in std::env::vars() {
        if (k.starts_with("CARGO_") && k != "CARGO_HOME")
            || k.starts_with("RUSTC")
            || k == "RUSTFLAGS"
            || k == "TARGET"
        {
            cmd.env_remove(&k);
        }
    }
    let status = cmd.status().expect("running cargo for the plugins");
    assert!(
        status.success(),
        "building the plugins failed (see the output above); is the wasm32-wasip2 target installed? run scripts/setup"
    );
    let dir = plugin_target.join("wasm32-wasip2/release");
    assert!(
        Path::new(&dir).join("word_count.wasm").exists(),
        "no word_count.wasm in {}",
        dir.display()
    );
    println!("cargo:rustc-env=BATON_PLUGIN_DIR={}", dir.display());

    python_plugins(&root, &plugin_target.join("python"));
}

/// Builds every Python plugin (`plugins/python-*`, an `app.py` on `guest-sdk/python`) with
/// componentize-py into `<dir>/<name>.wasm`, unless it is newer than its sources, and tells the
/// tests where they are (`BATON_PYTHON_PLUGIN_DIR`).
fn python_plugins(root: &Path, dir: &Path) {
    let sdk = root.join("guest-sdk/python");
    let wit = root.join("wit");
    println!("cargo:rerun-if-changed={}", sdk.join("baton_sdk").display());
    println!("cargo:rerun-if-env-changed=BATON_COMPONENTIZE_PY");
    std::fs::create_dir_all(dir).expect("the Python plugins' dir");
    let tool = std::env::var_os("BATON_COMPONENTIZE_PY")
        .map(PathBuf::from)
        .or_else(|| {
            [
                std::env::var_os("BATON_CACHE").map(PathBuf::from),
                std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/baton")),
            ]
            .into_iter()
            .flatten()
            .map(|c| c.join("py/bin/componentize-py"))
            .find(|p| p.exists())
        })
        .unwrap_or_else(|| "componentize-py".into());
    for entry in std::fs::read_dir(root.join("plugins")).expect("plugins/") {
        let src = entry.expect("plugins/ entry").path();
        let name = src.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if !name.starts_with("python-") || !src.join("app.py").exists() {
            continue;
        }
        println!("cargo:rerun-if-changed={}", src.display());
        let out = dir.join(format!("{name}.wasm"));
        if newer_than(&out, &[&src, &sdk.join("baton_sdk"), &wit]) {
            continue;
        }
        let status = Command::new(&tool)
            .arg("-d")
            .arg(&wit)
            .args(["-w", "processor", "componentize", "-p"])
            .arg(&sdk)
            .arg("-p")
            .arg(&src)
            .args(["app", "-o"])
            .arg(&out)
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "running {} for {name}: {e}; run scripts/setup (it installs componentize-py)",
                    tool.display()
                )
            });
        assert!(status.success(), "componentize-py failed for {name}");
    }
    println!("cargo:rustc-env=BATON_PYTHON_PLUGIN_DIR={}", dir.display());
}

/// True when `out` exists and is newer than every file under `inputs`.
fn newer_than(out: &Path, inputs: &[&Path]) -> bool {
    fn newest(p: &Path) -> Option<std::time::SystemTime> {
        let meta = std::fs::metadata(p).ok()?;
        if !meta.is_dir() {
            return meta.modified().ok();
        }
        let mut t = None;
        for e in std::fs::read_dir(p).ok()?.flatten() {
            let path = e.path();
            if path.file_name().is_some_and(|n| n == "__pycache__") {
                continue;
            }
            t = t.max(newest(&path));
        }
        t
    }
    let Ok(built) = std::fs::metadata(out).and_then(|m| m.modified()) else {
        return false;
    };
    inputs.iter().all(|i| newest(i).is_none_or(|t| t < built))
}
