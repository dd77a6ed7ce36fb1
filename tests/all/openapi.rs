//! `/api/v1/openapi.json` validates as OpenAPI 3.1 (openapi-spec-validator, installed by
//! scripts/setup), and every operation it documents is routed by the server.

use baton_tests::InProcess;
use reqwest::Method;

fn validator() -> std::path::PathBuf {
    let cache = std::env::var("BATON_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/baton")
        });
    cache.join("py/bin/openapi-spec-validator")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_validates_and_matches_the_routes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    let r = host.api.get("/api/v1/openapi.json").await?;
    assert_eq!(r.status, 200);
    let doc = r.body;
    assert_eq!(doc["openapi"], "3.1.0");
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&doc)?)?;
    let tool = validator();
    anyhow::ensure!(
        tool.exists(),
        "{} is missing: run scripts/setup",
        tool.display()
    );
    let out = std::process::Command::new(&tool).arg(&file).output()?;
    assert!(
        out.status.success(),
        "openapi-spec-validator: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Schemas come from the code: the spec of a pipeline has the fields the server accepts.
    let spec = &doc["components"]["schemas"]["PipelineSpec"]["properties"];
    for field in [
        "name",
        "module",
        "version",
        "inputs",
        "slots",
        "guarantee",
        "limits",
        "swap",
    ] {
        assert!(
            spec.get(field).is_some(),
            "PipelineSpec lacks {field}: {spec}"
        );
    }
    // Every documented operation reaches a handler (the fallback answers "no route").
    let paths = doc["paths"].as_object().expect("paths");
    let mut operations = 0;
    for (path, methods) in paths {
        let concrete = path
            .replace("{pipeline}", "nope")
            .replace("{store}", "s")
            .replace("{key}", "k")
            .replace("{topic}", "t");
        for method in methods.as_object().expect("methods").keys() {
            if path == "/api/v1/stream" {
                // An event stream never ends: its head is enough.
                let r = reqwest::get(format!("{}{path}", host.api.base())).await?;
                assert_eq!(r.status(), 200, "{method} {path}");
                assert!(
                    r.headers()["content-type"]
                        .to_str()?
                        .starts_with("text/event-stream")
                );
                operations += 1;
                continue;
            }
            let m: Method = method.to_uppercase().parse()?;
            let r = host
                .api
                .send_with_token(m, &concrete, Some(&serde_json::json!({})), None)
                .await?;
            assert_ne!(r.status, 405, "{method} {path} is not routed");
            assert!(
                !(r.status == 404 && r.error().contains("no route")),
                "{method} {path} is not routed: {}",
                r.body
            );
            operations += 1;
        }
    }
    assert!(operations >= 18, "{operations} operations");
    host.stop().await
}
