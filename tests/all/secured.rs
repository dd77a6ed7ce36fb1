//! A secured Kafka, as production clusters run it: a broker of the test's own, started by
//! `scripts/kafka` with a SASL_SSL listener (TLS with a keytool certificate, SCRAM-SHA-512 users
//! made by `kafka-storage format --add-scram`). baton is given only that listener and its
//! settings in a librdkafka properties file (`--kafka-config @FILE`), so every client it makes
//! (admin, consumers, transactional producers, membership, controller, changelog tails) must
//! carry them, or the pipeline stalls. A wrong password is refused at start, clearly and soon.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use baton_tests::{
    OwnBroker, SCRAM_PASSWORD, SCRAM_USER, baton_bin, count, unique, wait_alive, wait_for, words,
};
use serde_json::{Value, json};

/// A librdkafka properties file for `broker`'s SASL_SSL listener with `password`.
fn properties(dir: &Path, broker: &OwnBroker, password: &str) -> anyhow::Result<String> {
    let file = dir.join(format!("kafka-{password}.properties"));
    std::fs::write(
        &file,
        format!(
            "# the test broker's SASL_SSL listener\n\
             security.protocol=SASL_SSL\n\
             sasl.mechanisms=SCRAM-SHA-512\n\
             sasl.username={SCRAM_USER}\n\
             sasl.password={password}\n\
             ssl.ca.location={}\n",
            broker.ca_pem().display()
        ),
    )?;
    Ok(format!("@{}", file.display()))
}

/// wc-0's row as `api` shows it.
async fn wc0(api: &baton_tests::Api) -> anyhow::Result<Value> {
    api.partitions()
        .await?
        .into_iter()
        .find(|p| p["id"] == "wc-0")
        .ok_or_else(|| anyhow::anyhow!("no partition wc-0"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_sasl_ssl_broker_a_wrong_password_is_refused_and_two_hosts_count_exactly_across_a_move()
-> anyhow::Result<()> {
    let broker = tokio::task::spawn_blocking(|| OwnBroker::start_secured(19192)).await??;
    let bootstrap = broker.secured_bootstrap().expect("a SASL_SSL listener");
    let dir = tempfile::tempdir()?;

    // A wrong password: `baton run` exits with an error naming the mechanism and the user,
    // long before anything of the host's own would time out, and never shows the password.
    let wrong = "not-the-password";
    let bad = properties(dir.path(), &broker, wrong)?;
    let mut child = Command::new(baton_bin())
        .args(["run", "--http", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("refused"))
        .args(["--kafka", &bootstrap, "--kafka-config", &bad])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let exited = wait_for(
        "baton to exit on a refused login",
        Duration::from_secs(60),
        || {
            let status = child.try_wait();
            async move { Ok(status?) }
        },
    )
    .await;
    if exited.is_err() {
        let _ = child.kill();
    }
    let status = exited?;
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)?;
    assert!(!status.success(), "{stderr}");
    for said in [
        "refused the login",
        "SCRAM-SHA-512",
        &format!("`{SCRAM_USER}`"),
        "sasl.password",
    ] {
        assert!(stderr.contains(said), "{said:?} missing from: {stderr}");
    }
    assert!(!stderr.contains(wrong), "the password leaked: {stderr}");

    // The right password: two hosts, exactly-once word count, a move from the owner to the
    // other host while records flow, and exact counts on both.
    let good = properties(dir.path(), &broker, SCRAM_PASSWORD)?;
    let cluster = unique("secured");
    let start = |id: &'static str| {
        let (dir, cluster, bootstrap, good) = (
            dir.path().join(id),
            cluster.clone(),
            bootstrap.clone(),
            good.clone(),
        );
        async move {
            let extra = ["--kafka-config", &good];
            baton_tests::child_member_on(&dir, &cluster, id, &bootstrap, &extra, &[]).await
        }
    };
    let a = start("a").await?;
    let b = start("b").await?;
    wait_alive(&a.api, 2).await?;
    wait_alive(&b.api, 2).await?;
    a.api.upload_plugin("word-count", "word-count", "1").await?;
    a.api
        .create_pipeline(json!({
            "name": "wc", "module": "word-count", "version": "1", "inputs": ["secured-words"],
            "stores": ["counts"], "slots": 2, "partitions": 1, "guarantee": "exactly-once"
        }))
        .await?;
    let owner = wait_for("wc-0 running", Duration::from_secs(90), || async {
        let p = wc0(&a.api).await?;
        Ok((p["state"] == "running").then(|| p["owner"].as_str().unwrap_or_default().to_string()))
    })
    .await?;
    let target = if owner == "a" { "b" } else { "a" };
    let keyed = |ws: &[String]| -> Vec<(String, Option<String>)> {
        ws.iter().map(|w| (w.clone(), None)).collect()
    };
    let first = words(3000, 200, 1);
    let second = words(3000, 200, 2);
    a.api.produce("secured-words", &keyed(&first)).await?;
    a.api
        .wait_caught_up("wc", first.len() as u64, Duration::from_secs(90))
        .await?;

    let moved = a
        .api
        .post_json("/api/v1/partitions/wc-0/move", &json!({"to": target}))
        .await?;
    assert_eq!(moved.status, 202, "{moved:?}");
    // Records produced during the move, through the host that is about to lose the partition.
    for chunk in second.chunks(500) {
        a.api.produce("secured-words", &keyed(chunk)).await?;
    }
    wait_for(
        "wc-0 running on the target",
        Duration::from_secs(120),
        || async {
            let p = wc0(&a.api).await?;
            Ok((p["state"] == "running" && p["owner"] == target).then_some(()))
        },
    )
    .await?;
    let total = (first.len() + second.len()) as u64;
    let new_owner = if target == "a" { &a.api } else { &b.api };
    new_owner
        .wait_caught_up("wc", total, Duration::from_secs(120))
        .await?;
    let expected = count(first.iter().chain(&second).map(String::as_str));
    for api in [&a.api, &b.api] {
        baton_tests::assert_counts(api, "wc", &expected).await?;
    }

    // The password is nowhere in what the hosts show or log.
    for (id, api) in [("a", &a.api), ("b", &b.api)] {
        let shown = api.get("/api/v1/host").await?.body.to_string();
        assert!(
            !shown.contains(SCRAM_PASSWORD),
            "host {id} shows it: {shown}"
        );
        let log = std::fs::read_to_string(dir.path().join(id).join("baton.log"))?;
        assert!(!log.contains(SCRAM_PASSWORD), "host {id} logged it");
    }
    a.terminate()?;
    b.terminate()?;
    drop(broker);
    Ok(())
}
