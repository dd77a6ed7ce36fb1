//! One partition's loop: fetch a batch from its slots → process each slot's records in the
//! guest → commit state, outputs and input offsets atomically. It owns the partition's instance
//! and batch overlay and is the only writer of the partition's database.
//!
//! The loop runs in sessions. A session asks its [`PartitionIo`] to restore state and to say
//! where each input slot resumes, then processes batches until stopped or until an error; after
//! an error (a broker restart, a failed transaction) the next session starts from what was
//! committed, after a back-off. How a batch commits depends on the transport (see [`io`]).

pub mod commands;
pub mod events;
pub mod io;
pub mod kafka;
pub mod peers;
pub mod report;
pub mod supervisor;
pub mod swap;
pub mod tail;

pub use commands::{Command, Inbox, Wants};
pub use events::{Event, EventKind, EventLog};
pub use io::{Batch, EmbeddedIo, PartitionIo, ReplayRanges, RestoreProgress, replay_window};
pub use swap::{ModuleTarget, RollbackHook, Settings, SwapOutcome, SwapReport, SwapStatus, Target};

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;

use crate::control::PipelineRecord;
use crate::runtime::{CallError, Cursor, HostCtx, Instance, Message, Output, Runtime};
use crate::state::{PartitionDb, Writes};
use crate::transport::{LogRecord, Record};

/// The dead letters a pipeline replays (`POST /api/v1/pipelines/{p}/dead-letters/replay`),
/// shared by its partitions: a request bumps the generation, and each partition starts a new
/// session at its next batch boundary to read them. Replayed dead letters go through the
/// current version; the replay's progress is committed with each batch, as input offsets are,
/// so each dead letter is processed exactly once.
#[derive(Default)]
pub struct ReplayPlan {
    generation: AtomicU64,
    ranges: Mutex<ReplayRanges>,
}

impl ReplayPlan {
    /// A plan with the ranges requested so far.
    pub fn new(ranges: ReplayRanges) -> Arc<Self> {
        Arc::new(ReplayPlan {
            generation: AtomicU64::new(0),
            ranges: Mutex::new(ranges),
        })
    }

    /// Bumped by each request.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Every range requested, per slot.
    pub fn ranges(&self) -> ReplayRanges {
        self.ranges.lock().clone()
    }

    /// Adds a range of a slot's dead letters.
    pub fn add(&self, slot: u32, from: u64, to: u64) {
        self.ranges.lock().entry(slot).or_default().push((from, to));
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}

/// How far the replay of one slot's dead letters is.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct ReplayProgress {
    /// The slot (and partition of the dead-letter topic).
    pub slot: u32,
    /// The next dead letter to replay.
    pub offset: u64,
    /// Where the range being replayed ends (exclusive).
    pub to: u64,
}

/// How long a fetch waits for input when nothing is pending.
const FETCH_WAIT: Duration = Duration::from_millis(100);

/// Most bytes of state writes pending in a partition, whatever the commit interval: with many
/// partitions and a long interval, the overlay would otherwise hold a great deal of memory.
const MAX_PENDING_BYTES: usize = 8 << 20;

/// With batches pending, how long a fetch waits for input before the input counts as run dry
/// and they commit.
const IDLE_COMMIT: Duration = Duration::from_millis(50);

/// How long a fetch waits for input while only a commit is in flight: then the commit is
/// finished (its writes settled, the progress shown) soon after it is done.
const IN_FLIGHT_WAIT: Duration = Duration::from_millis(2);

/// How often every slot is checked for processing-time timers and expiries that fell due.
const TIME_CHECK: Duration = Duration::from_millis(100);

/// Most timers handed to one `on-timers` call.
const MAX_TIMERS_PER_CALL: usize = 1000;

/// Most `on-timers` calls per slot per check; what is left fires at the next check.
const MAX_TIMER_CALLS: usize = 8;

/// Most expired entries removed per slot per check.
const MAX_SWEEP: usize = 10_000;

/// Opens a session's [`PartitionIo`].
pub type IoFactory = Box<dyn Fn() -> anyhow::Result<Box<dyn PartitionIo>> + Send + Sync>;

/// Tuning of the partition loop.
#[derive(Debug, Clone)]
pub struct TaskConfig {
    /// Most records per fetched batch.
    pub max_batch: usize,
    /// Most records per guest call.
    pub max_call: usize,
    /// Most records processed between two commits, whatever the commit interval.
    pub max_pending: u64,
}

impl Default for TaskConfig {
    fn default() -> Self {
        TaskConfig {
            max_batch: 8192,
            max_call: 512,
            max_pending: 65_536,
        }
    }
}

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

fn add_elapsed(counter: &AtomicU64, since: Instant) -> Instant {
    let now = Instant::now();
    counter.fetch_add((now - since).as_micros() as u64, Ordering::Relaxed);
    now
}

/// Everything a partition task needs.
pub struct PartitionTask {
    /// Partition id, unique in the host.
    pub id: String,
    /// The pipeline.
    pub pipeline: Arc<PipelineRecord>,
    /// Slots owned.
    pub slots: Range<u32>,
    /// The partition's database.
    pub db: Arc<PartitionDb>,
    /// Opens the transport side of a session (clients, fencing).
    pub io: IoFactory,
    /// Declared output topics (and the dead-letter topic) and the size limits of writes.
    pub outputs: Arc<crate::runtime::WriteLimits>,
    /// The runtime.
    pub runtime: Arc<Runtime>,
    /// The module version the pipeline should run (hot swaps change it).
    pub target: Arc<ModuleTarget>,
    /// Told when this partition rejects a new version.
    pub on_rollback: RollbackHook,
    /// The pipeline's events.
    pub events: Arc<EventLog>,
    /// Tuning.
    pub config: TaskConfig,
    /// Shared status.
    pub status: Arc<PartitionStatus>,
    /// Commands from the supervisor: stop, drain, checkpoint, fence.
    pub inbox: Inbox,
    /// After Kafka refused a record for good: the offsets up to which records are processed
    /// one per commit, to find that record.
    pub isolate: Mutex<Option<Vec<Vec<u64>>>>,
    /// Dead letters to replay.
    pub replays: Arc<ReplayPlan>,
    /// The generation of the target this partition refused last (0: none).
    pub rejected: AtomicU64,
    /// Whether this host still owns the partition at its newest epoch, asked before each
    /// session with the control log read to its end: a host that was paused past its session
    /// timeout stops instead of fencing the partition's new owner.
    pub owns: OwnershipCheck,
    /// The target when the partition was started: its first session runs it, so that a swap
    /// requested before that session began happens at a batch boundary, with its report and
    /// probation, like any other.
    pub initial: Mutex<Option<Target>>,
    /// The host's protocol steps, where a test can hold this partition.
    pub steps: Arc<crate::steps::Steps>,
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
            replay: Mutex::new(Vec::new()),
            first_call: Mutex::new(None),
            first_fetch: Mutex::new(None),
            waiting_at_start: AtomicBool::new(true),
            restored: AtomicBool::new(false),
            steps: Mutex::new(Vec::new()),
        }
    }
}

impl Default for PartitionStatus {
    fn default() -> Self {
        Self::new()
    }
}

/// See [`PartitionTask::owns`].
pub type OwnershipCheck = Arc<dyn Fn() -> bool + Send + Sync>;

/// The meta key of the next input offset of `slot` in `topic`.
pub fn input_offset_key(topic: &str, slot: u32) -> String {
    format!("in/{topic}/{slot}")
}

/// The meta key of the changelog position (next offset) of `slot` of `store`.
pub fn changelog_offset_key(store: &str, slot: u32) -> String {
    format!("cl/{store}/{slot}")
}

impl PartitionTask {
    /// Runs the loop until stopped or failed. Blocking: call it on a thread of its own.
    ///
    /// A session that ends in an error is retried after a back-off that doubles up to 5 s and
    /// starts again from 100 ms after a healthy session (one that committed a batch). A panic
    /// in a session is caught: the partition shows `failed` with the panic's message until the
    /// back-off ends, then starts a new session.
    pub fn run(self) {
        let span =
            tracing::info_span!("partition", id = %self.id, pipeline = %self.pipeline.spec.name);
        let _g = span.enter();
        const FIRST_BACKOFF: Duration = Duration::from_millis(100);
        let mut backoff = FIRST_BACKOFF;
        loop {
            match self.inbox.wants() {
                Wants::Stop | Wants::Fence => {
                    // Between sessions nothing is pending: what was committed last stands.
                    *self.status.phase.lock() = Phase::Stopped;
                    self.inbox.done(self.status.progress.lock().clone());
                    return;
                }
                // Nothing pending to commit: answered with what was committed last.
                Wants::Checkpoint => self.inbox.done(self.status.progress.lock().clone()),
                Wants::Nothing => {}
            }
            if !(self.owns)() {
                // Assigned elsewhere since: starting a session would fence the new owner.
                tracing::info!("no longer assigned here: stopped");
                *self.status.phase.lock() = Phase::Stopped;
                return;
            }
            let batches_before = self.status.batches.load(Ordering::Relaxed);
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.session()));
            // Dead letters of batches that did not commit are dead-lettered again, and counted
            // again, by the next session.
            self.status.dead_letters.store(
                self.status.committed_dead_letters.load(Ordering::Relaxed),
                Ordering::Relaxed,
            );
            if self.status.batches.load(Ordering::Relaxed) > batches_before {
                backoff = FIRST_BACKOFF;
            }
            let phase = match outcome {
                Ok(Ok(())) => {
                    *self.status.phase.lock() = Phase::Stopped;
                    return;
                }
                Ok(Err(SessionError::Restart)) => continue,
                Ok(Err(SessionError::Fatal(msg))) => {
                    tracing::error!("partition failed: {msg}");
                    *self.status.phase.lock() = Phase::Failed(msg);
                    return;
                }
                Ok(Err(SessionError::Retry(e))) => {
                    let msg = format!("{e:#}");
                    tracing::warn!("partition session ended: {msg}; retrying in {backoff:?}");
                    *self.status.last_error.lock() = Some(msg.clone());
                    Phase::Recovering(msg)
                }
                Err(panic) => {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic without a message".into());
                    let msg =
                        format!("partition thread panicked: {what}; restarting in {backoff:?}");
                    tracing::error!("{msg}");
                    *self.status.last_error.lock() = Some(msg.clone());
                    self.status.panics.fetch_add(1, Ordering::Relaxed);
                    Phase::Failed(msg)
                }
            };
            *self.status.phase.lock() = phase;
            let until = Instant::now() + backoff;
            while Instant::now() < until && self.inbox.wants() == Wants::Nothing {
                std::thread::sleep(Duration::from_millis(20));
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    fn new_instance(&self, target: &Target) -> Result<Instance, SessionError> {
        self.try_instance(target)
            .map_err(InstanceError::into_session)
    }

    /// An initialised instance of a target (its module with its settings), or why there is none.
    fn try_instance(&self, target: &Target) -> Result<Instance, InstanceError> {
        self.instance_with(target, self.fresh_ctx(&target.settings))
    }

    fn instance_with(&self, target: &Target, ctx: HostCtx) -> Result<Instance, InstanceError> {
        let name = &self.pipeline.spec.module;
        let mut inst = self
            .runtime
            .instantiate(&target.module, ctx)
            .map_err(|e| InstanceError::Module(format!("instantiating module {name}: {e:#}")))?;
        if let Err(e) = inst.init(&target.settings.config) {
            // A state read that failed during `init` is the host's fault, not the module's.
            return Err(match inst.ctx().host_fault.take() {
                Some(f) => InstanceError::Host(format!("host failure during init: {f}")),
                None => InstanceError::Module(format!("init of module {name} failed: {e}")),
            });
        }
        Ok(inst)
    }

    /// Replaces a trapped instance, keeping the batch's pending writes and outputs.
    fn replace_instance(&self, target: &Target, inst: Instance) -> Result<Instance, SessionError> {
        let mut ctx = inst.into_ctx();
        ctx.reset_instance_resources();
        self.instance_with(target, ctx)
            .map_err(InstanceError::into_session)
    }

    fn fresh_ctx(&self, settings: &Settings) -> HostCtx {
        let mut limits = (*self.outputs).clone();
        limits.max_key_bytes = settings.limits.max_key_bytes as usize;
        limits.max_value_bytes = settings.limits.max_value_bytes as usize;
        limits.max_timers = settings.limits.max_timers;
        HostCtx::new(
            self.pipeline.spec.name.as_str().into(),
            self.db.clone(),
            Arc::new(limits),
            settings.limits.memory_bytes as usize,
            settings.wasi.clone(),
        )
    }

    /// Epoch ticks of one guest call's CPU budget. Each call gets the whole of `limits.cpu_ms`:
    /// a long batch never shortens the calls that follow it. The deadline fires on a tick, so
    /// one tick more makes the budget at least `cpu_ms`, never less.
    fn call_ticks(&self, settings: &Settings) -> u64 {
        (settings.limits.cpu_ms / crate::runtime::EPOCH_TICK.as_millis() as u64).max(1) + 1
    }

    /// At a batch boundary: switches to the target's new generation, if any. On failure the
    /// partition keeps (or goes back to) the version it ran and reports the rollback.
    fn maybe_swap(&self, mut inst: Instance, run: &mut Running) -> Result<Instance, SessionError> {
        let generation = self.target.generation();
        if generation == run.current.generation || generation == run.rejected {
            return Ok(inst);
        }
        let target = self.target.get();
        if target.module.sha256 == run.current.module.sha256
            && target.settings == run.current.settings
        {
            // Same code (e.g. the pipeline went back to what this partition already runs).
            *self.status.version.lock() = target.version.clone();
            self.status.swap.record(SwapReport {
                at: crate::control::now_ms(),
                generation: target.generation,
                version: target.version.clone(),
                outcome: SwapOutcome::Swapped,
                reason: None,
                pause_us: 0,
                timers_pending: 0,
            });
            run.current = target;
            run.previous = None;
            run.probation = 0;
            return Ok(inst);
        }
        let started = Instant::now();
        // A commit boundary: nothing is pending in the old instance's context.
        debug_assert!(inst.ctx().overlay.is_empty() && !inst.ctx().overlay.is_committing());
        drop(inst);
        match self.try_instance(&target) {
            Ok(mut new) => {
                let pause_us = started.elapsed().as_micros() as u64;
                let timers_pending = if new.takes_timers() {
                    0
                } else {
                    let n = new.ctx().pending_timers(self.slots.clone());
                    host_op(&mut new, n)?
                };
                tracing::info!(version = %target.version, pause_us, "module swapped");
                self.events.push(
                    EventKind::Swap,
                    None,
                    format!(
                        "now running version {} (paused {pause_us} µs)",
                        target.version
                    ),
                    &self.id,
                    None,
                );
                *self.status.version.lock() = target.version.clone();
                self.status.swap.record(SwapReport {
                    at: crate::control::now_ms(),
                    generation: target.generation,
                    version: target.version.clone(),
                    outcome: SwapOutcome::Swapped,
                    reason: None,
                    pause_us,
                    timers_pending,
                });
                run.probation = target.settings.swap.probation_batches;
                run.previous = Some(std::mem::replace(&mut run.current, target));
                Ok(new)
            }
            Err(InstanceError::Host(e)) => Err(SessionError::Retry(anyhow::anyhow!(e))),
            Err(InstanceError::Module(reason)) => {
                let back = self.new_instance(&run.current)?;
                self.reject(run, &target, reason, started);
                Ok(back)
            }
        }
    }

    fn reject(&self, run: &mut Running, target: &Target, reason: String, started: Instant) {
        let pause_us = started.elapsed().as_micros() as u64;
        tracing::warn!(version = %target.version, "module version rolled back: {reason}");
        self.events.push(
            EventKind::Rollback,
            None,
            format!("version {} rolled back: {reason}", target.version),
            &self.id,
            None,
        );
        run.rejected = target.generation;
        // Kept across sessions: until the rollback is recorded the target still names this
        // generation, and a new session must not start on it.
        self.rejected.store(target.generation, Ordering::Relaxed);
        // The pipeline goes back first, so that whoever sees this report sees the rollback.
        (self.on_rollback)(target.generation, reason.clone());
        self.status.swap.record(SwapReport {
            at: crate::control::now_ms(),
            generation: target.generation,
            version: target.version.clone(),
            outcome: SwapOutcome::RolledBack,
            reason: Some(reason),
            pause_us,
            timers_pending: 0,
        });
    }

    /// Runs a batch's records through the guest; returns the instance to use next.
    fn process_batch(
        &self,
        mut inst: Instance,
        target: &Target,
        groups: &[(u32, Vec<Message>)],
        dlq: &str,
    ) -> Result<Instance, SessionError> {
        for (slot, msgs) in groups {
            for chunk in msgs.chunks(self.config.max_call) {
                inst = self.process_chunk(inst, target, *slot, chunk, dlq)?;
            }
        }
        // The batch moved these slots' event time: their timers may be due.
        for (slot, _) in groups {
            inst = self.fire_timers(inst, target, *slot, dlq)?.0;
        }
        Ok(inst)
    }

    /// Fires the timers of `slot` that fell due and removes its expired entries, as calls of
    /// their own that commit with the pending batches. Returns the instance to use next and
    /// how many timers and entries there were.
    fn fire_timers(
        &self,
        mut inst: Instance,
        target: &Target,
        slot: u32,
        dlq: &str,
    ) -> Result<(Instance, usize), SessionError> {
        let cursor = Cursor {
            topic: self.pipeline.spec.inputs[0].clone(),
            slot,
            offset: 0,
            timestamp: 0,
        };
        inst.ctx().begin_call(cursor.clone());
        let now = crate::runtime::host::now_ms();
        let swept = inst.ctx().sweep_expired(slot, now, MAX_SWEEP);
        let mut n = host_op(&mut inst, swept)?;
        inst.ctx().keep_call();
        if !inst.takes_timers() {
            return Ok((inst, n));
        }
        let ticks = self.call_ticks(&target.settings);
        for _ in 0..MAX_TIMER_CALLS {
            inst.ctx().begin_call(cursor.clone());
            let due = inst.ctx().due_timers(slot, now, MAX_TIMERS_PER_CALL);
            let due = host_op(&mut inst, due)?;
            let Some(first) = due.first() else {
                inst.ctx().keep_call();
                break;
            };
            inst.ctx().cursor.timestamp = first.at;
            n += due.len();
            inst = self.fire(inst, target, &due, ticks, dlq)?;
        }
        Ok((inst, n))
    }

    /// Fires `due` in one call; when it fails, each timer alone, and one that still fails is
    /// dropped with a dead letter. The call was begun by the caller.
    fn fire(
        &self,
        mut inst: Instance,
        target: &Target,
        due: &[crate::runtime::time::DueTimer],
        ticks: u64,
        dlq: &str,
    ) -> Result<Instance, SessionError> {
        let cursor = inst.ctx().cursor.clone();
        let removed = inst.ctx().remove_timers(due);
        host_op(&mut inst, removed)?;
        let result = inst.on_timers(due, ticks);
        let (mut inst, err) = self.end_call(inst, target, result)?;
        let Some(err) = err else {
            return Ok(inst);
        };
        if due.len() > 1 {
            for t in due {
                inst.ctx().begin_call(Cursor {
                    timestamp: t.at,
                    ..cursor.clone()
                });
                inst = self.fire(inst, target, std::slice::from_ref(t), ticks, dlq)?;
            }
            return Ok(inst);
        }
        // One timer that fails alone: it is removed, and its dead letter says why.
        let t = &due[0];
        inst.ctx().begin_call(cursor.clone());
        let removed = inst.ctx().remove_timers(due);
        host_op(&mut inst, removed)?;
        inst.ctx().keep_call();
        let clock = match t.clock {
            crate::runtime::time::Clock::Event => "event-time",
            crate::runtime::time::Clock::Processing => "processing-time",
        };
        let msg = format!("timer ({clock} at {}) failed: {err}", t.at);
        self.events.push(
            EventKind::Error,
            None,
            format!("{msg}; sent to {dlq}"),
            &self.id,
            Some(&cursor),
        );
        tracing::warn!(slot = cursor.slot, "{msg}; sent to {dlq}");
        let partitions = self
            .outputs
            .outputs
            .get(dlq)
            .map_or(self.pipeline.spec.slots, |o| o.partitions)
            .max(1);
        self.status.dead_letters.fetch_add(1, Ordering::Relaxed);
        *self.status.last_error.lock() = Some(format!("slot {}: {msg}", cursor.slot));
        inst.ctx().push_dead_letter(Output {
            topic: dlq.to_string(),
            partition: cursor.slot % partitions,
            record: Record {
                key: Some(t.key.clone()),
                value: t.payload.clone(),
                headers: vec![
                    ("baton.error".into(), msg.into_bytes()),
                    (
                        "baton.timer".into(),
                        format!("{clock}:{}", t.at).into_bytes(),
                    ),
                    ("baton.slot".into(), cursor.slot.to_string().into_bytes()),
                ],
                timestamp: t.at,
            },
        });
        Ok(inst)
    }

    fn session(&self) -> Result<(), SessionError> {
        let rejected = self.rejected.load(Ordering::Relaxed);
        let mut current = self
            .initial
            .lock()
            .take()
            .unwrap_or_else(|| self.target.get());
        if current.generation == rejected
            && let Some(previous) = self.target.rollback_target(rejected)
        {
            // This partition refused the target's version and the rollback is not recorded
            // yet: go on with the version before it.
            current = previous;
        }
        *self.status.version.lock() = current.version.clone();
        let step = |name: &'static str| {
            let mut steps = self.status.steps.lock();
            if steps.len() < 8 {
                steps.push((name, Instant::now()));
            }
        };
        step("session");
        let mut inst = self.new_instance(&current)?;
        step("instance");
        let mut run = Running {
            current,
            previous: None,
            rejected,
            probation: 0,
        };
        let mut io = (self.io)().map_err(SessionError::from_io)?;
        step("clients");

        self.steps.pass(crate::steps::SESSION_RESTORE, &self.id);
        *self.status.phase.lock() = Phase::Restoring;
        let status = self.status.clone();
        io.restore(&self.db, &move |p| *status.restore.lock() = Some(p))
            .map_err(SessionError::Retry)?;
        step("restore");
        self.steps.pass(crate::steps::SESSION_RESTORED, &self.id);
        // `init` ran before the restore and may have read (and cached) what the restore then
        // overwrote.
        inst.ctx().forget_cached_state();
        let replay_generation = self.replays.generation();
        let next = io
            .positions(&self.db, &self.replays.ranges())
            .map_err(SessionError::Retry)?;
        self.update_progress(io.as_mut(), &next);
        let waiting = self.status.progress.lock().iter().any(|p| p.end > p.offset);
        self.status
            .waiting_at_start
            .store(waiting, Ordering::Relaxed);
        step("positions");
        *self.status.phase.lock() = Phase::Running;
        self.status.restored.store(true, Ordering::Release);
        tracing::info!(slots = ?self.slots, "partition running");

        // `next`: where processing goes on; `committed`: what the last commit covered. Batches
        // between them are pending: their writes are in the overlay, their outputs in the
        // context, and a failed commit discards them all (the next session starts again from
        // `committed`).
        let mut committed = next.clone();
        // The commit in flight, if any: processing goes on over its writes meanwhile.
        let mut in_flight: Option<InFlight> = None;
        let result = self.process(
            io.as_mut(),
            inst,
            &mut run,
            next,
            &mut committed,
            &mut in_flight,
            replay_generation,
        );
        if let Some(f) = in_flight.take() {
            // The session ends on an error with a commit in flight. The commit still ends
            // before the session's clients close; when it landed, it is counted.
            match io.commit_finish() {
                Ok(()) => self.account(io.as_mut(), f, &mut committed),
                Err(e) => {
                    tracing::debug!("the commit in flight at the session's end failed: {e:#}")
                }
            }
        }
        result
    }

    /// The session's loop: fetch, process, commit, until the partition stops or an error ends
    /// the session.
    #[allow(clippy::too_many_arguments)]
    fn process(
        &self,
        io: &mut dyn PartitionIo,
        mut inst: Instance,
        run: &mut Running,
        mut next: Vec<Vec<u64>>,
        committed: &mut Vec<Vec<u64>>,
        in_flight: &mut Option<InFlight>,
        replay_generation: u64,
    ) -> Result<(), SessionError> {
        let spec = &self.pipeline.spec;
        let dlq = self.pipeline.dlq_topic();
        let time = &self.status.time;
        let mut pending = Pending::default();
        let mut last_time_check = Instant::now();
        let mut ready = false;
        loop {
            let wants = self.inbox.wants();
            if wants == Wants::Fence {
                // Another owner took over: nothing pending commits. A commit in flight ends
                // with the session.
                tracing::info!(pending = pending.batches, "fenced: pending batches dropped");
                return Ok(());
            }
            let stopping = wants == Wants::Stop;
            let checkpoint = wants == Wants::Checkpoint;
            let generation = self.target.generation();
            let swap_due = generation != run.current.generation && generation != run.rejected;
            let replay_changed = self.replays.generation() != replay_generation;
            let isolating = self.isolating(&next);
            let interval = Duration::from_millis(run.current.settings.commit_interval_ms);
            // A stop, a swap, a replay and isolating a refused record need everything
            // committed; pending batches at their bound wait for the commit in flight.
            let settle_all = stopping || checkpoint || swap_due || replay_changed || isolating;
            let full = pending.records >= self.config.max_pending
                || inst.ctx().overlay.written_bytes() >= MAX_PENDING_BYTES;
            if in_flight.is_some() && (settle_all || full || io.commit_ready()) {
                let f = in_flight.take().expect("a commit is in flight");
                self.finish_commit(io, &mut inst, f, pending.batches > 0, committed, &dlq)?;
            }
            let due = settle_all || full || pending.since.is_some_and(|s| s.elapsed() >= interval);
            if pending.batches > 0 && due && in_flight.is_none() {
                let f = self.start_commit(io, &mut inst, &mut pending, &next)?;
                // Waited for when everything must be committed, or when it is done already
                // (the embedded log commits at once).
                if settle_all || io.commit_ready() {
                    self.finish_commit(io, &mut inst, f, false, committed, &dlq)?;
                } else {
                    *in_flight = Some(f);
                }
            }
            if stopping || checkpoint {
                // Everything is committed now.
                self.update_progress(io, committed);
                if stopping {
                    // Nothing more is this loop's to answer for: queries go to the next
                    // owner. Set before the answer, which the next owner acts on.
                    *self.status.phase.lock() = Phase::Stopped;
                }
                self.inbox.done(self.status.progress.lock().clone());
            }
            if stopping {
                self.steps.pass(crate::steps::STOPPING, &self.id);
                break;
            }
            // Only at a commit boundary, where nothing is pending, can the module change under
            // the state. A swap that lands after `swap_due` was read waits for the next commit.
            if pending.batches == 0 && in_flight.is_none() {
                inst = self.maybe_swap(inst, run)?;
            }
            if replay_changed {
                return Err(SessionError::Restart);
            }
            let fetch_started = Instant::now();
            if !ready && !self.status.waiting_at_start.load(Ordering::Relaxed) {
                // No record was waiting when processing began: the pause of a take-over ends
                // as the first fetch starts (nothing to process before it).
                ready = true;
                self.status.first_call.lock().get_or_insert(fetch_started);
            }
            // After Kafka refused a record for good, the records of that batch go one per
            // commit until they are past.
            let max_batch = if isolating { 1 } else { self.config.max_batch };
            // With batches pending, wait for input no longer than until they are due, nor
            // than `IDLE_COMMIT`: an input that has nothing for that long has run dry.
            // With only a commit in flight, look back soon to finish it.
            let wait = match pending.since {
                Some(s) => interval.saturating_sub(s.elapsed()).min(IDLE_COMMIT),
                None if in_flight.is_some() => IN_FLIGHT_WAIT,
                None => FETCH_WAIT,
            };
            let fetched = io
                .fetch(&next, max_batch, wait)
                .map_err(SessionError::from_io)?;
            let started = add_elapsed(&time.fetch_us, fetch_started);
            if !ready {
                // The pause of a take-over ends at the first guest call.
                if fetched.is_empty() {
                    self.status.first_fetch.lock().get_or_insert(started);
                } else {
                    ready = true;
                    self.status.first_call.lock().get_or_insert(started);
                }
            }
            // Processing-time timers and expiries fall due without records: every slot is
            // checked now and then, a quiet one too.
            if last_time_check.elapsed() >= TIME_CHECK {
                last_time_check = Instant::now();
                let mut fired = 0;
                for slot in self.slots.clone() {
                    let (i, n) = self.fire_timers(inst, &run.current, slot, &dlq)?;
                    inst = i;
                    fired += n;
                }
                if fired > 0 {
                    pending.add(0, Instant::now(), Vec::new(), &[]);
                }
            }
            if fetched.is_empty() {
                if pending.batches > 0 || in_flight.is_some() {
                    // The input is idle: what is pending commits now rather than at the
                    // interval's end.
                    self.commit_pending(
                        io,
                        &mut inst,
                        &mut pending,
                        in_flight,
                        &next,
                        committed,
                        &dlq,
                    )?;
                } else {
                    self.update_progress(io, committed);
                }
                continue;
            }
            let batch_span = tracing::debug_span!("batch");
            let _b = batch_span.enter();
            let mut count = 0u64;
            let mut new_next = next.clone();
            let mut groups = Vec::with_capacity(fetched.len());
            let mut unreplayable = Vec::new();
            for (ti, slot, recs) in fetched {
                let idx = (slot - self.slots.start) as usize;
                if let Some(last) = recs.last() {
                    new_next[ti][idx] = last.offset + 1;
                }
                count += recs.len() as u64;
                // Records move into guest messages: no copy of keys and values.
                let msgs: Vec<Message> = match spec.inputs.get(ti) {
                    Some(topic) => recs
                        .into_iter()
                        .map(|r| to_message(topic, slot, r))
                        .collect(),
                    // Dead letters being replayed: the records they were. One that was cut to
                    // fit the dead-letter topic is not the record it was: it goes back there.
                    None => {
                        let (cut, whole): (Vec<_>, Vec<_>) = recs.into_iter().partition(|r| {
                            r.record.headers.iter().any(|(k, _)| k == "baton.truncated")
                        });
                        for r in cut {
                            let m = replayed_message(&spec.inputs[0], slot, r);
                            unreplayable.push(self.dead_letter_output(
                                &m,
                                "a dead letter that was cut to fit the dead-letter topic cannot \
                                 be replayed",
                                EventKind::Error,
                                &dlq,
                            ));
                        }
                        whole
                            .into_iter()
                            .map(|r| replayed_message(&spec.inputs[0], slot, r))
                            .collect()
                    }
                };
                groups.push((slot, msgs));
            }
            let failed_before = self.status.dead_letters.load(Ordering::Relaxed);
            inst = self.process_batch(inst, &run.current, &groups, &dlq)?;
            // Under probation every batch commits on its own (nothing is pending before it),
            // so that it can be undone alone: probation counts commits.
            let on_probation = run.probation > 0;
            if on_probation {
                run.probation -= 1;
                let failed = self.status.dead_letters.load(Ordering::Relaxed) - failed_before;
                let share = failed as f64 / count as f64;
                let max = run.current.settings.swap.max_failure_share;
                if share > max
                    && let Some(previous) = run.previous.take()
                {
                    // Not committed: go back to the previous version and process the batch
                    // again, so nothing is lost and nothing is seen twice.
                    let rollback_started = Instant::now();
                    drop(inst);
                    self.status
                        .dead_letters
                        .fetch_sub(failed, Ordering::Relaxed);
                    let rejected = std::mem::replace(&mut run.current, previous);
                    inst = self.new_instance(&run.current)?;
                    *self.status.version.lock() = run.current.version.clone();
                    run.probation = 0;
                    self.reject(
                        run,
                        &rejected,
                        format!(
                            "{failed} of {count} records failed in a batch right after the swap \
                             (more than {:.0}% allowed)",
                            max * 100.0
                        ),
                        rollback_started,
                    );
                    inst = self.process_batch(inst, &run.current, &groups, &dlq)?;
                }
            }
            add_elapsed(&time.process_us, started);
            pending.add(count, started, unreplayable, &groups);
            next = new_next;
            // One record per commit while isolating the record Kafka refuses.
            if on_probation || isolating {
                self.commit_pending(
                    io,
                    &mut inst,
                    &mut pending,
                    in_flight,
                    &next,
                    committed,
                    &dlq,
                )?;
            }
        }
        Ok(())
    }

    /// True while the records up to the offsets where Kafka refused a record for good go one
    /// per commit.
    fn isolating(&self, next: &[Vec<u64>]) -> bool {
        let mut isolate = self.isolate.lock();
        match &*isolate {
            Some(until)
                if next
                    .iter()
                    .zip(until)
                    .any(|(n, u)| n.iter().zip(u).any(|(a, b)| a < b)) =>
            {
                true
            }
            Some(_) => {
                *isolate = None;
                false
            }
            None => false,
        }
    }

    /// Commits everything and waits: the commit in flight, then the pending batches.
    #[allow(clippy::too_many_arguments)]
    fn commit_pending(
        &self,
        io: &mut dyn PartitionIo,
        inst: &mut Instance,
        pending: &mut Pending,
        in_flight: &mut Option<InFlight>,
        next: &[Vec<u64>],
        committed: &mut Vec<Vec<u64>>,
        dlq: &str,
    ) -> Result<(), SessionError> {
        if let Some(f) = in_flight.take() {
            self.finish_commit(io, inst, f, pending.batches > 0, committed, dlq)?;
        }
        if pending.batches == 0 {
            return Ok(());
        }
        let f = self.start_commit(io, inst, pending, next)?;
        self.finish_commit(io, inst, f, false, committed, dlq)
    }

    /// Starts committing the pending batches: their state writes, outputs and dead letters,
    /// and every owned slot's offset up to `next`. Their writes stay visible to reads until the
    /// commit is finished.
    fn start_commit(
        &self,
        io: &mut dyn PartitionIo,
        inst: &mut Instance,
        pending: &mut Pending,
        next: &[Vec<u64>],
    ) -> Result<InFlight, SessionError> {
        let started = Instant::now();
        // Every owned slot's offset, idle or not: the broker expires a group's offset
        // `offsets.retention.minutes` after its last commit.
        let offsets = batch_offsets(next, self.slots.start);
        let ctx = inst.ctx();
        let writes = ctx.overlay.take();
        let mut outputs = std::mem::take(&mut ctx.outputs);
        outputs.append(&mut pending.unreplayable);
        let flight = InFlight {
            pending: std::mem::take(pending),
            next: next.to_vec(),
            outputs: outputs.len(),
            offsets: offsets.clone(),
            dead_letters: self.status.dead_letters.load(Ordering::Relaxed),
            started,
        };
        io.commit_start(
            &self.db,
            Arc::new(Batch {
                writes,
                outputs,
                offsets,
            }),
        )
        .map_err(SessionError::Retry)?;
        add_elapsed(&self.status.time.commit_us, started);
        Ok(flight)
    }

    /// Waits for the commit in flight. Once it is committed, `committed` is its `next` and the
    /// progress shows it. When Kafka refuses a record of it for good, the next session goes
    /// through its records one per commit to find it; when its one record is what Kafka
    /// refuses, that record is dead-lettered instead (and, when batches were processed over
    /// its writes, `on_top`, they are processed again in a new session).
    fn finish_commit(
        &self,
        io: &mut dyn PartitionIo,
        inst: &mut Instance,
        mut flight: InFlight,
        on_top: bool,
        committed: &mut Vec<Vec<u64>>,
        dlq: &str,
    ) -> Result<(), SessionError> {
        let waited = Instant::now();
        let mut restart = false;
        if let Err(e) = io.commit_finish() {
            // Nothing of the batches is in RocksDB: the next session resumes before them.
            if !refused_for_good(&e) {
                return Err(SessionError::Retry(e));
            }
            let Some(one) = flight.pending.single.take() else {
                // Kafka refused a record of these batches for good: the next session goes
                // through their records one per commit to find it.
                tracing::warn!("{e:#}; processing the pending records one per commit");
                *self.isolate.lock() = Some(flight.next);
                return Err(SessionError::Retry(e));
            };
            // This record's outputs or state writes are what Kafka refuses: its writes are
            // discarded and it goes to the dead-letter topic, or, when even that is
            // refused, it is dropped with an event saying so.
            inst.ctx().overlay.discard_committing();
            // What the discarded writes removed (fired timers, say) is back in RocksDB's view.
            inst.ctx().forget_cached_state();
            restart = on_top;
            let reason = format!("{e:#}");
            let dead = self.dead_letter_output(&one, &reason, EventKind::Error, dlq);
            // Counted as a dead letter whether it commits or is dropped below.
            flight.dead_letters += 1;
            let dead_batch = Batch {
                writes: Writes::none(),
                outputs: vec![dead],
                offsets: flight.offsets.clone(),
            };
            flight.outputs = 1;
            if let Err(e2) = io.commit(&self.db, Arc::new(dead_batch)) {
                if !refused_for_good(&e2) {
                    return Err(SessionError::Retry(e2));
                }
                flight.outputs = 0;
                self.events.push(
                    EventKind::Error,
                    None,
                    format!(
                        "record dropped: Kafka refused it ({reason}) and its dead letter \
                         ({e2:#})"
                    ),
                    &self.id,
                    None,
                );
                io.commit(
                    &self.db,
                    Arc::new(Batch {
                        writes: Writes::none(),
                        outputs: Vec::new(),
                        offsets: flight.offsets.clone(),
                    }),
                )
                .map_err(SessionError::Retry)?;
            }
        } else {
            // In RocksDB now: the hot-key cache takes the new values of the keys it holds.
            inst.ctx().overlay.settle();
        }
        add_elapsed(&self.status.time.commit_us, waited);
        tracing::debug!(
            records = flight.pending.records,
            batches = flight.pending.batches,
            outputs = flight.outputs,
            cached = inst.ctx().overlay.cached_bytes(),
            us = flight.started.elapsed().as_micros() as u64,
            "committed"
        );
        self.account(io, flight, committed);
        if restart {
            // The batches processed since read the discarded writes.
            return Err(SessionError::Restart);
        }
        Ok(())
    }

    /// Counts a commit that landed and shows its progress: `committed` is its `next`.
    fn account(&self, io: &mut dyn PartitionIo, flight: InFlight, committed: &mut Vec<Vec<u64>>) {
        if let Some(first) = flight.pending.first_fetched {
            self.status.batch_latency.observe(first.elapsed());
        }
        self.status
            .records_out
            .fetch_add(flight.outputs as u64, Ordering::Relaxed);
        self.status
            .records
            .fetch_add(flight.pending.records, Ordering::Relaxed);
        self.status.batches.fetch_add(1, Ordering::Relaxed);
        self.status
            .committed_dead_letters
            .store(flight.dead_letters, Ordering::Relaxed);
        committed.clear();
        committed.extend_from_slice(&flight.next);
        self.update_progress(io, committed);
    }

    /// Processes one slot's chunk; on failure retries each record alone and dead-letters those
    /// that still fail. Returns the instance to use next (a new one after a trap).
    fn process_chunk(
        &self,
        mut inst: Instance,
        target: &Target,
        slot: u32,
        msgs: &[Message],
        dlq: &str,
    ) -> Result<Instance, SessionError> {
        let ticks = self.call_ticks(&target.settings);
        let cursor = |m: &Message| Cursor {
            topic: m.topic.clone(),
            slot,
            offset: m.offset,
            timestamp: m.timestamp,
        };
        inst.ctx().begin_call(cursor(&msgs[0]));
        let result = inst.process(msgs, ticks);
        let (mut inst, err) = self.end_call(inst, target, result)?;
        let Some(err) = err else {
            return Ok(inst);
        };
        if msgs.len() == 1 {
            self.dead_letter(&mut inst, &msgs[0], &err, dlq);
            return Ok(inst);
        }
        tracing::debug!(
            records = msgs.len(),
            "batch call failed ({err}); retrying records one by one"
        );
        for m in msgs {
            inst.ctx().begin_call(cursor(m));
            let result = inst.process(std::slice::from_ref(m), ticks);
            let (next, err) = self.end_call(inst, target, result)?;
            inst = next;
            if let Some(e) = err {
                self.dead_letter(&mut inst, m, &e, dlq);
            }
        }
        Ok(inst)
    }

    /// Ends a guest call: its logs go to the events, a host fault ends the session, and the
    /// call's effects are kept, or dropped with its error (a trapped instance is replaced).
    fn end_call(
        &self,
        mut inst: Instance,
        target: &Target,
        result: Result<(), CallError>,
    ) -> Result<(Instance, Option<CallError>), SessionError> {
        self.take_logs(&mut inst);
        host_fault(&mut inst)?;
        match result {
            Ok(()) => {
                inst.ctx().keep_call();
                Ok((inst, None))
            }
            Err(e) => {
                inst.ctx().drop_call();
                if matches!(e, CallError::Trap(_)) {
                    inst = self.replace_instance(target, inst)?;
                }
                Ok((inst, Some(e)))
            }
        }
    }

    /// Moves the guest's log lines of the last call into the pipeline's events.
    fn take_logs(&self, inst: &mut Instance) {
        for l in std::mem::take(&mut inst.ctx().logs) {
            self.events.push(
                EventKind::Log,
                Some(l.level),
                l.message,
                &self.id,
                Some(&l.cursor),
            );
        }
    }

    fn dead_letter(&self, inst: &mut Instance, m: &Message, err: &CallError, dlq: &str) {
        let kind = match err {
            CallError::Guest(_) => EventKind::Error,
            CallError::Trap(_) => EventKind::Trap,
        };
        let out = self.dead_letter_output(m, &err.to_string(), kind, dlq);
        inst.ctx().push_dead_letter(out);
    }

    /// The dead letter of `m` with the reason `msg`, counted and reported as an event.
    fn dead_letter_output(&self, m: &Message, msg: &str, kind: EventKind, dlq: &str) -> Output {
        let (topic, slot, offset) = (&m.topic, m.slot, m.offset);
        self.events.push(
            kind,
            None,
            format!("{msg}; record sent to {dlq}"),
            &self.id,
            Some(&Cursor {
                topic: topic.clone(),
                slot,
                offset,
                timestamp: m.timestamp,
            }),
        );
        tracing::warn!(%topic, slot, offset, "record sent to {dlq}: {msg}");
        let mut headers: Vec<(String, Vec<u8>)> = m
            .headers
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect();
        headers.push(("baton.error".into(), msg.as_bytes().to_vec()));
        headers.push(("baton.topic".into(), topic.as_bytes().to_vec()));
        headers.push(("baton.slot".into(), slot.to_string().into_bytes()));
        headers.push(("baton.offset".into(), offset.to_string().into_bytes()));
        let mut record = Record {
            key: m.key.clone(),
            value: m.value.clone(),
            headers,
            timestamp: m.timestamp,
        };
        let out = self.outputs.outputs.get(dlq).copied();
        if let Some(max) = out.and_then(|o| o.max_record_bytes) {
            truncate_dead_letter(&mut record, max);
        }
        let partitions = out
            .map_or(self.pipeline.spec.slots, |o| o.partitions)
            .max(1);
        self.status.dead_letters.fetch_add(1, Ordering::Relaxed);
        *self.status.last_error.lock() = Some(format!("{topic}/{slot}@{offset}: {msg}"));
        Output {
            topic: dlq.to_string(),
            partition: slot % partitions,
            record,
        }
    }

    fn update_progress(&self, io: &mut dyn PartitionIo, next: &[Vec<u64>]) {
        let mut v = Vec::new();
        for (ti, topic) in self.pipeline.spec.inputs.iter().enumerate() {
            for (idx, offset) in next[ti].iter().enumerate() {
                let slot = self.slots.start + idx as u32;
                let end = io
                    .end_offset(ti, slot, *offset)
                    .unwrap_or(*offset)
                    .max(*offset);
                v.push(SlotProgress {
                    topic: topic.clone(),
                    slot,
                    offset: *offset,
                    end,
                });
            }
        }
        *self.status.progress.lock() = v;
        let inputs = self.pipeline.spec.inputs.len();
        let mut replay = Vec::new();
        if let Some(row) = next.get(inputs) {
            let ranges = self.replays.ranges();
            for (idx, offset) in row.iter().enumerate() {
                let slot = self.slots.start + idx as u32;
                if let Some((_, to)) = ranges.get(&slot).and_then(|r| replay_window(r, *offset))
                    && !io.replay_done(slot, *offset)
                {
                    replay.push(ReplayProgress {
                        slot,
                        offset: *offset,
                        to,
                    });
                }
            }
        }
        *self.status.replay.lock() = replay;
    }
}

/// The versions a session runs: the current one, the one before a swap under probation, and a
/// generation this partition refused.
struct Running {
    current: Target,
    previous: Option<Target>,
    rejected: u64,
    probation: u32,
}

/// A commit started and not finished yet.
struct InFlight {
    /// The batches it covers.
    pending: Pending,
    /// Where it leaves each input.
    next: Vec<Vec<u64>>,
    /// Its outputs and dead letters.
    outputs: usize,
    /// Its offsets, kept for a dead letter's commit in its place.
    offsets: Vec<(usize, u32, u64)>,
    /// Dead letters counted up to its batches.
    dead_letters: u64,
    started: Instant,
}

/// Batches processed since the last commit.
#[derive(Default)]
struct Pending {
    /// Batches and records pending.
    batches: u64,
    records: u64,
    /// When the first of them was fetched (the commit's latency is measured from it).
    first_fetched: Option<Instant>,
    /// When the first of them was processed: they commit `commit_interval_ms` after it.
    since: Option<Instant>,
    /// Dead letters that go back to the dead-letter topic rather than being replayed.
    unreplayable: Vec<Output>,
    /// The record pending, when exactly one is: when Kafka refuses it for good, it is
    /// dead-lettered.
    single: Option<Message>,
}

impl Pending {
    fn add(
        &mut self,
        records: u64,
        fetched: Instant,
        mut unreplayable: Vec<Output>,
        groups: &[(u32, Vec<Message>)],
    ) {
        self.single = if self.records == 0 && records == 1 {
            groups.iter().flat_map(|(_, m)| m).next().cloned()
        } else {
            None
        };
        self.batches += 1;
        self.records += records;
        self.first_fetched.get_or_insert(fetched);
        self.since.get_or_insert_with(Instant::now);
        self.unreplayable.append(&mut unreplayable);
    }
}

/// Why no instance could be made.
enum InstanceError {
    /// The module's fault (it does not instantiate, or its `init` fails): another try fails too.
    Module(String),
    /// The host's fault (a state read failed during `init`): worth another session.
    Host(String),
}

impl InstanceError {
    fn into_session(self) -> SessionError {
        match self {
            InstanceError::Module(m) => SessionError::Fatal(m),
            InstanceError::Host(m) => SessionError::Retry(anyhow::anyhow!(m)),
        }
    }
}

/// Why a session ended.
pub enum SessionError {
    /// Worth another session after a back-off (transport trouble, a failed commit).
    Retry(anyhow::Error),
    /// Another session would fail the same way (the module's `init` fails, a changelog is
    /// misconfigured).
    Fatal(String),
    /// A new session is needed at once, without an error (dead letters to replay).
    Restart,
}

impl SessionError {
    /// An error of the transport: fatal when no retry can fix it, else worth a retry.
    fn from_io(e: anyhow::Error) -> Self {
        match e.downcast_ref::<crate::transport::TransportError>() {
            Some(crate::transport::TransportError::Misconfigured(m)) => {
                SessionError::Fatal(m.clone())
            }
            _ => SessionError::Retry(e),
        }
    }
}

/// Makes a dead letter fit its topic: cuts its value, then its key, and says so in the header
/// `baton.truncated`, so that a record its dead-letter topic cannot take still leaves a trace.
fn truncate_dead_letter(r: &mut Record, max: usize) {
    let headers: usize = r.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    let key = r.key.as_ref().map_or(0, Vec::len);
    let value = r.value.as_ref().map_or(0, Vec::len);
    // Room for the header saying what was cut.
    let room = max.saturating_sub(headers + 128);
    if key + value + headers <= max {
        return;
    }
    let mut note = Vec::new();
    let value_room = room.saturating_sub(key.min(room));
    if let Some(v) = r.value.as_mut() {
        v.truncate(value_room);
        note.push(format!("value of {value} bytes cut to {}", v.len()));
    }
    let key_room = room.saturating_sub(r.value.as_ref().map_or(0, Vec::len));
    if let Some(k) = r.key.as_mut()
        && k.len() > key_room
    {
        k.truncate(key_room);
        note.push(format!("key of {key} bytes cut to {}", k.len()));
    }
    note.push(format!("the dead-letter topic takes at most {max} bytes"));
    r.headers
        .push(("baton.truncated".into(), note.join("; ").into_bytes()));
}

/// Every slot's next offset, per input, as a batch commits them.
fn batch_offsets(next: &[Vec<u64>], first_slot: u32) -> Vec<(usize, u32, u64)> {
    next.iter()
        .enumerate()
        .flat_map(|(ti, v)| {
            v.iter()
                .enumerate()
                .map(move |(idx, o)| (ti, first_slot + idx as u32, *o))
        })
        .collect()
}

/// True when Kafka refused a record of the batch for good: committing the same batch again
/// can never succeed.
fn refused_for_good(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<crate::transport::TransportError>(),
        Some(crate::transport::TransportError::Refused(_))
    )
}

/// Ends the session when the last guest call failed through a fault of the host (state I/O):
/// the batch is processed again by the next session, and no record is dead-lettered for it.
fn host_fault(inst: &mut Instance) -> Result<(), SessionError> {
    match inst.ctx().host_fault.take() {
        None => Ok(()),
        Some(f) => Err(SessionError::Retry(anyhow::anyhow!(
            "host failure during a guest call: {f}; the batch is processed again"
        ))),
    }
}

/// The result of a host operation on state outside a guest call (timers, expiries): a failure
/// ends the session, as a host fault during a call does.
fn host_op<T>(inst: &mut Instance, r: wasmtime::Result<T>) -> Result<T, SessionError> {
    host_fault(inst)?;
    r.map_err(|e| SessionError::Retry(e.into()))
}

/// A dead letter as the record it was: its topic and offset from the `baton.*` headers, which
/// are dropped.
fn replayed_message(first_input: &str, slot: u32, r: LogRecord) -> Message {
    let header = |name: &str| {
        r.record
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    };
    let topic = header("baton.topic").unwrap_or_else(|| first_input.to_string());
    let offset = header("baton.offset")
        .and_then(|o| o.parse().ok())
        .unwrap_or(r.offset);
    let mut m = to_message(&topic, slot, r);
    m.offset = offset;
    m.headers.retain(|h| !h.key.starts_with("baton."));
    m
}

fn to_message(topic: &str, slot: u32, r: LogRecord) -> Message {
    Message {
        topic: topic.to_string(),
        slot,
        offset: r.offset,
        timestamp: r.record.timestamp,
        key: r.record.key,
        value: r.record.value,
        headers: r
            .record
            .headers
            .into_iter()
            .map(|(key, value)| crate::runtime::Header { key, value })
            .collect(),
    }
}
