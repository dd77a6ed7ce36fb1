//! The partitions this host runs: started per pipeline, stopped, and shown.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

use parking_lot::Mutex;

use crate::control::PipelineRecord;
use crate::http::model::{PartitionInfo, PartitionState};
use crate::partition::kafka::KafkaIo;
use crate::partition::{
    EmbeddedIo, EventLog, IoFactory, ModuleTarget, PartitionIo, PartitionStatus, PartitionTask,
    Phase, ReplayPlan, RollbackHook, Settings,
};
use crate::runtime::{OutputTopic, WriteLimits};
use crate::state::PartitionDb;
use crate::transport::TopicKind;

use crate::app::Baton;

/// A running partition.
pub struct PartitionHandle {
    /// Partition id.
    pub id: String,
    /// Pipeline name.
    pub pipeline: String,
    /// Slots `[start, end)`.
    pub slots: std::ops::Range<u32>,
    /// Epoch: bumped on each change of owner or shape.
    pub epoch: u64,
    /// The database.
    pub db: Arc<PartitionDb>,
    /// Live status.
    pub status: Arc<PartitionStatus>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) thread: Mutex<Option<JoinHandle<()>>>,
}

impl Baton {
    /// Starts a pipeline's partitions here; a failure is kept as the pipeline's phase.
    pub(crate) fn start_or_record(&self, record: Arc<PipelineRecord>) {
        let name = record.spec.name.clone();
        match self.start_pipeline(record) {
            Ok(()) => {
                self.start_failures.write().remove(&name);
            }
            Err(e) => {
                let reason = format!("starting its partitions failed: {e:#}");
                tracing::error!(pipeline = %name, "{reason}");
                self.start_failures.write().insert(name, reason);
            }
        }
    }

    /// Stops a pipeline's partitions here and forgets them.
    pub(crate) fn stop_pipeline(&self, name: &str) {
        let parts: Vec<_> = self
            .partitions
            .read()
            .values()
            .filter(|h| h.pipeline == name)
            .cloned()
            .collect();
        for p in &parts {
            p.stop.store(true, Ordering::Relaxed);
        }
        for p in &parts {
            if let Some(t) = p.thread.lock().take() {
                let _ = t.join();
            }
        }
        self.partitions.write().retain(|_, h| h.pipeline != name);
        self.targets.write().remove(name);
        self.replay_plans.write().remove(name);
        self.events.write().remove(name);
        self.start_failures.write().remove(name);
    }

    pub(crate) fn start_pipeline(&self, record: Arc<PipelineRecord>) -> anyhow::Result<()> {
        let module = self
            .modules
            .read()
            .get(&record.sha256)
            .cloned()
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "module {} of pipeline {} is not loaded",
                    record.sha256,
                    record.spec.name
                )
            })?;
        let spec = &record.spec;
        let mut limits = WriteLimits {
            max_key_bytes: spec.limits.max_key_bytes as usize,
            max_value_bytes: spec.limits.max_value_bytes as usize,
            max_timers: spec.limits.max_timers,
            ..WriteLimits::default()
        };
        for t in spec.outputs.iter().chain([&record.dlq_topic()]) {
            let partitions = self
                .transport
                .partitions(t)?
                .ok_or_else(|| anyhow::anyhow!("topic `{t}` is missing"))?;
            let max_record_bytes = self.transport.max_record_bytes(t)?;
            limits.outputs.insert(
                t.clone(),
                OutputTopic {
                    partitions,
                    max_record_bytes,
                },
            );
        }
        if self.kafka.is_some() {
            for s in &spec.state_stores() {
                let changelog = record.changelog_topic(s);
                // Pipelines created before the host kept a store of its own lack its changelog.
                if s == crate::control::pipeline::TIME_STORE
                    && self.transport.partitions(&changelog)?.is_none()
                {
                    self.transport
                        .ensure_topic(&changelog, spec.slots, TopicKind::Compacted)?;
                }
                limits
                    .changelog_record_bytes
                    .push(self.transport.max_record_bytes(&changelog)?);
            }
        }
        let outputs = Arc::new(limits);
        let target = ModuleTarget::new(spec.version.clone(), module, Settings::of(spec));
        let replays = ReplayPlan::new(record.replays.clone());
        self.replay_plans
            .write()
            .insert(spec.name.clone(), replays.clone());
        self.targets
            .write()
            .insert(spec.name.clone(), target.clone());
        let events = Arc::new(EventLog::default());
        self.events
            .write()
            .insert(spec.name.clone(), events.clone());
        // A partition reports a rollback and goes on at once: recording it takes the control
        // lock and a log append, which an admin call may hold, so it runs on a thread of its own.
        let on_rollback: RollbackHook = {
            let (me, pipeline) = (self.me.clone(), spec.name.clone());
            Arc::new(move |generation, reason| {
                let (me, pipeline) = (me.clone(), pipeline.clone());
                let spawned = std::thread::Builder::new()
                    .name("baton-rollback".into())
                    .spawn(move || {
                        if let Some(baton) = me.upgrade() {
                            baton.auto_rollback(&pipeline, generation, &reason);
                        }
                    });
                if let Err(e) = spawned {
                    tracing::error!("starting the rollback recorder: {e}");
                }
            })
        };
        for (i, slots) in spec.initial_ranges().into_iter().enumerate() {
            let id = format!("{}-{i}", spec.name);
            let path = self
                .config
                .data_dir
                .join("state")
                .join(&spec.name)
                .join(&id);
            let db = Arc::new(self.state.open_partition(&path, &spec.state_stores())?);
            let status = Arc::new(PartitionStatus::new());
            let stop = Arc::new(AtomicBool::new(false));
            let io: IoFactory = {
                let (pipeline, id, slots) = (record.clone(), id.clone(), slots.clone());
                match (&self.embedded, &self.kafka) {
                    (Some(log), _) => {
                        let log = log.clone();
                        Box::new(move || {
                            Ok(Box::new(EmbeddedIo::new(
                                log.clone(),
                                pipeline.clone(),
                                &id,
                                slots.clone(),
                            )) as Box<dyn PartitionIo>)
                        })
                    }
                    (None, Some(k)) => {
                        let k = k.clone();
                        Box::new(move || {
                            Ok(Box::new(KafkaIo::open(
                                k.clone(),
                                pipeline.clone(),
                                &id,
                                slots.clone(),
                            )?) as Box<dyn PartitionIo>)
                        })
                    }
                    (None, None) => anyhow::bail!("no transport"),
                }
            };
            let task = PartitionTask {
                id: id.clone(),
                pipeline: record.clone(),
                slots: slots.clone(),
                db: db.clone(),
                io,
                outputs: outputs.clone(),
                runtime: self.runtime.clone(),
                target: target.clone(),
                on_rollback: on_rollback.clone(),
                events: events.clone(),
                config: self.config.task.clone(),
                status: status.clone(),
                stop: stop.clone(),
                isolate: Mutex::new(None),
                replays: replays.clone(),
                rejected: AtomicU64::new(0),
            };
            let thread = std::thread::Builder::new()
                .name(format!("baton-{id}"))
                .spawn(move || task.run())?;
            let handle = PartitionHandle {
                id: id.clone(),
                pipeline: record.spec.name.clone(),
                slots,
                epoch: 1,
                db,
                status,
                stop,
                thread: Mutex::new(Some(thread)),
            };
            self.partitions.write().insert(id, Arc::new(handle));
        }
        Ok(())
    }

    /// The running partitions with their live status (for metrics).
    pub fn partition_handles(&self) -> Vec<Arc<PartitionHandle>> {
        self.partitions.read().values().cloned().collect()
    }

    /// The partition table.
    pub fn partitions(&self) -> Vec<PartitionInfo> {
        self.partitions
            .read()
            .values()
            .map(|h| {
                let offsets = h.status.progress.lock().clone();
                let lag = offsets.iter().map(|o| o.end.saturating_sub(o.offset)).sum();
                let (state, error) = match &*h.status.phase.lock() {
                    Phase::Starting => (PartitionState::Starting, None),
                    Phase::Restoring => (PartitionState::Restoring, None),
                    Phase::Recovering(e) => (PartitionState::Recovering, Some(e.clone())),
                    Phase::Running => (PartitionState::Running, None),
                    Phase::Stopped => (PartitionState::Stopped, None),
                    Phase::Failed(e) => (PartitionState::Failed, Some(e.clone())),
                };
                PartitionInfo {
                    id: h.id.clone(),
                    pipeline: h.pipeline.clone(),
                    slots: [h.slots.start, h.slots.end],
                    owner: self.config.host_id.clone(),
                    epoch: h.epoch,
                    state,
                    restore: h.status.restore.lock().clone(),
                    error,
                    offsets,
                    lag,
                    records: h.status.records.load(Ordering::Relaxed),
                    dead_letters: h.status.dead_letters.load(Ordering::Relaxed),
                    last_error: h.status.last_error.lock().clone(),
                    time_ms: h.status.time.snapshot(),
                    version: h.status.version.lock().clone(),
                    last_swap: h.status.swap.last.lock().clone(),
                    replay: h.status.replay.lock().clone(),
                }
            })
            .collect()
    }
}
