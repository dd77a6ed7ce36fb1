//! Bad uploads and bad requests get a 4xx whose body names the problem.

use std::time::Duration;

use baton_tests::{InProcess, plugin_bytes, wait_for};
use serde_json::json;

/// A component whose core module only traps, built for the world `world` of the WIT in `wit`.
fn dummy_component(wit: &[(&str, String)], world: &str) -> Vec<u8> {
    let mut resolve = wit_parser::Resolve::default();
    let mut pkg = None;
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in wit {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    pkg.get_or_insert(resolve.push_dir(dir.path()).unwrap().0);
    let world = resolve.select_world(&[pkg.unwrap()], Some(world)).unwrap();
    let mut module =
        wit_component::dummy_module(&resolve, world, wit_parser::ManglingAndAbi::Standard32);
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
        false,
    )
    .unwrap();
    wit_component::ComponentEncoder::default()
        .module(&module)
        .unwrap()
        .validate(true)
        .encode()
        .unwrap()
}

/// The WIT files of contract `base` (`wit/` for 0.2.0, `wit/v0.1/` for 0.1.0), relabelled as
/// `version`.
fn baton_wit(base: &str, version: &str) -> Vec<(&'static str, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit");
    let (dir, files) = match base {
        "0.1.0" => (
            root.join("v0.1"),
            &[
                "types.wit",
                "state.wit",
                "output.wit",
                "log.wit",
                "handler.wit",
                "world.wit",
            ][..],
        ),
        _ => (
            root,
            &[
                "types.wit",
                "state.wit",
                "timers.wit",
                "output.wit",
                "log.wit",
                "handler.wit",
                "world.wit",
            ][..],
        ),
    };
    files
        .iter()
        .map(|f| {
            (
                *f,
                std::fs::read_to_string(dir.join(f))
                    .unwrap()
                    .replace(&format!("@{base}"), &format!("@{version}")),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_uploads_get_a_4xx_saying_why() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    let api = &host.api;
    let up = |bytes: Vec<u8>| {
        let api = api.clone();
        async move {
            api.post_bytes(
                "/api/v1/modules?name=m&version=1",
                bytes,
                "application/wasm",
            )
            .await
        }
    };

    let r = up(b"definitely not wasm".to_vec()).await?;
    assert_eq!(r.status, 422, "{:?}", r);
    assert!(
        r.error().contains("not a WebAssembly component"),
        "{}",
        r.error()
    );

    let r = up(b"\0asm\x01\0\0\0".to_vec()).await?;
    assert_eq!(r.status, 422);
    assert!(
        r.error().contains("core WebAssembly module"),
        "{}",
        r.error()
    );

    let mut truncated = plugin_bytes("word-count");
    truncated.truncate(truncated.len() / 2);
    let r = up(truncated).await?;
    assert_eq!(r.status, 422);
    assert!(r.error().contains("invalid component"), "{}", r.error());

    let other = dummy_component(
        &[(
            "w.wit",
            "package acme:thing@1.0.0;\nworld w { export run: func(); }\n".into(),
        )],
        "w",
    );
    let r = up(other).await?;
    assert_eq!(r.status, 422);
    assert!(
        r.error()
            .contains("does not fit the baton:processor/processor@0.2.0 world"),
        "{}",
        r.error()
    );

    // Versions this host does not serve are refused, naming the ones it does.
    for (base, version) in [("0.2.0", "0.3.0"), ("0.2.0", "1.0.0"), ("0.1.0", "1.0.0")] {
        let newer = dummy_component(&baton_wit(base, version), "processor");
        let r = up(newer).await?;
        assert_eq!(r.status, 422, "{version}");
        assert!(
            r.error().contains(&format!("baton:processor@{version}"))
                && r.error()
                    .contains("speaks baton:processor@0.1.x and @0.2.x"),
            "{}",
            r.error()
        );
    }

    // Dummies of both served contracts, and of a later patch of each, are valid: accepted.
    for (i, (base, version)) in [
        ("0.1.0", "0.1.0"),
        ("0.2.0", "0.2.0"),
        ("0.1.0", "0.1.3"),
        ("0.2.0", "0.2.1"),
    ]
    .into_iter()
    .enumerate()
    {
        let same = dummy_component(&baton_wit(base, version), "processor");
        let r = api
            .post_bytes(
                &format!("/api/v1/modules?name=m&version={}", i + 1),
                same,
                "application/wasm",
            )
            .await?;
        assert_eq!(r.status, 201, "{version}: {:?}", r);
        assert_eq!(r.body["wit"], format!("baton:processor@{base}"), "{r:?}");
    }

    let r = api
        .post_bytes(
            "/api/v1/modules?name=m&version=9",
            vec![],
            "application/wasm",
        )
        .await?;
    assert_eq!(r.status, 400);
    assert!(r.error().contains("empty body"));
    let r = api
        .post_bytes(
            "/api/v1/modules?version=2",
            plugin_bytes("word-count"),
            "application/wasm",
        )
        .await?;
    assert_eq!(r.status, 400);
    assert!(r.error().contains("name"), "{}", r.error());
    let r = api
        .post_bytes(
            "/api/v1/modules?name=bad/name&version=2",
            plugin_bytes("word-count"),
            "application/wasm",
        )
        .await?;
    assert_eq!(r.status, 400);
    // The same name and version with other bytes is a conflict, identical bytes are not.
    let r = api
        .post_bytes(
            "/api/v1/modules?name=m&version=1",
            plugin_bytes("word-count"),
            "application/wasm",
        )
        .await?;
    assert_eq!(r.status, 409, "{r:?}");
    let listed = api.get("/api/v1/modules").await?;
    assert_eq!(listed.body.as_array().unwrap().len(), 4);
    host.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_a_4xx_naming_the_problem() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    let api = &host.api;
    api.upload_plugin("word-count", "word-count", "1").await?;
    let good = json!({"name": "wc", "module": "word-count", "version": "1", "inputs": ["words"], "stores": ["counts"], "slots": 4});

    let r = api
        .post_bytes(
            "/api/v1/pipelines",
            b"{not json".to_vec(),
            "application/json",
        )
        .await?;
    assert_eq!(r.status, 400);
    let mut unknown = good.clone();
    unknown["colour"] = json!("red");
    let r = api.post_json("/api/v1/pipelines", &unknown).await?;
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.error().contains("colour"), "{}", r.error());
    let mut missing = good.clone();
    missing["version"] = json!("9");
    let r = api.post_json("/api/v1/pipelines", &missing).await?;
    assert_eq!(r.status, 400);
    assert!(r.error().contains("not uploaded"), "{}", r.error());
    let mut too_many = good.clone();
    too_many["partitions"] = json!(5);
    let r = api.post_json("/api/v1/pipelines", &too_many).await?;
    assert_eq!(r.status, 400);
    assert!(r.error().contains("partitions"));
    // The cluster's prefix (and the default cluster's) and its own names are reserved.
    let cluster = baton_tests::cluster_name(dir.path());
    for topic in [format!("{cluster}.control"), "baton.control".to_string()] {
        let mut own = good.clone();
        own["name"] = json!("sneaky");
        own["outputs"] = json!([topic]);
        let r = api.post_json("/api/v1/pipelines", &own).await?;
        assert_eq!(r.status, 400, "{r:?}");
        assert!(r.error().contains("reserved"), "{}", r.error());
        let r = api
            .post_json(
                &format!("/api/v1/topics/{topic}/records"),
                &json!([{"key": "a", "value": "b"}]),
            )
            .await?;
        assert_eq!(r.status, 400, "{r:?}");
        assert!(r.error().contains("reserved"), "{}", r.error());
    }
    for name in ["hosts", "control", "controller", "modules", "load"] {
        let mut own = good.clone();
        own["name"] = json!(name);
        let r = api.post_json("/api/v1/pipelines", &own).await?;
        assert_eq!(r.status, 400, "{r:?}");
        assert!(r.error().contains("reserved"), "{}", r.error());
    }

    // A pipeline whose partitions cannot start exists all the same: 201, phase `failed` with
    // the reason (here its state directory is taken by a file).
    let state = dir.path().join("state").join("blocked");
    std::fs::create_dir_all(&state)?;
    std::fs::write(state.join("blocked-0"), b"not a directory")?;
    let mut blocked = good.clone();
    blocked["name"] = json!("blocked");
    blocked["inputs"] = json!(["blocked-in"]);
    let r = api.post_json("/api/v1/pipelines", &blocked).await?;
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(r.body["phase"], "failed", "{}", r.body);
    let info = api.get("/api/v1/pipelines/blocked").await?.body;
    assert_eq!(info["phase"], "failed", "{info}");
    assert!(
        info["reason"]
            .as_str()
            .is_some_and(|r| r.contains("blocked-0")),
        "{info}"
    );
    let r = api.post_json("/api/v1/pipelines", &blocked).await?;
    assert_eq!(r.status, 409, "the name is taken: {r:?}");

    api.create_pipeline(good.clone()).await?;
    let info = wait_for("wc to run", Duration::from_secs(30), || async {
        let info = api.get("/api/v1/pipelines/wc").await?.body;
        Ok((info["phase"] == "running").then_some(info))
    })
    .await?;
    assert!(info.get("reason").is_none(), "{info}");
    let r = api.post_json("/api/v1/pipelines", &good).await?;
    assert_eq!(r.status, 409);
    // A topic that exists with another partition count is refused, naming the topic.
    let mut clash = good.clone();
    clash["name"] = json!("wc2");
    clash["slots"] = json!(8);
    let r = api.post_json("/api/v1/pipelines", &clash).await?;
    assert_eq!(r.status, 409);
    assert!(
        r.error().contains("topic `words` exists with 4 partitions"),
        "{}",
        r.error()
    );

    assert_eq!(
        api.get("/api/v1/pipelines/wc/stores/counts/keys/nobody")
            .await?
            .status,
        404
    );
    let r = api
        .get("/api/v1/pipelines/nope/stores/counts/keys/x")
        .await?;
    assert_eq!(r.status, 404);
    assert!(r.error().contains("pipeline `nope`"));
    let r = api
        .get("/api/v1/pipelines/wc/stores/nostore/keys/x")
        .await?;
    assert_eq!(r.status, 404);
    assert!(r.error().contains("no store `nostore`"));

    let r = api
        .post_json(
            "/api/v1/topics/nowhere/records",
            &json!([{"key": "a", "value": "b"}]),
        )
        .await?;
    assert_eq!(r.status, 404);
    let r = api
        .post_json("/api/v1/topics/words/records", &json!({"key": "a"}))
        .await?;
    assert_eq!(r.status, 400);
    assert!(r.error().contains("JSON array"), "{}", r.error());
    let r = api.get("/api/v1/topics/words/records?slot=99").await?;
    assert_eq!(r.status, 404);
    let r = api.get("/api/v1/topics/words/records?slot=abc").await?;
    assert_eq!(r.status, 400);
    assert_eq!(api.get("/api/v1/nothing-here").await?.status, 404);
    assert_eq!(api.get("/healthz").await?.status, 200);
    let h = api.get("/api/v1/host").await?;
    assert_eq!(h.body["transport"], "embedded");
    assert_eq!(h.body["state_memory"]["bound"], 64 << 20);

    // Tombstones and headers round-trip through produce and read.
    let r = api
        .post_json(
            "/api/v1/topics/words/records",
            &json!([{"key": "k", "value": null, "headers": {"h": "v"}}]),
        )
        .await?;
    assert_eq!(r.status, 200);
    let slot = r.body[0]["slot"].as_u64().unwrap();
    let back = api
        .get(&format!(
            "/api/v1/topics/words/records?slot={slot}&offset=0"
        ))
        .await?;
    let rec = &back.body["records"][0];
    assert_eq!(rec["key"], "k");
    assert!(rec["value"].is_null());
    assert_eq!(rec["headers"][0]["value"], "v");
    host.stop().await
}

/// An upload over the limit is answered 413 only once its body is read (and thrown away): a
/// client still sending when the server closed would see a reset instead of the answer. The
/// connection stays usable: a second request on it is answered too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_upload_is_read_to_its_end_before_the_413() -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    let addr = host
        .api
        .base()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let (mut rd, mut wr) = tokio::net::TcpStream::connect(&addr).await?.into_split();
    let size = (64 << 20) + 1;
    let writer = tokio::spawn(async move {
        let head = format!(
            "POST /api/v1/modules?name=big&version=1 HTTP/1.1\r\nHost: {addr}\r\n\
             Content-Type: application/wasm\r\nContent-Length: {size}\r\n\r\n"
        );
        wr.write_all(head.as_bytes()).await?;
        let chunk = vec![0u8; 1 << 20];
        let mut sent = 0;
        while sent < size {
            let n = chunk.len().min(size - sent);
            wr.write_all(&chunk[..n]).await?;
            sent += n;
        }
        wr.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        anyhow::Ok(wr)
    });
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let answered = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let text = String::from_utf8_lossy(&got);
            if text.matches("HTTP/1.1 ").count() >= 2 && text.ends_with('}') {
                return Ok(text.to_string());
            }
            match rd.read(&mut buf).await {
                Ok(0) => anyhow::bail!("the server closed the connection; it had sent {text:?}"),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => anyhow::bail!("reading the answers: {e}; got {text:?}"),
            }
        }
    })
    .await??;
    let statuses: Vec<&str> = answered
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| &answered[i + 9..i + 12])
        .collect();
    assert_eq!(statuses, ["413", "200"], "{answered}");
    assert!(
        answered.contains("limit of 64 MiB"),
        "the 413 names the limit: {answered}"
    );
    writer.await??;
    host.stop().await
}

/// Bodies over the limits get 413 with a message; garbage bodies and bad specs get 400; the
/// newer endpoints name the problem too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_and_garbage_bodies_are_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    // The server reads and throws away an oversize body before it answers 413: the client,
    // still sending, sees the answer and not a reset connection, and the connection stays
    // usable, so one client makes every call, each oversize call three times.
    let api = &baton_tests::Api::new(host.api.base());
    // A module over 64 MiB.
    let mut big = b"\0asm".to_vec();
    big.resize((64 << 20) + 1, 0);
    for _ in 0..3 {
        let r = api
            .post_bytes(
                "/api/v1/modules?name=big&version=1",
                big.clone(),
                "application/wasm",
            )
            .await?;
        assert_eq!(r.status, 413, "{:?}", r.body);
        assert!(!r.error().is_empty());
    }
    // A produce body over 16 MiB.
    let value = "x".repeat(1 << 20);
    let recs: Vec<_> = (0..17)
        .map(|i| json!({"key": format!("k{i}"), "value": value}))
        .collect();
    for _ in 0..3 {
        let r = api
            .post_json("/api/v1/topics/words/records", &json!(recs))
            .await?;
        assert_eq!(r.status, 413, "{:?}", r.body);
    }
    // A swap body over the default JSON limit, and garbage.
    api.upload_plugin("word-count", "word-count", "1").await?;
    api.create_pipeline(json!({"name": "wc", "module": "word-count", "version": "1",
                               "inputs": ["words"], "stores": ["counts"]}))
        .await?;
    for _ in 0..3 {
        let r = api
            .put_json(
                "/api/v1/pipelines/wc/module",
                &json!({"version": "x".repeat(3 << 20)}),
            )
            .await?;
        assert_eq!(r.status, 413, "{:?}", r.body);
    }
    let r = api
        .send_with_token(
            reqwest::Method::PUT,
            "/api/v1/pipelines/wc/module",
            Some(&json!(["version", "2"])),
            None,
        )
        .await?;
    assert!(r.status == 400 || r.status == 422, "{:?}", r.body);
    assert!(!r.error().is_empty());
    for (spec, says) in [
        (json!({"limits": {"cpu_ms": 1}}), "cpu_ms"),
        (json!({"limits": {"memory_bytes": 10}}), "memory_bytes"),
        (
            json!({"swap": {"max_failure_share": 2.0}}),
            "max_failure_share",
        ),
        (json!({"wasi": {"network": true}}), "network"),
    ] {
        let mut full = json!({"name": "p2", "module": "word-count", "version": "1",
                              "inputs": ["other"], "stores": ["counts"]});
        for (k, v) in spec.as_object().expect("object") {
            full[k] = v.clone();
        }
        let r = api.post_json("/api/v1/pipelines", &full).await?;
        assert!(r.status == 400 || r.status == 422, "{spec}: {:?}", r.body);
        assert!(r.error().contains(says), "{spec}: {}", r.error());
    }
    host.stop().await
}
