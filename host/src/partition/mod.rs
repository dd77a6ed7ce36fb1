//! One partition's loop: fetch a batch from its slots → process each slot's records in the
//! guest → commit state, outputs and input offsets atomically. It owns the partition's instance
//! and batch overlay and is the only writer of the partition's database.
//!
//! The loop runs in sessions. A session asks its [`PartitionIo`] to restore state and to say
//! where each input slot resumes, then processes batches until stopped or until an error; after
//! an error (a broker restart, a failed transaction) the next session starts from what was
//! committed, after a back-off. How a batch commits depends on the transport (see [`io`]).

mod commit;
mod dead_letters;
mod instance;
mod replay;
mod status;
mod timers;

pub mod checkpoints;
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
pub use replay::{ReplayPlan, ReplayProgress};
pub use status::{
    HISTOGRAM_BOUNDS, Histogram, LoopTime, LoopTimeMs, PartitionStatus, Phase, SlotProgress,
};
pub use swap::{ModuleTarget, RollbackHook, Settings, SwapOutcome, SwapReport, SwapStatus, Target};

use instance::{host_fault, host_op};
use replay::replayed_message;

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
    /// Commands from the supervisor: stop, drain, flush, fence.
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
                Wants::Flush => self.inbox.done(self.status.progress.lock().clone()),
                // Done by the next session, with its clients.
                Wants::Rewind => {}
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
                    self.status.session_failures.fetch_add(1, Ordering::Relaxed);
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
        *self.status.fetch_waker.lock() = io.fetch_waker();
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
            let flush = wants == Wants::Flush;
            let rewind = wants == Wants::Rewind;
            let generation = self.target.generation();
            let swap_due = generation != run.current.generation && generation != run.rejected;
            let replay_changed = self.replays.generation() != replay_generation;
            let isolating = self.isolating(&next);
            let interval = Duration::from_millis(run.current.settings.commit_interval_ms);
            // A stop, a swap, a replay and isolating a refused record need everything
            // committed; pending batches at their bound wait for the commit in flight.
            let settle_all = stopping || flush || rewind || swap_due || replay_changed || isolating;
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
            if stopping || flush {
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
            if rewind && in_flight.is_none() && pending.batches == 0 {
                // Everything is committed: the rewind commits the checkpoint's state over it,
                // and a new session starts from the checkpoint's input offsets.
                if let Some(r) = self.inbox.take_rewind() {
                    let done = self.rewind(io, &r);
                    let failed = done.is_err();
                    let _ = r
                        .reply
                        .send(done.as_ref().map(|n| *n).map_err(|e| format!("{e:#}")));
                    if failed {
                        return Err(SessionError::Retry(
                            done.err()
                                .unwrap_or_else(|| anyhow::anyhow!("rewind failed")),
                        ));
                    }
                    return Err(SessionError::Restart);
                }
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
            if crate::otlp::enabled() {
                crate::otlp::Span::root("batch", started, Instant::now())
                    .attr("baton.partition", self.id.as_str())
                    .attr("baton.pipeline", spec.name.as_str())
                    .attr("baton.records", count)
                    .export();
            }
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

    /// Commits the state and input offsets of the checkpoint in `r.dir` over the partition's:
    /// every key that differs, set to the checkpoint's value (or deleted), in one commit with
    /// the checkpoint's input offsets, so that the changelogs and the consumer group say the
    /// same as RocksDB. Answers how many keys were put back.
    fn rewind(&self, io: &mut dyn PartitionIo, r: &commands::Rewind) -> anyhow::Result<u64> {
        let diff = self.db.differences_from(&r.dir)?;
        let n = diff.len() as u64;
        let mut overlay = crate::state::Overlay::with_budget(self.db.hot_budget());
        for (store, key, value) in diff {
            overlay.put(store, key, value);
        }
        overlay.keep_call();
        let writes = overlay.take();
        let spec = &self.pipeline.spec;
        let mut offsets = Vec::new();
        for (ti, topic) in spec.inputs.iter().enumerate() {
            for slot in self.slots.clone() {
                let Some(offset) = r.input_offsets.get(&format!("{topic}/{slot}")) else {
                    anyhow::bail!("checkpoint {} has no input offset of {topic}/{slot}", r.seq);
                };
                offsets.push((ti, slot, *offset));
            }
        }
        io.commit(
            &self.db,
            Arc::new(Batch {
                writes,
                outputs: Vec::new(),
                offsets,
            }),
        )?;
        tracing::info!(seq = r.seq, keys = n, "rewound to a checkpoint");
        Ok(n)
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
