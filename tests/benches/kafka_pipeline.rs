//! baton on the real broker, side by side in one run:
//! - a bare rdkafka consumer reading the input topic (the ceiling on this machine);
//! - word-count (`groupByKey().count()`) as a Wasm component and as the same logic in native
//!   Rust, under exactly-once and at-least-once;
//! - the restore rate of word-count's changelog after its data dir is deleted;
//! - end-to-end latency of `uppercase` at a fixed rate, under both guarantees.
//!
//! Needs the broker of `scripts/kafka start`. `bench/run` runs it;
//! `BATON_BENCH_KAFKA_RECORDS` (default 1,000,000) sets the size of the throughput runs.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, bail};
use baton::http::model::PartitionState;
use baton::runtime::{HostCtx, Message, NativeModule, NativeProcessor, NativeStore};
use baton::{Baton, HostConfig};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message as _, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const SLOTS: u32 = 8;
/// One partition per core.
const PARTITIONS: u32 = 2;
const VOCABULARY: usize = 10_000;
const LATENCY_RATE: u64 = 10_000;
const LATENCY_SECS: u64 = 10;

/// word-count in native Rust: what the `word-count` plugin does, through the same host calls.
#[derive(Default)]
struct NativeWordCount {
    counts: Option<NativeStore>,
}

impl NativeProcessor for NativeWordCount {
    fn process(&mut self, ctx: &mut HostCtx, batch: &[Message]) -> Result<(), String> {
        if self.counts.is_none() {
            self.counts = Some(ctx.native_open("counts")?);
        }
        let counts = self.counts.as_ref().expect("opened above");
        // One `apply` of the batch's increments, as the SDK sends them.
        ctx.native_add_all(counts, batch.iter().filter_map(|m| m.key.as_deref()), 1)
    }
}

/// uppercase in native Rust (not used in the table; keeps the two plugins' natives together).
struct NativeUppercase;

impl NativeProcessor for NativeUppercase {
    fn process(&mut self, ctx: &mut HostCtx, batch: &[Message]) -> Result<(), String> {
        for m in batch {
            let v = m
                .value
                .as_ref()
                .map(|v| String::from_utf8_lossy(v).to_uppercase().into_bytes());
            ctx.native_send("out", m.key.as_deref(), v.as_deref(), &m.headers)?;
        }
        Ok(())
    }
}

/// User and system CPU seconds of this process so far, from `/proc/self/stat`.
fn own_cpu_secs() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| -> Result<f64> {
        Ok(fields
            .get(i)
            .context("short /proc/self/stat")?
            .parse::<f64>()?)
    };
    // After the command: state is field 0, utime 11, stime 12 (clock ticks of 1/100 s).
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

fn bootstrap() -> String {
    std::env::var("BATON_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

fn client(extra: &[(&str, &str)]) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap());
    c.set("socket.nagle.disable", "true");
    for (k, v) in extra {
        c.set(*k, *v);
    }
    c
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn open_host(dir: &Path, cluster: &str) -> Result<Arc<Baton>> {
    let mut cfg = HostConfig::new(dir);
    cfg.state_memory = 256 << 20;
    cfg.kafka = Some(baton::transport::kafka::KafkaConfig::new(bootstrap()));
    cfg.cluster = cluster.to_string();
    cfg.native_modules = vec![
        NativeModule {
            name: "word-count-native".into(),
            version: "1".into(),
            factory: Arc::new(|| Box::new(NativeWordCount::default())),
        },
        NativeModule {
            name: "uppercase-native".into(),
            version: "1".into(),
            factory: Arc::new(|| Box::new(NativeUppercase)),
        },
    ];
    Baton::open(cfg)
}

fn create(baton: &Baton, spec: serde_json::Value) -> Result<()> {
    let spec = serde_json::from_value(spec)?;
    baton
        .create_pipeline(spec)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// Records processed (committed) by `pipeline`, failing if a partition failed.
fn processed(baton: &Baton, pipeline: &str) -> Result<u64> {
    let mut done = 0;
    for p in baton.partitions().iter().filter(|p| p.pipeline == pipeline) {
        if p.state == PartitionState::Failed {
            bail!("partition {} failed: {:?}", p.id, p.error);
        }
        done += p.offsets.iter().map(|o| o.offset).sum::<u64>();
    }
    Ok(done)
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !f()? {
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// Produces `n` word records to a fresh topic, in slot murmur2(key) like the Java client.
fn produce_words(topic: &str, n: usize) -> Result<()> {
    let producer: BaseProducer = client(&[
        ("linger.ms", "20"),
        ("batch.size", "1000000"),
        ("compression.type", "lz4"),
        ("partitioner", "murmur2_random"),
        ("queue.buffering.max.messages", "1000000"),
    ])
    .create()?;
    for w in baton_tests::words(n, VOCABULARY, 7) {
        let mut rec = BaseRecord::<str, str>::to(topic).key(&w).payload("1");
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((_, back)) => {
                    rec = back;
                    producer.poll(Duration::from_millis(5));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(120))?;
    Ok(())
}

fn create_topic(baton: &Baton, topic: &str) -> Result<()> {
    baton
        .transport()
        .ensure_topic(topic, SLOTS, baton::transport::TopicKind::Data)?;
    Ok(())
}

/// Bare consumers reading `n` records of `topic` from the beginning, one per baton partition
/// (each assigned the same slots), in parallel: records/s.
fn bare_consumer(topic: &str, n: usize) -> Result<f64> {
    bare_consumers(topic, n, SLOTS, PARTITIONS)
}

/// `consumers` bare consumers reading `n` records of the first `slots` partitions of `topic`,
/// each an equal share, in parallel: records/s.
fn bare_consumers(topic: &str, n: usize, slots: u32, consumers: u32) -> Result<f64> {
    let started = Instant::now();
    let per = slots / consumers;
    let threads: Vec<_> = (0..consumers)
        .map(|i| {
            let topic = topic.to_string();
            std::thread::spawn(move || -> Result<(usize, Instant)> {
                // Tuned as baton's consumers are: the same fetch settings, committed reads.
                let mut settings = vec![
                    ("group.id", "baton.bench.bare"),
                    ("enable.auto.commit", "false"),
                    ("isolation.level", "read_committed"),
                ];
                settings.extend_from_slice(baton::transport::kafka::FETCH_SETTINGS);
                let consumer: BaseConsumer = client(&settings).create()?;
                let mut tpl = TopicPartitionList::new();
                let mut ends = HashMap::new();
                for p in i * per..(i + 1) * per {
                    tpl.add_partition_offset(&topic, p as i32, Offset::Beginning)?;
                    let end = consumer
                        .fetch_watermarks(&topic, p as i32, Duration::from_secs(10))?
                        .1;
                    if end > 0 {
                        ends.insert(p as i32, end);
                    }
                }
                consumer.assign(&tpl)?;
                let mut seen = 0usize;
                let mut bytes = 0usize;
                let mut last = Instant::now();
                // Done when every partition's last record is read; in a transactional topic
                // the end is a commit marker that no consumer sees, so also when nothing has
                // come for 500 ms (the time of the last record counts).
                while !ends.is_empty() && (seen == 0 || last.elapsed() < Duration::from_millis(500))
                {
                    if let Some(m) = consumer.poll(Duration::from_millis(100)) {
                        let m = m?;
                        // Touch the key like a processor would.
                        bytes += m.key().map(<[u8]>::len).unwrap_or(0);
                        seen += 1;
                        last = Instant::now();
                        if ends
                            .get(&m.partition())
                            .is_some_and(|e| m.offset() + 1 >= *e)
                        {
                            ends.remove(&m.partition());
                        }
                    }
                    if started.elapsed() > Duration::from_secs(600) {
                        bail!("bare consumer read only {seen} records in 600 s");
                    }
                }
                std::hint::black_box(bytes);
                Ok((seen, last))
            })
        })
        .collect();
    let mut total = 0;
    let mut finished = started;
    for t in threads {
        let (seen, last) = t
            .join()
            .map_err(|_| anyhow::anyhow!("consumer panicked"))??;
        total += seen;
        finished = finished.max(last);
    }
    if n > 0 && total != n {
        bail!("bare consumers read {total} records, expected {n}");
    }
    Ok(total as f64 / (finished - started).as_secs_f64())
}

/// The ceiling of a restore: `readers` of baton's own consumers (its client settings, committed
/// reads, batched fetches with records borrowed from librdkafka's buffers, as a restore reads)
/// over the first `slots` partitions of `topic`, from their start to their ends, touching each
/// record's key and doing nothing else; answers records/s.
fn bare_readers(topic: &str, slots: u32, readers: u32) -> Result<f64> {
    let transport = baton::transport::kafka::KafkaTransport::connect(
        baton::transport::kafka::KafkaConfig::new(bootstrap()),
    )?;
    let started = Instant::now();
    let per = slots / readers;
    let finished = std::thread::scope(|scope| -> Result<Vec<(u64, Instant)>> {
        let threads: Vec<_> = (0..readers)
            .map(|i| {
                let transport = &transport;
                scope.spawn(move || -> Result<(u64, Instant)> {
                    let reader = transport.input_consumer("baton.bench.bare")?;
                    let mut assign = Vec::new();
                    let mut ends = Vec::new();
                    for p in i * per..(i + 1) * per {
                        let (lo, hi) = reader.watermarks(topic, p)?;
                        assign.push((topic.to_string(), p, lo));
                        ends.push((p, hi));
                    }
                    reader.assign(&assign, assign.len())?;
                    let (mut seen, mut bytes, mut last) = (0u64, 0usize, Instant::now());
                    // Done when every partition's position passes its end (transaction markers
                    // take offsets too).
                    while ends
                        .iter()
                        .any(|&(p, hi)| reader.position(topic, p).unwrap_or(0) < hi)
                    {
                        let n = reader.fetch_raw(20_000, Duration::from_millis(20), &mut |r| {
                            bytes += r.key.map_or(0, <[u8]>::len);
                        });
                        if n > 0 {
                            seen += n as u64;
                            last = Instant::now();
                        }
                        if started.elapsed() > Duration::from_secs(600) {
                            bail!("bare reader read only {seen} records in 600 s");
                        }
                    }
                    std::hint::black_box(bytes);
                    Ok((seen, last))
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().map_err(|_| anyhow::anyhow!("reader panicked"))?)
            .collect()
    })?;
    let total: u64 = finished.iter().map(|f| f.0).sum();
    let last = finished.iter().map(|f| f.1).max().unwrap_or(started);
    Ok(total as f64 / (last - started).as_secs_f64())
}

struct Run {
    label: String,
    rate: f64,
    /// Time in guest calls per record, in ns.
    process_ns: f64,
}

/// Runs word-count (`module`) under `guarantee` over `topic` and returns records/s from
/// pipeline creation to the last committed batch.
fn word_count(
    baton: &Baton,
    name: &str,
    module: &str,
    guarantee: &str,
    topic: &str,
    n: u64,
) -> Result<(f64, f64)> {
    let started = Instant::now();
    create(
        baton,
        serde_json::json!({
            "name": name, "module": module, "version": "1", "inputs": [topic],
            "stores": ["counts"], "slots": SLOTS, "partitions": PARTITIONS,
            "guarantee": guarantee,
        }),
    )?;
    wait_until(
        &format!("{name} to process {n}"),
        Duration::from_secs(600),
        || Ok(processed(baton, name)? >= n),
    )?;
    let (mut f, mut p, mut c) = (0, 0, 0);
    for part in baton.partitions().iter().filter(|p| p.pipeline == name) {
        f += part.time_ms.fetch;
        p += part.time_ms.process;
        c += part.time_ms.commit;
    }
    eprintln!("  loop time (ms, all partitions): fetch {f}, process {p}, commit {c}");
    Ok((
        n as f64 / started.elapsed().as_secs_f64(),
        p as f64 * 1e6 / n as f64,
    ))
}

/// Uppercase at a fixed rate; returns (p50, p99, max) in ms of produce → read_committed.
/// `interval`: the pipeline's `commit_interval_ms` (its default when `None`).
fn latency(
    baton: &Baton,
    name: &str,
    module: &str,
    guarantee: &str,
    interval: Option<u64>,
) -> Result<(f64, f64, f64)> {
    let input = baton_tests::unique("bench-lat-in");
    let output = baton_tests::unique("bench-lat-out");
    create_topic(baton, &input)?;
    let mut config = serde_json::Map::new();
    config.insert("output".into(), output.clone().into());
    let mut spec = serde_json::json!({
        "name": name, "module": module, "version": "1", "inputs": [input],
        "outputs": [output], "slots": SLOTS, "partitions": PARTITIONS,
        "guarantee": guarantee, "config": config,
    });
    if let Some(ms) = interval {
        spec["commit_interval_ms"] = ms.into();
    }
    create(baton, spec)?;
    wait_until(&format!("{name} to run"), Duration::from_secs(60), || {
        let parts = baton.partitions();
        let mine: Vec<_> = parts.iter().filter(|p| p.pipeline == name).collect();
        Ok(!mine.is_empty() && mine.iter().all(|p| p.state == PartitionState::Running))
    })?;

    let consumer: BaseConsumer = client(&[
        ("group.id", "baton.bench.latency"),
        ("enable.auto.commit", "false"),
        ("isolation.level", "read_committed"),
        ("fetch.wait.max.ms", "5"),
    ])
    .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..SLOTS {
        tpl.add_partition_offset(&output, p as i32, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;

    let total = LATENCY_RATE * LATENCY_SECS;
    let producer_topic = input.clone();
    let producer = std::thread::spawn(move || -> Result<()> {
        let producer: BaseProducer = client(&[
            ("linger.ms", "1"),
            ("partitioner", "murmur2_random"),
            ("enable.idempotence", "true"),
        ])
        .create()?;
        let started = Instant::now();
        let per_ms = LATENCY_RATE / 1000;
        for i in 0..total {
            // Pace: record i is due at i / rate seconds.
            let due = Duration::from_micros(i * 1_000_000 / LATENCY_RATE);
            if i % per_ms == 0 {
                // Sleep, not poll: librdkafka's poll timeout is in whole milliseconds, so a
                // sub-millisecond poll spins a core the broker and baton need.
                producer.poll(Duration::ZERO);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
            let key = format!("k{}", i % 1000);
            let t = now_micros().to_string();
            let headers = OwnedHeaders::new().insert(Header {
                key: "t",
                value: Some(&t),
            });
            let mut rec = BaseRecord::<str, str>::to(&producer_topic)
                .key(&key)
                .payload("hello")
                .headers(headers);
            loop {
                match producer.send(rec) {
                    Ok(()) => break,
                    Err((_, back)) => {
                        rec = back;
                        producer.poll(Duration::from_millis(1));
                    }
                }
            }
            producer.poll(Duration::ZERO);
        }
        producer.flush(Duration::from_secs(60))?;
        Ok(())
    });

    let mut samples = Vec::with_capacity(total as usize);
    let deadline = Instant::now() + Duration::from_secs(LATENCY_SECS + 120);
    while (samples.len() as u64) < total {
        if Instant::now() > deadline {
            bail!("read only {} of {total} outputs", samples.len());
        }
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m?;
            let seen = now_micros();
            let t = m
                .headers()
                .and_then(|h| h.iter().find(|h| h.key == "t"))
                .and_then(|h| h.value)
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
                .context("output without the `t` header")?;
            samples.push(seen.saturating_sub(t));
        }
    }
    producer
        .join()
        .map_err(|_| anyhow::anyhow!("producer panicked"))??;
    // The first second is warm-up (connections, first transactions).
    let mut steady: Vec<u64> = samples[LATENCY_RATE as usize..].to_vec();
    steady.sort_unstable();
    let pct = |q: f64| steady[((steady.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
    Ok((pct(0.50), pct(0.99), pct(1.0)))
}

fn main() -> Result<()> {
    // `cargo bench` passes `--bench`; nothing else to parse.
    let n: u64 = std::env::var("BATON_BENCH_KAFKA_RECORDS")
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(1_000_000);
    if let Ok(filter) = std::env::var("BATON_BENCH_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
    // The ceiling of bench/steady and bench/state-scale: bare readers over an existing topic,
    // with their CPU time.
    // BATON_BENCH_BARE_PARTITIONS and BATON_BENCH_BARE_CONSUMERS: how many of its partitions
    // to read (default 8) and how many consumers share them (default 2).
    if let Ok(topic) = std::env::var("BATON_BENCH_BARE_TOPIC") {
        let env = |name: &str, default: u32| -> Result<u32> {
            match std::env::var(name) {
                Ok(v) => v.parse().with_context(|| format!("{name}={v}")),
                Err(_) => Ok(default),
            }
        };
        let slots = env("BATON_BENCH_BARE_PARTITIONS", SLOTS)?;
        let consumers = env("BATON_BENCH_BARE_CONSUMERS", PARTITIONS)?.clamp(1, slots.max(1));
        let cpu_before = own_cpu_secs()?;
        let started = Instant::now();
        let rate = bare_readers(&topic, slots, consumers)?;
        let secs = started.elapsed().as_secs_f64();
        let cpu = own_cpu_secs()? - cpu_before;
        println!("bare {rate:.0} {secs:.3} {cpu:.3}");
        return Ok(());
    }
    let only = std::env::var("BATON_BENCH_ONLY").unwrap_or_default();
    let dir = tempfile::tempdir()?;
    let cluster = baton_tests::unique("bench");
    let baton = open_host(dir.path(), &cluster)?;
    let topic = baton_tests::unique("bench-words");
    create_topic(&baton, &topic)?;
    if only == "ping" {
        let topic = baton_tests::unique("bench-ping");
        create_topic(&baton, &topic)?;
        for linger in ["0", "2"] {
            for idem in ["false", "true"] {
                let p: BaseProducer =
                    client(&[("linger.ms", linger), ("enable.idempotence", idem)]).create()?;
                let mut t = Vec::new();
                for i in 0..200 {
                    let s = Instant::now();
                    for j in 0..140 {
                        let k = format!("{i}-{j}");
                        p.send(BaseRecord::<str, str>::to(&topic).key(&k).payload("x"))
                            .map_err(|(e, _)| e)?;
                    }
                    while p.in_flight_count() > 0 {
                        p.poll(Duration::from_millis(1));
                    }
                    t.push(s.elapsed().as_micros());
                }
                t.sort();
                println!(
                    "linger {linger} idempotence {idem}: p50 {} us p90 {} us",
                    t[100], t[180]
                );
            }
        }
        return Ok(());
    }
    if only == "latency" {
        baton
            .upload_module("uppercase", "1", &baton_tests::plugin_bytes("uppercase"))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        // BATON_BENCH_COMMIT_INTERVALS=0,10,20,50,100 measures each commit interval.
        let intervals: Vec<Option<u64>> = match std::env::var("BATON_BENCH_COMMIT_INTERVALS") {
            Ok(list) => list
                .split(',')
                .map(|ms| ms.trim().parse().map(Some))
                .collect::<Result<_, _>>()
                .context("BATON_BENCH_COMMIT_INTERVALS: a comma-separated list of milliseconds")?,
            Err(_) => vec![None],
        };
        println!(
            "| guarantee | commit_interval_ms | p50 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|"
        );
        for interval in intervals {
            for (guarantee, short) in [("exactly-once", "eos"), ("at-least-once", "alo")] {
                let name = format!(
                    "up-{short}-{}",
                    interval.map_or("d".into(), |i| i.to_string())
                );
                let (p50, p99, max) = latency(&baton, &name, "uppercase", guarantee, interval)?;
                let shown = interval.map_or("default".into(), |i| i.to_string());
                println!("| {guarantee} | {shown} | {p50:.1} | {p99:.1} | {max:.1} |");
            }
        }
        baton.shutdown();
        return Ok(());
    }
    eprintln!("producing {n} records to {topic} ({SLOTS} partitions)…");
    produce_words(&topic, n as usize)?;

    let ceiling = if only.is_empty() {
        eprintln!("bare consumer…");
        bare_consumer(&topic, n as usize)?
    } else {
        0.0
    };
    let mut runs = Vec::new();
    let wasm_plugin = baton_tests::plugin_bytes("word-count");
    baton
        .upload_module("word-count", "1", &wasm_plugin)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    baton
        .upload_module("uppercase", "1", &baton_tests::plugin_bytes("uppercase"))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if only.is_empty() {
        // Not measured: warms the broker's transaction paths (its JIT) so that the first
        // measured run does not pay for it.
        eprintln!("warm-up…");
        word_count(
            &baton,
            "wc-warm-up",
            "word-count-native",
            "exactly-once",
            &topic,
            n,
        )?;
    }
    for (guarantee, short) in [("exactly-once", "eos"), ("at-least-once", "alo")] {
        for (module, kind) in [("word-count", "wasm"), ("word-count-native", "native")] {
            if !only.is_empty() && only != format!("{kind}-{short}") {
                continue;
            }
            eprintln!("word-count {kind} {guarantee}…");
            let name = format!("wc-{kind}-{short}");
            let (rate, process_ns) = word_count(&baton, &name, module, guarantee, &topic, n)?;
            runs.push(Run {
                label: format!("{kind} {guarantee}"),
                rate,
                process_ns,
            });
        }
    }

    // Kafka Streams on the same topic and broker (bench/run resolves and compiles it).
    let mut streams = Vec::new();
    if only.is_empty() {
        match std::env::var("BATON_KSTREAMS_CP") {
            Ok(cp) => {
                for guarantee in ["exactly-once", "at-least-once"] {
                    eprintln!("Kafka Streams word-count {guarantee}…");
                    streams.push((guarantee, kafka_streams(&cp, &topic, guarantee)?));
                }
            }
            Err(_) => {
                eprintln!("BATON_KSTREAMS_CP is not set: Kafka Streams skipped (bench/run sets it)")
            }
        }
    }
    if !only.is_empty() {
        // One run alone (e.g. BATON_BENCH_ONLY=wasm-eos, to profile it).
        for r in &runs {
            println!("{}: {:.0} records/s", r.label, r.rate);
        }
        baton.shutdown();
        return Ok(());
    }
    // Restore: stop the host, delete the Wasm exactly-once pipeline's state, reopen.
    eprintln!("restore…");
    baton.shutdown();
    drop(baton);
    std::fs::remove_dir_all(dir.path().join("state").join("wc-wasm-eos"))?;
    let started = Instant::now();
    let baton = open_host(dir.path(), &cluster)?;
    let mut restored = 0u64;
    wait_until("wc-wasm-eos to restore", Duration::from_secs(600), || {
        let parts = baton.partitions();
        let mine: Vec<_> = parts
            .iter()
            .filter(|p| p.pipeline == "wc-wasm-eos")
            .collect();
        let done = mine.len() == PARTITIONS as usize
            && mine.iter().all(|p| {
                p.state == PartitionState::Running && p.restore.as_ref().is_some_and(|r| r.finished)
            });
        if done {
            restored = mine
                .iter()
                .filter_map(|p| p.restore.as_ref())
                .map(|r| r.done)
                .sum();
        }
        Ok(done)
    })?;
    let restore_secs = started.elapsed().as_secs_f64();
    // Check the restored counts against the input.
    let expected = baton_tests::count(
        baton_tests::words(n as usize, VOCABULARY, 7)
            .iter()
            .map(String::as_str),
    );
    for (key, want) in expected.iter().take(50) {
        let got = baton
            .queries()
            .lookup("wc-wasm-eos", "counts", key.as_bytes(), None)
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .and_then(|l| l.value_i64);
        if got != Some(*want) {
            bail!("restored count of {key}: {got:?}, expected {want}");
        }
    }

    let mut lat = HashMap::new();
    for (guarantee, short) in [("exactly-once", "eos"), ("at-least-once", "alo")] {
        eprintln!("latency {guarantee}…");
        lat.insert(
            guarantee,
            latency(&baton, &format!("up-{short}"), "uppercase", guarantee, None)?,
        );
    }
    baton.shutdown();

    println!(
        "\nbaton on Apache Kafka (one broker on 127.0.0.1), {n} records, {SLOTS} slots, {PARTITIONS} partitions\n"
    );
    println!(
        "| word-count | records/s | of bare consumer | native rate / this | process ns/record | / native |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    println!("| bare rdkafka consumers, one per partition (ceiling) | {ceiling:.0} | 1.00 | | | |");
    for (i, r) in runs.iter().enumerate() {
        // Runs alternate wasm, native.
        let native = if i % 2 == 0 { &runs[i + 1] } else { r };
        println!(
            "| {} | {:.0} | {:.2} | {:.2} | {:.0} | {:.2} |",
            r.label,
            r.rate,
            r.rate / ceiling,
            native.rate / r.rate,
            r.process_ns,
            r.process_ns / native.process_ns
        );
    }
    if !streams.is_empty() {
        println!(
            "\n| groupByKey().count(), {PARTITIONS} stream threads | Kafka Streams records/s | baton (Wasm) records/s | baton / Kafka Streams |\n|---|---:|---:|---:|"
        );
        for (guarantee, rate) in &streams {
            let baton = runs
                .iter()
                .find(|r| r.label == format!("wasm {guarantee}"))
                .map(|r| r.rate)
                .unwrap_or(0.0);
            println!(
                "| {guarantee} | {rate:.0} | {baton:.0} | {:.2} |",
                baton / rate
            );
        }
    }
    println!(
        "\n| restore (word-count changelog, data dir deleted) | value |\n|---|---:|\n\
         | changelog records replayed | {restored} |\n| time to running | {restore_secs:.2} s |\n\
         | records/s | {:.0} |",
        restored as f64 / restore_secs
    );
    println!(
        "\n| uppercase at {LATENCY_RATE} records/s, {LATENCY_SECS} s | p50 ms | p99 ms | max ms |\n|---|---:|---:|---:|"
    );
    for g in ["exactly-once", "at-least-once"] {
        let (p50, p99, max) = lat[g];
        println!("| {g} | {p50:.1} | {p99:.1} | {max:.1} |");
    }
    Ok(())
}

/// Runs bench/kstreams/WordCount.java (Kafka Streams, `groupByKey().count()`) over `topic` with
/// one stream thread per baton partition; returns its records/s.
fn kafka_streams(classpath: &str, topic: &str, guarantee: &str) -> Result<f64> {
    let app = baton_tests::unique("bench-kstreams");
    let out = std::process::Command::new("java")
        .args(["-Xmx1g", "-cp", classpath, "WordCount"])
        .args([
            &bootstrap(),
            topic,
            &app,
            guarantee,
            &PARTITIONS.to_string(),
        ])
        .output()
        .context("running java (Kafka Streams)")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "Kafka Streams failed: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    stdout
        .split_whitespace()
        .next()
        .and_then(|r| r.parse().ok())
        .with_context(|| format!("Kafka Streams printed {stdout:?}"))
}
