//! The Kafka side of a partition session: input consumer with manual assignment, a producer
//! (transactional under exactly-once), changelog restore, and the commit protocols.
//!
//! Exactly-once: begin → changelog records (last value per key per batch) + outputs → flush →
//! input offsets via `send_offsets_to_transaction` → commit → RocksDB `WriteBatch` with the
//! state writes, the input offsets and the changelog offsets. At-least-once commits the same
//! way (the transaction is its fence); it differs in its longer default commit interval and in
//! how leniently a restart reconciles RocksDB's offsets with the group's.
//!
//! A commit runs on a thread of the session's own, the committer, which owns the producer: the
//! partition thread goes on processing the next batches (over the overlay, which still shows
//! the committing writes) while the flush and the transaction's round trips are in flight.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::io::{
    Batch, PartitionIo, ReplayRanges, RestoreProgress, Sources, in_replay, replay_window,
    start_offset,
};
use super::{changelog_offset_key, input_offset_key};
use crate::control::{Guarantee, PipelineRecord};
use crate::state::PartitionDb;
use crate::transport::LogRecord;
use crate::transport::kafka::{BatchProducer, GroupMetadata, InputConsumer, KafkaTransport};

/// How often end offsets (for lag) are asked of the broker.
const END_OFFSET_TTL: Duration = Duration::from_millis(500);

/// How long a partition's loop waits for an input's end offset before it goes on with the last
/// one known.
const END_OFFSET_WAIT: Duration = Duration::from_secs(1);

/// How often a partition compares its input topics' partition counts with its slots.
const INPUT_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// Fails (for good) when an input topic gained partitions: the pipeline's slots are fixed, so
/// it would silently never read the new ones.
fn check_inputs(transport: &KafkaTransport, pipeline: &PipelineRecord) -> anyhow::Result<()> {
    use crate::transport::{Transport, TransportError};
    let slots = pipeline.spec.slots;
    for topic in &pipeline.spec.inputs {
        if let Some(n) = transport.partitions(topic)?
            && n != slots
        {
            return Err(TransportError::Misconfigured(format!(
                "input topic `{topic}` now has {n} partitions, but pipeline `{}` has {slots} \
                 slots and would never read partitions {slots}..{n}; records produced there are \
                 not processed. Create a new pipeline with slots = {n} (a pipeline's slots are \
                 fixed)",
                pipeline.spec.name
            ))
            .into());
        }
    }
    Ok(())
}

/// One session of a partition on Kafka.
pub struct KafkaIo {
    transport: Arc<KafkaTransport>,
    pipeline: Arc<PipelineRecord>,
    slots: Range<u32>,
    consumer: InputConsumer,
    committer: Committer,
    ends: HashMap<(usize, u32), (u64, Instant)>,
    /// The topics read: inputs, and the dead-letter topic during a replay.
    sources: Sources,
    /// When the input topics' partition counts were last compared with the slots.
    inputs_checked: Instant,
    /// Changelog records the last restore applied: none means RocksDB was at the changelog's
    /// end, so its input offsets are those of the last committed batch.
    restored: u64,
    /// A warming replica's changelog reader, which the restore goes on with.
    warm: Option<super::tail::Tail>,
    /// What a move's target checked of the owner's release just before this session: the
    /// group's committed offsets, and that the warm reader is at the changelogs' ends.
    checked: Option<Checked>,
    /// Asked for the inputs' ends (for the lag); it never fetches.
    watermarks: InputConsumer,
    /// Per input slot: the next offset when it last changed, and since when it has not.
    stalls: HashMap<(usize, u32), (u64, Instant)>,
    /// When records were last fetched: a loop away longer (committing while the broker was
    /// down) starts the stall clocks again.
    fetched_at: Instant,
    /// When the stall clocks were last looked at.
    stalls_checked: Instant,
    /// Since when, and why, the inputs' ends could not be asked (cleared by an answer).
    ends_failing: Option<(Instant, String)>,
    /// The host's faults, and this partition's id, for [`crate::steps::INPUT_STALL`].
    faults: Option<(Arc<crate::steps::Steps>, String)>,
}

/// How often a session looks for input slots that stalled.
const STALL_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Clients made ready for a partition before its first session here (by a move's target while
/// it warms up), so that the session does not wait for them: its consumer (coordinator found),
/// its producer (not yet fencing the owner's: that is `init_transactions`, at the session's
/// start), and the changelog reader of the warming replica, positioned where RocksDB is.
pub struct Prepared {
    consumer: InputConsumer,
    producer: BatchProducer,
    tail: super::tail::Tail,
    checked: Option<Checked>,
    /// The checkpoint the replica's database was restored from, when it had none here.
    restored: Option<crate::state::checkpoint::Restored>,
}

/// The group's committed offsets of input slots, read and checked against the owner's release
/// by a move's target, with its reader caught up to the released changelog ends: the owner
/// released the partition, so neither can change before the session starts, and the session
/// need not read them again on the pause path.
struct Checked {
    committed: HashMap<(String, u32), Option<u64>>,
}

impl Prepared {
    /// Creates the clients of partition `id` and checks its topics; `tail` is the replica's
    /// changelog reader.
    pub fn new(
        transport: &KafkaTransport,
        pipeline: &PipelineRecord,
        id: &str,
        slots: Range<u32>,
        tail: super::tail::Tail,
    ) -> anyhow::Result<Self> {
        let consumer = transport.input_consumer(&pipeline.group_id())?;
        let producer = transport.batch_producer(&pipeline.transactional_id(id))?;
        producer.connect(Duration::from_secs(10))?;
        for s in pipeline.spec.state_stores() {
            transport.check_compacted(&pipeline.changelog_topic(&s))?;
        }
        check_inputs(transport, pipeline)?;
        // Finds the group's coordinator and the inputs' leaders now rather than at the start.
        let tps: Vec<(String, u32)> = pipeline
            .spec
            .inputs
            .iter()
            .flat_map(|t| slots.clone().map(move |s| (t.clone(), s)))
            .collect();
        consumer.committed(&tps)?;
        // And their ends once (within 2 s, without retries): the consumer then holds the
        // inputs' metadata, so that the session's question for the ends (in a handoff's pause)
        // needs no metadata request first. A failure here only costs that request later.
        if let Err(e) = consumer.ends_within(&tps, Duration::from_secs(2)) {
            tracing::debug!(partition = id, "asking the inputs' ends ahead: {e}");
        }
        Ok(Prepared {
            consumer,
            producer,
            tail,
            checked: None,
            restored: None,
        })
    }

    /// Notes the checkpoint the replica's database was restored from (shown by the partition
    /// once its session runs).
    pub fn with_restored(mut self, restored: Option<crate::state::checkpoint::Restored>) -> Self {
        self.restored = restored;
        self
    }

    /// The checkpoint the replica's database was restored from, if any.
    pub fn restored(&self) -> Option<&crate::state::checkpoint::Restored> {
        self.restored.as_ref()
    }

    /// Records what the take-over checked of the release: the group's `committed` offsets of
    /// the slots `tps`, and the tail caught up to the released changelog ends.
    pub fn checked(&mut self, tps: &[(String, u32)], committed: &[Option<u64>]) {
        self.checked = Some(Checked {
            committed: tps.iter().cloned().zip(committed.iter().copied()).collect(),
        });
    }

    /// The changelog reader, to keep warming with.
    pub fn tail(&mut self) -> &mut super::tail::Tail {
        &mut self.tail
    }

    /// The group's committed offsets of these input slots, stable ones only: a transaction
    /// still completing is waited for.
    pub fn committed(
        &self,
        tps: &[(String, u32)],
    ) -> Result<Vec<Option<u64>>, crate::transport::TransportError> {
        self.consumer.committed(tps)
    }
}

impl KafkaIo {
    /// Opens the clients of partition `id` (or takes the `prepared` ones) and fences older
    /// producers of the partition, with the host's holds and faults in `steps`.
    ///
    /// Every session writes through a transactional producer of the partition's own id,
    /// whatever the pipeline's guarantee: registering it makes the broker refuse the writes of
    /// an older owner that still runs (a zombie: stopped, cut off, then back), which would
    /// otherwise put changelog values from its diverged state after the new owner's. Under
    /// at-least-once the input offsets are still committed after the transaction, outside
    /// it; see [`Committer`].
    pub fn open(
        transport: Arc<KafkaTransport>,
        pipeline: Arc<PipelineRecord>,
        id: &str,
        slots: Range<u32>,
        prepared: Option<Prepared>,
        audit: Option<CommitAudit>,
        steps: Arc<crate::steps::Steps>,
    ) -> anyhow::Result<Self> {
        let (consumer, producer, warm, checked) = match prepared {
            Some(p) => (p.consumer, p.producer, Some(p.tail), p.checked),
            None => {
                let consumer = transport.input_consumer(&pipeline.group_id())?;
                let producer = transport.batch_producer(&pipeline.transactional_id(id))?;
                for s in pipeline.spec.state_stores() {
                    transport.check_compacted(&pipeline.changelog_topic(&s))?;
                }
                check_inputs(&transport, &pipeline)?;
                (consumer, producer, None, None)
            }
        };
        // A move's target registers its producer (fencing the old owner's) on the committer
        // thread, while the session restores and reads its positions: the old owner released
        // the partition in the control log, and the target checked before taking over that
        // its last transaction is complete and its offsets and changelog ends are the
        // released ones, so nothing it could write is left to fence; the first commit waits
        // for the registration. Any other session (a failover, whose old owner may still be
        // alive) fences first.
        let deferred_init = warm.is_some();
        if !deferred_init {
            producer.connect(Duration::from_secs(10))?;
            producer.init_transactions()?;
        }
        let changelogs: Vec<String> = pipeline
            .spec
            .state_stores()
            .iter()
            .map(|s| pipeline.changelog_topic(s))
            .collect();
        let group = consumer.group_metadata()?;
        let hang = transport
            .config()
            .commit_hang
            .unwrap_or(crate::transport::kafka::COMMIT_HANG);
        let committer = Committer::start(
            id,
            deferred_init,
            hang,
            CommitterState {
                producer,
                group,
                changelogs,
                stores: pipeline.spec.state_stores(),
                audit,
                seq: Default::default(),
                steps: steps.clone(),
                id: id.to_string(),
                given_up: Default::default(),
            },
        )?;
        let sources = Sources {
            topics: pipeline.spec.inputs.clone(),
            replay_ends: Vec::new(),
            replay_ranges: Vec::new(),
        };
        let watermarks = transport.input_consumer(&pipeline.group_id())?;
        Ok(KafkaIo {
            transport,
            pipeline,
            slots,
            consumer,
            committer,
            ends: HashMap::new(),
            restored: 0,
            sources,
            inputs_checked: Instant::now(),
            warm,
            checked,
            watermarks,
            stalls: HashMap::new(),
            fetched_at: Instant::now(),
            stalls_checked: Instant::now(),
            ends_failing: None,
            faults: Some((steps, id.to_string())),
        })
    }

    /// Fails the session when an input slot has had records to read and delivered none for
    /// the configured stall time while the session fetched, and no fetch came back full (a
    /// backlog of other slots in the shared prefetch queue): a new session makes new clients.
    fn check_stalls(&mut self, next: &[Vec<u64>]) -> anyhow::Result<()> {
        let now = Instant::now();
        if now.duration_since(self.fetched_at) > STALL_CHECK_INTERVAL {
            self.stalls.clear();
        }
        self.fetched_at = now;
        if now.duration_since(self.stalls_checked) < STALL_CHECK_INTERVAL {
            return Ok(());
        }
        self.stalls_checked = now;
        let limit = self
            .transport
            .config()
            .input_stall
            .unwrap_or(crate::transport::kafka::INPUT_STALL);
        // Blind to the inputs' ends for as long as a stall would take to notice: the clients
        // may be as stuck as a consumer that stops delivering.
        if let Some((since, e)) = &self.ends_failing
            && now.duration_since(*since) >= limit
        {
            anyhow::bail!(
                "the ends of the inputs could not be read for {}s ({e}): the partition's \
                 clients are made again",
                limit.as_secs_f64()
            );
        }
        let inputs = self.pipeline.spec.inputs.len();
        for (ti, row) in next.iter().enumerate().take(inputs) {
            for (idx, &n) in row.iter().enumerate() {
                let slot = self.slots.start + idx as u32;
                let since = match self.stalls.get(&(ti, slot)) {
                    Some(&(at, since)) if at == n => since,
                    _ => {
                        self.stalls.insert((ti, slot), (n, now));
                        continue;
                    }
                };
                let Some(&(end, _)) = self.ends.get(&(ti, slot)) else {
                    continue;
                };
                if n >= end || now.duration_since(since) < limit {
                    continue;
                }
                let topic = &self.sources.topics[ti];
                // Past the end (transaction markers take offsets): nothing is left to read.
                if self.consumer.position(topic, slot).is_none_or(|p| p < end) {
                    anyhow::bail!(
                        "input {topic}/{slot} delivered nothing for {}s at offset {n}, with \
                         records up to {end} to read: the partition's clients are made again",
                        limit.as_secs_f64()
                    );
                }
            }
        }
        Ok(())
    }

    fn offsets(&self, batch: &Batch) -> Vec<(String, u32, u64)> {
        batch
            .offsets
            .iter()
            .map(|(ti, slot, next)| (self.sources.topics[*ti].clone(), *slot, *next))
            .collect()
    }
}

impl PartitionIo for KafkaIo {
    fn restore(
        &mut self,
        db: &PartitionDb,
        progress: &dyn Fn(RestoreProgress),
    ) -> anyhow::Result<()> {
        let started = Instant::now();
        let mut tail = match self.warm.take() {
            Some(mut warm) => {
                // Caught up to the released ends just now: nobody writes after a release.
                if self.checked.is_none() {
                    warm.refresh()?;
                }
                warm
            }
            None => {
                super::tail::Tail::open(&self.transport, &self.pipeline, self.slots.clone(), db)?
            }
        };
        let total = tail.behind();
        let report = |done: u64, finished: bool| {
            let secs = started.elapsed().as_secs_f64().max(1e-3);
            progress(RestoreProgress {
                done,
                total,
                rate: done as f64 / secs,
                finished,
            });
        };
        self.restored = 0;
        if tail.caught_up() {
            report(0, true);
            tail.close_in_background();
            return Ok(());
        }
        tracing::info!(records = total, "restoring state from the changelog");
        let mut last_log = Instant::now();
        let done = tail.read_to_end(db, Duration::from_secs(60), &mut |done| {
            if last_log.elapsed() > Duration::from_secs(2) {
                tracing::info!(done, total, "restoring");
                last_log = Instant::now();
            }
            report(done, false);
        })?;
        self.restored = done;
        tail.close_in_background();
        report(done, true);
        tracing::info!(
            records = done,
            secs = started.elapsed().as_secs_f64(),
            "restore finished"
        );
        Ok(())
    }

    /// The group's offsets are the truth. Every transaction commits the offset of every owned
    /// slot, idle or not, so the broker does not expire an idle slot's offset. Where the group has
    /// none (a new pipeline, or offsets expired after `offsets.retention.minutes` without a
    /// commit), RocksDB's input offset is used, but only when the restore found RocksDB at the
    /// changelog's end: after a crash between the Kafka commit and the RocksDB write it lags the
    /// group by one batch. Any other disagreement fails the partition, naming the slot.
    fn positions(
        &mut self,
        db: &PartitionDb,
        replays: &ReplayRanges,
    ) -> anyhow::Result<Vec<Vec<u64>>> {
        let spec = &self.pipeline.spec;
        let eos = spec.guarantee == Guarantee::ExactlyOnce;
        let inputs = spec.inputs.len();
        let dlq = self.pipeline.dlq_topic();
        let replaying = replays
            .iter()
            .any(|(slot, r)| self.slots.contains(slot) && !r.is_empty());
        let mut topics = spec.inputs.clone();
        if replaying {
            topics.push(dlq.clone());
        }
        let tps: Vec<(String, u32)> = topics
            .iter()
            .flat_map(|t| self.slots.clone().map(move |s| (t.clone(), s)))
            .collect();
        let checked = self.checked.take().and_then(|c| {
            tps.iter()
                .map(|tp| c.committed.get(tp).copied())
                .collect::<Option<Vec<_>>>()
        });
        let started = Instant::now();
        let was_checked = checked.is_some();
        let committed = match checked {
            Some(c) => c,
            None => self.consumer.committed(&tps)?,
        };
        let committed_at = Instant::now();
        let mut out = vec![Vec::new(); topics.len()];
        let mut assign = Vec::new();
        self.sources.replay_ends.clear();
        self.sources.replay_ranges.clear();
        for ((topic, slot), group) in tps.iter().zip(committed) {
            let ti = topics.iter().position(|t| t == topic).unwrap_or(0);
            let local = db.get_meta_u64(&input_offset_key(topic, *slot))?;
            let next = match (group, local) {
                (Some(g), Some(l)) if eos && l > g => anyhow::bail!(
                    "slot {slot} of `{topic}`: RocksDB has processed up to offset {l}, beyond the \
                     group's committed offset {g}; the group `{}` was reset or rewound by hand. \
                     Refusing to guess: delete the partition's state to reprocess from the group's \
                     offset, or set the group's offset to {l}",
                    self.pipeline.group_id()
                ),
                (Some(g), Some(l)) if !eos => g.max(l),
                (Some(g), _) => g,
                (None, Some(l)) if self.restored == 0 || !eos => {
                    tracing::warn!(
                        %topic,
                        slot,
                        offset = l,
                        "the group has no offset for this slot (expired?); resuming from RocksDB's"
                    );
                    l
                }
                (None, Some(l)) => anyhow::bail!(
                    "slot {slot} of `{topic}`: the group `{}` has no committed offset (expired \
                     after offsets.retention.minutes?) and RocksDB's input offset {l} may lag the \
                     last commit (the restore replayed {} changelog records); refusing to guess \
                     where to resume. Set the group's offset for this slot by hand",
                    self.pipeline.group_id(),
                    self.restored
                ),
                (None, None) if ti < inputs => start_offset(&self.pipeline, ti, *slot),
                (None, None) => 0,
            };
            if ti < inputs {
                out[ti].push(next);
                assign.push((topic.clone(), *slot, next));
                continue;
            }
            // The dead-letter row: replay from the cursor to the end of its range.
            let ranges = replays.get(slot).cloned().unwrap_or_default();
            let (start, end) = replay_window(&ranges, next).unwrap_or((next, next));
            out[ti].push(start);
            self.sources.replay_ends.push(end);
            self.sources.replay_ranges.push(ranges);
            if start < end {
                assign.push((topic.clone(), *slot, start));
            }
        }
        self.sources.topics = topics;
        // The inputs' ends, asked before the consumer fetches (after, a question waits behind
        // its long poll): the lag is known at once, and the consumer learns the partitions'
        // leaders now, so its first fetch goes out as soon as it is assigned.
        let tps: Vec<(String, u32)> = assign.iter().map(|(t, s, _)| (t.clone(), *s)).collect();
        let ends = self.consumer.ends(&tps).ok();
        let ends_at = Instant::now();
        let mut waiting = Vec::with_capacity(assign.len());
        for (i, (topic, slot, next)) in assign.iter().enumerate() {
            let mut lag = 0;
            if let Some(ti) = self.sources.topics.iter().position(|t| t == topic)
                && let Some(hi) = ends.as_ref().map(|e| e[i])
            {
                self.ends.insert((ti, *slot), (hi, Instant::now()));
                lag = hi.saturating_sub(*next);
            }
            waiting.push(lag > 0);
        }
        // Those with records waiting first: the first fetch then returns at once with records
        // (see `InputConsumer::assign`).
        let mut order: Vec<usize> = (0..assign.len()).collect();
        order.sort_by_key(|&i| !waiting[i]);
        let first = waiting.iter().filter(|w| **w).count();
        let ordered: Vec<(String, u32, u64)> = order.iter().map(|&i| assign[i].clone()).collect();
        self.consumer.assign(&ordered, first)?;
        // RocksDB's input offsets follow the group's from here on, even for a batch that
        // commits no state: were the group's offsets to expire later, RocksDB's are current.
        let mut meta = Vec::new();
        for (ti, row) in out.iter().enumerate() {
            for (idx, next) in row.iter().enumerate() {
                let slot = self.slots.start + idx as u32;
                meta.push((
                    input_offset_key(&self.sources.topics[ti], slot),
                    Some(next.to_be_bytes().to_vec()),
                ));
            }
        }
        let assigned_at = Instant::now();
        db.commit([], &meta)?;
        if started.elapsed() > Duration::from_millis(20) {
            // Within a handoff's pause: where a slow one went.
            let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
            tracing::info!(
                committed_ms = ms(started, committed_at),
                checked = was_checked,
                ends_ms = ms(committed_at, ends_at),
                assign_ms = ms(ends_at, assigned_at),
                commit_ms = ms(assigned_at, Instant::now()),
                "input positions took {:.1} ms",
                ms(started, Instant::now())
            );
        }
        Ok(out)
    }

    fn fetch(
        &mut self,
        next: &[Vec<u64>],
        max: usize,
        wait: Duration,
    ) -> anyhow::Result<Vec<(usize, u32, Vec<LogRecord>)>> {
        if self.inputs_checked.elapsed() > INPUT_CHECK_INTERVAL {
            self.inputs_checked = Instant::now();
            check_inputs(&self.transport, &self.pipeline)?;
        }
        if let Some((steps, id)) = &self.faults
            && steps.injected(crate::steps::INPUT_STALL, id)
        {
            self.consumer.pause_all()?;
        }
        self.check_stalls(next)?;
        let fetched = self.consumer.fetch(max, wait);
        // A full batch: the slots share one prefetch queue, and one slot's backlog may hold
        // another's records back; only a consumer with nothing more to give stalls.
        if fetched.iter().map(|f| f.records.len()).sum::<usize>() >= max {
            self.stalls.clear();
        }
        let replay_row = self.sources.replay_row(self.pipeline.spec.inputs.len());
        let first_slot = self.slots.start;
        Ok(fetched
            .into_iter()
            .filter_map(|mut f| {
                let ti = self.sources.topics.iter().position(|t| *t == f.topic)?;
                if Some(ti) == replay_row {
                    // Only dead letters within the ranges asked for are replayed: not those
                    // between two ranges, nor new ones past the last.
                    let ranges = &self.sources.replay_ranges[(f.partition - first_slot) as usize];
                    f.records.retain(|r| in_replay(ranges, r.offset));
                }
                (!f.records.is_empty()).then_some((ti, f.partition, f.records))
            })
            .collect())
    }

    fn commit_start(&mut self, db: &Arc<PartitionDb>, batch: Arc<Batch>) -> anyhow::Result<()> {
        let offsets = self.offsets(&batch);
        self.committer.start_job(Job {
            db: db.clone(),
            batch,
            offsets,
        })
    }

    fn fetch_waker(&self) -> Option<crate::transport::FetchWaker> {
        Some(self.consumer.waker())
    }

    fn commit_ready(&mut self) -> bool {
        self.committer.ready()
    }

    fn commit_finish(&mut self) -> anyhow::Result<()> {
        self.committer.finish()
    }

    fn replay_done(&mut self, slot: u32, next: u64) -> bool {
        let idx = (slot - self.slots.start) as usize;
        let Some(&end) = self.sources.replay_ends.get(idx) else {
            return true;
        };
        next >= end
            || self
                .consumer
                .position(&self.pipeline.dlq_topic(), slot)
                .is_some_and(|p| p >= end)
    }

    fn end_offset(&mut self, input: usize, slot: u32, next: u64) -> Option<u64> {
        let topic = &self.sources.topics[input];
        let end = match self.ends.get(&(input, slot)) {
            Some((end, at)) if at.elapsed() < END_OFFSET_TTL => *end,
            cached => {
                let cached = cached.map(|(end, _)| *end);
                // Asked of a client that never fetches: asked of the input consumer, the
                // question would wait behind its long-polling fetch. Asked once, briefly: the
                // partition's loop waits for the answer.
                match self.watermarks.end_once(topic, slot, END_OFFSET_WAIT) {
                    Ok(end) => {
                        self.ends_failing = None;
                        self.ends.insert((input, slot), (end, Instant::now()));
                        end
                    }
                    Err(e) => {
                        if self.ends_failing.is_none() {
                            tracing::warn!("asking for the end of {topic}/{slot}: {e}");
                            self.ends_failing = Some((Instant::now(), e.to_string()));
                        }
                        // An end only grows: the last one known still bounds what is there
                        // to read. Asked again after the same interval as an answer.
                        let end = cached?;
                        self.ends.insert((input, slot), (end, Instant::now()));
                        end
                    }
                }
            }
        };
        // Transaction markers take offsets: once the consumer's position passed the end,
        // nothing committed is left to read.
        if self
            .consumer
            .position(topic, slot)
            .is_some_and(|p| p >= end)
        {
            Some(next)
        } else {
            Some(end)
        }
    }
}

/// A commit for the committer thread.
struct Job {
    db: Arc<PartitionDb>,
    batch: Arc<Batch>,
    /// The batch's input offsets by topic name.
    offsets: Vec<(String, u32, u64)>,
}

/// What the committer thread owns.
struct CommitterState {
    producer: BatchProducer,
    group: GroupMetadata,
    changelogs: Vec<String>,
    stores: Vec<String>,
    audit: Option<CommitAudit>,
    /// Commits of this session so far.
    seq: std::sync::atomic::AtomicU64,
    /// The host's holds ([`crate::steps::COMMIT_SEND`]), and the partition's id.
    steps: Arc<crate::steps::Steps>,
    id: String,
    /// Set, under its lock, when the session gave the commit in flight up: from then on this
    /// thread writes nothing to RocksDB, which the next session uses.
    given_up: Arc<parking_lot::Mutex<bool>>,
}

/// Who commits, for the record of each commit a test asks for ([`crate::steps::COMMITS_ENV`]).
#[derive(Clone, Debug)]
pub struct CommitAudit {
    /// The topic of the records (one partition).
    pub topic: String,
    /// This host.
    pub host: String,
    /// The partition.
    pub partition: String,
    /// The epoch of the assignment the session runs under.
    pub epoch: u64,
    /// The session's start, in ms since the epoch: sessions of one host and epoch differ.
    pub session: i64,
}

/// The session's committer thread: one commit at a time, in the order started.
struct Committer {
    jobs: Option<mpsc::SyncSender<Job>>,
    done: mpsc::Receiver<anyhow::Result<()>>,
    thread: Option<JoinHandle<()>>,
    /// A commit was started and its result not collected.
    busy: bool,
    /// The result of the commit in flight, once it came.
    result: Option<anyhow::Result<()>>,
    /// When the commit in flight was started.
    started: Option<Instant>,
    /// How long a commit may take ([`crate::transport::kafka::COMMIT_HANG`]).
    hang: Duration,
    /// The committer thread's [`CommitterState::given_up`].
    given_up: Arc<parking_lot::Mutex<bool>>,
}

impl Committer {
    /// With `init`, the thread first registers the transactional producer
    /// (`init_transactions`); every commit fails with its error if that fails.
    fn start(id: &str, init: bool, hang: Duration, state: CommitterState) -> anyhow::Result<Self> {
        let (jobs, rx) = mpsc::sync_channel::<Job>(1);
        let (tx, done) = mpsc::sync_channel(1);
        let given_up = state.given_up.clone();
        let thread = std::thread::Builder::new()
            .name(format!("baton-commit-{id}"))
            .spawn(move || {
                let registered = if init {
                    state
                        .producer
                        .init_transactions()
                        .map_err(|e| format!("registering the transactional producer: {e:#}"))
                } else {
                    Ok(())
                };
                for job in rx {
                    let r = match &registered {
                        Ok(()) => state.commit(&job),
                        Err(e) => Err(anyhow::anyhow!("{e}")),
                    };
                    // The batch is let go of before the result is sent: the partition thread
                    // then owns the writes alone and moves them into its cache.
                    drop(job);
                    if tx.send(r).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Committer {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
            busy: false,
            result: None,
            started: None,
            hang,
            given_up,
        })
    }

    fn start_job(&mut self, job: Job) -> anyhow::Result<()> {
        anyhow::ensure!(!self.busy, "a commit is already in flight");
        self.jobs
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("the committer has stopped"))?
            .send(job)
            .map_err(|_| anyhow::anyhow!("the committer has stopped"))?;
        self.busy = true;
        self.started = Some(Instant::now());
        Ok(())
    }

    fn ready(&mut self) -> bool {
        if !self.busy || self.result.is_some() {
            return true;
        }
        if self.started.is_some_and(|s| s.elapsed() >= self.hang) {
            // Taken by `finish`, which gives it up.
            return true;
        }
        match self.done.try_recv() {
            Ok(r) => {
                self.result = Some(r);
                true
            }
            Err(mpsc::TryRecvError::Empty) => false,
            Err(mpsc::TryRecvError::Disconnected) => {
                self.result = Some(Err(anyhow::anyhow!("the committer stopped")));
                true
            }
        }
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        if !self.busy {
            return Ok(());
        }
        self.busy = false;
        if let Some(r) = self.result.take() {
            return r;
        }
        let waited = self.started.map_or(Duration::ZERO, |s| s.elapsed());
        match self.done.recv_timeout(self.hang.saturating_sub(waited)) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(anyhow::anyhow!("the committer stopped"))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Whatever the stuck call does later, RocksDB is the next session's; and the
                // next session's producer fences this one, so its transaction cannot commit.
                *self.given_up.lock() = true;
                Err(anyhow::anyhow!(
                    "a commit did not finish within {}s (librdkafka can wait for ever for a \
                     group coordinator it lost, after a broker restart): it is given up and the \
                     partition's clients are made again",
                    self.hang.as_secs_f64()
                ))
            }
        }
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        // A commit in flight ends (committed or aborted) before the session does: the next
        // session must not find RocksDB written under it.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            if *self.given_up.lock() {
                // Stuck in a call that may never return: left to end on its own, if ever.
                tracing::warn!("a committer stuck in a Kafka call is left behind");
                return;
            }
            let _ = t.join();
        }
    }
}

impl CommitterState {
    fn send_batch(&self, batch: &Batch) -> anyhow::Result<()> {
        // The changelog records of each store and slot in one call: at millions of keys there
        // is one per input record.
        type Run<'a> = ((usize, u32), Vec<(&'a [u8], Option<&'a [u8]>)>);
        let mut runs: Vec<Run<'_>> = Vec::new();
        for w in batch.writes.iter() {
            let (slot, key) = w
                .key
                .split_first_chunk::<4>()
                .ok_or_else(|| anyhow::anyhow!("a state key without its slot: {:?}", w.key))?;
            let at = (w.store, u32::from_be_bytes(*slot));
            // Writes come grouped by store and key: the last run is nearly always the one.
            let last = runs.len().checked_sub(1).filter(|&i| runs[i].0 == at);
            let run = match last.or_else(|| runs.iter().position(|(to, _)| *to == at)) {
                Some(i) => i,
                None => {
                    runs.push((at, Vec::new()));
                    runs.len() - 1
                }
            };
            runs[run].1.push((key, w.value));
        }
        for ((store, slot), records) in runs {
            self.producer
                .send_many(&self.changelogs[store], slot, records)?;
        }
        for o in &batch.outputs {
            self.producer.send(&o.topic, o.partition, &o.record)?;
        }
        Ok(())
    }

    /// The record of this commit, in its transaction, when a test asks for one.
    fn send_audit(&self, job: &Job) -> anyhow::Result<()> {
        let Some(a) = &self.audit else { return Ok(()) };
        let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let value = serde_json::json!({
            "host": a.host, "partition": a.partition, "epoch": a.epoch, "session": a.session,
            "seq": seq, "offsets": job.offsets, "at": crate::control::now_ms(),
        });
        self.producer.send_parts(
            &a.topic,
            0,
            Some(a.partition.as_bytes()),
            Some(&serde_json::to_vec(&value)?),
            crate::control::now_ms(),
        )?;
        Ok(())
    }

    fn commit(&self, job: &Job) -> anyhow::Result<()> {
        self.steps.pass(crate::steps::COMMIT_SEND, &self.id);
        let batch = &job.batch;
        self.producer.begin()?;
        let result = self
            .send_batch(batch)
            .and_then(|()| self.send_audit(job))
            .and_then(|()| {
                let t0 = Instant::now();
                let written = self.producer.flush()?;
                let t1 = Instant::now();
                self.producer.commit(&job.offsets, &self.group)?;
                tracing::debug!(
                    flush_us = (t1 - t0).as_micros() as u64,
                    commit_us = t1.elapsed().as_micros() as u64,
                    "transaction committed"
                );
                Ok(written)
            });
        let written = match result {
            Ok(w) => w,
            Err(e) => {
                self.producer.abort();
                return Err(e);
            }
        };
        // Committed in Kafka: now RocksDB, with the input and changelog offsets.
        let mut meta = Vec::with_capacity(job.offsets.len() + written.len());
        for (topic, slot, next) in &job.offsets {
            meta.push((
                input_offset_key(topic, *slot),
                Some(next.to_be_bytes().to_vec()),
            ));
        }
        for ((topic, partition), last) in &written {
            if let Some(si) = self.changelogs.iter().position(|t| t == topic) {
                meta.push((
                    changelog_offset_key(&self.stores[si], *partition),
                    Some((last + 1).to_be_bytes().to_vec()),
                ));
            }
        }
        // Not once the session gave this commit up: the next session owns the database.
        let given_up = self.given_up.lock();
        anyhow::ensure!(
            !*given_up,
            "the session gave this commit up: RocksDB is not written"
        );
        job.db.commit(batch.writes.sorted(), &meta)?;
        drop(given_up);
        Ok(())
    }
}
