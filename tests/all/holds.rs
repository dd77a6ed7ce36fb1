//! Faults injected at one protocol step: a thread of the host is held at a named step
//! (`baton::steps`) while the test checks what the rest of the host does, then let go.

use std::time::Duration;

use baton::partition::supervisor::single_host_assignments;
use baton::steps;
use baton_tests::{InProcess, wait_for, word_count_host, words};
use serde_json::json;

/// A lookup's status and body.
async fn ask(host: &InProcess, key: &str) -> anyhow::Result<(u16, serde_json::Value)> {
    let r = host
        .api
        .get(&format!("/api/v1/pipelines/held/stores/counts/keys/{key}"))
        .await?;
    Ok((r.status, r.body))
}

/// Until a partition's loop has restored its state, queries say so: a key it holds comes back
/// with `restoring: true`, and a key it does not hold is a 503 (it may be there once the
/// restore reaches it), not a 404. A partition drained and stopped here answers 503. Once it
/// runs again, answers are current.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_say_when_state_is_not_restored_yet_or_has_moved_on() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = word_count_host(dir.path(), "held", 2, 1).await?;
    let api = &host.api;
    let keys = words(500, 20, 3);
    let recs: Vec<_> = keys
        .iter()
        .map(|k| (k.clone(), Some("x".to_string())))
        .collect();
    api.produce("held-in", &recs).await?;
    api.wait_caught_up("held", keys.len() as u64, Duration::from_secs(60))
        .await?;
    let present = keys[0].clone();
    let want = keys.iter().filter(|k| **k == present).count() as i64;
    let (status, body) = ask(&host, &present).await?;
    assert_eq!(
        (status, body["restoring"].clone()),
        (200, json!(false)),
        "{body}"
    );

    let all = single_host_assignments(&host.baton.pipeline("held")?);
    for step in [steps::SESSION_RESTORE, steps::SESSION_RESTORED] {
        // A new loop of the partition, held at `step` of its first session.
        host.baton.assign("held", &[])?;
        let hold = host.baton.steps().hold(step, Some("held-0"));
        host.baton.assign("held", &all)?;
        let reached = tokio::task::spawn_blocking(move || {
            let reached = hold.wait_reached(Duration::from_secs(30));
            (hold, reached)
        });
        let (hold, reached) = reached.await?;
        assert!(reached, "{step}: the partition never reached the step");

        let (status, body) = ask(&host, &present).await?;
        assert_eq!(status, 200, "{step}: {body}");
        assert_eq!(body["value_i64"], json!(want), "{step}: {body}");
        assert_eq!(body["restoring"], json!(true), "{step}: {body}");
        let (status, body) = ask(&host, "never-sent").await?;
        assert_eq!(status, 503, "{step}: {body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("held-0") && error.contains("restoring"),
            "{step}: {error}"
        );
        let scan = api
            .get("/api/v1/pipelines/held/stores/counts/keys?limit=5")
            .await?;
        assert_eq!(
            (scan.status, scan.body["restoring"].clone()),
            (200, json!(true)),
            "{step}: {}",
            scan.body
        );

        hold.release();
        wait_for(
            &format!("{step}: the partition to run and answer as current"),
            Duration::from_secs(30),
            || async {
                let (status, body) = ask(&host, &present).await?;
                Ok((status == 200 && body["restoring"] == json!(false)).then_some(()))
            },
        )
        .await?;
        let (status, body) = ask(&host, "never-sent").await?;
        assert_eq!(status, 404, "{step}: {body}");
    }

    // Drained (as for a move) and still in the table: not this host's to answer for.
    let h = host
        .baton
        .partition_handles()
        .into_iter()
        .find(|h| h.id == "held-0")
        .expect("held-0 runs");
    let drained = tokio::task::spawn_blocking(move || h.drain(Duration::from_secs(30))).await?;
    assert!(drained.is_some(), "the drain was answered");
    let (status, body) = ask(&host, &present).await?;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("held-0") && e.contains("stopped")),
        "{body}"
    );
    // Assigned again: a new loop answers.
    host.baton.assign("held", &all)?;
    assert_eq!(api.counter("held", "counts", &present).await?, Some(want));
    host.stop().await
}

/// An assignment followed while a drained loop is still finishing (a move abandoned right
/// after the owner's drain answer) starts the partition again once the old loop has ended,
/// instead of leaving it stopped for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assignment_followed_while_a_drained_loop_finishes_runs_the_partition_again()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = word_count_host(dir.path(), "drained", 2, 1).await?;
    let api = &host.api;
    let first = words(300, 20, 7);
    let recs = |keys: &[String]| -> Vec<(String, Option<String>)> {
        keys.iter()
            .map(|k| (k.clone(), Some("x".to_string())))
            .collect()
    };
    api.produce("drained-in", &recs(&first)).await?;
    api.wait_caught_up("drained", first.len() as u64, Duration::from_secs(60))
        .await?;

    let hold = host.baton.steps().hold(steps::STOPPING, Some("drained-0"));
    let h = host
        .baton
        .partition_handles()
        .into_iter()
        .find(|h| h.id == "drained-0")
        .expect("drained-0 runs");
    let (hold, drained) = tokio::task::spawn_blocking(move || {
        let drained = h.drain(Duration::from_secs(30));
        (hold, drained)
    })
    .await?;
    assert!(drained.is_some(), "the drain was answered");
    assert!(
        hold.wait_reached(Duration::from_secs(30)),
        "the drained loop never reached its last step"
    );
    // The loop is held before its end: the assignment is followed now.
    let all = single_host_assignments(&host.baton.pipeline("drained")?);
    let baton = host.baton.clone();
    let mut assigned = tokio::task::spawn_blocking(move || baton.assign("drained", &all));
    // It waits for the held loop to end, then starts a new one.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut assigned)
            .await
            .is_err(),
        "the assignment was done with while the drained loop still ran"
    );
    hold.release();
    assigned.await??;

    let second = words(300, 20, 8);
    api.produce("drained-in", &recs(&second)).await?;
    api.wait_caught_up(
        "drained",
        (first.len() + second.len()) as u64,
        Duration::from_secs(60),
    )
    .await?;
    let all_keys = [first, second].concat();
    let want = baton_tests::count(all_keys.iter().map(String::as_str));
    baton_tests::assert_counts(api, "drained", &want).await?;
    host.stop().await
}
