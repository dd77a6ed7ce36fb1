//! Pipelines: creation, settings changes, deletion, dead-letter replays, and what the API
//! shows of them. A narrow handle: the log, the control log, the catalog, the supervisor, the
//! runtime, and where new partitions go (which the host wires in).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;

use crate::control::log::ControlLog;
use crate::control::pipeline::{GuestLimits, SwapPolicy, changelog_topic, dlq_topic};
use crate::control::{
    AssignmentRecord, Catalog, ControlEvent, DeadLetterReplay, PipelineDeletion, PipelineRecord,
    PipelineSpec, PipelineUpdate, ReplayRange, Start, SwapRecord, now_ms,
};
use crate::error::{Error, Result};
use crate::partition::supervisor::Supervisor;
use crate::partition::{Phase, Settings};
use crate::runtime::host::WasiGrants;
use crate::runtime::{NativeModule, Runtime, WriteLimits};
use crate::transport::{Log, TopicKind};

/// A pipeline as `GET /api/v1/pipelines` shows it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct PipelineInfo {
    /// The spec.
    #[serde(flatten)]
    pub spec: PipelineSpec,
    /// sha256 of the running module.
    pub sha256: String,
    /// The dead-letter topic.
    pub dlq: String,
    /// Creation time (ms since the epoch).
    pub created_at: i64,
    /// The last swaps of its module version, with the reason of automatic rollbacks.
    pub swaps: Vec<SwapRecord>,
    /// `starting`, `running`, `failed` or `deleting`.
    pub phase: PipelinePhase,
    /// Why it failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What a pipeline is doing, as `GET /api/v1/pipelines/{p}` shows it.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PipelinePhase {
    /// Its partitions are starting or restoring.
    Starting,
    /// Every partition runs.
    Running,
    /// It could not start, or a partition failed for good; `reason` says why.
    Failed,
    /// It is being deleted.
    Deleting,
}

/// The body of `PATCH /api/v1/pipelines/{p}`: what to change; what is absent stays.
#[derive(Debug, Clone, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelinePatch {
    /// New guest limits (all of them: absent fields take their defaults).
    pub limits: Option<GuestLimits>,
    /// New config for `init`.
    pub config: Option<serde_json::Map<String, serde_json::Value>>,
    /// New swap policy.
    pub swap: Option<SwapPolicy>,
    /// New WASI grants.
    pub wasi: Option<WasiGrants>,
    /// New commit interval, in milliseconds.
    pub commit_interval_ms: Option<u64>,
    /// New checkpoint interval, in seconds (0: only on demand).
    pub checkpoint_interval_s: Option<u64>,
    /// New auto-balance settings (the whole `balance` object).
    #[serde(default)]
    pub balance: Option<crate::control::pipeline::BalancePolicy>,
}

/// Where a new pipeline's partitions go: its first assignments (the host wires it in).
pub type Placement = Box<dyn Fn(&PipelineRecord) -> Vec<AssignmentRecord> + Send + Sync>;

/// The pipelines of the cluster as this host changes them.
pub struct Pipelines {
    /// The cluster's name: the prefix of its topics.
    cluster: String,
    /// `<data dir>/state`: a purge deletes `<pipeline>` under it.
    state_dir: PathBuf,
    native: Vec<NativeModule>,
    log: Log,
    control: Arc<ControlLog>,
    catalog: Arc<Mutex<Catalog>>,
    supervisor: Arc<Supervisor>,
    runtime: Arc<Runtime>,
    placement: Placement,
    /// Pipeline names whose creation or deletion is in progress.
    creating: Mutex<BTreeSet<String>>,
    /// Pipelines being deleted.
    deleting: Mutex<BTreeSet<String>>,
}

impl Pipelines {
    /// Pipelines over these handles.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cluster: String,
        state_dir: PathBuf,
        native: Vec<NativeModule>,
        log: Log,
        control: Arc<ControlLog>,
        catalog: Arc<Mutex<Catalog>>,
        supervisor: Arc<Supervisor>,
        runtime: Arc<Runtime>,
        placement: Placement,
    ) -> Self {
        Pipelines {
            cluster,
            state_dir,
            native,
            log,
            control,
            catalog,
            supervisor,
            runtime,
            placement,
            creating: Mutex::new(BTreeSet::new()),
            deleting: Mutex::new(BTreeSet::new()),
        }
    }

    /// Creates a pipeline: checks the spec, creates missing topics, records it in the control
    /// log and starts its partitions.
    pub fn create(&self, mut spec: PipelineSpec) -> Result<PipelineInfo> {
        spec.validate(&self.cluster).map_err(Error::BadRequest)?;
        // The interval in effect is recorded: a later change of the guarantee's default does
        // not change a running pipeline.
        spec.commit_interval_ms = Some(spec.commit_interval_ms());
        spec.checkpoint_interval_s = Some(spec.checkpoint_interval_s());
        // The name is reserved while its topics are checked and created, without holding the
        // control lock across those broker round trips.
        let _reservation = self.reserve_name(&spec.name)?;
        let sha256 = {
            let catalog = self.catalog.lock();
            if catalog.pipelines.contains_key(&spec.name) {
                return Err(Error::Conflict(format!(
                    "pipeline `{}` already exists",
                    spec.name
                )));
            }
            if catalog.deleted.contains_key(&spec.name) {
                return Err(Error::Conflict(format!(
                    "pipeline `{0}` was deleted, but its state (changelogs, dead letters, input \
                     offsets) still exists, so the name is taken; \
                     DELETE /api/v1/pipelines/{0}?purge=true to delete the state and free the name",
                    spec.name
                )));
            }
            match catalog
                .modules
                .get(&(spec.module.clone(), spec.version.clone()))
            {
                Some(m) => m.sha256.clone(),
                None if let Some(m) = self
                    .native
                    .iter()
                    .find(|m| m.name == spec.module && m.version == spec.version) =>
                {
                    m.address()
                }
                None => {
                    return Err(Error::BadRequest(format!(
                        "module `{}` version `{}` is not uploaded; POST it to /api/v1/modules?name={}&version={} first",
                        spec.module, spec.version, spec.module, spec.version
                    )));
                }
            }
        };
        // Check every topic before creating any, so that a refusal leaves nothing behind.
        let dlq = dlq_topic(&self.cluster, &spec.name);
        let mut topics: Vec<(String, TopicKind)> = spec
            .inputs
            .iter()
            .chain(spec.outputs.iter())
            .map(|t| (t.clone(), TopicKind::Data))
            .chain([(dlq.clone(), TopicKind::DeadLetters)])
            .collect();
        if self.log.is_kafka() {
            topics.extend(spec.state_stores().iter().map(|s| {
                (
                    changelog_topic(&self.cluster, &spec.name, s),
                    TopicKind::Compacted,
                )
            }));
        }
        for (t, _) in &topics {
            if let Some(actual) = self.log.partitions(t)?
                && actual != spec.slots
            {
                return Err(Error::Conflict(format!(
                    "topic `{t}` exists with {actual} partitions, but pipeline `{}` has {} slots and needs one partition per slot; \
                     use slots = {actual} or another topic",
                    spec.name, spec.slots
                )));
            }
        }
        // A changelog that already holds records belongs to an earlier pipeline of this name:
        // restoring from it would start the new pipeline with someone else's state.
        for (t, kind) in &topics {
            if *kind != TopicKind::Compacted || self.log.partitions(t)?.is_none() {
                continue;
            }
            for p in 0..spec.slots {
                let end = self.log.end_offset(t, p)?;
                if end > 0 {
                    return Err(Error::Conflict(format!(
                        "changelog topic `{t}` already holds records (partition {p} ends at offset {end}),                          left by an earlier pipeline named `{}`; delete the topic or use another pipeline name",
                        spec.name
                    )));
                }
            }
        }
        for (t, kind) in &topics {
            self.log.ensure_topic(t, spec.slots, *kind)?;
        }
        let mut start_offsets = BTreeMap::new();
        if spec.start == Start::Latest {
            for t in &spec.inputs {
                let ends = (0..spec.slots)
                    .map(|s| self.log.end_offset(t, s))
                    .collect::<Result<Vec<_>, _>>()?;
                start_offsets.insert(t.clone(), ends);
            }
        }
        let record = PipelineRecord {
            spec,
            sha256,
            start_offsets,
            created_at: now_ms(),
            prefix: self.cluster.clone(),
            swaps: Vec::new(),
            replays: BTreeMap::new(),
            layout: None,
            incarnation: Some(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0),
            ),
        };
        // The log's or nobody's: the pipeline exists once its event is read back, and starts
        // here then, as on every host (a failure to start is its phase, not the call's).
        {
            let _g = self.control.lock();
            self.control
                .commit(ControlEvent::Pipeline(Box::new(record.clone())))?;
        }
        // Another host may have created a pipeline of this name first, in the log.
        let ours = self
            .catalog
            .lock()
            .pipelines
            .get(&record.spec.name)
            .is_some_and(|p| p.incarnation == record.incarnation);
        if !ours {
            return Err(Error::Conflict(format!(
                "pipeline `{}` was created by another host at the same time; this creation \
                 does not count",
                record.spec.name
            )));
        }
        if self.log.is_kafka() {
            // Its partitions get owners now, spread over the live hosts (the controller gives
            // a partition whose owner is gone to another). Assignments take effect when read
            // back, here as on every host: the partitions start then.
            let mut last = None;
            {
                let _g = self.control.lock();
                for a in (self.placement)(&record) {
                    match self.control.append(&ControlEvent::Assigned(a)) {
                        Ok(at) => last = Some(at),
                        // The controller assigns what is left unassigned.
                        Err(e) => tracing::warn!("assigning a new partition: {e}"),
                    }
                }
            }
            if let Some(at) = last {
                self.control.wake_follower();
                if !self
                    .control
                    .read_back(at, std::time::Duration::from_secs(10))
                {
                    tracing::warn!(
                        pipeline = %record.spec.name,
                        "the new partitions' assignments are not read back from the control log yet"
                    );
                }
            }
        }
        Ok(self.pipeline_info(&record))
    }

    /// Reserves a pipeline name for a creation in progress; released when dropped.
    pub(crate) fn reserve_name(&self, name: &str) -> Result<NameReservation<'_>> {
        if !self.creating.lock().insert(name.to_string()) {
            return Err(Error::Conflict(format!(
                "pipeline `{name}` is being created or deleted by another call"
            )));
        }
        Ok(NameReservation {
            set: &self.creating,
            name: name.to_string(),
        })
    }

    /// A pipeline's phase: `failed` when its partitions could not start or one failed for
    /// good, `running` when every partition runs, else `starting`.
    pub(crate) fn phase(&self, name: &str) -> (PipelinePhase, Option<String>) {
        if self.deleting.lock().contains(name) {
            return (PipelinePhase::Deleting, None);
        }
        if let Some(reason) = self.supervisor.start_failure(name).as_ref() {
            return (PipelinePhase::Failed, Some(reason.clone()));
        }
        let parts = self.supervisor.pipeline_partitions(name);
        let mut all_running = !parts.is_empty();
        for h in &parts {
            match &*h.status.phase.lock() {
                Phase::Failed(e) => {
                    return (
                        PipelinePhase::Failed,
                        Some(format!("partition {} failed: {e}", h.id)),
                    );
                }
                Phase::Running => {}
                _ => all_running = false,
            }
        }
        if all_running {
            (PipelinePhase::Running, None)
        } else {
            (PipelinePhase::Starting, None)
        }
    }

    pub(crate) fn pipeline_info(&self, r: &PipelineRecord) -> PipelineInfo {
        let (phase, reason) = self.phase(&r.spec.name);
        PipelineInfo {
            dlq: r.dlq_topic(),
            spec: r.spec.clone(),
            sha256: r.sha256.clone(),
            created_at: r.created_at,
            swaps: r.swaps.clone(),
            phase,
            reason,
        }
    }

    /// Deletes a pipeline: records the deletion in the control log, then stops its partitions.
    /// With `purge`, also deletes its state (changelogs, dead letters, consumer group, local
    /// state) and frees the name; without, the name stays taken while the state exists.
    pub fn delete(&self, name: &str, purge: bool) -> Result<PipelineDeletion> {
        let (record, live) = {
            let catalog = self.catalog.lock();
            match (catalog.pipelines.get(name), catalog.deleted.get(name)) {
                (Some(r), _) => (r.clone(), true),
                (None, Some(r)) if purge => (r.clone(), false),
                (None, Some(_)) => {
                    return Err(Error::Conflict(format!(
                        "pipeline `{name}` is already deleted; its state still exists: \
                         DELETE /api/v1/pipelines/{name}?purge=true deletes it"
                    )));
                }
                (None, None) => {
                    return Err(Error::NotFound(format!("pipeline `{name}` does not exist")));
                }
            }
        };
        let _reservation = self.reserve_name(name)?;
        self.deleting.lock().insert(name.to_string());
        let _deleting = NameReservation {
            set: &self.deleting,
            name: name.to_string(),
        };
        let record_event = |purge: bool| -> Result<PipelineDeletion> {
            let deletion = PipelineDeletion {
                pipeline: name.to_string(),
                purge,
                at: now_ms(),
            };
            // Read back, it stops the pipeline's partitions, here as on every host.
            let _g = self.control.lock();
            self.control
                .commit(ControlEvent::PipelineDeleted(deletion.clone()))?;
            Ok(deletion)
        };
        // First the deletion (the partitions stop, the name stays taken), then the purge, which
        // is recorded, freeing the name, only once the state is really gone.
        let mut deletion = None;
        if live {
            deletion = Some(record_event(false)?);
        }
        if purge {
            let mut topics: Vec<String> = record
                .spec
                .state_stores()
                .iter()
                .map(|s| record.changelog_topic(s))
                .filter(|_| self.log.is_kafka())
                .collect();
            topics.push(record.dlq_topic());
            let purged = (|| -> Result<()> {
                self.log.delete_topics(&topics)?;
                self.log.delete_group(&record.group_id())?;
                let dir = self.state_dir.join(name);
                if dir.exists() {
                    std::fs::remove_dir_all(&dir)
                        .map_err(|e| Error::Internal(format!("deleting {}: {e}", dir.display())))?;
                }
                self.supervisor
                    .purge_checkpoints(name, record.created_at)
                    .map_err(Error::Unavailable)?;
                Ok(())
            })();
            if let Err(e) = purged {
                return Err(Error::Unavailable(format!(
                    "pipeline `{name}` is deleted, but deleting its state failed: {e}; its name \
                     stays taken. Try DELETE /api/v1/pipelines/{name}?purge=true again"
                )));
            }
            deletion = Some(record_event(true)?);
        }
        tracing::info!(pipeline = name, purge, "pipeline deleted");
        deletion.ok_or_else(|| Error::Internal("nothing was deleted".into()))
    }

    /// Replays dead letters of a pipeline through its current version, exactly once: those of
    /// `slot` (every slot without it) from `from` to `to` (by default, from where the last
    /// replay of the slot ended to the end of the dead-letter topic now). A range that starts
    /// before the end of an earlier one is refused: no dead letter is replayed twice.
    pub fn replay(
        &self,
        name: &str,
        slot: Option<u32>,
        from: Option<u64>,
        to: Option<u64>,
    ) -> Result<DeadLetterReplay> {
        let record = self.get(name)?;
        if slot.is_none() && (from.is_some() || to.is_some()) {
            return Err(Error::BadRequest(
                "`from` and `to` are offsets of one partition of the dead-letter topic: name \
                 its `slot` too"
                    .into(),
            ));
        }
        let slots: Vec<u32> = match slot {
            Some(s) if s >= record.spec.slots => {
                return Err(Error::BadRequest(format!(
                    "slot {s} does not exist: pipeline `{name}` has slots 0 to {}",
                    record.spec.slots - 1
                )));
            }
            Some(s) => vec![s],
            None => (0..record.spec.slots).collect(),
        };
        if self.supervisor.replay_plan(name).is_none() {
            return Err(Error::Unavailable(format!(
                "pipeline `{name}` is not running here"
            )));
        }
        let dlq = record.dlq_topic();
        let _g = self.control.lock();
        let record = self.get(name)?;
        let mut ranges = Vec::new();
        for s in slots {
            let done = record
                .replays
                .get(&s)
                .and_then(|r| r.last())
                .map_or(0, |(_, to)| *to);
            let end = self.log.end_offset(&dlq, s)?;
            let (from, to) = (from.unwrap_or(done), to.unwrap_or(end).min(end));
            if from < done {
                return Err(Error::Conflict(format!(
                    "dead letters of slot {s} up to offset {done} were already replayed (or are \
                     being replayed); replay from {done} on"
                )));
            }
            if from < to {
                ranges.push(ReplayRange { slot: s, from, to });
            }
        }
        let replay = DeadLetterReplay {
            pipeline: name.to_string(),
            ranges,
            at: now_ms(),
        };
        if !replay.ranges.is_empty() {
            self.control
                .commit(ControlEvent::DeadLettersReplayed(replay.clone()))?;
            // A replay another host recorded at the same time may have come first in the log.
            let record = self.get(name)?;
            let counted = replay.ranges.iter().all(|r| {
                record
                    .replays
                    .get(&r.slot)
                    .is_some_and(|rs| rs.contains(&(r.from, r.to)))
            });
            if !counted {
                return Err(Error::Conflict(format!(
                    "another replay of pipeline `{name}`'s dead letters was recorded at the same \
                     time and overlaps this one; this one does not count"
                )));
            }
            tracing::info!(pipeline = name, ranges = ?replay.ranges, "replaying dead letters");
        }
        Ok(replay)
    }

    /// Every pipeline.
    pub fn list(&self) -> Vec<PipelineInfo> {
        self.catalog
            .lock()
            .pipelines
            .values()
            .cloned()
            .collect::<Vec<_>>()
            .iter()
            .map(|r| self.pipeline_info(r))
            .collect()
    }

    /// One pipeline.
    pub fn get(&self, name: &str) -> Result<PipelineRecord> {
        self.catalog.lock().pipeline(name)
    }

    /// Changes a running pipeline's limits, config, swap policy or WASI grants: checked (the
    /// new config must pass the module's `init`), recorded in the control log, then applied at
    /// each partition's next batch boundary, as a swap is. Waits up to `wait` for every
    /// partition; `Ok((info, false))` when some had not reached a batch boundary by then.
    pub fn update(
        &self,
        name: &str,
        patch: PipelinePatch,
        wait: Duration,
    ) -> Result<(PipelineInfo, bool)> {
        if patch.limits.is_none()
            && patch.config.is_none()
            && patch.swap.is_none()
            && patch.wasi.is_none()
            && patch.commit_interval_ms.is_none()
            && patch.checkpoint_interval_s.is_none()
            && patch.balance.is_none()
        {
            return Err(Error::BadRequest(
                "nothing to change: send any of limits, config, swap, wasi, commit_interval_ms, \
                 checkpoint_interval_s, balance"
                    .into(),
            ));
        }
        // Read, checked and recorded under the control lock, so that two changes (or a change
        // and a rollback) cannot interleave and leave the partitions on other settings than
        // the catalog.
        let control = self.control.lock();
        let record = self.get(name)?;
        let update = PipelineUpdate {
            pipeline: name.to_string(),
            limits: patch.limits,
            config: patch.config,
            swap: patch.swap,
            wasi: patch.wasi,
            commit_interval_ms: patch.commit_interval_ms,
            checkpoint_interval_s: patch.checkpoint_interval_s,
            balance: patch.balance,
            at: now_ms(),
            rollback_reason: None,
        };
        let mut spec = record.spec.clone();
        update.apply_to(&mut spec);
        spec.validate(&self.cluster).map_err(Error::BadRequest)?;
        let settings = Settings::of(&spec);
        let target = self
            .supervisor
            .target(name)
            .ok_or_else(|| Error::Unavailable(format!("pipeline `{name}` is not running here")))?;
        // The new config must pass `init` before anything changes.
        if let Some(db) = self
            .supervisor
            .pipeline_partitions(name)
            .first()
            .map(|h| h.db.clone())
        {
            let ctx = crate::runtime::HostCtx::new(
                name.into(),
                db,
                Arc::new(WriteLimits::default()),
                settings.limits.memory_bytes as usize,
                settings.wasi.clone(),
            );
            let mut inst = self
                .runtime
                .instantiate(&target.get().module, ctx)
                .map_err(|e| Error::Internal(format!("instantiating for the check: {e:#}")))?;
            inst.init(&settings.config).map_err(|e| {
                Error::BadRequest(format!(
                    "the module's init refuses the new config: {e}; nothing was changed"
                ))
            })?;
        }
        // Read back, it reaches the partitions, here as on every host.
        let at = self.control.commit(ControlEvent::PipelineUpdated(update))?;
        drop(control);
        let Some(generation) = target.made_by(at) else {
            // The pipeline stopped here, or changed again at once.
            let record = self.get(name)?;
            return Ok((self.pipeline_info(&record), false));
        };
        tracing::info!(pipeline = name, generation, "pipeline settings changed");
        let parts = self.supervisor.pipeline_partitions(name);
        let deadline = Instant::now() + wait;
        let applied = loop {
            let all = parts.iter().all(|h| {
                h.status
                    .swap
                    .last
                    .lock()
                    .as_ref()
                    .is_some_and(|r| r.generation >= generation)
            });
            if all || Instant::now() > deadline {
                break all;
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let record = self.get(name)?;
        Ok((self.pipeline_info(&record), applied))
    }
}

/// A pipeline name held by a creation in progress.
pub(crate) struct NameReservation<'a> {
    set: &'a Mutex<BTreeSet<String>>,
    name: String,
}

impl Drop for NameReservation<'_> {
    fn drop(&mut self) {
        self.set.lock().remove(&self.name);
    }
}
