//! One partition's loop: fetch a batch from its slots → process each slot's records in the
//! guest → commit state, outputs and input offsets atomically. It owns the partition's instance
//! and batch overlay and is the only writer of the partition's database.
//!
//! Commit on the embedded log (an outbox): one RocksDB write carries the batch's state writes,
//! the per-slot input offsets, the batch sequence number and the batch's outputs (the outbox).
//! Only then are the outputs appended to their topics, as idempotent appends tagged with the
//! partition's producer id and the batch sequence. After a crash, the task re-sends the outbox
//! of the last committed batch; the log skips whatever it already has. So state, outputs and
//! offsets move together, exactly once.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;

use crate::cluster::PipelineRecord;
use crate::runtime::{CallError, Cursor, HostCtx, Instance, Message, Module, Output, Runtime};
use crate::state::PartitionDb;
use crate::transport::embedded::{EmbeddedLog, decode_record, encode_record};
use crate::transport::{LogRecord, Record};

/// Tuning of the partition loop.
#[derive(Debug, Clone)]
pub struct TaskConfig {
    /// Most records per batch (one commit).
    pub max_batch: usize,
    /// Most records per guest call.
    pub max_call: usize,
    /// CPU budget of one guest call, in epoch ticks of 10 ms.
    pub call_ticks: u64,
    /// Linear memory limit of an instance, in bytes.
    pub memory_limit: usize,
}

impl Default for TaskConfig {
    fn default() -> Self {
        TaskConfig {
            max_batch: 8192,
            max_call: 512,
            call_ticks: 1000,
            memory_limit: 256 << 20,
        }
    }
}

/// What a partition is doing.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Opening state and instantiating.
    Starting,
    /// Processing.
    Running,
    /// Stopped on request.
    Stopped,
    /// Stopped by an error it cannot get past; the message says which.
    Failed(String),
}

/// Progress of one input slot.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
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
    /// Records sent to the dead-letter topic since start.
    pub dead_letters: AtomicU64,
    /// Batches committed since start.
    pub batches: AtomicU64,
    /// The last processing error (dead-lettered or not), if any.
    pub last_error: Mutex<Option<String>>,
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
    /// The log.
    pub log: Arc<EmbeddedLog>,
    /// The runtime.
    pub runtime: Arc<Runtime>,
    /// The module version to run.
    pub module: Module,
    /// Tuning.
    pub config: TaskConfig,
    /// Shared status.
    pub status: Arc<PartitionStatus>,
    /// Set to stop at the next batch boundary.
    pub stop: Arc<AtomicBool>,
}

impl PartitionStatus {
    /// A status in the starting phase.
    pub fn new() -> Self {
        PartitionStatus {
            phase: Mutex::new(Phase::Starting),
            progress: Mutex::new(Vec::new()),
            records: AtomicU64::new(0),
            dead_letters: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            last_error: Mutex::new(None),
        }
    }
}

impl Default for PartitionStatus {
    fn default() -> Self {
        Self::new()
    }
}

/// The meta key of the next input offset of `slot` in `topic`.
pub fn input_offset_key(topic: &str, slot: u32) -> String {
    format!("in/{topic}/{slot}")
}

const SEQ_KEY: &str = "seq";
const OUTBOX_KEY: &str = "outbox";

struct Input {
    topic: String,
    /// Next offset per slot of the range.
    next: Vec<u64>,
}

impl PartitionTask {
    /// Runs the loop until stopped or failed. Blocking: call it on a thread of its own.
    pub fn run(self) {
        let span =
            tracing::info_span!("partition", id = %self.id, pipeline = %self.pipeline.spec.name);
        let _g = span.enter();
        match self.run_inner() {
            Ok(()) => *self.status.phase.lock() = Phase::Stopped,
            Err(e) => {
                let msg = format!("{e:#}");
                tracing::error!("partition failed: {msg}");
                *self.status.phase.lock() = Phase::Failed(msg);
            }
        }
    }

    fn producer_id(&self) -> String {
        format!("{}/{}", self.pipeline.spec.name, self.id)
    }

    fn new_instance(&self, ctx: HostCtx) -> anyhow::Result<Instance> {
        let mut inst = self.runtime.instantiate(&self.module, ctx)?;
        inst.init(&self.pipeline.spec.config_pairs()).map_err(|e| {
            anyhow::anyhow!("init of module {} failed: {e}", self.pipeline.spec.module)
        })?;
        Ok(inst)
    }

    /// Replaces a trapped instance, keeping the batch's pending writes and outputs.
    fn replace_instance(&self, inst: Instance) -> anyhow::Result<Instance> {
        let mut ctx = inst.into_ctx();
        ctx.reset_instance_resources();
        self.new_instance(ctx)
    }

    fn run_inner(&self) -> anyhow::Result<()> {
        let spec = &self.pipeline.spec;
        let outputs_allowed = Arc::new(
            spec.outputs
                .iter()
                .map(|t| {
                    Ok((
                        t.clone(),
                        self.log
                            .partitions(t)
                            .ok_or_else(|| anyhow::anyhow!("output topic `{t}` is missing"))?,
                    ))
                })
                .collect::<anyhow::Result<_>>()?,
        );
        let ctx = HostCtx::new(
            spec.name.as_str().into(),
            self.db.clone(),
            outputs_allowed,
            self.config.memory_limit,
        );
        let mut inst = self.new_instance(ctx)?;

        let mut inputs = Vec::new();
        for topic in &spec.inputs {
            let mut next = Vec::new();
            for slot in self.slots.clone() {
                let start = self
                    .pipeline
                    .start_offsets
                    .get(topic)
                    .and_then(|v| v.get(slot as usize))
                    .copied()
                    .unwrap_or(0);
                next.push(
                    self.db
                        .get_meta_u64(&input_offset_key(topic, slot))?
                        .unwrap_or(start),
                );
            }
            inputs.push(Input {
                topic: topic.clone(),
                next,
            });
        }
        let mut seq = self.db.get_meta_u64(SEQ_KEY)?.unwrap_or(0);
        if let Some(outbox) = self.db.get_meta(OUTBOX_KEY)? {
            let outputs = decode_outbox(&outbox)?;
            tracing::info!(
                seq,
                outputs = outputs.len(),
                "re-sending the outbox of the last committed batch"
            );
            self.publish(&outputs, seq)?;
        }
        self.update_progress(&inputs);
        *self.status.phase.lock() = Phase::Running;
        tracing::info!(slots = ?self.slots, "partition running");

        let dlq = spec.dlq_topic();
        let mut rotate = 0usize;
        let slot_count = self.slots.len();
        while !self.stop.load(Ordering::Relaxed) {
            let generation = self.log.generation();
            // Fetch: up to max_batch records, starting at a rotating slot so none starves.
            let mut fetched: Vec<(usize, u32, Vec<LogRecord>)> = Vec::new();
            let mut budget = self.config.max_batch;
            'fetch: for i in 0..slot_count {
                let idx = (rotate + i) % slot_count;
                let slot = self.slots.start + idx as u32;
                for (ti, input) in inputs.iter().enumerate() {
                    if budget == 0 {
                        break 'fetch;
                    }
                    let recs = self.log.read(&input.topic, slot, input.next[idx], budget)?;
                    if !recs.is_empty() {
                        budget -= recs.len();
                        fetched.push((ti, slot, recs));
                    }
                }
            }
            rotate = (rotate + 1) % slot_count.max(1);
            if fetched.is_empty() {
                self.update_progress(&inputs);
                self.log
                    .wait_for_append(generation, Duration::from_millis(100));
                continue;
            }
            let started = Instant::now();
            let batch_span = tracing::debug_span!("batch", seq = seq + 1);
            let _b = batch_span.enter();
            let mut count = 0u64;
            let mut read = Vec::with_capacity(fetched.len());
            for (ti, slot, recs) in fetched {
                let idx = (slot - self.slots.start) as usize;
                if let Some(last) = recs.last() {
                    inputs[ti].next[idx] = last.offset + 1;
                }
                let topic = &inputs[ti].topic;
                count += recs.len() as u64;
                // Records move into guest messages: no copy of keys and values.
                let msgs: Vec<Message> = recs
                    .into_iter()
                    .map(|r| to_message(topic, slot, r))
                    .collect();
                for chunk in msgs.chunks(self.config.max_call) {
                    inst = self.process_chunk(inst, slot, chunk, &dlq)?;
                }
                read.push((ti, slot));
            }
            // Commit: state writes, offsets, sequence and outbox in one RocksDB write.
            seq += 1;
            let ctx = inst.ctx();
            let writes = ctx.overlay.take();
            let outputs = std::mem::take(&mut ctx.outputs);
            let mut meta = Vec::with_capacity(read.len() + 2);
            for (ti, slot) in read {
                let idx = (slot - self.slots.start) as usize;
                meta.push((
                    input_offset_key(&inputs[ti].topic, slot),
                    Some(inputs[ti].next[idx].to_be_bytes().to_vec()),
                ));
            }
            meta.push((SEQ_KEY.to_string(), Some(seq.to_be_bytes().to_vec())));
            meta.push((
                OUTBOX_KEY.to_string(),
                (!outputs.is_empty()).then(|| encode_outbox(&outputs)),
            ));
            self.db.commit(writes, &meta)?;
            self.publish(&outputs, seq)?;
            self.status.records.fetch_add(count, Ordering::Relaxed);
            self.status.batches.fetch_add(1, Ordering::Relaxed);
            self.update_progress(&inputs);
            tracing::debug!(
                records = count,
                outputs = outputs.len(),
                us = started.elapsed().as_micros() as u64,
                "batch committed"
            );
        }
        Ok(())
    }

    /// Processes one slot's chunk; on failure retries each record alone and dead-letters those
    /// that still fail. Returns the instance to use next (a new one after a trap).
    fn process_chunk(
        &self,
        mut inst: Instance,
        slot: u32,
        msgs: &[Message],
        dlq: &str,
    ) -> anyhow::Result<Instance> {
        let cursor = |m: &Message| Cursor {
            topic: m.topic.clone(),
            slot,
            offset: m.offset,
            timestamp: m.timestamp,
        };
        inst.ctx().begin_call(cursor(&msgs[0]));
        let err = match inst.process(msgs, self.config.call_ticks) {
            Ok(()) => {
                inst.ctx().keep_call();
                return Ok(inst);
            }
            Err(e) => e,
        };
        inst.ctx().drop_call();
        if matches!(err, CallError::Trap(_)) {
            inst = self.replace_instance(inst)?;
        }
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
            match inst.process(std::slice::from_ref(m), self.config.call_ticks) {
                Ok(()) => inst.ctx().keep_call(),
                Err(e) => {
                    inst.ctx().drop_call();
                    if matches!(e, CallError::Trap(_)) {
                        inst = self.replace_instance(inst)?;
                    }
                    self.dead_letter(&mut inst, m, &e, dlq);
                }
            }
        }
        Ok(inst)
    }

    fn dead_letter(&self, inst: &mut Instance, m: &Message, err: &CallError, dlq: &str) {
        let msg = err.to_string();
        let (topic, slot, offset) = (&m.topic, m.slot, m.offset);
        tracing::warn!(%topic, slot, offset, "record sent to {dlq}: {msg}");
        let mut headers: Vec<(String, Vec<u8>)> = m
            .headers
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect();
        headers.push(("baton.error".into(), msg.clone().into_bytes()));
        headers.push(("baton.topic".into(), topic.as_bytes().to_vec()));
        headers.push(("baton.slot".into(), slot.to_string().into_bytes()));
        headers.push(("baton.offset".into(), offset.to_string().into_bytes()));
        let record = Record {
            key: m.key.clone(),
            value: m.value.clone(),
            headers,
            timestamp: m.timestamp,
        };
        let partitions = self.log.partitions(dlq).unwrap_or(1);
        inst.ctx().push_dead_letter(Output {
            topic: dlq.to_string(),
            partition: slot % partitions,
            record,
        });
        self.status.dead_letters.fetch_add(1, Ordering::Relaxed);
        *self.status.last_error.lock() = Some(format!("{topic}/{slot}@{offset}: {msg}"));
    }

    /// Appends a committed batch's outputs, idempotently (producer id + batch sequence).
    fn publish(&self, outputs: &[Output], seq: u64) -> anyhow::Result<()> {
        if outputs.is_empty() {
            return Ok(());
        }
        let mut groups: BTreeMap<(&str, u32), Vec<Record>> = BTreeMap::new();
        for o in outputs {
            groups
                .entry((o.topic.as_str(), o.partition))
                .or_default()
                .push(o.record.clone());
        }
        let producer = self.producer_id();
        for ((topic, partition), records) in groups {
            self.log
                .append(topic, partition, &records, Some((&producer, seq)), false)?;
        }
        Ok(())
    }

    fn update_progress(&self, inputs: &[Input]) {
        let mut v = Vec::new();
        for input in inputs {
            for (idx, next) in input.next.iter().enumerate() {
                let slot = self.slots.start + idx as u32;
                let end = self.log.end_offset(&input.topic, slot).unwrap_or(0);
                v.push(SlotProgress {
                    topic: input.topic.clone(),
                    slot,
                    offset: *next,
                    end,
                });
            }
        }
        *self.status.progress.lock() = v;
    }
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
