//! How a batch reaches durable storage, per transport: the [`PartitionIo`] of a session.
//!
//! - Embedded log ([`EmbeddedIo`], an outbox): one RocksDB write (WAL synced) carries the
//!   batch's state writes, the input offsets, the batch sequence number and the batch's outputs;
//!   then the outputs are appended (and synced) as idempotent appends tagged with the
//!   partition's producer id and the sequence. After a crash or a power loss the outbox of the
//!   last committed batch is re-sent; the log skips what it has and completes a torn append.
//! - Kafka ([`super::kafka::KafkaIo`]): one transaction carries the changelog records, the
//!   outputs and the input offsets; only after it commits does RocksDB get the state writes with
//!   the changelog and input offsets. RocksDB never holds uncommitted data; restore replays the
//!   changelog from RocksDB's offsets.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::input_offset_key;
use crate::control::PipelineRecord;
use crate::record::Output;
use crate::state::{PartitionDb, Writes};
use crate::transport::embedded::{Appended, EmbeddedLog, decode_record, encode_record};
use crate::transport::{LogRecord, Record};

/// What one batch commits.
pub struct Batch {
    /// State writes, coalesced: the last value per key.
    pub writes: Arc<Writes>,
    /// Output records and dead letters.
    pub outputs: Vec<Output>,
    /// Per input (index into the pipeline's inputs) and slot: the next offset to read.
    pub offsets: Vec<(usize, u32, u64)>,
}

/// Progress of a restore, shown by `GET /api/v1/partitions`.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, schemars::JsonSchema)]
pub struct RestoreProgress {
    /// Changelog records applied.
    pub done: u64,
    /// Changelog records to apply.
    pub total: u64,
    /// Records per second so far.
    pub rate: f64,
    /// True once caught up.
    pub finished: bool,
}

/// Dead letters to process again, per slot: ranges `[from, to)` of the slot's partition of the
/// dead-letter topic, in order (`POST /api/v1/pipelines/{p}/dead-letters/replay`).
pub type ReplayRanges = BTreeMap<u32, Vec<(u64, u64)>>;

/// What of a slot's replay ranges is still to do from `cursor` (the next dead letter not yet
/// replayed): `[start, end)` from the first pending dead letter to the end of the last range,
/// or `None` when every range is behind it. Offsets between two ranges are not replayed (see
/// [`in_replay`]); a cursor short of a range's end only by transaction markers still reaches
/// the ranges after it.
pub fn replay_window(ranges: &[(u64, u64)], cursor: u64) -> Option<(u64, u64)> {
    let first = ranges.iter().find(|(_, to)| *to > cursor)?;
    let end = ranges.iter().map(|(_, to)| *to).max().unwrap_or(0);
    Some((cursor.max(first.0), end))
}

/// True when the dead letter at `offset` is in one of the ranges to replay.
pub fn in_replay(ranges: &[(u64, u64)], offset: u64) -> bool {
    ranges
        .iter()
        .any(|(from, to)| (*from..*to).contains(&offset))
}

/// The sources a session reads: the pipeline's inputs, then its dead-letter topic when dead
/// letters of an owned slot are to be replayed. A source is named by its index (`ti`) in batches
/// and offsets; the dead-letter row's offsets are the replay's progress, committed with the
/// batch like any input's.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// Topic names: the inputs, then the dead-letter topic if it is read.
    pub topics: Vec<String>,
    /// Per slot of the partition: where the replay of its dead letters ends (exclusive).
    pub replay_ends: Vec<u64>,
    /// Per slot of the partition: the ranges of dead letters to replay.
    pub replay_ranges: Vec<Vec<(u64, u64)>>,
}

impl Sources {
    /// The index of the dead-letter row, when dead letters are replayed.
    pub fn replay_row(&self, inputs: usize) -> Option<usize> {
        (self.topics.len() > inputs).then_some(inputs)
    }
}

/// The transport side of one session of a partition.
pub trait PartitionIo: Send {
    /// Brings the partition's state up to what was committed.
    fn restore(
        &mut self,
        db: &PartitionDb,
        progress: &dyn Fn(RestoreProgress),
    ) -> anyhow::Result<()>;
    /// Where each input resumes: next offset per input, per slot of the partition; then, when
    /// `replays` has dead letters of an owned slot still to do, a row for the dead-letter topic.
    fn positions(
        &mut self,
        db: &PartitionDb,
        replays: &ReplayRanges,
    ) -> anyhow::Result<Vec<Vec<u64>>>;
    /// Up to `max` records from the slots, grouped by (input, slot): what is there, at once;
    /// when nothing is, waits up to `wait` for some.
    fn fetch(
        &mut self,
        next: &[Vec<u64>],
        max: usize,
        wait: Duration,
    ) -> anyhow::Result<Vec<(usize, u32, Vec<LogRecord>)>>;
    /// Starts committing a batch atomically: its outputs, state writes and offsets. One commit
    /// is in flight at a time; [`PartitionIo::commit_finish`] ends it. Processing may go on
    /// meanwhile, but nothing of the batch is in RocksDB before it committed.
    fn commit_start(&mut self, db: &Arc<PartitionDb>, batch: Arc<Batch>) -> anyhow::Result<()>;
    /// What wakes [`PartitionIo::fetch`] waiting for input from another thread, if anything.
    fn fetch_waker(&self) -> Option<crate::transport::FetchWaker> {
        None
    }
    /// True when the commit in flight has ended (well or not), or when none is.
    fn commit_ready(&mut self) -> bool {
        true
    }
    /// Waits for the commit in flight to end; on error nothing of it is in RocksDB.
    fn commit_finish(&mut self) -> anyhow::Result<()>;
    /// Commits a batch and waits for it.
    fn commit(&mut self, db: &Arc<PartitionDb>, batch: Arc<Batch>) -> anyhow::Result<()> {
        self.commit_start(db, batch)?;
        self.commit_finish()
    }
    /// The end of an input slot for lag: `next` when everything committed there is consumed.
    fn end_offset(&mut self, input: usize, slot: u32, next: u64) -> Option<u64>;
    /// True when the replay of `slot`'s dead letters has nothing left below its end, `next`
    /// being the cursor (transaction markers may keep it short of the end).
    fn replay_done(&mut self, slot: u32, next: u64) -> bool {
        let _ = (slot, next);
        true
    }
}

/// Where a slot starts when nothing was committed for it: the pipeline's start offsets.
pub fn start_offset(pipeline: &PipelineRecord, input: usize, slot: u32) -> u64 {
    let topic = &pipeline.spec.inputs[input];
    pipeline
        .start_offsets
        .get(topic)
        .and_then(|v| v.get(slot as usize))
        .copied()
        .unwrap_or(0)
}

const SEQ_KEY: &str = "seq";
const OUTBOX_KEY: &str = "outbox";

/// The metadata keys of `pipeline`'s partition that belong to `slots`: every input,
/// dead-letter and changelog position of them (what a merge copies of the other side).
pub fn meta_keys_of(pipeline: &PipelineRecord, slots: Range<u32>) -> Vec<String> {
    let mut keys = Vec::new();
    let dlq = pipeline.dlq_topic();
    for slot in slots {
        for topic in pipeline.spec.inputs.iter().chain([&dlq]) {
            keys.push(input_offset_key(topic, slot));
        }
        for store in pipeline.spec.state_stores() {
            keys.push(super::changelog_offset_key(&store, slot));
        }
    }
    keys
}

/// The metadata keys of a database of `pipeline`'s partition over `slots` that one half of a
/// split, keeping `keep`, deletes: every input, dead-letter and changelog position of the
/// other slots, and the outbox of the partition's last batch, which it published already
/// (a half re-sending it under its own producer would publish it twice).
pub fn meta_keys_outside(
    pipeline: &PipelineRecord,
    slots: Range<u32>,
    keep: Range<u32>,
) -> Vec<String> {
    let mut keys = vec![OUTBOX_KEY.to_string()];
    for slot in slots.filter(|s| !keep.contains(s)) {
        keys.extend(meta_keys_of(pipeline, slot..slot + 1));
    }
    keys
}

/// The embedded log's side of a partition.
pub struct EmbeddedIo {
    log: Arc<EmbeddedLog>,
    pipeline: Arc<PipelineRecord>,
    slots: Range<u32>,
    producer: String,
    seq: u64,
    rotate: usize,
    sources: Sources,
    /// The result of the last commit, until it is collected.
    finished: Option<anyhow::Result<()>>,
}

impl EmbeddedIo {
    /// The IO of partition `id` over `slots`.
    pub fn new(
        log: Arc<EmbeddedLog>,
        pipeline: Arc<PipelineRecord>,
        id: &str,
        slots: Range<u32>,
    ) -> Self {
        // A pipeline purged and created again must not inherit its predecessor's sequences.
        let producer = match pipeline.incarnation {
            Some(n) => format!("{}.{n}/{id}", pipeline.spec.name),
            None => format!("{}/{id}", pipeline.spec.name),
        };
        EmbeddedIo {
            log,
            slots,
            sources: Sources {
                topics: pipeline.spec.inputs.clone(),
                replay_ends: Vec::new(),
                replay_ranges: Vec::new(),
            },
            pipeline,
            producer,
            seq: 0,
            rotate: 0,
            finished: None,
        }
    }

    /// Appends a committed batch's outputs, idempotently (producer id + batch sequence).
    fn publish(&self, outputs: &[Output], seq: u64) -> anyhow::Result<()> {
        let mut groups: BTreeMap<(&str, u32), Vec<Record>> = BTreeMap::new();
        for o in outputs {
            groups
                .entry((o.topic.as_str(), o.partition))
                .or_default()
                .push(o.record.clone());
        }
        for ((topic, partition), records) in groups {
            let r = self.log.append(
                topic,
                partition,
                &records,
                Some((&self.producer, seq)),
                // On disk before the next batch's commit replaces the outbox that could
                // re-send it: outputs survive a power loss as the state does.
                true,
            )?;
            if r == Appended::Duplicate {
                tracing::debug!(topic, partition, seq, "outbox already in the log");
            }
        }
        Ok(())
    }
}

impl EmbeddedIo {
    /// Commits a batch: RocksDB (synced) then the outputs.
    fn commit_now(&mut self, db: &PartitionDb, batch: &Batch) -> anyhow::Result<()> {
        let seq = self.seq + 1;
        let mut meta = Vec::with_capacity(batch.offsets.len() + 2);
        for (ti, slot, next) in &batch.offsets {
            meta.push((
                input_offset_key(&self.sources.topics[*ti], *slot),
                Some(next.to_be_bytes().to_vec()),
            ));
        }
        meta.push((SEQ_KEY.to_string(), Some(seq.to_be_bytes().to_vec())));
        meta.push((
            OUTBOX_KEY.to_string(),
            (!batch.outputs.is_empty()).then(|| encode_outbox(&batch.outputs)),
        ));
        // Synced: after a power loss the state, offsets and outbox are those of a committed batch.
        db.commit_with(batch.writes.sorted(), &meta, true)?;
        self.seq = seq;
        self.publish(&batch.outputs, seq)
    }
}

impl PartitionIo for EmbeddedIo {
    fn restore(
        &mut self,
        db: &PartitionDb,
        progress: &dyn Fn(RestoreProgress),
    ) -> anyhow::Result<()> {
        self.seq = db.get_meta_u64(SEQ_KEY)?.unwrap_or(0);
        if let Some(outbox) = db.get_meta(OUTBOX_KEY)? {
            let outputs = decode_outbox(&outbox)?;
            tracing::info!(
                seq = self.seq,
                outputs = outputs.len(),
                "re-sending the outbox of the last committed batch"
            );
            self.publish(&outputs, self.seq)?;
        }
        progress(RestoreProgress {
            done: 0,
            total: 0,
            rate: 0.0,
            finished: true,
        });
        Ok(())
    }

    fn positions(
        &mut self,
        db: &PartitionDb,
        replays: &ReplayRanges,
    ) -> anyhow::Result<Vec<Vec<u64>>> {
        let mut out = Vec::new();
        for (ti, topic) in self.pipeline.spec.inputs.iter().enumerate() {
            let mut v = Vec::new();
            for slot in self.slots.clone() {
                let start = start_offset(&self.pipeline, ti, slot);
                v.push(
                    db.get_meta_u64(&input_offset_key(topic, slot))?
                        .unwrap_or(start),
                );
            }
            out.push(v);
        }
        self.sources
            .topics
            .truncate(self.pipeline.spec.inputs.len());
        self.sources.replay_ends.clear();
        self.sources.replay_ranges.clear();
        let dlq = self.pipeline.dlq_topic();
        let mut row = Vec::new();
        for slot in self.slots.clone() {
            let cursor = db.get_meta_u64(&input_offset_key(&dlq, slot))?.unwrap_or(0);
            let ranges = replays.get(&slot).cloned().unwrap_or_default();
            let (start, end) = replay_window(&ranges, cursor).unwrap_or((cursor, cursor));
            row.push(start);
            self.sources.replay_ends.push(end);
            self.sources.replay_ranges.push(ranges);
        }
        if row
            .iter()
            .zip(&self.sources.replay_ends)
            .any(|(s, e)| s < e)
        {
            self.sources.topics.push(dlq);
            out.push(row);
        }
        Ok(out)
    }

    fn fetch(
        &mut self,
        next: &[Vec<u64>],
        max: usize,
        wait: Duration,
    ) -> anyhow::Result<Vec<(usize, u32, Vec<LogRecord>)>> {
        let generation = self.log.generation();
        let mut fetched = Vec::new();
        let mut budget = max;
        let n = self.slots.len();
        // Start at a rotating slot so that none starves.
        'fetch: for i in 0..n {
            let idx = (self.rotate + i) % n;
            let slot = self.slots.start + idx as u32;
            for (ti, topic) in self.sources.topics.iter().enumerate() {
                if budget == 0 {
                    break 'fetch;
                }
                let mut want = budget;
                let mut from = next[ti][idx];
                if self.sources.replay_row(self.pipeline.spec.inputs.len()) == Some(ti) {
                    // Dead letters are replayed within their ranges only: from the pending
                    // range's start to its end.
                    let ranges = &self.sources.replay_ranges[idx];
                    let Some(&(start, end)) = ranges.iter().find(|(_, to)| *to > from) else {
                        continue;
                    };
                    from = from.max(start);
                    want = want.min((end - from) as usize);
                }
                let recs = self.log.read(topic, slot, from, want)?;
                if !recs.is_empty() {
                    budget -= recs.len();
                    fetched.push((ti, slot, recs));
                }
            }
        }
        self.rotate = (self.rotate + 1) % n.max(1);
        if fetched.is_empty() && !wait.is_zero() {
            self.log.wait_for_append(generation, wait);
        }
        Ok(fetched)
    }

    fn commit_start(&mut self, db: &Arc<PartitionDb>, batch: Arc<Batch>) -> anyhow::Result<()> {
        // RocksDB is the embedded log's durability: the commit is done at once.
        self.finished = Some(self.commit_now(db, &batch));
        Ok(())
    }

    fn commit_finish(&mut self) -> anyhow::Result<()> {
        self.finished.take().unwrap_or(Ok(()))
    }

    fn replay_done(&mut self, slot: u32, next: u64) -> bool {
        let idx = (slot - self.slots.start) as usize;
        self.sources
            .replay_ends
            .get(idx)
            .is_none_or(|end| next >= *end)
    }

    fn end_offset(&mut self, input: usize, slot: u32, _next: u64) -> Option<u64> {
        self.log.end_offset(&self.sources.topics[input], slot).ok()
    }
}

fn encode_outbox(outputs: &[Output]) -> Vec<u8> {
    let mut buf = Vec::new();
    for o in outputs {
        buf.extend_from_slice(&(o.topic.len() as u32).to_le_bytes());
        buf.extend_from_slice(o.topic.as_bytes());
        buf.extend_from_slice(&o.partition.to_le_bytes());
        encode_record(&mut buf, &o.record);
    }
    buf
}

fn decode_outbox(mut b: &[u8]) -> anyhow::Result<Vec<Output>> {
    let bad = || anyhow::anyhow!("the outbox in the partition's state does not decode");
    let mut out = Vec::new();
    while !b.is_empty() {
        let n = u32::from_le_bytes(b.get(0..4).ok_or_else(bad)?.try_into()?) as usize;
        let topic = String::from_utf8(b.get(4..4 + n).ok_or_else(bad)?.to_vec())?;
        let partition = u32::from_le_bytes(b.get(4 + n..8 + n).ok_or_else(bad)?.try_into()?);
        let (record, used) = decode_record(&b[8 + n..]).ok_or_else(bad)?;
        out.push(Output {
            topic,
            partition,
            record,
        });
        b = &b[8 + n + used..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outbox_round_trip() {
        let outs = vec![
            Output {
                topic: "a".into(),
                partition: 3,
                record: Record {
                    key: None,
                    value: Some(b"v".to_vec()),
                    headers: vec![],
                    timestamp: 5,
                },
            },
            Output {
                topic: "bb".into(),
                partition: 0,
                record: Record::default(),
            },
        ];
        assert_eq!(decode_outbox(&encode_outbox(&outs)).unwrap(), outs);
    }
}
