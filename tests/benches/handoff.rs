//! Handoff pauses of live moves: two `baton` processes on Kafka run word-count (exactly-once)
//! in 2 partitions under a steady input of about 5,000 records/s, and one partition moves back
//! and forth between them. Each move's pause is what the new owner records: from the old
//! owner's final commit to its own first guest call. The table gives p50/p99/max per state
//! size (the partition's keys), and where the time of a median move goes, step by step.
//!
//! Then, in the same run and under the same load, the partition of slots 0..2 is split in two
//! and its halves merged back, again and again (every other merge across the two hosts): the
//! splits' and merges' pauses, and how long each call took.
//!
//! `cargo bench -p baton-tests --bench handoff` (part of `bench/run`). BATON_BENCH_MOVES sets
//! the moves per size (default 50); BATON_BENCH_RESHAPES the splits and merges (default as
//! many); BATON_BENCH_KEYS the sizes (default `10000,1000000`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use baton_tests::{
    ChildHost, TestProducer, cluster_name, group_offsets, kafka_bootstrap, wait_for,
};
use serde_json::{Value, json};

const SLOTS: u32 = 4;

fn quantile(sorted: &[f64], q: f64) -> f64 {
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// What one size measured: each move's pause and steps, and the splits' and merges' pauses
/// with how long each call took (a merge across hosts includes its warm move).
struct Measured {
    moves: Vec<(f64, Vec<(String, f64)>)>,
    splits: Vec<(f64, f64)>,
    merges: Vec<(f64, f64, bool)>,
}

/// The partition of `api`'s table holding slots `[0, 2)`, with its owner.
async fn first_partition(api: &baton_tests::Api) -> anyhow::Result<(String, String)> {
    api.partitions()
        .await?
        .into_iter()
        .find(|p| p["slots"] == json!([0, 2]))
        .map(|p| {
            (
                p["id"].as_str().unwrap_or_default().to_string(),
                p["owner"].as_str().unwrap_or_default().to_string(),
            )
        })
        .context("the partition of slots 0..2")
}

/// Waits until `id` runs on `owner` as `api` shows it.
async fn running_on(api: &baton_tests::Api, id: &str, owner: &str) -> anyhow::Result<()> {
    wait_for(
        &format!("{id} running on {owner}"),
        Duration::from_secs(300),
        || async {
            Ok(api
                .partitions()
                .await?
                .iter()
                .any(|p| p["id"] == id && p["owner"] == owner && p["state"] == "running")
                .then_some(()))
        },
    )
    .await
}

/// The moves of `keys` keys (each move's pause and steps), then `reshapes` splits of the
/// partition of slots 0..2 and merges of its halves back, every other one across the hosts.
async fn moves_of(keys: u64, moves: usize, reshapes: usize) -> anyhow::Result<Measured> {
    let dirs: Vec<_> = (0..2)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let bootstrap = kafka_bootstrap();
    let cluster = cluster_name(dirs[0].path());
    let flags = |id: &'static str| {
        vec![
            "--kafka".to_string(),
            bootstrap.clone(),
            "--host-id".into(),
            id.into(),
            "--session-timeout".into(),
            "6s".into(),
        ]
    };
    let mut hosts = Vec::new();
    for (i, id) in ["a", "b"].into_iter().enumerate() {
        let f = flags(id);
        hosts.push(
            ChildHost::start_in(
                dirs[i].path(),
                &cluster,
                &f.iter().map(String::as_str).collect::<Vec<_>>(),
            )
            .await?,
        );
    }
    let api = hosts[0].api.clone();
    baton_tests::wait_alive(&api, 2).await?;
    let input = baton_tests::unique("handoff-in");
    api.upload_plugin("word-count", "word-count", "1").await?;
    api.create_pipeline(json!({
        "name": "wc", "module": "word-count", "version": "1", "inputs": [input],
        "stores": ["counts"], "slots": SLOTS, "partitions": 2, "guarantee": "exactly-once"
    }))
    .await?;
    wait_for(
        "both partitions running",
        Duration::from_secs(60),
        || async {
            let ps = api.partitions().await?;
            Ok((ps.len() == 2 && ps.iter().all(|p| p["state"] == "running")).then_some(()))
        },
    )
    .await?;

    // The state: `keys` distinct keys over both partitions (half in the one that moves).
    let p = TestProducer::new()?;
    let all = keys * 2;
    let mut sent = 0u64;
    while sent < all {
        let n = (all - sent).min(20_000);
        let recs: Vec<(String, String)> = (sent..sent + n)
            .map(|i| (format!("key{i:09}"), "x".into()))
            .collect();
        p.send(&input, SLOTS, &recs).await?;
        sent += n;
    }
    let group = format!("{cluster}.wc");
    wait_for("the state loaded", Duration::from_secs(600), || async {
        let done: u64 = group_offsets(&group, &input, SLOTS)?.iter().sum();
        Ok((done >= all).then_some(()))
    })
    .await?;

    // A steady input, about 5,000 records/s, over keys of the state.
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (stop, input) = (stop.clone(), input.clone());
        tokio::spawn(async move {
            let p = TestProducer::new()?;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let recs: Vec<(String, String)> = (0..250)
                    .map(|j| (format!("key{:09}", (i * 250 + j) * 7919 % all), "x".into()))
                    .collect();
                p.send(&input, SLOTS, &recs).await?;
                i += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(())
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut out = Vec::new();
    for m in 0..moves {
        let row: Value = api
            .partitions()
            .await?
            .into_iter()
            .find(|p| p["id"] == "wc-0")
            .context("wc-0")?;
        let to = if row["owner"] == "a" { "b" } else { "a" };
        let started = Instant::now();
        let r = api
            .post_json("/api/v1/partitions/wc-0/move", &json!({ "to": to }))
            .await?;
        anyhow::ensure!(r.status == 202, "move {m}: {r:?}");
        let id = r.body["move"].as_str().unwrap_or_default().to_string();
        let done = wait_for(
            &format!("move {m} done"),
            Duration::from_secs(300),
            || async {
                let row = api
                    .partitions()
                    .await?
                    .into_iter()
                    .find(|p| p["id"] == "wc-0")
                    .context("wc-0")?;
                let mv = row["moves"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|x| x["id"] == id.as_str())
                    .cloned();
                match mv {
                    Some(x) if x["phase"] == "abandoned" => {
                        anyhow::bail!("move {m} abandoned: {x}")
                    }
                    Some(x) if x["phase"] == "done" && row["owner"] == to => Ok(Some(x)),
                    _ => Ok(None),
                }
            },
        )
        .await?;
        let pause = done["pause_ms"].as_f64().context("a pause")?;
        let steps = done["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                (
                    s["step"].as_str().unwrap_or_default().to_string(),
                    s["ms"].as_f64().unwrap_or(0.0),
                )
            })
            .collect();
        eprintln!(
            "{keys} keys, move {m}: pause {pause:.1} ms ({:.1} s in all), steps {}",
            started.elapsed().as_secs_f64(),
            done["steps"]
        );
        out.push((pause, steps));
    }

    // Splits and merges under the same load.
    let (mut splits, mut merges) = (Vec::new(), Vec::new());
    for r in 0..reshapes {
        let (id, owner) = first_partition(&api).await?;
        let started = Instant::now();
        let s = api
            .post_json(&format!("/api/v1/partitions/{id}/split"), &json!({"at": 1}))
            .await?;
        anyhow::ensure!(s.status == 200, "split {r}: {s:?}");
        let took = started.elapsed().as_secs_f64();
        let pause = s.body["pause_ms"].as_f64().context("a split's pause")?;
        eprintln!(
            "{keys} keys, split {r}: pause {pause:.1} ms ({took:.2} s in all), steps {}",
            s.body["steps"]
        );
        splits.push((pause, took));
        let halves: Vec<String> = s.body["halves"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| h.as_str().map(str::to_string))
            .collect();
        anyhow::ensure!(halves.len() == 2, "{s:?}");
        for h in &halves {
            running_on(&api, h, &owner).await?;
        }
        // Every other merge joins halves on two hosts: the right one moves first.
        let across = r % 2 == 1;
        if across {
            let to = if owner == "a" { "b" } else { "a" };
            let m = api
                .post_json(
                    &format!("/api/v1/partitions/{}/move", halves[1]),
                    &json!({ "to": to }),
                )
                .await?;
            anyhow::ensure!(m.status == 202, "{m:?}");
            running_on(&api, &halves[1], to).await?;
            // Asked of the right half's host: the left half is moved to it, warm.
        }
        // A move runs on its target before its end is in the control log: until then a merge
        // is refused (409, "is moving"), and asked again.
        let deadline = Instant::now() + Duration::from_secs(30);
        let (started, m) = loop {
            let started = Instant::now();
            let m = api
                .post_json(
                    "/api/v1/partitions/merge",
                    &json!({"left": halves[if across { 1 } else { 0 }], "right": halves[if across { 0 } else { 1 }]}),
                )
                .await?;
            let moving = m.status == 409
                && m.body["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("is moving"));
            if !moving || Instant::now() > deadline {
                break (started, m);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        anyhow::ensure!(m.status == 200, "merge {r}: {m:?}");
        let took = started.elapsed().as_secs_f64();
        let pause = m.body["pause_ms"].as_f64().context("a merge's pause")?;
        eprintln!(
            "{keys} keys, merge {r} ({}): pause {pause:.1} ms ({took:.2} s in all), steps {}",
            if across { "across hosts" } else { "one host" },
            m.body["steps"]
        );
        merges.push((pause, took, across));
        let merged = m.body["merged"].as_str().unwrap_or_default().to_string();
        wait_for(
            &format!("{merged} running"),
            Duration::from_secs(120),
            || async {
                Ok(api
                    .partitions()
                    .await?
                    .iter()
                    .any(|p| p["id"] == merged.as_str() && p["state"] == "running")
                    .then_some(()))
            },
        )
        .await?;
    }
    stop.store(true, Ordering::Relaxed);
    producer.await??;
    for h in hosts {
        h.terminate()?;
    }
    Ok(Measured {
        moves: out,
        splits,
        merges,
    })
}

fn main() -> anyhow::Result<()> {
    let moves: usize = std::env::var("BATON_BENCH_MOVES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let sizes: Vec<u64> = std::env::var("BATON_BENCH_KEYS")
        .unwrap_or_else(|_| "10000,1000000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let reshapes: usize = std::env::var("BATON_BENCH_RESHAPES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(moves);
    let mut rows = Vec::new();
    let mut reshaped = Vec::new();
    for keys in sizes {
        let m = rt.block_on(moves_of(keys, moves, reshapes))?;
        rows.push((keys, m.moves));
        reshaped.push((keys, m.splits, m.merges));
    }
    println!(
        "handoff pauses of live moves (2 hosts, word-count exactly-once, ~5,000 records/s, \
         {moves} moves per size)\n"
    );
    println!("| keys in the partition | moves | pause p50 ms | p99 ms | max ms |");
    println!("|---:|---:|---:|---:|---:|");
    for (keys, got) in &rows {
        let mut p: Vec<f64> = got.iter().map(|g| g.0).collect();
        p.sort_by(f64::total_cmp);
        println!(
            "| {keys} | {} | {:.1} | {:.1} | {:.1} |",
            p.len(),
            quantile(&p, 0.5),
            quantile(&p, 0.99),
            p[p.len() - 1]
        );
    }
    println!("\nwhere the pause goes (ms per step, median over the moves)\n");
    let names: Vec<String> = rows
        .first()
        .and_then(|(_, g)| g.first())
        .map(|(_, s)| s.iter().map(|(n, _)| n.clone()).collect())
        .unwrap_or_default();
    print!("| keys |");
    for n in &names {
        print!(" {n} |");
    }
    println!();
    print!("|---:|");
    for _ in &names {
        print!("---:|");
    }
    println!();
    for (keys, got) in &rows {
        let mut by: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for (_, steps) in got {
            for (n, ms) in steps {
                by.entry(n).or_default().push(*ms);
            }
        }
        print!("| {keys} |");
        for n in &names {
            let mut v = by.get(n.as_str()).cloned().unwrap_or_default();
            v.sort_by(f64::total_cmp);
            if v.is_empty() {
                print!(" - |");
            } else {
                print!(" {:.1} |", quantile(&v, 0.5));
            }
        }
        println!();
    }
    println!(
        "\nsplit and merge pauses in the same runs (the partition of slots 0..2 split at slot 1, \
         then its halves merged back; every other merge across the two hosts, its right half \
         moved first)\n"
    );
    println!(
        "| keys in the partition | splits | split p50 ms | p99 ms | max ms | split call p50 s | max s | merges | merge p50 ms | p99 ms | max ms | merge call, one host, p50 s | merge call, across hosts (with its warm move), p50 s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let sorted = |v: Vec<f64>| {
        let mut v = v;
        v.sort_by(f64::total_cmp);
        v
    };
    let q = |v: &[f64], at: f64| {
        if v.is_empty() {
            "-".to_string()
        } else {
            format!("{:.1}", quantile(v, at))
        }
    };
    let q2 = |v: &[f64], at: f64| {
        if v.is_empty() {
            "-".to_string()
        } else {
            format!("{:.2}", quantile(v, at))
        }
    };
    for (keys, splits, merges) in &reshaped {
        let sp = sorted(splits.iter().map(|s| s.0).collect());
        let st = sorted(splits.iter().map(|s| s.1).collect());
        let mp = sorted(merges.iter().map(|m| m.0).collect());
        let one = sorted(merges.iter().filter(|m| !m.2).map(|m| m.1).collect());
        let across = sorted(merges.iter().filter(|m| m.2).map(|m| m.1).collect());
        println!(
            "| {keys} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            sp.len(),
            q(&sp, 0.5),
            q(&sp, 0.99),
            q(&sp, 1.0),
            q2(&st, 0.5),
            q2(&st, 1.0),
            mp.len(),
            q(&mp, 0.5),
            q(&mp, 0.99),
            q(&mp, 1.0),
            q2(&one, 0.5),
            q2(&across, 0.5),
        );
    }
    Ok(())
}
