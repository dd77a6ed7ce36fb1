//! The quick starts in `docs/`, run as a new user would run them: every `sh` block of the
//! document, in order, in a fresh directory, against a host of the test's own.

use std::path::Path;
use std::process::Command;

use baton_tests::{ChildHost, baton_bin};

/// The `sh` blocks of a Markdown document, joined in order.
fn sh_blocks(doc: &str) -> String {
    let mut script = String::new();
    let mut inside = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            inside = !inside && line.trim() == "```sh";
            continue;
        }
        if inside {
            script.push_str(line);
            script.push('\n');
        }
    }
    script
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_quick_start() -> anyhow::Result<()> {
    quick_start("python", "python").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_quick_start() -> anyhow::Result<()> {
    quick_start("js", "js").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_quick_start() -> anyhow::Result<()> {
    quick_start("c", "c").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_quick_start() -> anyhow::Result<()> {
    quick_start("go", "go").await
}

/// Runs `docs/quickstart-<doc>.md`: a processor `greeter` made with `baton new --lang <lang>`,
/// built, tested locally, deployed, fed, changed to count 10 per record and hot-swapped.
async fn quick_start(doc: &str, lang: &str) -> anyhow::Result<()> {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../docs/quickstart-{doc}.md")),
    )?;
    let script = sh_blocks(&doc);
    assert!(
        script.contains(&format!("baton new --lang {lang} greeter")),
        "{script}"
    );
    let host_dir = tempfile::tempdir()?;
    let host = ChildHost::start(host_dir.path(), &[]).await?;
    let work = tempfile::tempdir()?;
    let bin_dir = baton_bin().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let base = host.api.base().to_string();
    let out = tokio::task::spawn_blocking({
        let work = work.path().to_path_buf();
        move || {
            Command::new("timeout")
                .args(["600", "bash", "-euo", "pipefail", "-c", &script])
                .current_dir(&work)
                .env("PATH", path)
                .env("BATON_URL", base)
                .output()
        }
    })
    .await??;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "the quick start failed:\n{stdout}\n{stderr}"
    );
    assert!(stderr.contains("the state matches --expect"), "{stderr}");
    // What the user was told to expect, checked on the host.
    assert_eq!(
        host.api.counter("greeter", "counts", "ada").await?,
        Some(12)
    );
    assert_eq!(
        host.api.counter("greeter", "counts", "grace").await?,
        Some(1)
    );
    let r = host.api.get("/api/v1/pipelines/greeter").await?;
    assert_eq!(r.body["version"], "2", "{}", r.body);
    let built = work.path().join("greeter/target/greeter.wasm");
    assert!(built.exists(), "{}", built.display());
    Ok(())
}
