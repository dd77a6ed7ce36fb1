//! Hot swaps of a pipeline's module version, coordinated over its partitions, with automatic
//! rollback, and the pipeline's events. A narrow handle: the control log, the catalog, the
//! module registry, the supervisor, and the partition table the host wires in.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::control::log::ControlLog;
use crate::control::modules::Registry;
use crate::control::{Catalog, ControlEvent, PipelineRecord, PipelineUpdate, SwapRecord, now_ms};
use crate::error::{Error, Result};
use crate::http::model::{SwapPartition, SwapResult, SwapStatus};
use crate::partition::report::PartitionInfo;
use crate::partition::supervisor::{PartitionHandle, Supervisor};
use crate::partition::{Event, SwapOutcome};

/// The cluster's partition table, as the host makes it (its own partitions live, the others'
/// as their owners report them).
pub type Table = Box<dyn Fn() -> Vec<PartitionInfo> + Send + Sync>;

/// Hot swaps and automatic rollbacks of this host's pipelines.
pub struct Swaps {
    host_id: String,
    /// Whether the host runs on Kafka: partitions on other hosts report their swaps.
    cluster: bool,
    control: Arc<ControlLog>,
    catalog: Arc<Mutex<Catalog>>,
    registry: Arc<Registry>,
    supervisor: Arc<Supervisor>,
    table: Table,
}

impl Swaps {
    /// Swaps over these handles; `table` is the cluster's partition table.
    pub fn new(
        host_id: String,
        cluster: bool,
        control: Arc<ControlLog>,
        catalog: Arc<Mutex<Catalog>>,
        registry: Arc<Registry>,
        supervisor: Arc<Supervisor>,
        table: Table,
    ) -> Self {
        Swaps {
            host_id,
            cluster,
            control,
            catalog,
            registry,
            supervisor,
            table,
        }
    }

    fn pipeline(&self, name: &str) -> Result<PipelineRecord> {
        self.catalog.lock().pipeline(name)
    }

    /// Switches `pipeline` to `version` of its module at every partition's next batch boundary
    /// and waits (up to `wait`) until each reports; a version that fails is rolled back.
    pub fn swap(&self, pipeline: &str, version: &str, wait: Duration) -> Result<SwapResult> {
        let (generation, target) = {
            let _g = self.control.lock();
            let record = self.pipeline(pipeline)?;
            let spec = &record.spec;
            let sha256 = self.registry.address(&spec.module, version).ok_or_else(|| {
                Error::NotFound(format!(
                    "module `{}` version `{version}` is not uploaded; POST it to /api/v1/modules?name={}&version={version} first",
                    spec.module, spec.module
                ))
            })?;
            if !self.registry.is_loaded(&sha256) {
                return Err(Error::Internal(format!(
                    "module {sha256} is in the catalog but not loaded"
                )));
            }
            let target = self.supervisor.target(pipeline).ok_or_else(|| {
                Error::Unavailable(format!("pipeline `{pipeline}` is not running here"))
            })?;
            if spec.version == version {
                return Ok(SwapResult {
                    pipeline: pipeline.into(),
                    version: version.into(),
                    running: version.into(),
                    outcome: SwapStatus::Unchanged,
                    reason: None,
                    warnings: Vec::new(),
                    partitions: Vec::new(),
                });
            }
            let event = ControlEvent::Swap(SwapRecord {
                pipeline: pipeline.into(),
                from: spec.version.clone(),
                version: version.into(),
                sha256,
                at: now_ms(),
                rollback_reason: None,
            });
            // Read back, it reaches the partitions, here as on every host.
            let at = self.control.commit(event)?;
            tracing::info!(pipeline, from = %spec.version, version, "hot swap requested");
            let generation = target.made_by(at).ok_or_else(|| {
                Error::Unavailable(format!(
                    "pipeline `{pipeline}` stopped running here while the swap was recorded"
                ))
            })?;
            (generation, target)
        };
        let requested = now_ms();
        let parts = self.supervisor.pipeline_partitions(pipeline);
        let deadline = Instant::now() + wait;
        let reported = |h: &PartitionHandle| {
            h.status
                .swap
                .last
                .lock()
                .clone()
                .filter(|r| r.generation >= generation)
        };
        // Partitions on other hosts swap when their hosts follow the event; their reports come
        // with the hosts' load reports (once a second), within a second of clock skew.
        let remote = || -> Vec<SwapPartition> {
            if !self.cluster {
                return Vec::new();
            }
            (self.table)()
                .into_iter()
                .filter(|p| p.pipeline == pipeline && p.owner != self.host_id)
                .map(|p| SwapPartition {
                    id: p.id,
                    report: p
                        .last_swap
                        .filter(|r| r.version == version && r.at >= requested - 1_000),
                })
                .collect()
        };
        let mut last_remote_look = Instant::now();
        let mut others = remote();
        loop {
            let moved_on = target.generation() != generation;
            if last_remote_look.elapsed() >= Duration::from_millis(50) {
                others = remote();
                last_remote_look = Instant::now();
            }
            let all = parts.iter().all(|h| reported(h).is_some())
                && others.iter().all(|p| p.report.is_some());
            let refused = others.iter().any(|p| {
                p.report
                    .as_ref()
                    .is_some_and(|r| r.outcome == SwapOutcome::RolledBack)
            });
            if all || moved_on || refused || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        // A rollback by any partition takes the whole pipeline back.
        let mut reason = None;
        let mut partitions: Vec<SwapPartition> = parts
            .iter()
            .map(|h| {
                let report = reported(h);
                if let Some(r) = &report
                    && r.generation == generation
                    && r.outcome == SwapOutcome::RolledBack
                {
                    reason = reason.take().or_else(|| r.reason.clone());
                }
                SwapPartition {
                    id: h.id.clone(),
                    report,
                }
            })
            .collect();
        for p in others {
            if let Some(r) = &p.report
                && r.outcome == SwapOutcome::RolledBack
            {
                reason = reason.take().or_else(|| r.reason.clone());
            }
            partitions.push(p);
        }
        partitions.sort_by(|a, b| a.id.cmp(&b.id));
        if reason.is_some() {
            // A partition refused the version: the rollback is recorded on a thread of its own.
            // Answer once it is in the log and the catalog (or, if it cannot be recorded, at
            // the deadline), so that the caller reads the pipeline as it is.
            while target.generation() == generation && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            drop(self.control.lock());
        }
        if reason.is_none() && target.generation() != generation {
            // A change takes the catalog before the partitions: once the target moved on, an
            // automatic rollback's reason is in the catalog.
            drop(self.control.lock());
            reason = self
                .pipeline(pipeline)
                .ok()
                .and_then(|r| r.swaps.last().and_then(|s| s.rollback_reason.clone()));
        }
        let outcome = if reason.is_some() {
            SwapStatus::RolledBack
        } else if partitions.iter().all(|p| p.report.is_some()) {
            SwapStatus::Swapped
        } else {
            SwapStatus::Pending
        };
        let timers: u64 = partitions
            .iter()
            .filter_map(|p| p.report.as_ref())
            .map(|r| r.timers_pending)
            .sum();
        let mut warnings = Vec::new();
        if timers > 0 {
            warnings.push(format!(
                "{timers} timers are pending, and version {version} speaks baton:processor@0.1.0, \
                 which has no timers: they stay pending, and fire once a version for 0.2 runs"
            ));
        }
        Ok(SwapResult {
            pipeline: pipeline.into(),
            version: version.into(),
            running: target.get().version,
            outcome,
            reason,
            warnings,
            partitions,
        })
    }

    /// Events of `pipeline` newer than `after`.
    pub fn events(&self, pipeline: &str, after: u64, limit: usize) -> Result<Vec<Event>> {
        self.pipeline(pipeline)?;
        Ok(self
            .supervisor
            .events(pipeline)
            .map(|e| e.since(after, limit))
            .unwrap_or_default())
    }

    /// Called by a partition that refused `generation`: takes the pipeline back to the version
    /// it ran before, unless something newer was asked for meanwhile, and records why.
    /// Records a partition's rollback in the control log, then applies it. Until the record is
    /// in the log nothing changes (each partition keeps refusing the version on its own); a
    /// failed append is retried every second for up to five minutes.
    pub(crate) fn auto_rollback(&self, pipeline: &str, generation: u64, reason: &str) {
        let deadline = Instant::now() + Duration::from_secs(300);
        while !self.try_auto_rollback(pipeline, generation, reason) {
            if Instant::now() > deadline {
                tracing::error!(pipeline, "giving up recording the rollback: {reason}");
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// One attempt of [`Swaps::auto_rollback`]: false when the append failed.
    pub(crate) fn try_auto_rollback(&self, pipeline: &str, generation: u64, reason: &str) -> bool {
        let _g = self.control.lock();
        let Some(target) = self.supervisor.target(pipeline) else {
            return true;
        };
        let from = target.get().version;
        let Some(back) = target.rollback_target(generation) else {
            return true;
        };
        if self.pipeline(pipeline).map(|p| p.spec.version).ok() != Some(from.clone()) {
            // A change recorded in the log has not reached the partitions yet: it supersedes
            // the refused version.
            return true;
        }
        tracing::warn!(pipeline, from = %from, to = %back.version, "automatic rollback: {reason}");
        let current = target.get();
        let event =
            if back.module.sha256 == current.module.sha256 && back.version == current.version {
                // A change of settings was refused: the previous settings go back.
                ControlEvent::PipelineUpdated(PipelineUpdate {
                    pipeline: pipeline.into(),
                    limits: Some(back.settings.limits.clone()),
                    config: Some(back.settings.config_json.clone()),
                    swap: Some(back.settings.swap.clone()),
                    wasi: Some(back.settings.wasi.clone()),
                    commit_interval_ms: Some(back.settings.commit_interval_ms),
                    checkpoint_interval_s: None,
                    balance: None,
                    at: now_ms(),
                    rollback_reason: Some(reason.to_string()),
                })
            } else {
                ControlEvent::Swap(SwapRecord {
                    pipeline: pipeline.into(),
                    from,
                    version: back.version.clone(),
                    sha256: back.module.sha256.clone(),
                    at: now_ms(),
                    rollback_reason: Some(reason.to_string()),
                })
            };
        // The log's or nobody's: without the record, the pipeline stays on the new version,
        // which each partition keeps refusing on its own until a rollback is recorded. Read
        // back, it takes the partitions back, here as on every host, unless a change recorded
        // before it in the log superseded the refused version (then a retry does not count
        // either).
        match self.control.commit(event) {
            Ok(at) => {
                if target.made_by(at).is_none() {
                    tracing::info!(
                        pipeline,
                        "the rollback came after a newer change in the log"
                    );
                }
                true
            }
            Err(e) => {
                tracing::error!(
                    pipeline,
                    "recording the rollback in the control log failed (retrying): {e}"
                );
                false
            }
        }
    }
}
