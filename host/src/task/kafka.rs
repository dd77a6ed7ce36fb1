//! The Kafka side of a partition session: input consumer with manual assignment, a producer
//! (transactional under exactly-once), changelog restore, and the commit protocols.
//!
//! Exactly-once: begin → changelog records (last value per key per batch) + outputs → flush →
//! input offsets via `send_offsets_to_transaction` → commit → RocksDB `WriteBatch` with the
//! state writes, the input offsets and the changelog offsets. At-least-once: the same records
//! without a transaction, flushed, then RocksDB, then the offsets committed to the group.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::io::{Batch, PartitionIo, RestoreProgress, start_offset};
use super::{changelog_offset_key, input_offset_key};
use crate::cluster::{Guarantee, PipelineRecord};
use crate::state::{PartitionDb, WriteOp, slot_key};
use crate::transport::kafka::{BatchProducer, InputConsumer, KafkaTransport};
use crate::transport::{LogRecord, Record};

/// How often end offsets (for lag) are asked of the broker.
const END_OFFSET_TTL: Duration = Duration::from_millis(500);

/// One session of a partition on Kafka.
pub struct KafkaIo {
    transport: Arc<KafkaTransport>,
    pipeline: Arc<PipelineRecord>,
    slots: Range<u32>,
    consumer: InputConsumer,
    producer: BatchProducer,
    changelogs: Vec<String>,
    ends: HashMap<(usize, u32), (u64, Instant)>,
    linger: Duration,
}

impl KafkaIo {
    /// Opens the clients of partition `id`; under exactly-once, fences older producers.
    pub fn open(
        transport: Arc<KafkaTransport>,
        pipeline: Arc<PipelineRecord>,
        id: &str,
        slots: Range<u32>,
    ) -> anyhow::Result<Self> {
        let consumer = transport.input_consumer(&pipeline.group_id())?;
        let eos = pipeline.spec.guarantee == Guarantee::ExactlyOnce;
        let txn_id = pipeline.transactional_id(id);
        let producer = transport.batch_producer(eos.then_some(txn_id.as_str()))?;
        if eos {
            producer.init_transactions()?;
        }
        let changelogs = pipeline
            .spec
            .stores
            .iter()
            .map(|s| pipeline.changelog_topic(s))
            .collect();
        // A transaction costs a few round trips: gather records longer under exactly-once.
        let linger = Duration::from_millis(if eos { 10 } else { 2 });
        Ok(KafkaIo {
            transport,
            pipeline,
            slots,
            consumer,
            producer,
            changelogs,
            ends: HashMap::new(),
            linger,
        })
    }

    fn send_batch(&self, batch: &Batch) -> anyhow::Result<()> {
        for w in &batch.writes {
            let slot = u32::from_be_bytes(w.key[..4].try_into()?);
            let record = Record {
                key: Some(w.key[4..].to_vec()),
                value: w.value.clone(),
                headers: vec![],
                timestamp: crate::cluster::now_ms(),
            };
            self.producer
                .send(&self.changelogs[w.store], slot, &record)?;
        }
        for o in &batch.outputs {
            self.producer.send(&o.topic, o.partition, &o.record)?;
        }
        Ok(())
    }

    fn offsets(&self, batch: &Batch) -> Vec<(String, u32, u64)> {
        batch
            .offsets
            .iter()
            .map(|(ti, slot, next)| (self.pipeline.spec.inputs[*ti].clone(), *slot, *next))
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
        let reader = self
            .transport
            .input_consumer(&format!("{}.restore", self.pipeline.group_id()))?;
        // Per changelog partition: where RocksDB is, and where the changelog ends.
        let mut todo: Vec<(usize, u32, u64, u64)> = Vec::new();
        for (si, topic) in self.changelogs.iter().enumerate() {
            let store = &self.pipeline.spec.stores[si];
            for slot in self.slots.clone() {
                let local = db
                    .get_meta_u64(&changelog_offset_key(store, slot))?
                    .unwrap_or(0);
                let hi = reader.high_watermark(topic, slot)?;
                let start = local.max(reader.low_watermark(topic, slot)?);
                if start < hi {
                    todo.push((si, slot, start, hi));
                }
            }
        }
        let total: u64 = todo.iter().map(|t| t.3 - t.2).sum();
        let report = |done: u64, finished: bool| {
            let secs = started.elapsed().as_secs_f64().max(1e-3);
            progress(RestoreProgress {
                done,
                total,
                rate: done as f64 / secs,
                finished,
            });
        };
        if todo.is_empty() {
            report(0, true);
            return Ok(());
        }
        tracing::info!(
            partitions = todo.len(),
            records = total,
            "restoring state from the changelog"
        );
        reader.assign(
            &todo
                .iter()
                .map(|(si, slot, start, _)| (self.changelogs[*si].clone(), *slot, *start))
                .collect::<Vec<_>>(),
        )?;
        let mut done = 0u64;
        let mut pending: Vec<(usize, u32, u64, u64)> = todo;
        let mut last_progress = Instant::now();
        let mut last_log = Instant::now();
        while !pending.is_empty() {
            let fetched = reader.fetch(
                10_000,
                Duration::from_millis(200),
                Duration::from_millis(20),
            );
            let mut writes = Vec::new();
            let mut meta = Vec::new();
            for f in &fetched {
                let Some(si) = self.changelogs.iter().position(|t| *t == f.topic) else {
                    continue;
                };
                for r in &f.records {
                    let key = slot_key(f.partition, r.record.key.as_deref().unwrap_or_default());
                    writes.push(WriteOp {
                        store: si,
                        key,
                        value: r.record.value.clone(),
                    });
                }
                if let Some(last) = f.records.last() {
                    meta.push((
                        changelog_offset_key(&self.pipeline.spec.stores[si], f.partition),
                        Some((last.offset + 1).to_be_bytes().to_vec()),
                    ));
                }
                done += f.records.len() as u64;
            }
            if !writes.is_empty() {
                db.commit(writes, &meta)?;
                last_progress = Instant::now();
            }
            // A changelog partition is done once the reader's position passed its end
            // (transaction markers and aborted records take offsets too).
            pending.retain(|(si, slot, _, hi)| {
                reader
                    .position(&self.changelogs[*si], *slot)
                    .is_none_or(|p| p < *hi)
            });
            if last_log.elapsed() > Duration::from_secs(2) {
                tracing::info!(done, total, "restoring");
                last_log = Instant::now();
            }
            report(done, false);
            anyhow::ensure!(
                last_progress.elapsed() < Duration::from_secs(60),
                "restore made no progress for 60 s"
            );
        }
        report(done, true);
        tracing::info!(
            records = done,
            secs = started.elapsed().as_secs_f64(),
            "restore finished"
        );
        Ok(())
    }

    fn positions(&mut self, _db: &PartitionDb) -> anyhow::Result<Vec<Vec<u64>>> {
        let spec = &self.pipeline.spec;
        let tps: Vec<(String, u32)> = spec
            .inputs
            .iter()
            .flat_map(|t| self.slots.clone().map(move |s| (t.clone(), s)))
            .collect();
        let committed = self.consumer.committed(&tps)?;
        let mut out = vec![Vec::new(); spec.inputs.len()];
        let mut assign = Vec::new();
        for ((topic, slot), c) in tps.iter().zip(committed) {
            let ti = spec.inputs.iter().position(|t| t == topic).unwrap_or(0);
            let next = c.unwrap_or_else(|| start_offset(&self.pipeline, ti, *slot));
            out[ti].push(next);
            assign.push((topic.clone(), *slot, next));
        }
        self.consumer.assign(&assign)?;
        Ok(out)
    }

    fn fetch(
        &mut self,
        _next: &[Vec<u64>],
        max: usize,
    ) -> anyhow::Result<Vec<(usize, u32, Vec<LogRecord>)>> {
        let fetched = self
            .consumer
            .fetch(max, Duration::from_millis(100), self.linger);
        let inputs = &self.pipeline.spec.inputs;
        Ok(fetched
            .into_iter()
            .filter_map(|f| {
                inputs
                    .iter()
                    .position(|t| *t == f.topic)
                    .map(|ti| (ti, f.partition, f.records))
            })
            .collect())
    }

    fn commit(&mut self, db: &PartitionDb, batch: Batch) -> anyhow::Result<()> {
        let offsets = self.offsets(&batch);
        let written = if self.producer.is_transactional() {
            self.producer.begin()?;
            let result = self.send_batch(&batch).and_then(|()| {
                let t0 = Instant::now();
                let written = self.producer.flush()?;
                let t1 = Instant::now();
                self.producer.commit(&offsets, &self.consumer)?;
                tracing::debug!(
                    flush_us = (t1 - t0).as_micros() as u64,
                    commit_us = t1.elapsed().as_micros() as u64,
                    "transaction committed"
                );
                Ok(written)
            });
            match result {
                Ok(w) => w,
                Err(e) => {
                    self.producer.abort();
                    return Err(e);
                }
            }
        } else {
            let t0 = Instant::now();
            self.send_batch(&batch)?;
            let t1 = Instant::now();
            let written = self.producer.flush()?;
            tracing::debug!(
                send_us = (t1 - t0).as_micros() as u64,
                flush_us = t1.elapsed().as_micros() as u64,
                "batch flushed"
            );
            written
        };
        // Committed in Kafka: now RocksDB, with the input and changelog offsets.
        let mut meta = Vec::with_capacity(offsets.len() + written.len());
        for (topic, slot, next) in &offsets {
            meta.push((
                input_offset_key(topic, *slot),
                Some(next.to_be_bytes().to_vec()),
            ));
        }
        for ((topic, partition), last) in &written {
            if let Some(si) = self.changelogs.iter().position(|t| t == topic) {
                meta.push((
                    changelog_offset_key(&self.pipeline.spec.stores[si], *partition),
                    Some((last + 1).to_be_bytes().to_vec()),
                ));
            }
        }
        db.commit(batch.writes, &meta)?;
        if !self.producer.is_transactional() {
            self.consumer.commit_async(&offsets)?;
        }
        Ok(())
    }

    fn end_offset(&mut self, input: usize, slot: u32, next: u64) -> Option<u64> {
        let topic = &self.pipeline.spec.inputs[input];
        let end = match self.ends.get(&(input, slot)) {
            Some((end, at)) if at.elapsed() < END_OFFSET_TTL => *end,
            _ => {
                let end = self.consumer.high_watermark(topic, slot).ok()?;
                self.ends.insert((input, slot), (end, Instant::now()));
                end
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
