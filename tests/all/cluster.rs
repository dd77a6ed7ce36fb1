//! Membership: the hosts of a cluster on Kafka see each other through the consumer group
//! `<cluster>.hosts` and the load reports of `<cluster>.load`; they agree on one controller, and
//! a host that leaves (cleanly, or by `kill -9` and the session timeout) stops counting as alive.
//! On the embedded log a host is its own cluster.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use baton_tests::partition_table as table;
use baton_tests::{
    InProcess, cluster_name, count_at, kafka_bootstrap, kafka_lock, member, wait_for,
};
use serde_json::Value;

/// id → (address, alive, controller), as one host answers `GET /api/v1/hosts`.
type View = BTreeMap<String, (String, bool, bool)>;

async fn view(api: &baton_tests::Api) -> anyhow::Result<View> {
    let r = api.get("/api/v1/hosts").await?;
    anyhow::ensure!(r.status == 200, "{r:?}");
    Ok(r.body
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| {
            (
                h["id"].as_str().unwrap_or_default().to_string(),
                (
                    h["address"].as_str().unwrap_or_default().to_string(),
                    h["alive"].as_bool().unwrap_or(false),
                    h["controller"].as_bool().unwrap_or(false),
                ),
            )
        })
        .collect())
}

/// Waits until every API in `apis` gives the same view, in which exactly the hosts `alive`
/// are alive (with their addresses) and one of them is the controller; returns it.
async fn agreed(
    apis: &[&baton_tests::Api],
    alive: &BTreeMap<&str, String>,
    timeout: Duration,
) -> anyhow::Result<String> {
    wait_for("the hosts to agree", timeout, || async {
        let mut views = Vec::new();
        for api in apis {
            views.push(view(api).await?);
        }
        let first = &views[0];
        let live: BTreeMap<&str, String> = first
            .iter()
            .filter(|(_, v)| v.1)
            .map(|(id, v)| (id.as_str(), v.0.clone()))
            .collect();
        let controllers: Vec<&String> = first
            .iter()
            .filter(|(_, v)| v.1 && v.2)
            .map(|(id, _)| id)
            .collect();
        let same = views.iter().all(|v| v == first);
        Ok((same && &live == alive && controllers.len() == 1).then(|| controllers[0].clone()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_agree_on_members_and_one_controller_as_hosts_come_and_go() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let dirs: Vec<_> = (0..4)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    // The child process sets its cluster from its data dir; the others join that cluster.
    let cluster = cluster_name(dirs[3].path());
    let mut hosts = Vec::new();
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        hosts.push(member(dirs[i].path(), &cluster, id).await?);
    }
    let child = baton_tests::child_member(dirs[3].path(), &cluster, "d").await?;
    let mut alive: BTreeMap<&str, String> = ["a", "b", "c"]
        .iter()
        .zip(&hosts)
        .map(|(id, h)| (*id, h.api.base().to_string()))
        .collect();
    alive.insert("d", child.api.base().to_string());
    let apis = |hosts: &[InProcess]| -> Vec<baton_tests::Api> {
        hosts.iter().map(|h| h.api.clone()).collect()
    };
    let all = [apis(&hosts), vec![child.api.clone()]].concat();
    let refs: Vec<&baton_tests::Api> = all.iter().collect();
    let controller = agreed(&refs, &alive, Duration::from_secs(60)).await?;

    // Each reports its load and heartbeat, its version and its control protocol (the process
    // `d` too).
    let r = hosts[0].api.get("/api/v1/hosts").await?;
    for h in r.body.as_array().unwrap() {
        assert!(h["load"]["partitions"].is_u64(), "{h}");
        assert_eq!(h["version"], baton::VERSION, "{h}");
        assert_eq!(h["protocol"], baton::cluster::CONTROL_PROTOCOL, "{h}");
        assert!(
            h["last_heartbeat_ms"].as_i64().unwrap() > 1_700_000_000_000,
            "{h}"
        );
    }

    // kill -9: the others count it gone once its session times out.
    let killed = Instant::now();
    child.kill9()?;
    alive.remove("d");
    let refs: Vec<&baton_tests::Api> = all[..3].iter().collect();
    let after_kill = agreed(&refs, &alive, Duration::from_secs(60)).await?;
    assert!(
        killed.elapsed() < Duration::from_secs(40),
        "a dead host took {:?} to be noticed",
        killed.elapsed()
    );
    let gone = view(&all[0]).await?;
    assert_eq!(
        gone.get("d").map(|v| v.1),
        Some(false),
        "d is listed, not alive: {gone:?}"
    );

    // The controller stops cleanly: another takes over, agreed by the rest.
    let at = ["a", "b", "c"]
        .iter()
        .position(|id| *id == after_kill)
        .unwrap_or_else(|| panic!("controller {after_kill} (before: {controller}) is a, b or c"));
    let leaving = hosts.remove(at);
    leaving.stop().await?;
    alive.remove(after_kill.as_str());
    let rest = apis(&hosts);
    let refs: Vec<&baton_tests::Api> = rest.iter().collect();
    let next = agreed(&refs, &alive, Duration::from_secs(30)).await?;
    assert_ne!(next, after_kill, "a host that left is not the controller");
    for h in hosts {
        h.stop().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_embedded_log_a_host_is_its_own_cluster() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = InProcess::start(dir.path()).await?;
    let hosts = host.api.get("/api/v1/hosts").await?.body;
    let list = hosts.as_array().cloned().unwrap_or_default();
    assert_eq!(list.len(), 1, "{hosts}");
    let me: &Value = &list[0];
    // The id is made up once and kept in the data dir.
    let id = std::fs::read_to_string(dir.path().join("host-id"))?;
    assert_eq!(me["id"], id.trim());
    assert_eq!(me["address"], host.api.base());
    assert_eq!(
        (me["alive"].as_bool(), me["controller"].as_bool()),
        (Some(true), Some(true))
    );
    host.api
        .upload_plugin("word-count", "word-count", "1")
        .await?;
    host.api
        .create_pipeline(serde_json::json!({
            "name": "wc", "module": "word-count", "version": "1", "inputs": ["in"],
            "stores": ["counts"], "slots": 4, "partitions": 2
        }))
        .await?;
    let parts = host.api.partitions().await?;
    assert_eq!(parts.len(), 2, "{parts:?}");
    assert!(parts.iter().all(|p| p["owner"] == id.trim()), "{parts:?}");
    host.stop().await?;
    // Restarted on its data, it keeps its id.
    let again = InProcess::start(dir.path()).await?;
    let hosts = again.api.get("/api/v1/hosts").await?.body;
    assert_eq!(hosts[0]["id"], id.trim());
    again.stop().await
}

/// Partitions of pipeline `p` running on host `id`, by id, as `api` shows them.
async fn running(api: &baton_tests::Api, p: &str, id: &str) -> anyhow::Result<Vec<String>> {
    Ok(api
        .partitions()
        .await?
        .into_iter()
        .filter(|x| x["pipeline"] == p && x["state"] == "running" && x["owner"] == id)
        .map(|x| x["id"].as_str().unwrap_or_default().to_string())
        .collect())
}

/// Every (key, count) of `wc`'s store, scanned page by page from one host.
async fn scan_all(api: &baton_tests::Api) -> anyhow::Result<BTreeMap<String, i64>> {
    let mut out = BTreeMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/v1/pipelines/wc/stores/counts/keys?limit=77&cursor={c}"),
            None => "/api/v1/pipelines/wc/stores/counts/keys?limit=77".to_string(),
        };
        let r = api.get(&path).await?;
        anyhow::ensure!(r.status == 200, "scan: {r:?}");
        for item in r.body["items"].as_array().into_iter().flatten() {
            let key = item["key"].as_str().unwrap_or_default().to_string();
            anyhow::ensure!(
                out.insert(key.clone(), item["value_i64"].as_i64().unwrap_or(-1))
                    .is_none(),
                "{key} twice in a scan"
            );
        }
        match r.body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return Ok(out),
        }
    }
}

/// Waits until every host shows the same partition table, with every partition running on
/// its owner; returns it.
async fn same_table(
    apis: &[baton_tests::Api],
    timeout: Duration,
) -> anyhow::Result<Vec<(String, String, u64)>> {
    wait_for(
        "every host to show the same partition table",
        timeout,
        || async {
            let first = table(&apis[0]).await?;
            for api in apis {
                if table(api).await? != first {
                    return Ok(None);
                }
            }
            let states: Vec<Value> = apis[0].partitions().await?;
            let all_running = states.iter().all(|p| p["state"] == "running");
            Ok((all_running && !first.is_empty()).then_some(first))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_spread_over_hosts_and_fail_over_with_exact_counts() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let dirs: Vec<_> = (0..3)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    // a and b in this process; c a `baton` process, whose cluster is named by its data dir.
    let cluster = cluster_name(dirs[2].path());
    let mut hosts = Vec::new();
    for (i, id) in ["a", "b"].iter().enumerate() {
        hosts.push(member(dirs[i].path(), &cluster, id).await?);
    }
    let child = baton_tests::child_member(dirs[2].path(), &cluster, "c").await?;
    let apis: Vec<baton_tests::Api> = hosts
        .iter()
        .map(|h| h.api.clone())
        .chain([child.api.clone()])
        .collect();
    let everyone: BTreeMap<&str, String> = ["a", "b", "c"]
        .iter()
        .zip(&apis)
        .map(|(id, a)| (*id, a.base().to_string()))
        .collect();
    let refs: Vec<&baton_tests::Api> = apis.iter().collect();
    agreed(&refs, &everyone, Duration::from_secs(60)).await?;

    // Created on a: every host learns of the pipeline, and each runs one of its partitions.
    let input = baton_tests::unique("cl-in");
    apis[0]
        .upload_plugin("word-count", "word-count", "1")
        .await?;
    apis[0]
        .create_pipeline(serde_json::json!({
            "name": "wc", "module": "word-count", "version": "1", "inputs": [input],
            "stores": ["counts"], "slots": 6, "partitions": 3
        }))
        .await?;
    wait_for(
        "one partition running on each host",
        Duration::from_secs(60),
        || async {
            let mut all = Vec::new();
            for (api, id) in apis.iter().zip(["a", "b", "c"]) {
                let mine = running(api, "wc", id).await?;
                if mine.len() != 1 {
                    return Ok(None);
                }
                all.extend(mine);
            }
            all.sort();
            Ok((all == ["wc-0", "wc-1", "wc-2"]).then_some(()))
        },
    )
    .await?;
    for api in &apis {
        let r = api.get("/api/v1/pipelines/wc").await?;
        assert_eq!(r.status, 200, "every host knows the pipeline: {r:?}");
    }
    let shown = same_table(&apis, Duration::from_secs(30)).await?;
    let mut owners: Vec<&str> = shown.iter().map(|(_, o, _)| o.as_str()).collect();
    owners.sort();
    assert_eq!(owners, ["a", "b", "c"], "one partition per host: {shown:?}");
    assert!(shown.iter().all(|(_, _, e)| *e == 1), "{shown:?}");
    let owned_by = |shown: &[(String, String, u64)], host: &str| -> Vec<String> {
        shown
            .iter()
            .filter(|(_, o, _)| o == host)
            .map(|(id, _, _)| id.clone())
            .collect()
    };

    let producer = baton_tests::TestProducer::new()?;
    let group = format!("{cluster}.wc");
    let committed = |n: u64| {
        let (input, group) = (input.clone(), group.clone());
        async move {
            let done: u64 = baton_tests::group_offsets(&group, &input, 6)?.iter().sum();
            Ok((done >= n).then_some(()))
        }
    };
    let mut sent = Vec::new();
    let send = |keys: &[String]| {
        let recs: Vec<(String, String)> = keys.iter().map(|k| (k.clone(), "x".into())).collect();
        let (producer, input) = (&producer, input.clone());
        async move { producer.send(&input, 6, &recs).await }
    };
    let keys = baton_tests::words(6_000, 200, 21);
    send(&keys).await?;
    sent.extend(keys);
    wait_for(
        "the first records committed",
        Duration::from_secs(60),
        || committed(6_000),
    )
    .await?;

    // kill -9 of c, records still coming: once its session times out, its partition runs on a
    // or b (restored from its changelog, the dead owner's open transaction fenced), epoch 2.
    let c_had = owned_by(&shown, "c");
    child.kill9()?;
    let keys = baton_tests::words(6_000, 200, 22);
    send(&keys).await?;
    sent.extend(keys);
    let rest = apis[..2].to_vec();
    let shown = wait_for("c's partition to move", Duration::from_secs(60), || async {
        let t = same_table(&rest, Duration::from_secs(30)).await?;
        Ok(c_had
            .iter()
            .all(|id| t.iter().any(|(i, o, e)| i == id && o != "c" && *e == 2))
            .then_some(t))
    })
    .await?;
    wait_for(
        "records after the kill committed",
        Duration::from_secs(90),
        || committed(12_000),
    )
    .await?;
    // b answers every key: from the slots it owns, and by asking a for the others.
    let so_far = baton_tests::count(sent.iter().map(String::as_str));
    for (k, n) in &so_far {
        assert_eq!(count_at(&apis[1], k).await?, Some(*n), "count of {k} at b");
    }
    // And scans the whole store, pages crossing from its slots to a's.
    assert_eq!(scan_all(&apis[1]).await?, so_far, "a scan at b");

    // b stops cleanly: its partition moves too, at the next epoch.
    let b_had = owned_by(&shown, "b");
    let b = hosts.remove(1);
    b.stop().await?;
    let keys = baton_tests::words(6_000, 200, 23);
    send(&keys).await?;
    sent.extend(keys);
    let a = [apis[0].clone()];
    let shown = wait_for("every partition on a", Duration::from_secs(60), || async {
        let t = same_table(&a, Duration::from_secs(30)).await?;
        Ok(t.iter().all(|(_, o, _)| o == "a").then_some(t))
    })
    .await?;
    for (id, _, epoch) in &shown {
        if c_had.contains(id) || b_had.contains(id) {
            assert!(*epoch >= 2, "{id} moved: {shown:?}");
        } else {
            assert_eq!(*epoch, 1, "{id} stayed: {shown:?}");
        }
    }
    wait_for("every record committed", Duration::from_secs(90), || {
        committed(18_000)
    })
    .await?;

    // Every count is exact across a kill -9 and a clean stop.
    let want = baton_tests::count(sent.iter().map(String::as_str));
    for (k, n) in &want {
        assert_eq!(count_at(&a[0], k).await?, Some(*n), "count of {k}");
    }
    for h in hosts {
        h.stop().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_is_fenced_and_rejoins_without_a_fencing_loop() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let dirs: Vec<_> = (0..2)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let cluster = cluster_name(dirs[1].path());
    let a = member(dirs[0].path(), &cluster, "a").await?;
    let c = baton_tests::child_member(dirs[1].path(), &cluster, "c").await?;
    let both = [a.api.clone(), c.api.clone()];
    let everyone: BTreeMap<&str, String> = [
        ("a", a.api.base().to_string()),
        ("c", c.api.base().to_string()),
    ]
    .into_iter()
    .collect();
    agreed(
        &both.iter().collect::<Vec<_>>(),
        &everyone,
        Duration::from_secs(60),
    )
    .await?;
    let input = baton_tests::unique("zombie-in");
    a.api.upload_plugin("word-count", "word-count", "1").await?;
    a.api
        .create_pipeline(serde_json::json!({
            "name": "wc", "module": "word-count", "version": "1", "inputs": [input],
            "stores": ["counts"], "slots": 4, "partitions": 2
        }))
        .await?;
    let shown = same_table(&both, Duration::from_secs(60)).await?;
    let seen = baton_tests::Owners::default();
    seen.record(std::slice::from_ref(&shown));
    let c_had: Vec<String> = shown
        .iter()
        .filter(|(_, o, _)| o == "c")
        .map(|(id, _, _)| id.clone())
        .collect();
    assert_eq!(c_had.len(), 1, "{shown:?}");

    let producer = baton_tests::TestProducer::new()?;
    let group = format!("{cluster}.wc");
    let committed = |n: u64| {
        let (input, group) = (input.clone(), group.clone());
        async move {
            let done: u64 = baton_tests::group_offsets(&group, &input, 4)?.iter().sum();
            Ok((done >= n).then_some(()))
        }
    };
    let mut sent = Vec::new();
    for (round, seed) in [31u64, 32, 33].into_iter().enumerate() {
        let keys = baton_tests::words(4_000, 150, seed);
        let recs: Vec<(String, String)> = keys.iter().map(|k| (k.clone(), "x".into())).collect();
        producer.send(&input, 4, &recs).await?;
        sent.extend(keys);
        match round {
            0 => {
                wait_for(
                    "the first records committed",
                    Duration::from_secs(60),
                    || committed(4_000),
                )
                .await?;
                // c freezes with its partition's transaction possibly open: once its session
                // times out, a takes the partition at epoch 2 and fences c's producer.
                let pid = c.pid().to_string();
                std::process::Command::new("kill")
                    .args(["-STOP", &pid])
                    .status()?;
                let moved = wait_for("c's partition on a", Duration::from_secs(60), || async {
                    let t = table(&a.api).await?;
                    Ok(c_had
                        .iter()
                        .all(|id| t.iter().any(|(i, o, e)| i == id && o == "a" && *e == 2))
                        .then_some(t))
                })
                .await?;
                seen.record(&[moved]);
            }
            1 => {
                wait_for("records while c is frozen", Duration::from_secs(60), || {
                    committed(8_000)
                })
                .await?;
                // c wakes up: it learns it lost the partition and follows, without fencing a;
                // back in the cluster, it gets its fair share again by a warm move (epoch 3).
                let pid = c.pid().to_string();
                std::process::Command::new("kill")
                    .args(["-CONT", &pid])
                    .status()?;
                wait_for(
                    "c back with one partition, moved to it, agreeing",
                    Duration::from_secs(90),
                    || async {
                        let (ta, tc) = (table(&a.api).await?, table(&c.api).await?);
                        seen.record(&[ta.clone(), tc.clone()]);
                        let on_c = running(&c.api, "wc", "c").await?;
                        let hosts = view(&a.api).await?;
                        let c_alive = hosts.get("c").is_some_and(|v| v.1);
                        let moved_back = ta.iter().any(|(_, o, e)| o == "c" && *e == 3);
                        Ok((on_c.len() == 1 && moved_back && c_alive && ta == tc).then_some(()))
                    },
                )
                .await?;
            }
            _ => {}
        }
    }
    wait_for("every record committed", Duration::from_secs(90), || {
        committed(12_000)
    })
    .await?;
    // No fencing loop: the epochs went no further than the takeover and the move back.
    let t = table(&a.api).await?;
    seen.record(std::slice::from_ref(&t));
    assert!(t.iter().all(|(_, _, e)| *e <= 3), "{t:?}");
    let mut owners: Vec<&str> = t.iter().map(|(_, o, _)| o.as_str()).collect();
    owners.sort();
    assert_eq!(owners, ["a", "c"], "{t:?}");
    let want = baton_tests::count(sent.iter().map(String::as_str));
    for (k, n) in &want {
        assert_eq!(
            count_at(&c.api, k).await?,
            Some(*n),
            "count of {k}, asked of c"
        );
    }
    a.stop().await?;
    Ok(())
}

/// An in-process host `id` of `cluster` with a token, that snapshots its catalog every 10
/// control-log records when it is the controller.
async fn token_member(dir: &std::path::Path, cluster: &str, id: &str) -> anyhow::Result<InProcess> {
    let (cluster, id) = (cluster.to_string(), id.to_string());
    InProcess::start_configured(dir, Some(&kafka_bootstrap()), move |c| {
        c.cluster = cluster;
        c.host_id = Some(id);
        c.session_timeout = Duration::from_secs(6);
        c.token = Some("s3cret".into());
        c.control_snapshot_every = 10;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_change_the_catalog_run_on_the_controller_and_replay_starts_at_a_snapshot()
-> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let dirs: Vec<_> = (0..3)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let cluster = baton_tests::unique("fwd");
    let ids = ["a", "b", "c"];
    let mut hosts = Vec::new();
    for (dir, id) in dirs.iter().zip(ids) {
        hosts.push(token_member(dir.path(), &cluster, id).await?);
    }
    baton_tests::wait_alive(&hosts[0].api, 3).await?;
    let controller = wait_for("one controller", Duration::from_secs(30), || async {
        let v = view(&hosts[0].api).await?;
        let c: Vec<_> = v
            .iter()
            .filter(|(_, h)| h.2)
            .map(|(id, _)| id.clone())
            .collect();
        Ok((c.len() == 1).then(|| c[0].clone()))
    })
    .await?;
    let x = ids.iter().position(|id| *id != controller).unwrap();
    let y = ids
        .iter()
        .position(|id| *id != controller && *id != ids[x])
        .unwrap();
    let api = |i: usize| baton_tests::Api::with_token(hosts[i].api.base(), "s3cret");

    // The token is checked where the call arrives.
    let spec = serde_json::json!({
        "name": "wc", "module": "word-count", "version": "1",
        "inputs": [baton_tests::unique("fwd-in")], "stores": ["counts"],
        "slots": 4, "partitions": 2
    });
    let r = hosts[x].api.post_json("/api/v1/pipelines", &spec).await?;
    assert_eq!(r.status, 401, "{:?}", r.body);
    assert!(
        r.error().contains("needs `Authorization: Bearer"),
        "{}",
        r.error()
    );
    let r = baton_tests::Api::with_token(hosts[x].api.base(), "wrong")
        .post_json("/api/v1/pipelines", &spec)
        .await?;
    assert_eq!(r.status, 401, "{:?}", r.body);

    // With it, a call that changes the catalog runs on the controller, whichever host takes it.
    api(x)
        .upload_plugin("word-count", "word-count", "1")
        .await?;
    let r = api(x).post_json("/api/v1/pipelines", &spec).await?;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.handled_by.as_deref(), Some(controller.as_str()));
    let r = api(y).post_json("/api/v1/pipelines", &spec).await?;
    assert_eq!(r.status, 409, "a second pipeline of one name: {:?}", r.body);
    assert_eq!(r.handled_by.as_deref(), Some(controller.as_str()));
    for i in 0..12u64 {
        let r = api(if i % 2 == 0 { x } else { y })
            .send_with_token(
                reqwest::Method::PATCH,
                "/api/v1/pipelines/wc",
                Some(&serde_json::json!({ "commit_interval_ms": 20 + i })),
                None,
            )
            .await?;
        assert!(matches!(r.status, 200 | 202), "{:?}", r.body);
        assert_eq!(r.handled_by.as_deref(), Some(controller.as_str()));
    }
    let r = api(controller_index(&ids, &controller))
        .send_with_token(
            reqwest::Method::PATCH,
            "/api/v1/pipelines/wc",
            Some(&serde_json::json!({ "commit_interval_ms": 55 })),
            None,
        )
        .await?;
    assert_eq!(r.handled_by.as_deref(), Some(controller.as_str()));
    // Unknown pipeline: the controller's 404 comes back as it is.
    let r = api(y)
        .send_with_token(
            reqwest::Method::DELETE,
            "/api/v1/pipelines/nope",
            None,
            None,
        )
        .await?;
    assert_eq!(r.status, 404, "{:?}", r.body);
    assert!(r.error().contains("nope"), "{}", r.error());
    let expected_log = hosts[x].baton.control_position();

    // x starts again: its replay begins at the controller's newest snapshot, and its catalog
    // is the same as the others'.
    let stopped = hosts.remove(x);
    stopped.stop().await?;
    let again = token_member(dirs[x].path(), &cluster, ids[x]).await?;
    let r = again.api.get("/api/v1/host").await?;
    let replay = &r.body["control"]["replay"];
    let (from, to, replayed) = (
        replay["from"].as_u64().unwrap(),
        replay["to"].as_u64().unwrap(),
        replay["replayed"].as_u64().unwrap(),
    );
    assert!(
        to >= 16 && to >= expected_log,
        "the log holds every event: {replay}"
    );
    assert!(from > 0, "replay began at a snapshot: {replay}");
    // From the newest snapshot: fewer records than the snapshot interval (10), however long
    // the log is by then.
    assert!(
        replayed < 10,
        "replay did not start at the newest snapshot: {replay}"
    );
    let r = again.api.get("/api/v1/pipelines/wc").await?;
    assert_eq!(r.body["commit_interval_ms"], 55, "{}", r.body);
    hosts.insert(x, again);
    let tables = |hosts: &[InProcess]| {
        let apis: Vec<_> = hosts.iter().map(|h| h.api.clone()).collect();
        async move {
            let mut all = Vec::new();
            for a in &apis {
                all.push(table(a).await?);
            }
            anyhow::Ok(all)
        }
    };
    wait_for(
        "every host shows one partition table",
        Duration::from_secs(30),
        || async {
            let all = tables(&hosts).await?;
            Ok((all.iter().all(|t| *t == all[0] && t.len() == 2)).then_some(()))
        },
    )
    .await?;
    for h in hosts {
        h.stop().await?;
    }
    Ok(())
}

fn controller_index(ids: &[&str], controller: &str) -> usize {
    ids.iter().position(|id| *id == controller).unwrap()
}

/// Two hosts that both take a catalog change at once (two controllers for a moment, while the
/// controller changes) each check it against their own view, and both append: the order in the
/// control log settles it, the same way on both. Of two registrations of one module version with
/// other content, and of two creations of one pipeline name, the first in the log counts and the
/// other caller hears 409; both hosts end with the same catalog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_changing_the_catalog_at_once_agree_on_the_log_order() -> anyhow::Result<()> {
    let _k = kafka_lock().await;
    let dirs: Vec<_> = (0..2)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let cluster = cluster_name(dirs[0].path());
    let a = member(dirs[0].path(), &cluster, "a").await?;
    let b = member(dirs[1].path(), &cluster, "b").await?;
    baton_tests::wait_alive(&a.api, 2).await?;

    // One version, other content on each host; straight to each host, not through the API,
    // which forwards catalog changes to the one controller.
    let upload = |host: &InProcess, plugin: &'static str| {
        let baton = host.baton.clone();
        tokio::task::spawn_blocking(move || {
            baton.upload_module("m", "1", &baton_tests::plugin_bytes(plugin))
        })
    };
    let (ra, rb) = tokio::join!(upload(&a, "word-count"), upload(&b, "uppercase"));
    let (ra, rb) = (ra?, rb?);
    fn conflict<T>(r: &Result<T, baton::error::Error>) -> bool {
        matches!(r, Err(baton::error::Error::Conflict(_)))
    }
    assert!(
        ra.is_ok() != rb.is_ok() && (conflict(&ra) || conflict(&rb)),
        "one registration counts, the other is a conflict: a {ra:?}; b {rb:?}"
    );
    let winner = ra
        .as_ref()
        .or(rb.as_ref())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for host in [&a, &b] {
        let r = host.api.get("/api/v1/modules").await?;
        let shas: Vec<&str> = r
            .body
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["name"] == "m" && m["version"] == "1")
            .filter_map(|m| m["sha256"].as_str())
            .collect();
        assert_eq!(shas, [winner.sha256.as_str()], "{}", r.body);
    }

    // One pipeline name, other inputs on each host.
    let inputs = [
        baton_tests::unique("agree-a"),
        baton_tests::unique("agree-b"),
    ];
    let create = |host: &InProcess, input: &str| {
        let baton = host.baton.clone();
        let spec: baton::control::pipeline::PipelineSpec =
            serde_json::from_value(serde_json::json!({
                "name": "agree", "module": "m", "version": "1", "inputs": [input],
                "slots": 2, "partitions": 1
            }))
            .expect("a valid spec");
        tokio::task::spawn_blocking(move || baton.create_pipeline(spec))
    };
    let (ra, rb) = tokio::join!(create(&a, &inputs[0]), create(&b, &inputs[1]));
    let (ra, rb) = (ra?, rb?);
    assert!(
        ra.is_ok() != rb.is_ok() && (conflict(&ra) || conflict(&rb)),
        "one creation counts, the other is a conflict: a {ra:?}; b {rb:?}"
    );
    let input = if ra.is_ok() { &inputs[0] } else { &inputs[1] };
    for host in [&a, &b] {
        let r = host.api.get("/api/v1/pipelines/agree").await?;
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.body["inputs"], serde_json::json!([input]), "{}", r.body);
    }
    // And its one partition runs on one host, as both see it.
    wait_for(
        "one owner, seen by both",
        Duration::from_secs(60),
        || async {
            let (ta, tb) = (table(&a.api).await?, table(&b.api).await?);
            Ok((ta == tb && ta.len() == 1 && !ta[0].1.is_empty()).then_some(()))
        },
    )
    .await?;
    a.stop().await?;
    b.stop().await?;
    Ok(())
}
