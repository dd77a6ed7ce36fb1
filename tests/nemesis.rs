//! The fault harness of reconfiguration (`bench/faults`, and a short run in the tests): three
//! `baton` processes on the test broker run word count (state) and uppercase (outputs) under
//! exactly-once while records keep coming; both partitions move at once, and a nemesis strikes
//! the move of `wc-0` at one protocol step: it kills (`kill -9`) or stops (SIGSTOP, then
//! SIGCONT) the owner or the target while the target is held at that step by a timed hold of
//! `baton::steps::STEPS_ENV`. Every time is drawn from a seeded generator.
//!
//! The checker then asks, of everything sent:
//! - every key's count exact;
//! - every output exactly once under `read_committed`: none lost, none twice;
//! - no two hosts committed for one partition at one epoch, from the record each commit writes
//!   in its transaction (`baton::steps::COMMITS_ENV`), read back from Kafka;
//! - no transaction left open: what was written before the fault is readable `read_committed`
//!   within the session timeout plus 5 s.
//!
//! Its pause is the longest time between two commits of one partition, from the same records:
//! what the partition's users waited, moves, failovers and holds included.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde_json::{Value, json};

use crate::{Api, ChildHost, TestProducer, count, kafka_bootstrap, unique, wait_for, words};

/// The hosts' session timeout; a fault's open transaction must be readable within it plus 5 s.
pub const SESSION: Duration = Duration::from_secs(6);

/// What the nemesis does, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nemesis {
    /// `kill -9` of the target while it warms its replica.
    KillTargetWarming,
    /// `kill -9` of the target after the owner's release, before its take-over.
    KillTargetBeforeTakeOver,
    /// `kill -9` of the owner after its release, while the target is held before its take-over.
    KillOwnerAfterRelease,
    /// `kill -9` of the owner while the target warms.
    KillOwnerWarming,
    /// SIGSTOP of the owner while the target warms, for up to 9 s (past the session timeout:
    /// it is failed over, and must be fenced when it wakes), then SIGCONT.
    StopOwnerWarming,
    /// SIGSTOP of the target between the release and its take-over, then SIGCONT.
    StopTargetBeforeTakeOver,
    /// `kill -9` of the target during its take-over: the assignment at the next epoch counts,
    /// and its session has restored but not yet processed.
    KillTargetTakingOver,
    /// SIGSTOP of the target during its take-over, then SIGCONT (past the session timeout:
    /// it is failed over, and must be fenced when it wakes).
    StopTargetTakingOver,
    /// `kill -9` of the controller while the target warms.
    KillControllerWarming,
    /// `kill -9` of the controller after the owner's release, while the target is held before
    /// its take-over.
    KillControllerReleased,
    /// `kill -9` of the owner mid-split: the partition stopped after its final commit, its
    /// halves made, the split not yet recorded done.
    KillOwnerSplitting,
    /// SIGSTOP of the owner mid-split (as above), past the session timeout, then SIGCONT: the
    /// partition is failed over and the split given up; the owner must not start the halves.
    StopOwnerSplitting,
    /// `kill -9` of the owner mid-checkpoint: its files uploaded, its manifest not written.
    KillOwnerCheckpointing,
    /// `kill -9` of the host that merges two partitions (the target of the merge), after both
    /// stopped with their final commits and the merged one caught up, before the merge is
    /// recorded done.
    KillTargetMerging,
    /// `kill -9` of the owner of the partition that moves to the merging host, while it warms
    /// there.
    KillOwnerMerging,
}

/// Whom the nemesis strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Victim {
    Owner,
    Target,
    Controller,
}

impl Nemesis {
    /// Every scenario.
    pub const ALL: &[Nemesis] = &[
        Nemesis::KillTargetWarming,
        Nemesis::KillTargetBeforeTakeOver,
        Nemesis::KillOwnerAfterRelease,
        Nemesis::KillOwnerWarming,
        Nemesis::StopOwnerWarming,
        Nemesis::StopTargetBeforeTakeOver,
        Nemesis::KillTargetTakingOver,
        Nemesis::StopTargetTakingOver,
        Nemesis::KillControllerWarming,
        Nemesis::KillControllerReleased,
        Nemesis::KillOwnerSplitting,
        Nemesis::StopOwnerSplitting,
        Nemesis::KillOwnerCheckpointing,
        Nemesis::KillTargetMerging,
        Nemesis::KillOwnerMerging,
    ];

    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Nemesis::KillTargetWarming => "kill target, warming",
            Nemesis::KillTargetBeforeTakeOver => "kill target, released",
            Nemesis::KillOwnerAfterRelease => "kill owner, released",
            Nemesis::KillOwnerWarming => "kill owner, warming",
            Nemesis::StopOwnerWarming => "stop owner, warming",
            Nemesis::StopTargetBeforeTakeOver => "stop target, released",
            Nemesis::KillTargetTakingOver => "kill target, taking over",
            Nemesis::StopTargetTakingOver => "stop target, taking over",
            Nemesis::KillControllerWarming => "kill controller, warming",
            Nemesis::KillControllerReleased => "kill controller, released",
            Nemesis::KillOwnerSplitting => "kill owner, splitting",
            Nemesis::StopOwnerSplitting => "stop owner, splitting",
            Nemesis::KillOwnerCheckpointing => "kill owner, checkpointing",
            Nemesis::KillTargetMerging => "kill target, merging",
            Nemesis::KillOwnerMerging => "kill owner, merging",
        }
    }

    /// Whether the run merges wc-0 and wc-1 (on two hosts) rather than splitting.
    fn merges(self) -> bool {
        matches!(self, Nemesis::KillTargetMerging | Nemesis::KillOwnerMerging)
    }

    /// Whether the owner of wc-0 is struck while it splits or checkpoints it (rather than
    /// during a move).
    fn on_owner(self) -> bool {
        matches!(
            self,
            Nemesis::KillOwnerSplitting
                | Nemesis::StopOwnerSplitting
                | Nemesis::KillOwnerCheckpointing
                | Nemesis::KillTargetMerging
                | Nemesis::KillOwnerMerging
        )
    }

    /// The key of the step held: the partition, or its first checkpoint.
    fn key(self) -> &'static str {
        match self {
            Nemesis::KillOwnerCheckpointing => "wc-0/1",
            Nemesis::KillOwnerMerging => "wc-1",
            _ => "wc-0",
        }
    }

    /// The step the target is held at when the nemesis strikes: a session's step during the
    /// take-over (the initial owner passes it once at its start too, which only delays it).
    fn step(self) -> &'static str {
        match self {
            Nemesis::KillTargetWarming
            | Nemesis::KillOwnerWarming
            | Nemesis::StopOwnerWarming
            | Nemesis::KillControllerWarming => baton::steps::MOVE_WARMING,
            Nemesis::KillTargetTakingOver | Nemesis::StopTargetTakingOver => {
                baton::steps::SESSION_RESTORED
            }
            Nemesis::KillTargetBeforeTakeOver
            | Nemesis::KillOwnerAfterRelease
            | Nemesis::StopTargetBeforeTakeOver
            | Nemesis::KillControllerReleased => baton::steps::MOVE_TAKE_OVER,
            Nemesis::KillOwnerSplitting | Nemesis::StopOwnerSplitting => baton::steps::SPLIT_RECORD,
            Nemesis::KillOwnerCheckpointing => baton::steps::CHECKPOINT_UPLOAD,
            Nemesis::KillTargetMerging => baton::steps::MERGE_RECORD,
            Nemesis::KillOwnerMerging => baton::steps::MOVE_WARMING,
        }
    }

    fn victim(self) -> Victim {
        match self {
            Nemesis::KillOwnerAfterRelease
            | Nemesis::KillOwnerWarming
            | Nemesis::StopOwnerWarming
            | Nemesis::KillOwnerSplitting
            | Nemesis::StopOwnerSplitting
            | Nemesis::KillOwnerCheckpointing
            | Nemesis::KillTargetMerging
            | Nemesis::KillOwnerMerging => Victim::Owner,
            Nemesis::KillControllerWarming | Nemesis::KillControllerReleased => Victim::Controller,
            _ => Victim::Target,
        }
    }

    fn kills(self) -> bool {
        !matches!(
            self,
            Nemesis::StopOwnerWarming
                | Nemesis::StopTargetBeforeTakeOver
                | Nemesis::StopTargetTakingOver
                | Nemesis::StopOwnerSplitting
        )
    }
}

/// A small seeded generator (SplitMix64): runs are repeated from their printed seed.
pub struct Rng(u64);

impl Rng {
    /// From `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A duration in `[lo, hi)`.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = (hi.saturating_sub(lo)).as_millis().max(1) as u64;
        lo + Duration::from_millis(self.next_u64() % span)
    }

    /// One of `items`.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[(self.next_u64() % items.len() as u64) as usize]
    }
}

/// What one run found.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The scenario.
    pub nemesis: Nemesis,
    /// Its seed.
    pub seed: u64,
    /// Records sent.
    pub records: usize,
    /// Counts short of what was sent, plus outputs missing.
    pub lost: u64,
    /// Counts past what was sent, plus outputs written twice or never sent.
    pub duplicated: u64,
    /// Partitions committed by two hosts at one epoch.
    pub two_writers: Vec<String>,
    /// The longest time between two commits of one partition, ms: what its users waited
    /// (records keep coming, and a running partition commits every 100 ms or so).
    pub max_gap_ms: f64,
    /// The longest pause of the moves that were done, ms.
    pub max_pause_ms: Option<f64>,
    /// How long after the fault what was written before it was readable `read_committed`.
    pub open_txn: Duration,
    /// The moves' ends, as `partition: phase (reason)`.
    pub moves: Vec<String>,
}

impl Outcome {
    /// Whether every check held.
    pub fn passed(&self) -> bool {
        self.lost == 0
            && self.duplicated == 0
            && self.two_writers.is_empty()
            && self.open_txn <= SESSION + Duration::from_secs(5)
    }
}

/// A host of the run: its id, data dir, and process while it runs.
struct Member {
    id: &'static str,
    dir: PathBuf,
    host: Option<ChildHost>,
}

/// The run's cluster: three hosts, their environment, and the topics.
struct Cluster {
    cluster: String,
    members: Vec<Member>,
    steps: String,
    commits: String,
}

impl Cluster {
    async fn start(&mut self, i: usize) -> Result<()> {
        let m = &mut self.members[i];
        let reached = m.dir.join("steps.reached");
        let reached = reached.to_string_lossy().into_owned();
        let env = [
            (baton::steps::STEPS_ENV, self.steps.as_str()),
            (baton::steps::STEPS_LOG_ENV, reached.as_str()),
            (baton::steps::COMMITS_ENV, self.commits.as_str()),
        ];
        let host = crate::child_member_with(&m.dir, &self.cluster, m.id, &env).await?;
        m.host = Some(host);
        Ok(())
    }

    fn index(&self, id: &str) -> Result<usize> {
        self.members
            .iter()
            .position(|m| m.id == id)
            .with_context(|| format!("no host `{id}`"))
    }

    /// The API of a host that runs.
    fn api(&self) -> Result<Api> {
        self.members
            .iter()
            .find_map(|m| m.host.as_ref().map(|h| h.api.clone()))
            .context("no host runs")
    }

    fn pid(&self, i: usize) -> Result<u32> {
        Ok(self.members[i]
            .host
            .as_ref()
            .context("the host does not run")?
            .pid())
    }
}

fn signal(pid: u32, sig: &str) -> Result<()> {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()?;
    if !status.success() {
        bail!("kill {sig} {pid}: {status}");
    }
    Ok(())
}

/// A partition's row as `api` shows it.
async fn row(api: &Api, id: &str) -> Result<Value> {
    api.partitions()
        .await?
        .into_iter()
        .find(|p| p["id"] == id)
        .with_context(|| format!("no partition {id}"))
}

async fn request_move(api: &Api, partition: &str, to: &str) -> Result<String> {
    let r = api
        .post_json(
            &format!("/api/v1/partitions/{partition}/move"),
            &json!({ "to": to }),
        )
        .await?;
    if r.status != 202 {
        bail!("moving {partition} to {to}: {} {}", r.status, r.body);
    }
    Ok(r.body["move"].as_str().unwrap_or_default().to_string())
}

/// The end offsets of `topic`'s partitions for uncommitted or committed reads.
fn ends(topic: &str, partitions: u32, committed: bool) -> Result<Vec<i64>> {
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", "baton-faults")
        .set(
            "isolation.level",
            if committed {
                "read_committed"
            } else {
                "read_uncommitted"
            },
        )
        .create()?;
    (0..partitions)
        .map(|p| {
            let (_, hi) = consumer.fetch_watermarks(topic, p as i32, Duration::from_secs(10))?;
            Ok(hi)
        })
        .collect()
}

/// How many preloaded keys the checker asks word count for (each was sent once); uppercase's
/// outputs of every one of them are checked.
const PRELOAD_SAMPLE: usize = 2_000;

/// Sends `keys` records of distinct keys (`p<i>`, value the key) to `input` and waits until
/// both pipelines processed them: the state of production shape (millions of keys) that a
/// move's target then warms up and a take-over restores, before any fault. Returns them.
async fn preload(api: &Api, input: &str, keys: usize) -> Result<Vec<(String, String)>> {
    if keys == 0 {
        return Ok(Vec::new());
    }
    let started = Instant::now();
    let producer = TestProducer::new()?;
    let mut sent = Vec::with_capacity(keys);
    for from in (0..keys).step_by(50_000) {
        let recs: Vec<(String, String)> = (from..(from + 50_000).min(keys))
            .map(|i| (format!("p{i}"), format!("p{i}")))
            .collect();
        producer.send(input, 2, &recs).await?;
        sent.extend(recs);
    }
    let deadline = Duration::from_secs(60 + keys as u64 / 5_000);
    api.wait_caught_up("wc", keys as u64, deadline).await?;
    api.wait_caught_up("up", keys as u64, deadline).await?;
    eprintln!(
        "preloaded {keys} keys in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(sent)
}

/// The keys whose counts the checker asks for: every key of `sent` (the records sent under
/// faults) and a sample of the preloaded ones (each sent once), with what each should count.
fn to_count(sent: &[(String, String)], preloaded: &[(String, String)]) -> BTreeMap<String, i64> {
    let mut want = count(sent.iter().map(|(k, _)| k.as_str()));
    let step = (preloaded.len() / PRELOAD_SAMPLE).max(1);
    for (k, _) in preloaded.iter().step_by(step) {
        *want.entry(k.clone()).or_default() += 1;
    }
    want
}

/// Sends chunks of records with unique values to `input` until `stop`.
fn produce_until(
    input: String,
    stop: Arc<AtomicBool>,
    sent: Arc<Mutex<Vec<(String, String)>>>,
    seed: u64,
) -> tokio::task::JoinHandle<Result<()>> {
    tokio::spawn(async move {
        let producer = TestProducer::new()?;
        let keys = words(1_000_000, 500, seed);
        for (c, chunk) in keys.chunks(200).enumerate() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let recs: Vec<_> = chunk
                .iter()
                .enumerate()
                .map(|(i, k)| (k.clone(), format!("v{c}-{i}")))
                .collect();
            producer.send(&input, 2, &recs).await?;
            sent.lock().unwrap().extend(recs);
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        Ok(())
    })
}

/// The cluster's controller, as `GET /api/v1/hosts` shows it.
async fn controller(api: &Api) -> Result<String> {
    let r = api.get("/api/v1/hosts").await?;
    r.body
        .as_array()
        .into_iter()
        .flatten()
        .find(|h| h["controller"] == true)
        .and_then(|h| h["id"].as_str())
        .map(str::to_string)
        .context("no host is the controller")
}

/// Starts the three hosts of a run under `root` with the holds `steps`, a topic for their
/// commit records, and word count and uppercase (an output topic) in `partitions` partitions
/// each, exactly-once; returns once every partition runs, with the input, output and commits
/// topics (named after `name`).
async fn deploy(
    root: &Path,
    name: &str,
    steps: String,
    partitions: u32,
) -> Result<(Cluster, String, String, String)> {
    let commits = unique(&format!("{name}-commits"));
    {
        use baton::transport::Transport;
        let t = baton::transport::kafka::KafkaTransport::connect(
            baton::transport::kafka::KafkaConfig::new(kafka_bootstrap()),
        )?;
        t.ensure_topic(&commits, 1, baton::transport::TopicKind::Data)?;
    }
    let mut c = Cluster {
        cluster: crate::cluster_name(root),
        members: ["a", "b", "c"]
            .into_iter()
            .map(|id| Member {
                id,
                dir: root.join(id),
                host: None,
            })
            .collect(),
        steps,
        commits: commits.clone(),
    };
    for i in 0..3 {
        c.start(i).await?;
    }
    let api = c.api()?;
    crate::wait_alive(&api, 3).await?;
    let (input, output) = (
        unique(&format!("{name}-in")),
        unique(&format!("{name}-out")),
    );
    api.upload_plugin("word-count", "word-count", "1").await?;
    api.upload_plugin("uppercase", "uppercase", "1").await?;
    api.create_pipeline(json!({
        "name": "wc", "module": "word-count", "version": "1", "inputs": [input],
        "stores": ["counts"], "slots": 2, "partitions": partitions, "guarantee": "exactly-once"
    }))
    .await?;
    api.create_pipeline(json!({
        "name": "up", "module": "uppercase", "version": "1", "inputs": [input],
        "outputs": [output], "config": {"output": output}, "slots": 2,
        "partitions": partitions, "guarantee": "exactly-once"
    }))
    .await?;
    for pipeline in ["wc", "up"] {
        for i in 0..partitions {
            let p = format!("{pipeline}-{i}");
            wait_for(&format!("{p} running"), Duration::from_secs(60), || async {
                let r = row(&api, &p).await?;
                Ok((r["state"] == "running").then_some(()))
            })
            .await?;
        }
    }
    Ok((c, input, output, commits))
}

/// One run of `nemesis`, its times drawn from `seed`. The hosts' data dirs and logs are kept
/// (and named) when the run fails or a check does not hold.
///
/// `keys`: distinct keys preloaded before the faults ([`preload`]), so that the partitions'
/// state is of production shape; 0 for none.
pub async fn run(nemesis: Nemesis, seed: u64, keys: usize) -> Result<Outcome> {
    let root = tempfile::tempdir()?;
    let result = run_in(nemesis, seed, keys, root.path()).await;
    if !result.as_ref().is_ok_and(Outcome::passed) {
        let kept = root.keep();
        eprintln!(
            "{} (seed {seed}): the hosts' data dirs and logs are kept in {}",
            nemesis.name(),
            kept.display()
        );
        return result.with_context(|| format!("the hosts' logs are in {}", kept.display()));
    }
    result
}

async fn run_in(nemesis: Nemesis, seed: u64, keys: usize, root: &Path) -> Result<Outcome> {
    if nemesis.on_owner() {
        return run_on_owner(nemesis, seed, keys, root).await;
    }
    let mut rng = Rng::new(seed);
    let hold = rng.between(Duration::from_millis(500), Duration::from_millis(3000));
    let steps = format!("{}@wc-0={}ms", nemesis.step(), hold.as_millis());
    let (mut c, input, output, commits) = deploy(root, "faults", steps, 1).await?;
    let api = c.api()?;
    let preloaded = preload(&api, &input, keys).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(Mutex::new(Vec::new()));
    let producer = produce_until(input.clone(), stop.clone(), sent.clone(), seed);
    tokio::time::sleep(rng.between(Duration::from_millis(500), Duration::from_millis(1500))).await;

    // Both partitions move at once; the nemesis strikes the move of wc-0.
    let mut owner = row(&api, "wc-0").await?["owner"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // The controller is struck as a third party: neither the owner nor the target.
    let ctrl = controller(&api).await?;
    if nemesis.victim() == Victim::Controller && owner == ctrl {
        let to = rng.pick(
            &["a", "b", "c"]
                .into_iter()
                .filter(|h| *h != ctrl)
                .collect::<Vec<_>>(),
        );
        let id = request_move(&api, "wc-0", to).await?;
        wait_for(
            &format!("wc-0 moved to {to} first"),
            Duration::from_secs(60),
            || async {
                let r = row(&api, "wc-0").await?;
                let done = r["moves"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|m| m["id"] == id.as_str())
                    .and_then(|m| m["phase"].as_str().map(str::to_string));
                match done.as_deref() {
                    Some("done") if r["owner"] == to && r["state"] == "running" => Ok(Some(())),
                    Some("abandoned") => bail!("the first move of wc-0 to {to} was abandoned: {r}"),
                    _ => Ok(None),
                }
            },
        )
        .await?;
        owner = to.to_string();
    }
    let others: Vec<&str> = ["a", "b", "c"]
        .into_iter()
        .filter(|h| *h != owner && (nemesis.victim() != Victim::Controller || *h != ctrl))
        .collect();
    let target = rng.pick(&others).to_string();
    let up_owner = row(&api, "up-0").await?["owner"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let up_to = rng.pick(
        &["a", "b", "c"]
            .into_iter()
            .filter(|h| *h != up_owner)
            .collect::<Vec<_>>(),
    );
    request_move(&api, "wc-0", &target).await?;
    request_move(&api, "up-0", up_to).await?;

    let (oi, ti) = (c.index(&owner)?, c.index(&target)?);
    crate::wait_held(
        &c.members[ti].dir,
        nemesis.step(),
        "wc-0",
        Duration::from_secs(90),
    )
    .await?;
    tokio::time::sleep(rng.between(Duration::ZERO, hold / 2)).await;
    let victim = match nemesis.victim() {
        Victim::Owner => oi,
        Victim::Target => ti,
        Victim::Controller => c.index(&ctrl)?,
    };
    // Transactions are on the output and on wc's changelog.
    let (struck, open_txn) = strike(&mut c, victim, nemesis.kills(), &output).await?;
    let out_for = rng.between(Duration::from_millis(500), Duration::from_secs(9));
    revive(&mut c, victim, nemesis.kills(), struck, out_for).await?;

    // Settle: three hosts, no move under way, both partitions running.
    let api = c.api()?;
    crate::wait_alive(&api, 3).await?;
    wait_for("the moves ended", Duration::from_secs(120), || async {
        let mut ended = true;
        for p in ["wc-0", "up-0"] {
            let r = row(&api, p).await?;
            let moving = r["moves"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| !matches!(m["phase"].as_str(), Some("done" | "abandoned")));
            ended &= !moving && r["state"] == "running";
        }
        Ok(ended.then_some(()))
    })
    .await?;
    let (
        sent,
        Verdict {
            lost,
            duplicated,
            two_writers,
            max_gap_ms,
        },
    ) = wind_down(&api, &stop, producer, &sent, &preloaded, &output, &commits).await?;
    let (mut max_pause_ms, mut moves) = (None::<f64>, Vec::new());
    for p in ["wc-0", "up-0"] {
        for m in row(&api, p).await?["moves"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(ms) = m["pause_ms"].as_f64() {
                max_pause_ms = Some(max_pause_ms.map_or(ms, |x| x.max(ms)));
            }
            moves.push(format!(
                "{p} {}→{}: {}{}",
                m["from"].as_str().unwrap_or("?"),
                m["to"].as_str().unwrap_or("?"),
                m["phase"].as_str().unwrap_or("?"),
                m["reason"]
                    .as_str()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            ));
        }
    }
    drop(c);
    Ok(Outcome {
        nemesis,
        seed,
        records: preloaded.len() + sent.len(),
        lost,
        duplicated,
        two_writers,
        max_gap_ms,
        max_pause_ms,
        open_txn,
        moves,
    })
}

/// The rows of every partition of `pipelines` once they cover their slots `[0, 2)` and run,
/// with no move or split of them under way.
async fn settled(api: &Api, pipelines: &[&str]) -> Result<Option<Vec<Value>>> {
    let rows = api.partitions().await?;
    for p in pipelines {
        let mine: Vec<&Value> = rows.iter().filter(|r| r["pipeline"] == *p).collect();
        let covered: u64 = mine
            .iter()
            .map(|r| r["slots"][1].as_u64().unwrap_or(0) - r["slots"][0].as_u64().unwrap_or(0))
            .sum();
        let quiet = mine.iter().all(|r| {
            r["state"] == "running"
                && r["splitting"].is_null()
                && r["merging"].is_null()
                && !r["moves"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|m| !matches!(m["phase"].as_str(), Some("done" | "abandoned")))
        });
        if covered != 2 || !quiet {
            return Ok(None);
        }
    }
    Ok(Some(rows))
}

/// A run that strikes the owner of wc-0 while it splits wc-0 (up-0 splits too, unstruck) or
/// while it checkpoints wc-0.
async fn run_on_owner(nemesis: Nemesis, seed: u64, keys: usize, root: &Path) -> Result<Outcome> {
    let mut rng = Rng::new(seed);
    let hold = rng.between(Duration::from_millis(500), Duration::from_millis(3000));
    let steps = format!(
        "{}@{}={}ms",
        nemesis.step(),
        nemesis.key(),
        hold.as_millis()
    );
    // A merge joins two partitions of one slot each, on two hosts: wc-1 moves to wc-0's host.
    let partitions = if nemesis.merges() { 2 } else { 1 };
    let (mut c, input, output, commits) = deploy(root, "faults", steps, partitions).await?;
    let api = c.api()?;
    let preloaded = preload(&api, &input, keys).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(Mutex::new(Vec::new()));
    let producer = produce_until(input.clone(), stop.clone(), sent.clone(), seed);
    tokio::time::sleep(rng.between(Duration::from_millis(500), Duration::from_millis(1500))).await;

    let owner_of = |id: &'static str| {
        let api = api.clone();
        async move {
            Ok::<_, anyhow::Error>(
                row(&api, id).await?["owner"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        }
    };
    let owner = owner_of("wc-0").await?;
    // The host held: wc-0's owner (which merges, and is the target of wc-1's move).
    let held = c.index(&owner)?;
    let oi = match nemesis {
        Nemesis::KillOwnerMerging => c.index(&owner_of("wc-1").await?)?,
        _ => held,
    };
    if nemesis.merges() && oi == held && nemesis == Nemesis::KillOwnerMerging {
        bail!("wc-0 and wc-1 run on one host: nothing moves to merge them");
    }
    // Asked of another host than the owner, which forwards the call; it fails when the owner
    // is struck, and is not waited for.
    let ask_at = (0..3)
        .find(|i| *i != oi && *i != held)
        .unwrap_or((oi + 1) % 3);
    let asker = c.members[ask_at]
        .host
        .as_ref()
        .map(|h| h.api.clone())
        .context("a host runs")?;
    let asks: Vec<(&str, Value)> = if nemesis == Nemesis::KillOwnerCheckpointing {
        vec![("/api/v1/partitions/wc-0/checkpoint", Value::Null)]
    } else if nemesis.merges() {
        vec![
            (
                "/api/v1/partitions/merge",
                json!({"left": "wc-0", "right": "wc-1"}),
            ),
            (
                "/api/v1/partitions/merge",
                json!({"left": "up-0", "right": "up-1"}),
            ),
        ]
    } else {
        vec![
            ("/api/v1/partitions/wc-0/split", json!({"at": 1})),
            ("/api/v1/partitions/up-0/split", json!({"at": 1})),
        ]
    };
    let mut asked = Vec::new();
    for (path, body) in asks {
        let api = asker.clone();
        asked.push(tokio::spawn(async move {
            let r = api.post_json(path, &body).await;
            (
                path,
                r.map(|r| (r.status, r.body)).map_err(|e| e.to_string()),
            )
        }));
    }
    crate::wait_held(
        &c.members[held].dir,
        nemesis.step(),
        nemesis.key(),
        Duration::from_secs(90),
    )
    .await?;
    tokio::time::sleep(rng.between(Duration::ZERO, hold / 2)).await;
    let (struck, open_txn) = strike(&mut c, oi, nemesis.kills(), &output).await?;
    let out_for = if nemesis.kills() {
        rng.between(Duration::from_millis(500), Duration::from_secs(9))
    } else {
        // Past the session timeout: the owner is failed over while it sleeps.
        SESSION + rng.between(Duration::from_secs(1), Duration::from_secs(4))
    };
    revive(&mut c, oi, nemesis.kills(), struck, out_for).await?;
    let api = c.api()?;
    crate::wait_alive(&api, 3).await?;
    let rows = wait_for(
        "every partition running, no split or move under way",
        Duration::from_secs(120),
        || settled(&api, &["wc", "up"]),
    )
    .await?;
    let mut moves = Vec::new();
    for a in asked {
        let (path, r) = a.await?;
        moves.push(match r {
            Ok((status, body)) => format!(
                "{path}: {status} {}",
                body.get("error")
                    .or(body.get("phase"))
                    .map(Value::to_string)
                    .unwrap_or_default()
            ),
            Err(e) => format!("{path}: {e}"),
        });
    }
    moves.push(format!(
        "partitions after: {}",
        rows.iter()
            .map(|r| format!(
                "{}@{}",
                r["id"].as_str().unwrap_or("?"),
                r["owner"].as_str().unwrap_or("?")
            ))
            .collect::<Vec<_>>()
            .join(" ")
    ));
    let (
        sent,
        Verdict {
            lost,
            duplicated,
            two_writers,
            max_gap_ms,
        },
    ) = wind_down(&api, &stop, producer, &sent, &preloaded, &output, &commits).await?;
    drop(c);
    Ok(Outcome {
        nemesis,
        seed,
        records: preloaded.len() + sent.len(),
        lost,
        duplicated,
        two_writers,
        max_gap_ms,
        max_pause_ms: None,
        open_txn,
        moves,
    })
}

/// Strikes host `victim` of `c` (kill -9, or SIGSTOP when not `kills`) and answers how long
/// after the fault what was written before it to `output` and wc's changelog became readable
/// `read_committed` (committed, or aborted by a fence).
async fn strike(
    c: &mut Cluster,
    victim: usize,
    kills: bool,
    output: &str,
) -> Result<(Instant, Duration)> {
    let changelog = format!("{}.wc.counts.changelog", c.cluster);
    let written = |committed: bool| -> Result<Vec<i64>> {
        let mut e = ends(output, 2, committed)?;
        e.extend(ends(&changelog, 2, committed)?);
        Ok(e)
    };
    let before = written(false)?;
    let struck = Instant::now();
    if kills {
        if let Some(h) = c.members[victim].host.take() {
            h.kill9()?;
        }
    } else {
        signal(c.pid(victim)?, "-STOP")?;
    }
    let open_txn = loop {
        let now = written(true)?;
        if now.iter().zip(&before).all(|(n, b)| n >= b) {
            break struck.elapsed();
        }
        if struck.elapsed() > SESSION + Duration::from_secs(30) {
            break struck.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    Ok((struck, open_txn))
}

/// Brings `victim` back `out_for` after `struck`: started again, or SIGCONT.
async fn revive(
    c: &mut Cluster,
    victim: usize,
    kills: bool,
    struck: Instant,
    out_for: Duration,
) -> Result<()> {
    tokio::time::sleep(out_for.saturating_sub(struck.elapsed())).await;
    if kills {
        c.start(victim).await
    } else {
        signal(c.pid(victim)?, "-CONT")
    }
}

/// Stops the producer, waits until both pipelines processed every record, and checks them:
/// the records sent and the verdict.
#[allow(clippy::too_many_arguments)]
async fn wind_down(
    api: &Api,
    stop: &AtomicBool,
    producer: tokio::task::JoinHandle<Result<()>>,
    sent: &Mutex<Vec<(String, String)>>,
    preloaded: &[(String, String)],
    output: &str,
    commits: &str,
) -> Result<(Vec<(String, String)>, Verdict)> {
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    producer.await??;
    let sent = sent.lock().unwrap().clone();
    let total = (preloaded.len() + sent.len()) as u64;
    api.wait_caught_up("wc", total, Duration::from_secs(120))
        .await?;
    api.wait_caught_up("up", total, Duration::from_secs(120))
        .await?;
    let v = verdict(api, &sent, preloaded, output, commits).await?;
    Ok((sent, v))
}

/// What the checker found of everything `sent`.
struct Verdict {
    lost: u64,
    duplicated: u64,
    two_writers: Vec<String>,
    max_gap_ms: f64,
}

/// Checks word count's counts and uppercase's outputs (`output`) against what was `sent`, and
/// the commit records of `commits` for two writers at one epoch and the longest gap.
async fn verdict(
    api: &Api,
    sent: &[(String, String)],
    preloaded: &[(String, String)],
    output: &str,
    commits: &str,
) -> Result<Verdict> {
    // Counts.
    let (mut lost, mut duplicated) = (0u64, 0u64);
    let want = to_count(sent, preloaded);
    for (k, n) in &want {
        let got = api.counter("wc", "counts", k).await?.unwrap_or(0);
        if got < *n {
            lost += (*n - got) as u64;
        } else {
            duplicated += (got - *n) as u64;
        }
    }
    // Outputs, exactly once.
    let mut outputs: BTreeMap<(String, String), i64> = BTreeMap::new();
    for (k, v) in preloaded.iter().chain(sent) {
        *outputs.entry((k.clone(), v.to_uppercase())).or_default() += 1;
    }
    for kv in crate::read_committed(output, 2)? {
        *outputs.entry(kv).or_default() -= 1;
    }
    for n in outputs.values() {
        if *n > 0 {
            lost += *n as u64;
        } else {
            duplicated += n.unsigned_abs();
        }
    }
    // One writer per partition and epoch.
    let mut writers: BTreeMap<(String, u64), BTreeSet<String>> = BTreeMap::new();
    let mut times: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (_, _, v) in crate::read_committed_raw(commits, 1)? {
        let v: Value = serde_json::from_slice(&v.unwrap_or_default())?;
        times
            .entry(v["partition"].as_str().unwrap_or_default().to_string())
            .or_default()
            .push(v["at"].as_i64().unwrap_or_default());
        writers
            .entry((
                v["partition"].as_str().unwrap_or_default().to_string(),
                v["epoch"].as_u64().unwrap_or_default(),
            ))
            .or_default()
            .insert(v["host"].as_str().unwrap_or_default().to_string());
    }
    if writers.is_empty() {
        bail!("no commit was recorded in {commits}");
    }
    let mut max_gap_ms = 0f64;
    for t in times.values_mut() {
        t.sort_unstable();
        for w in t.windows(2) {
            max_gap_ms = max_gap_ms.max((w[1] - w[0]) as f64);
        }
    }
    let two_writers = writers
        .iter()
        .filter(|(_, hosts)| hosts.len() > 1)
        .map(|((p, e), hosts)| format!("{p} at epoch {e}: {hosts:?}"))
        .collect();
    Ok(Verdict {
        lost,
        duplicated,
        two_writers,
        max_gap_ms,
    })
}

/// The harness's table of `outcomes`, a row per scenario.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut out = String::from(
        "| scenario | runs | records | lost | duplicated | two writers | max pause ms | max move pause ms | max open txn s | pass |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for n in Nemesis::ALL {
        let rows: Vec<&Outcome> = outcomes.iter().filter(|o| o.nemesis == *n).collect();
        if rows.is_empty() {
            continue;
        }
        let pause = rows
            .iter()
            .filter_map(|o| o.max_pause_ms)
            .fold(None::<f64>, |a, b| Some(a.map_or(b, |a| a.max(b))));
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {:.0} | {} | {:.1} | {} |\n",
            n.name(),
            rows.len(),
            rows.iter().map(|o| o.records).sum::<usize>(),
            rows.iter().map(|o| o.lost).sum::<u64>(),
            rows.iter().map(|o| o.duplicated).sum::<u64>(),
            rows.iter().map(|o| o.two_writers.len()).sum::<usize>(),
            rows.iter().map(|o| o.max_gap_ms).fold(0.0, f64::max),
            pause.map_or("-".into(), |p| format!("{p:.1}")),
            rows.iter()
                .map(|o| o.open_txn.as_secs_f64())
                .fold(0.0, f64::max),
            if rows.iter().all(|o| o.passed()) {
                "yes"
            } else {
                "NO"
            },
        ));
    }
    out
}

/// What a churn run found ([`churn`]).
#[derive(Debug, Clone)]
pub struct Churn {
    /// Moves asked for, and those refused at once (with the answer).
    pub requested: usize,
    /// Requests refused, each with its answer.
    pub refused: Vec<String>,
    /// Moves done.
    pub done: usize,
    /// Moves abandoned because a host they involved left, restarted, was failed over or did not
    /// answer (or drain), or because they timed out: each with its reason.
    pub abandoned_for_a_host: Vec<String>,
    /// Moves abandoned for any other reason: races, each with its reason.
    pub abandoned_otherwise: Vec<String>,
    /// The pauses of the moves done, ms, sorted.
    pub pauses_ms: Vec<f64>,
    /// The moves done with a pause over 100 ms, with their steps.
    pub slow: Vec<String>,
    /// Records sent.
    pub records: usize,
    /// The checker's findings, as in [`Outcome`].
    pub lost: u64,
    /// Counts past what was sent, plus outputs written twice.
    pub duplicated: u64,
    /// Partitions committed by two hosts at one epoch.
    pub two_writers: Vec<String>,
}

impl Churn {
    /// The pause at quantile `q` of the moves done, ms.
    pub fn pause(&self, q: f64) -> Option<f64> {
        let n = self.pauses_ms.len();
        (n > 0).then(|| self.pauses_ms[((n as f64 * q).ceil() as usize).clamp(1, n) - 1])
    }

    /// Whether nothing was lost or doubled and no two hosts wrote one epoch.
    pub fn passed(&self) -> bool {
        self.lost == 0 && self.duplicated == 0 && self.two_writers.is_empty()
    }
}

/// Churn: three hosts run word count and uppercase in two partitions each (4 partitions)
/// under exactly-once while records keep coming; `moves` moves are asked for 0.7 s apart, each
/// of a random partition to a random other host, and halfway one host is killed (`kill -9`)
/// and started again 3 s later. Every move's end is collected as it happens; the checker then
/// asks what [`run`]'s does.
///
/// `keys`: distinct keys preloaded before the moves ([`preload`]); 0 for none.
pub async fn churn(moves: usize, seed: u64, keys: usize) -> Result<Churn> {
    let root = tempfile::tempdir()?;
    let result = churn_in(moves, seed, keys, root.path()).await;
    if !result.as_ref().is_ok_and(Churn::passed) {
        let kept = root.keep();
        eprintln!(
            "churn (seed {seed}): the hosts' data dirs and logs are kept in {}",
            kept.display()
        );
        return result.with_context(|| format!("the hosts' logs are in {}", kept.display()));
    }
    result
}

const CHURNED: [&str; 4] = ["wc-0", "wc-1", "up-0", "up-1"];

/// Every move of the churned partitions `api` shows, by id, over what `seen` had.
async fn collect_moves(api: &Api, seen: &mut BTreeMap<String, Value>) -> Result<()> {
    for p in api.partitions().await? {
        if !CHURNED.contains(&p["id"].as_str().unwrap_or_default()) {
            continue;
        }
        for m in p["moves"].as_array().into_iter().flatten() {
            if let Some(id) = m["id"].as_str() {
                seen.insert(id.to_string(), m.clone());
            }
        }
    }
    Ok(())
}

async fn churn_in(moves: usize, seed: u64, keys: usize, root: &Path) -> Result<Churn> {
    let mut rng = Rng::new(seed);
    let hosts = ["a", "b", "c"];
    let (mut c, input, output, commits) = deploy(root, "churn", String::new(), 2).await?;
    let preloaded = preload(&c.api()?, &input, keys).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(Mutex::new(Vec::new()));
    let producer = produce_until(input.clone(), stop.clone(), sent.clone(), seed);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mut seen = BTreeMap::new();
    let (mut requested, mut refused) = (0, Vec::new());
    let victim = rng.pick(&[0usize, 1, 2]);
    let mut killed_at = None;
    for i in 0..moves {
        if i == moves / 2 {
            if let Some(h) = c.members[victim].host.take() {
                h.kill9()?;
            }
            killed_at = Some(Instant::now());
        }
        if killed_at.is_some_and(|t| t.elapsed() >= Duration::from_secs(3))
            && c.members[victim].host.is_none()
        {
            c.start(victim).await?;
        }
        let api = c.api()?;
        let p = rng.pick(&CHURNED);
        let owner = row(&api, p).await?["owner"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let to = rng.pick(
            &hosts
                .into_iter()
                .filter(|h| *h != owner)
                .collect::<Vec<_>>(),
        );
        requested += 1;
        if let Err(e) = request_move(&api, p, to).await {
            refused.push(format!("{e:#}"));
        }
        let next = Instant::now() + Duration::from_millis(700);
        while Instant::now() < next {
            collect_moves(&api, &mut seen).await?;
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }
    if c.members[victim].host.is_none() {
        c.start(victim).await?;
    }
    let api = c.api()?;
    crate::wait_alive(&api, 3).await?;
    wait_for("the moves ended", Duration::from_secs(120), || async {
        let mut now = BTreeMap::new();
        collect_moves(&api, &mut now).await?;
        let mut ended = true;
        for p in CHURNED {
            ended &= row(&api, p).await?["state"] == "running";
        }
        ended &= now
            .values()
            .all(|m| matches!(m["phase"].as_str(), Some("done" | "abandoned")));
        Ok(ended.then_some(()))
    })
    .await?;
    collect_moves(&api, &mut seen).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    producer.await??;
    let sent = sent.lock().unwrap().clone();
    let total = (preloaded.len() + sent.len()) as u64;
    api.wait_caught_up("wc", total, Duration::from_secs(120))
        .await?;
    api.wait_caught_up("up", total, Duration::from_secs(120))
        .await?;
    let v = verdict(&api, &sent, &preloaded, &output, &commits).await?;
    let (mut done, mut for_a_host, mut otherwise, mut pauses) =
        (0, Vec::new(), Vec::new(), Vec::new());
    let mut slow = Vec::new();
    for m in seen.values() {
        match m["phase"].as_str() {
            Some("done") => {
                done += 1;
                if let Some(ms) = m["pause_ms"].as_f64() {
                    pauses.push(ms);
                    if ms > 100.0 {
                        slow.push(format!(
                            "{} {}→{}: {ms:.1} ms, steps {}",
                            m["partition"].as_str().unwrap_or("?"),
                            m["from"].as_str().unwrap_or("?"),
                            m["to"].as_str().unwrap_or("?"),
                            m["steps"]
                        ));
                    }
                }
            }
            Some("abandoned") => {
                let reason = m["reason"].as_str().unwrap_or_default();
                let what = format!(
                    "{} {}→{}: {reason}",
                    m["partition"].as_str().unwrap_or("?"),
                    m["from"].as_str().unwrap_or("?"),
                    m["to"].as_str().unwrap_or("?")
                );
                if [
                    "left the cluster",
                    "restarted",
                    "reported no address",
                    "failed over",
                    "did not answer",
                    "did not drain",
                    "timed out",
                    "time out",
                ]
                .iter()
                .any(|w| reason.contains(w))
                {
                    for_a_host.push(what);
                } else {
                    otherwise.push(what);
                }
            }
            _ => {}
        }
    }
    pauses.sort_by(f64::total_cmp);
    drop(c);
    Ok(Churn {
        requested,
        refused,
        done,
        abandoned_for_a_host: for_a_host,
        abandoned_otherwise: otherwise,
        pauses_ms: pauses,
        slow,
        records: preloaded.len() + sent.len(),
        lost: v.lost,
        duplicated: v.duplicated,
        two_writers: v.two_writers,
    })
}
