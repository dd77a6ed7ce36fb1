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
}
