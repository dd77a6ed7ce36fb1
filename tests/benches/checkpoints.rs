//! Incremental checkpoints of one partition's database, to the local store and to an
//! S3-compatible server (moto, on 127.0.0.1): a full checkpoint of a state of
//! `BATON_CKPT_MIB` MiB (default 1024) of 100-byte values, then `BATON_CKPT_ROUNDS` (default
//! 10) rounds that each change `BATON_CKPT_CHANGE` (default 0.01) of the keys at random and take
//! a checkpoint: duration (p50, p99, max), bytes uploaded against the state's size, and the part
//! of those bytes in files compactions wrote (SST files below level 0). Then restores of the
//! last checkpoint, each into a new directory, alternating with a bare client reading the same
//! objects, `BATON_CKPT_RESTORES` (default 3) of each: their medians.
//! `BATON_CKPT_STORES` picks the stores (default `local,s3`). Prints a table.
//!
//! The rounds start once the load's compactions are done (`BATON_CKPT_SETTLE=0` starts them at
//! once, with the compaction debt of a gigabyte written in seconds), and wait
//! `BATON_CKPT_INTERVAL_S` (default 5) seconds between a round's writes and its checkpoint, as
//! a host's scheduler does between checkpoints: uploading what compactions wrote ahead of the
//! checkpoint, once a second, counted in its bytes uploaded.

use std::time::{Duration, Instant};

use baton::state::StateEnv;
use baton::state::WriteRef;
use baton::state::checkpoint::{CheckpointStore, PartitionRef};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

fn key(slot: u32, i: u64) -> Vec<u8> {
    let mut k = slot.to_be_bytes().to_vec();
    k.extend_from_slice(format!("key-{i:012}").as_bytes());
    k
}

/// Writes `keys` (indexes) with fresh random values, 10,000 per commit, moving the changelog
/// offset of slot 0 on by one per write.
fn write(db: &baton::state::PartitionDb, keys: &[u64], rng: &mut Rng, offset: &mut u64) {
    let mut value = [0u8; 100];
    for chunk in keys.chunks(10_000) {
        let mut owned = Vec::with_capacity(chunk.len());
        for &i in chunk {
            rng.fill(&mut value);
            owned.push((key((i % 4) as u32, i), value.to_vec()));
        }
        let writes = owned.iter().map(|(k, v)| WriteRef {
            store: 0,
            key: k,
            value: Some(v),
        });
        *offset += chunk.len() as u64;
        db.commit(
            writes,
            &[(
                "cl/counts/0".to_string(),
                Some(offset.to_be_bytes().to_vec()),
            )],
        )
        .expect("commit");
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn main() -> anyhow::Result<()> {
    let mib: u64 = env_or("BATON_CKPT_MIB", 1024);
    let rounds: usize = env_or("BATON_CKPT_ROUNDS", 10);
    let change: f64 = env_or("BATON_CKPT_CHANGE", 0.01);
    let stores: String = env_or("BATON_CKPT_STORES", "local,s3".to_string());
    let settle: bool = env_or("BATON_CKPT_SETTLE", 1u8) == 1;
    let interval_s: u64 = env_or("BATON_CKPT_INTERVAL_S", 5);
    let n = (mib << 20) / 120;
    let rt = tokio::runtime::Runtime::new()?;
    let s3 = if stores.contains("s3") {
        Some(rt.block_on(baton_tests::S3Server::start("bench"))?)
    } else {
        None
    };
    let s3_options: Vec<(String, String)> = s3
        .as_ref()
        .map(|s| {
            s.env()
                .into_iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v))
                .collect()
        })
        .unwrap_or_default();
    let dir = tempfile::tempdir()?;
    let env = StateEnv::new(512 << 20);
    let stores_names = vec!["counts".to_string()];
    let mut rows = Vec::new();
    let mut reshape: Option<String> = None;
    for kind in stores.split(',').filter(|s| !s.is_empty()) {
        let url = match kind {
            "local" => dir
                .path()
                .join(format!("store-{kind}"))
                .to_string_lossy()
                .into_owned(),
            "s3" => format!("s3://{}/bench", s3.as_ref().expect("an S3 server").bucket),
            other => anyhow::bail!("BATON_CKPT_STORES: unknown store {other}"),
        };
        let store = CheckpointStore::open_with(&url, 3, &s3_options).map_err(anyhow::Error::msg)?;
        let db_path = dir.path().join(format!("db-{kind}"));
        let db = env.open_partition(&db_path, &stores_names)?;
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut offset = 0u64;
        let all: Vec<u64> = (0..n).collect();
        let started = Instant::now();
        write(&db, &all, &mut rng, &mut offset);
        eprintln!(
            "{kind}: {n} keys written in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        if settle {
            // The state as a partition holds it after running a while: the load's compactions
            // done, so that what the rounds upload is what 1% of changes cause.
            let started = Instant::now();
            db.wait_for_compactions(Duration::from_secs(600))?;
            eprintln!(
                "{kind}: compactions settled in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        let p = PartitionRef::new("bench", 1, &format!("bench-{kind}"), [0, 4]);
        let full = store.take(&db, &p, "bench")?;
        let (mut durations, mut rocksdb, mut uploaded, mut sizes, mut compacted) =
            (Vec::new(), Vec::new(), 0u64, 0u64, 0u64);
        let mut with_wal = 0usize;
        for _ in 0..rounds {
            let changed: Vec<u64> = (0..(n as f64 * change) as u64)
                .map(|_| rng.next() % n)
                .collect();
            write(&db, &changed, &mut rng, &mut offset);
            // The interval between checkpoints, as a host's scheduler spends it: what
            // compactions write goes to the store ahead of the checkpoint, once a second.
            let until = Instant::now() + Duration::from_secs(interval_s);
            while Instant::now() < until {
                std::thread::sleep(Duration::from_secs(1).min(until - Instant::now()));
                store.upload_ahead(&db, &p)?;
            }
            let info = store.take(&db, &p, "bench")?;
            let levels = db.sst_levels();
            durations.push(info.duration_ms);
            rocksdb.push(info.rocksdb_ms);
            with_wal += usize::from(info.wal_bytes > 0);
            uploaded += info.uploaded_bytes;
            sizes += info.size_bytes;
            // Files compactions wrote: below level 0 and new in this checkpoint.
            let last = store.manifests(&p)?.pop().expect("a manifest");
            let before: std::collections::HashSet<String> = store
                .manifests(&p)?
                .iter()
                .rev()
                .nth(1)
                .map(|m| m.files.iter().map(|f| f.object.clone()).collect())
                .unwrap_or_default();
            compacted += last
                .files
                .iter()
                .filter(|f| !before.contains(&f.object))
                .filter(|f| levels.get(&f.name).is_some_and(|l| *l > 0))
                .map(|f| f.size)
                .sum::<u64>();
        }
        durations.sort_by(f64::total_cmp);
        rocksdb.sort_by(f64::total_cmp);
        // Restores of the last checkpoint, each into a new directory, alternating with a bare
        // client reading the same objects (BATON_CKPT_RESTORES times each, 3 by default): the
        // medians, so that a slow moment of the server falls on neither side alone.
        let restores: usize = env_or("BATON_CKPT_RESTORES", 3usize).max(1);
        let (mut restore_times, mut bare_times) = (Vec::new(), Vec::new());
        let mut restored = None;
        for i in 0..restores {
            let target = dir.path().join(format!("restored-{kind}-{i}"));
            let started = Instant::now();
            let r = store
                .restore(&p, &stores_names, &target)?
                .expect("a checkpoint to restore");
            restore_times.push(started.elapsed().as_secs_f64());
            bare_times.push(store.read_all(&p, r.seq)?);
            std::fs::remove_dir_all(&target)?;
            restored = Some(r);
        }
        let restored = restored.expect("at least one restore");
        restore_times.sort_by(f64::total_cmp);
        bare_times.sort_by(f64::total_cmp);
        let restore_s = restore_times[restore_times.len() / 2];
        let bare_s = bare_times[bare_times.len() / 2];
        eprintln!(
            "{kind}: restores {restore_times:.3?} s, bare reads {bare_times:.3?} s of {} bytes",
            restored.bytes
        );
        rows.push(format!(
            "| {kind} | {:.0} | {:.0} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {with_wal} | {:.1}% | {:.1}% | {:.2} | {:.0} | {:.0} | {:.2} |",
            full.size_bytes as f64 / (1 << 20) as f64,
            full.duration_ms,
            rounds,
            pct(&durations, 0.5),
            pct(&durations, 0.99),
            durations.last().copied().unwrap_or(0.0),
            pct(&rocksdb, 0.99),
            100.0 * uploaded as f64 / sizes.max(1) as f64,
            100.0 * compacted as f64 / sizes.max(1) as f64,
            restore_s,
            restored.bytes as f64 / (1 << 20) as f64 / restore_s,
            restored.bytes as f64 / (1 << 20) as f64 / bare_s,
            (restored.bytes as f64 / restore_s) / (restored.bytes as f64 / bare_s),
        ));
        // The split's own work on this state, once: what `cluster::split` does to make its
        // halves (a flush, a hard-link checkpoint per half, opened and cut to its slots), and a
        // merge's warm step (the other half's slots ingested from a checkpoint of it).
        if reshape.is_none() {
            let started = Instant::now();
            db.flush()?;
            let mut halves = Vec::new();
            for (i, slots) in [0..2u32, 2..4].into_iter().enumerate() {
                let path = dir.path().join(format!("half-{i}"));
                db.create_checkpoint(&path)?;
                let half = env.open_partition(&path, &stores_names)?;
                half.keep_slots(slots, &[])?;
                halves.push(half);
            }
            let split_s = started.elapsed().as_secs_f64();
            let side = dir.path().join("merge-side");
            let started = Instant::now();
            halves[1].create_checkpoint(&side)?;
            let entries = halves[0].ingest_slots_from(&side, 2..4, &[])?;
            let merge_s = started.elapsed().as_secs_f64();
            let sst_bytes = |dir: &std::path::Path| -> u64 {
                std::fs::read_dir(dir)
                    .map(|d| {
                        d.flatten()
                            .filter(|e| e.path().extension().is_some_and(|x| x == "sst"))
                            .filter_map(|e| e.metadata().ok())
                            .map(|m| m.len())
                            .sum()
                    })
                    .unwrap_or(0)
            };
            let half_dir = dir.path().join("half-1");
            let before = sst_bytes(&half_dir);
            let started = Instant::now();
            halves[1].compact_dropped(2..4)?;
            let compact_s = started.elapsed().as_secs_f64();
            let after = sst_bytes(&half_dir);
            reshape = Some(format!(
                "| {:.0} | {n} | {split_s:.2} | {merge_s:.2} | {entries} | {compact_s:.1} | {:.0} | {:.0} |",
                full.size_bytes as f64 / (1 << 20) as f64,
                before as f64 / (1 << 20) as f64,
                after as f64 / (1 << 20) as f64,
            ));
        }
        drop(db);
    }
    println!(
        "\ncheckpoints of one partition ({mib} MiB of 100-byte values, {n} keys; {:.1}% of the keys changed between checkpoints)\n",
        change * 100.0
    );
    println!(
        "| store | state MiB | full ms | rounds | incremental p50 ms | p99 ms | max ms | RocksDB checkpoint p99 ms | with the WAL in place of a flush | uploaded / size | of which compactions | restore s | restore MiB/s | bare client MiB/s | restore / bare |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!("{r}");
    }
    if let Some(r) = &reshape {
        println!(
            "\nsplit and merge work on this state (not the pause: both are done while the partition runs)\n"
        );
        println!(
            "| state MiB | keys | split: flush, two checkpoints, opened and cut, s | merge: the other half checkpointed and ingested, s | entries ingested | one half's compaction of the other's range, s | that half's SST files before, MiB | after, MiB |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
        println!("{r}");
    }
    Ok(())
}
