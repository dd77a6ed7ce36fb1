//! The dashboard's event stream under load: word-count on the embedded log, 4 partitions over
//! 8 slots, fed as fast as the host takes it, while 0, 1 and 10 clients follow
//! `GET /api/v1/stream`. Per round: the records/s processed, the host's CPU, and per client the
//! messages a second and their size. Prints a table.
//!
//! `cargo bench -p baton-tests --bench stream` (BATON_STREAM_SECS: seconds per round, default 10)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use baton::control::PipelineSpec;
use baton::{Baton, HostConfig};

/// CPU seconds this process used so far (user and system).
fn cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

/// Follows the stream for `secs`: (messages, bytes).
async fn follow(base: String, secs: f64) -> (usize, usize) {
    let Ok(mut resp) = reqwest::get(format!("{base}/api/v1/stream")).await else {
        return (0, 0);
    };
    let end = tokio::time::Instant::now() + Duration::from_secs_f64(secs);
    let (mut messages, mut bytes) = (0, 0);
    while let Ok(Ok(Some(chunk))) = tokio::time::timeout_at(end, resp.chunk()).await {
        bytes += chunk.len();
        messages += chunk
            .windows(b"event: snapshot".len())
            .filter(|w| *w == b"event: snapshot")
            .count();
    }
    (messages, bytes)
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let secs: f64 = std::env::var("BATON_STREAM_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10.0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let baton = Baton::open(HostConfig::new(dir.path())).unwrap();
    let base = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        baton.set_address(&format!("http://{addr}"));
        let router = baton::http::router(baton.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        format!("http://{addr}")
    });
    baton
        .upload_module("word-count", "1", &baton_tests::plugin_bytes("word-count"))
        .unwrap();
    baton
        .transport()
        .ensure_topic("words", 8, baton::transport::TopicKind::Data)
        .unwrap();
    let spec: PipelineSpec = serde_json::from_value(serde_json::json!({
        "name": "wc", "module": "word-count", "version": "1", "inputs": ["words"],
        "stores": ["counts"], "slots": 8, "partitions": 4
    }))
    .unwrap();
    baton.create_pipeline(spec).unwrap();

    // Records flow the whole time, kept about a second ahead of the partitions.
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = {
        let (baton, stop) = (baton.clone(), stop.clone());
        std::thread::spawn(move || {
            let keys = baton_tests::words(50_000, 100_000, 1);
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let done: u64 = baton.partitions().iter().map(|p| p.records).sum();
                if sent > done + 500_000 {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                baton
                    .produce("words", baton_tests::keyed_records(&keys))
                    .unwrap();
                sent += keys.len() as u64;
            }
        })
    };
    let processed = || -> u64 { baton.partitions().iter().map(|p| p.records).sum() };
    std::thread::sleep(Duration::from_secs(3));

    println!(
        "\nthe dashboard's event stream while word-count runs on the embedded log (4 partitions), {secs} s a round\n"
    );
    println!(
        "| clients | records/s processed | host CPU, cores | messages/s per client (min–max) | KiB per message |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for clients in [0usize, 1, 10, 0, 10] {
        let (n0, c0, t0) = (processed(), cpu_s(), Instant::now());
        let got: Vec<(usize, usize)> = rt.block_on(async {
            let tasks: Vec<_> = (0..clients)
                .map(|_| tokio::spawn(follow(base.clone(), secs)))
                .collect();
            if tasks.is_empty() {
                tokio::time::sleep(Duration::from_secs_f64(secs)).await;
            }
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap_or((0, 0)));
            }
            out
        });
        let dt = t0.elapsed().as_secs_f64();
        let rate = (processed() - n0) as f64 / dt;
        let cores = (cpu_s() - c0) / dt;
        let per: Vec<f64> = got.iter().map(|(m, _)| *m as f64 / dt).collect();
        let (min, max) = per
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
        let messages: usize = got.iter().map(|(m, _)| m).sum();
        let bytes: usize = got.iter().map(|(_, b)| b).sum();
        let (spread, size) = if clients == 0 {
            ("–".to_string(), "–".to_string())
        } else {
            (
                format!("{min:.2}–{max:.2}"),
                format!("{:.1}", bytes as f64 / messages.max(1) as f64 / 1024.0),
            )
        };
        println!("| {clients} | {rate:.0} | {cores:.2} | {spread} | {size} |");
        // The feed stops 10 s after its last client: the next round starts from the same place.
        std::thread::sleep(Duration::from_secs(1));
    }
    stop.store(true, Ordering::Relaxed);
    feeder.join().unwrap();
    baton.shutdown();
}
