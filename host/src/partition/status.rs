//! What a partition's loop reports while it runs: its phase, the offsets it committed, its
//! counters, where its time goes and its batch latency.

use super::*;

/// What a partition is doing.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Opening state and instantiating.
    Starting,
    /// Catching state up from the changelog (or re-sending the outbox).
    Restoring,
    /// Processing.
    Running,
    /// Between sessions after an error; the message says which.
    Recovering(String),
    /// Stopped on request.
    Stopped,
    /// Stopped by an error it cannot get past; the message says which.
    Failed(String),
}

/// Progress of one input slot.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct SlotProgress {
    /// Input topic.
    pub topic: String,
    /// Slot.
    pub slot: u32,
    /// Next offset to process (all before it are committed).
    pub offset: u64,
    /// The topic partition's end offset when last looked at.
    pub end: u64,
}

/// Live status of a partition, shared with the HTTP layer.
pub struct PartitionStatus {
    /// Wakes the running session's fetch, so that a command is acted on at once rather than
    /// after the fetch's wait (none on the embedded log, whose waits are short).
    pub fetch_waker: Mutex<Option<crate::transport::FetchWaker>>,
    /// Phase.
    pub phase: Mutex<Phase>,
    /// Per-slot progress.
    pub progress: Mutex<Vec<SlotProgress>>,
    /// Records processed since start.
    pub records: AtomicU64,
    /// Records sent to the dead-letter topic since start (those of pending batches included).
    pub dead_letters: AtomicU64,
    /// `dead_letters` as of the last commit.
    pub committed_dead_letters: AtomicU64,
    /// Commits since start.
    pub batches: AtomicU64,
    /// The last processing error (dead-lettered or not), if any.
    pub last_error: Mutex<Option<String>>,
    /// Progress of the last restore.
    pub restore: Mutex<Option<RestoreProgress>>,
    /// Where the loop's time went.
    pub time: LoopTime,
    /// Hot swaps.
    pub swap: SwapStatus,
    /// Records sent to outputs (dead letters included) since start.
    pub records_out: AtomicU64,
    /// Time from a batch's last fetched record to its commit.
    pub batch_latency: Histogram,
    /// The module version running now.
    pub version: Mutex<String>,
    /// Sessions that ended in a panic since start.
    pub panics: AtomicU64,
    /// Sessions that ended in an error and were started again since start (a failed commit, a
    /// broker error, a fenced producer, a stalled input).
    pub session_failures: AtomicU64,
    /// Replays of dead letters in progress.
    pub replay: Mutex<Vec<ReplayProgress>>,
    /// When the partition here first called the guest with records (the end of a move's
    /// pause).
    pub first_call: Mutex<Option<Instant>>,
    /// When its first fetch here returned, with records or not.
    pub first_fetch: Mutex<Option<Instant>>,
    /// Whether input records were waiting when its first session here began processing.
    pub waiting_at_start: AtomicBool,
    /// Whether a session of this loop restored its state and ran: until then, what the
    /// database holds may be older than the changelogs.
    pub restored: AtomicBool,
    /// When each step of the first session's start ended (for a move's pause breakdown).
    pub steps: Mutex<Vec<(&'static str, Instant)>>,
    /// The checkpoint its database was restored from when it started here, if any.
    pub restored_from: Mutex<Option<crate::state::checkpoint::Restored>>,
    /// Its last checkpoint (taken here, or the newest in the store when it started here).
    pub last_checkpoint: Mutex<Option<crate::state::checkpoint::CheckpointInfo>>,
    /// Why its last checkpoint here failed, until one succeeds.
    pub checkpoint_error: Mutex<Option<String>>,
    /// Checkpoints taken here since it started here.
    pub checkpoints: AtomicU64,
    /// Checkpoints that failed here since it started here.
    pub checkpoint_failures: AtomicU64,
    /// Bytes its checkpoints here uploaded.
    pub checkpoint_uploaded_bytes: AtomicU64,
}

/// Cumulative time of the partition loop by step, in microseconds.
#[derive(Default)]
pub struct LoopTime {
    /// Waiting for and reading input.
    pub fetch_us: AtomicU64,
    /// Guest calls (Wasm or native), state reads included.
    pub process_us: AtomicU64,
    /// Committing: the transport (transaction, flush) and the RocksDB write.
    pub commit_us: AtomicU64,
}

/// [`LoopTime`] as the partition table shows it, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize, Default, schemars::JsonSchema)]
pub struct LoopTimeMs {
    /// Waiting for and reading input.
    pub fetch: u64,
    /// Guest calls.
    pub process: u64,
    /// Commits.
    pub commit: u64,
}

impl LoopTime {
    /// A snapshot in milliseconds.
    pub fn snapshot(&self) -> LoopTimeMs {
        let ms = |a: &AtomicU64| a.load(Ordering::Relaxed) / 1000;
        LoopTimeMs {
            fetch: ms(&self.fetch_us),
            process: ms(&self.process_us),
            commit: ms(&self.commit_us),
        }
    }
}

/// Upper bounds of [`Histogram`] buckets, in seconds.
pub const HISTOGRAM_BOUNDS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A latency histogram for Prometheus: per-bucket counts (the last one is +Inf) and a sum.
#[derive(Default)]
pub struct Histogram {
    /// Counts per bucket of [`HISTOGRAM_BOUNDS`], then one for larger values.
    pub buckets: [AtomicU64; 14],
    /// Sum of the observations, in microseconds.
    pub sum_us: AtomicU64,
}

impl Histogram {
    /// Adds an observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = HISTOGRAM_BOUNDS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(HISTOGRAM_BOUNDS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }
}

impl PartitionStatus {
    /// A status in the starting phase.
    pub fn new() -> Self {
        PartitionStatus {
            phase: Mutex::new(Phase::Starting),
            progress: Mutex::new(Vec::new()),
            records: AtomicU64::new(0),
            dead_letters: AtomicU64::new(0),
            committed_dead_letters: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            last_error: Mutex::new(None),
            restore: Mutex::new(None),
            time: LoopTime::default(),
            swap: SwapStatus::default(),
            records_out: AtomicU64::new(0),
            batch_latency: Histogram::default(),
            version: Mutex::new(String::new()),
            panics: AtomicU64::new(0),
            session_failures: AtomicU64::new(0),
            replay: Mutex::new(Vec::new()),
            first_call: Mutex::new(None),
            first_fetch: Mutex::new(None),
            waiting_at_start: AtomicBool::new(true),
            restored: AtomicBool::new(false),
            steps: Mutex::new(Vec::new()),
            restored_from: Mutex::new(None),
            last_checkpoint: Mutex::new(None),
            checkpoint_error: Mutex::new(None),
            checkpoints: AtomicU64::new(0),
            checkpoint_failures: AtomicU64::new(0),
            checkpoint_uploaded_bytes: AtomicU64::new(0),
            fetch_waker: Mutex::new(None),
        }
    }
}

impl Default for PartitionStatus {
    fn default() -> Self {
        Self::new()
    }
}
