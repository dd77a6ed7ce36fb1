//! One baton host: the embedded log, the shared state environment, the runtime, the catalog
//! replayed from the control log, and the partition tasks. The HTTP layer and the CLI call the
//! operations here; nothing here knows about HTTP.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::cluster::pipeline::{changelog_topic, dlq_topic};
use crate::cluster::{
    Catalog, ControlEvent, DeadLetterReplay, ModuleDeletion, ModuleRecord, PipelineDeletion,
    PipelineRecord, PipelineSpec, PipelineUpdate, ReplayRange, Start, SwapRecord, now_ms,
};
use crate::error::{Error, Result};
use crate::http::model::{
    PartitionInfo, PartitionState, PipelineInfo, PipelinePatch, PipelinePhase, ProduceRecord,
    Produced, SwapPartition, SwapResult, SwapStatus,
};
use crate::query::{LocalResolver, OwnerResolver};
use crate::runtime::{Module, NativeModule, OutputTopic, Runtime, WriteLimits};
use crate::state::{PartitionDb, StateEnv};
use crate::task::kafka::KafkaIo;
use crate::task::{
    EmbeddedIo, Event, EventLog, IoFactory, ModuleTarget, PartitionIo, PartitionStatus,
    PartitionTask, Phase, ReplayPlan, RollbackHook, Settings, SwapOutcome, TaskConfig,
};
use crate::transport::embedded::EmbeddedLog;
use crate::transport::kafka::{KafkaConfig, KafkaTransport};
use crate::transport::partitioner::partition_for_key;
use crate::transport::{LogRecord, Record, TopicKind, Transport};

/// Size of a module chunk: well under Kafka's default 1 MB message limit.
const MODULE_CHUNK: usize = 512 << 10;

/// Settings of a host.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Where the log, state, modules and compiled code live.
    pub data_dir: PathBuf,
    /// Bytes of RocksDB block cache and memtables shared by all partitions of the host.
    pub state_memory: usize,
    /// Partition loop tuning.
    pub task: TaskConfig,
    /// Name of this host in the partition table.
    pub host_id: String,
    /// Kafka, or `None` for the embedded log.
    pub kafka: Option<KafkaConfig>,
    /// Name of the cluster: its control log is `<cluster>.control` and its module chunks
    /// `<cluster>.modules`, so that several baton clusters can share one Kafka cluster.
    pub cluster: String,
    /// With a token, every mutating API call needs `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// Processors linked into the host that pipelines may name like uploaded modules (the
    /// benchmarks' native baselines). Every host that runs such a pipeline needs them too.
    pub native_modules: Vec<NativeModule>,
}

impl HostConfig {
    /// Defaults for `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        HostConfig {
            data_dir: data_dir.into(),
            state_memory: 512 << 20,
            task: TaskConfig::default(),
            host_id: "local".into(),
            kafka: None,
            cluster: "baton".into(),
            native_modules: Vec::new(),
            token: None,
        }
    }
}

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
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// A baton host.
pub struct Baton {
    pub(crate) config: HostConfig,
    pub(crate) control_topic: String,
    pub(crate) modules_topic: String,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) embedded: Option<Arc<EmbeddedLog>>,
    pub(crate) kafka: Option<Arc<KafkaTransport>>,
    pub(crate) state: Arc<StateEnv>,
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) catalog: Mutex<Catalog>,
    pub(crate) modules: RwLock<BTreeMap<String, Module>>,
    pub(crate) partitions: RwLock<BTreeMap<String, Arc<PartitionHandle>>>,
    /// Per pipeline: the module version its partitions should run.
    pub(crate) targets: RwLock<BTreeMap<String, Arc<ModuleTarget>>>,
    /// Per pipeline: the dead letters its partitions replay.
    pub(crate) replay_plans: RwLock<BTreeMap<String, Arc<ReplayPlan>>>,
    /// Per pipeline: recent events.
    pub(crate) events: RwLock<BTreeMap<String, Arc<EventLog>>>,
    /// Who owns a slot (always this host for now).
    pub(crate) resolver: Box<dyn OwnerResolver>,
    /// Itself, for the hooks partitions call back through.
    pub(crate) me: std::sync::Weak<Baton>,
    pub(crate) round_robin: AtomicU32,
    /// Serialises control-plane changes: held only around a log append and its apply, never
    /// across topic creation or module chunk appends.
    pub(crate) control: Mutex<()>,
    /// Pipeline names whose creation or deletion is in progress.
    pub(crate) creating: Mutex<std::collections::BTreeSet<String>>,
    /// Pipelines being deleted.
    pub(crate) deleting: Mutex<std::collections::BTreeSet<String>>,
    /// Control-log appends that fail on purpose (tests only).
    pub(crate) control_faults: AtomicU32,
    /// Pipelines whose partitions could not start here, with the reason.
    pub(crate) start_failures: RwLock<BTreeMap<String, String>>,
}

impl Baton {
    /// Opens the host on its data directory: replays the control log, loads modules (from the
    /// compiled-code cache) and starts every pipeline's partitions.
    pub fn open(config: HostConfig) -> anyhow::Result<Arc<Self>> {
        std::fs::create_dir_all(&config.data_dir)?;
        let (transport, embedded, kafka): (Arc<dyn Transport>, _, _) = match &config.kafka {
            None => {
                let log = Arc::new(EmbeddedLog::open(&config.data_dir.join("log"))?);
                (log.clone(), Some(log), None)
            }
            Some(k) => {
                let t = Arc::new(KafkaTransport::connect(k.clone())?);
                tracing::info!(bootstrap = %k.bootstrap, "connected to Kafka");
                (t.clone(), None, Some(t))
            }
        };
        let state = Arc::new(StateEnv::new(config.state_memory));
        let runtime = Runtime::new(config.data_dir.join("compiled"))?;
        std::fs::create_dir_all(config.data_dir.join("modules"))?;
        crate::cluster::names::check_cluster(&config.cluster).map_err(anyhow::Error::msg)?;
        let control_topic = format!("{}.control", config.cluster);
        let modules_topic = format!("{}.modules", config.cluster);
        transport.ensure_topic(&control_topic, 1, TopicKind::Forever)?;
        // Module bytes in chunks keyed `<sha256>:<i>:<n>`: compaction keeps every chunk.
        transport.ensure_topic(&modules_topic, 1, TopicKind::Compacted)?;
        let catalog = replay_control(transport.as_ref(), &control_topic, CONTROL_REPLAY_STALL)?;
        let baton = Arc::new_cyclic(|me| Baton {
            me: me.clone(),
            resolver: Box::new(LocalResolver),
            targets: RwLock::new(BTreeMap::new()),
            replay_plans: RwLock::new(BTreeMap::new()),
            events: RwLock::new(BTreeMap::new()),
            config,
            control_topic,
            modules_topic,
            transport,
            embedded,
            kafka,
            state,
            runtime,
            catalog: Mutex::new(Catalog::default()),
            modules: RwLock::new(BTreeMap::new()),
            partitions: RwLock::new(BTreeMap::new()),
            round_robin: AtomicU32::new(0),
            control: Mutex::new(()),
            creating: Mutex::new(Default::default()),
            deleting: Mutex::new(Default::default()),
            control_faults: AtomicU32::new(0),
            start_failures: RwLock::new(BTreeMap::new()),
        });
        for m in &baton.config.native_modules {
            baton.modules.write().insert(m.address(), Module::native(m));
        }
        for m in catalog.modules.values() {
            let bytes = baton
                .module_bytes(&m.sha256)
                .map_err(|e| anyhow::anyhow!("module {} {}: {e}", m.name, m.version))?;
            let module = baton
                .runtime
                .load(&bytes)
                .map_err(|e| anyhow::anyhow!("module {} {}: {e}", m.name, m.version))?;
            baton.modules.write().insert(m.sha256.clone(), module);
        }
        let pipelines: Vec<PipelineRecord> = catalog.pipelines.values().cloned().collect();
        *baton.catalog.lock() = catalog;
        // A pipeline that cannot start here shows `failed` with the reason; the others run.
        for p in pipelines {
            baton.start_or_record(Arc::new(p));
        }
        tracing::info!(data_dir = %baton.config.data_dir.display(), "baton host open");
        Ok(baton)
    }

    /// Holds the control lock, as a long admin call does (tests only: no partition may stall
    /// behind it).
    #[doc(hidden)]
    pub fn hold_control_for_test(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.control.lock()
    }

    /// The host's settings.
    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// The transport (embedded log or Kafka).
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    /// The shared state environment.
    pub fn state_env(&self) -> &Arc<StateEnv> {
        &self.state
    }

    fn module_path(&self, sha256: &str) -> PathBuf {
        self.config
            .data_dir
            .join("modules")
            .join(format!("{sha256}.wasm"))
    }

    /// Makes the next `n` control-log appends fail (tests only).
    #[doc(hidden)]
    pub fn fail_control_appends_for_test(&self, n: u32) {
        self.control_faults.store(n, Ordering::SeqCst);
    }

    fn append_control(&self, event: &ControlEvent) -> Result<()> {
        if self
            .control_faults
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Error::Unavailable(
                "control log append failed (injected)".into(),
            ));
        }
        let value = serde_json::to_vec(event).map_err(|e| Error::Internal(e.to_string()))?;
        let record = Record {
            key: None,
            value: Some(value),
            headers: vec![],
            timestamp: now_ms(),
        };
        self.transport.append(&self.control_topic, 0, &[record])?;
        Ok(())
    }

    /// The bytes of a module: the local copy, or (on Kafka) reassembled from `baton.modules`.
    fn module_bytes(&self, sha256: &str) -> anyhow::Result<Vec<u8>> {
        let path = self.module_path(sha256);
        if let Ok(bytes) = std::fs::read(&path) {
            return Ok(bytes);
        }
        let mut chunks: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
        let mut count = None;
        let end = self.transport.end_offset(&self.modules_topic, 0)?;
        let mut offset = 0;
        while offset < end {
            let records = self.transport.read(&self.modules_topic, 0, offset, 256)?;
            if records.is_empty() {
                break;
            }
            for r in records {
                offset = r.offset + 1;
                let key = String::from_utf8_lossy(r.record.key.as_deref().unwrap_or_default())
                    .into_owned();
                let mut parts = key.split(':');
                if parts.next() != Some(sha256) {
                    continue;
                }
                let (Some(i), Some(n)) = (
                    parts.next().and_then(|p| p.parse().ok()),
                    parts.next().and_then(|p| p.parse().ok()),
                ) else {
                    continue;
                };
                count = Some(n);
                chunks.insert(i, r.record.value.unwrap_or_default());
            }
        }
        let n: usize = count
            .ok_or_else(|| anyhow::anyhow!("module {sha256} is not in {}", self.modules_topic))?;
        anyhow::ensure!(
            chunks.len() == n,
            "module {sha256}: {} of {n} chunks in {}",
            chunks.len(),
            self.modules_topic
        );
        let bytes: Vec<u8> = chunks.into_values().flatten().collect();
        anyhow::ensure!(
            crate::runtime::sha256_hex(&bytes) == sha256,
            "module {sha256}: chunks do not match the hash"
        );
        write_file(&path, &bytes)?;
        Ok(bytes)
    }

    /// Validates a component against the world, stores it by content and registers
    /// `name`/`version`. Re-uploading identical bytes under the same name and version is a no-op.
    pub fn upload_module(&self, name: &str, version: &str, bytes: &[u8]) -> Result<ModuleRecord> {
        let ok = crate::cluster::names::is_dotted_name;
        if !ok(name) {
            return Err(Error::BadRequest(format!(
                "invalid module name `{name}`: use 1 to 64 ASCII letters, digits, '-', '_' and '.'"
            )));
        }
        if !ok(version) {
            return Err(Error::BadRequest(format!(
                "invalid version `{version}`: use 1 to 64 ASCII letters, digits, '-', '_' and '.'"
            )));
        }
        let module = self.runtime.load(bytes)?;
        let conflict = |catalog: &Catalog| -> Option<Result<ModuleRecord>> {
            let existing = catalog
                .modules
                .get(&(name.to_string(), version.to_string()))?;
            Some(if existing.sha256 == module.sha256 {
                Ok(existing.clone())
            } else {
                Err(Error::Conflict(format!(
                    "module {name} version {version} already exists with other content (sha256 {}); upload under a new version",
                    existing.sha256
                )))
            })
        };
        if let Some(answer) = conflict(&self.catalog.lock()) {
            return answer;
        }
        // The bytes are content-addressed, so storing them needs no lock: no partition or
        // other admin call waits behind the chunks' appends.
        let path = self.module_path(&module.sha256);
        if !path.exists() {
            write_file(&path, bytes)
                .map_err(|e| Error::Internal(format!("storing module: {e}")))?;
        }
        let known = self
            .catalog
            .lock()
            .modules
            .values()
            .any(|m| m.sha256 == module.sha256);
        if !known {
            // Every host of the cluster can fetch it from the log: no shared filesystem.
            let chunks: Vec<&[u8]> = bytes.chunks(MODULE_CHUNK).collect();
            let n = chunks.len();
            for (i, c) in chunks.into_iter().enumerate() {
                let r = Record {
                    key: Some(format!("{}:{i}:{n}", module.sha256).into_bytes()),
                    value: Some(c.to_vec()),
                    headers: vec![],
                    timestamp: now_ms(),
                };
                self.transport
                    .append(&self.modules_topic, 0, std::slice::from_ref(&r))?;
            }
        }
        let record = ModuleRecord {
            name: name.to_string(),
            version: version.to_string(),
            sha256: module.sha256.clone(),
            size: module.size,
            wit: module.wit(),
            uploaded_at: now_ms(),
        };
        let _g = self.control.lock();
        if let Some(answer) = conflict(&self.catalog.lock()) {
            return answer;
        }
        self.append_control(&ControlEvent::Module(record.clone()))?;
        self.modules.write().insert(module.sha256.clone(), module);
        self.catalog
            .lock()
            .apply(ControlEvent::Module(record.clone()));
        tracing::info!(name, version, sha256 = %record.sha256, "module registered");
        Ok(record)
    }

    /// Every module version.
    pub fn modules(&self) -> Vec<ModuleRecord> {
        self.catalog.lock().modules.values().cloned().collect()
    }

    /// Creates a pipeline: checks the spec, creates missing topics, records it in the control
    /// log and starts its partitions.
    pub fn create_pipeline(&self, spec: PipelineSpec) -> Result<PipelineInfo> {
        spec.validate(&self.config.cluster)
            .map_err(Error::BadRequest)?;
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
                    .config
                    .native_modules
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
        let dlq = dlq_topic(&self.config.cluster, &spec.name);
        let mut topics: Vec<(String, TopicKind)> = spec
            .inputs
            .iter()
            .chain(spec.outputs.iter())
            .map(|t| (t.clone(), TopicKind::Data))
            .chain([(dlq.clone(), TopicKind::DeadLetters)])
            .collect();
        if self.kafka.is_some() {
            topics.extend(spec.state_stores().iter().map(|s| {
                (
                    changelog_topic(&self.config.cluster, &spec.name, s),
                    TopicKind::Compacted,
                )
            }));
        }
        for (t, _) in &topics {
            if let Some(actual) = self.transport.partitions(t)?
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
            if *kind != TopicKind::Compacted || self.transport.partitions(t)?.is_none() {
                continue;
            }
            for p in 0..spec.slots {
                let end = self.transport.end_offset(t, p)?;
                if end > 0 {
                    return Err(Error::Conflict(format!(
                        "changelog topic `{t}` already holds records (partition {p} ends at offset {end}),                          left by an earlier pipeline named `{}`; delete the topic or use another pipeline name",
                        spec.name
                    )));
                }
            }
        }
        for (t, kind) in &topics {
            self.transport.ensure_topic(t, spec.slots, *kind)?;
        }
        let mut start_offsets = BTreeMap::new();
        if spec.start == Start::Latest {
            for t in &spec.inputs {
                let ends = (0..spec.slots)
                    .map(|s| self.transport.end_offset(t, s))
                    .collect::<Result<Vec<_>, _>>()?;
                start_offsets.insert(t.clone(), ends);
            }
        }
        let record = PipelineRecord {
            spec,
            sha256,
            start_offsets,
            created_at: now_ms(),
            prefix: self.config.cluster.clone(),
            swaps: Vec::new(),
            replays: BTreeMap::new(),
            incarnation: Some(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0),
            ),
        };
        {
            // The log's or nobody's: applied only once appended.
            let _g = self.control.lock();
            self.append_control(&ControlEvent::Pipeline(Box::new(record.clone())))?;
            self.catalog
                .lock()
                .apply(ControlEvent::Pipeline(Box::new(record.clone())));
        }
        // The pipeline exists now; a failure to start is its phase, not the call's.
        self.start_or_record(Arc::new(record.clone()));
        Ok(self.pipeline_info(&record))
    }

    /// Starts a pipeline's partitions here; a failure is kept as the pipeline's phase.
    fn start_or_record(&self, record: Arc<PipelineRecord>) {
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

    /// Reserves a pipeline name for a creation in progress; released when dropped.
    fn reserve_name(&self, name: &str) -> Result<NameReservation<'_>> {
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
    fn phase(&self, name: &str) -> (PipelinePhase, Option<String>) {
        if self.deleting.lock().contains(name) {
            return (PipelinePhase::Deleting, None);
        }
        if let Some(reason) = self.start_failures.read().get(name) {
            return (PipelinePhase::Failed, Some(reason.clone()));
        }
        let parts: Vec<_> = self
            .partitions
            .read()
            .values()
            .filter(|h| h.pipeline == name)
            .cloned()
            .collect();
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

    fn pipeline_info(&self, r: &PipelineRecord) -> PipelineInfo {
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
    pub fn delete_pipeline(&self, name: &str, purge: bool) -> Result<PipelineDeletion> {
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
            let _g = self.control.lock();
            let event = ControlEvent::PipelineDeleted(deletion.clone());
            self.append_control(&event)?;
            self.catalog.lock().apply(event);
            Ok(deletion)
        };
        // First the deletion (the partitions stop, the name stays taken), then the purge, which
        // is recorded, freeing the name, only once the state is really gone.
        let mut deletion = None;
        if live {
            deletion = Some(record_event(false)?);
            self.stop_pipeline(name);
        }
        if purge {
            let mut topics: Vec<String> = record
                .spec
                .state_stores()
                .iter()
                .map(|s| record.changelog_topic(s))
                .filter(|_| self.kafka.is_some())
                .collect();
            topics.push(record.dlq_topic());
            let purged = (|| -> Result<()> {
                self.transport.delete_topics(&topics)?;
                self.transport.delete_group(&record.group_id())?;
                let dir = self.config.data_dir.join("state").join(name);
                if dir.exists() {
                    std::fs::remove_dir_all(&dir)
                        .map_err(|e| Error::Internal(format!("deleting {}: {e}", dir.display())))?;
                }
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

    /// Stops a pipeline's partitions here and forgets them.
    fn stop_pipeline(&self, name: &str) {
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

    /// Deletes a module version; refused (409) while a pipeline runs it.
    pub fn delete_module(&self, name: &str, version: &str) -> Result<ModuleDeletion> {
        let _g = self.control.lock();
        {
            let catalog = self.catalog.lock();
            if !catalog
                .modules
                .contains_key(&(name.to_string(), version.to_string()))
            {
                return Err(Error::NotFound(format!(
                    "module `{name}` version `{version}` does not exist"
                )));
            }
            let users: Vec<&str> = catalog
                .pipelines
                .values()
                .filter(|p| p.spec.module == name && p.spec.version == version)
                .map(|p| p.spec.name.as_str())
                .collect();
            if !users.is_empty() {
                return Err(Error::Conflict(format!(
                    "module `{name}` version `{version}` is run by pipelines [{}]; swap them to \
                     another version or delete them first",
                    users.join(", ")
                )));
            }
        }
        let deletion = ModuleDeletion {
            name: name.to_string(),
            version: version.to_string(),
            at: now_ms(),
        };
        let event = ControlEvent::ModuleDeleted(deletion.clone());
        self.append_control(&event)?;
        self.catalog.lock().apply(event);
        Ok(deletion)
    }

    /// Replays dead letters of a pipeline through its current version, exactly once: those of
    /// `slot` (every slot without it) from `from` to `to` (by default, from where the last
    /// replay of the slot ended to the end of the dead-letter topic now). A range that starts
    /// before the end of an earlier one is refused: no dead letter is replayed twice.
    pub fn replay_dead_letters(
        &self,
        name: &str,
        slot: Option<u32>,
        from: Option<u64>,
        to: Option<u64>,
    ) -> Result<DeadLetterReplay> {
        let record = self.pipeline(name)?;
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
        let plan =
            self.replay_plans.read().get(name).cloned().ok_or_else(|| {
                Error::Unavailable(format!("pipeline `{name}` is not running here"))
            })?;
        let dlq = record.dlq_topic();
        let _g = self.control.lock();
        let record = self.pipeline(name)?;
        let mut ranges = Vec::new();
        for s in slots {
            let done = record
                .replays
                .get(&s)
                .and_then(|r| r.last())
                .map_or(0, |(_, to)| *to);
            let end = self.transport.end_offset(&dlq, s)?;
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
            let event = ControlEvent::DeadLettersReplayed(replay.clone());
            self.append_control(&event)?;
            self.catalog.lock().apply(event);
            for r in &replay.ranges {
                plan.add(r.slot, r.from, r.to);
            }
            tracing::info!(pipeline = name, ranges = ?replay.ranges, "replaying dead letters");
        }
        Ok(replay)
    }

    /// Every pipeline.
    pub fn pipelines(&self) -> Vec<PipelineInfo> {
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
    pub fn pipeline(&self, name: &str) -> Result<PipelineRecord> {
        self.catalog
            .lock()
            .pipelines
            .get(name)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("pipeline `{name}` does not exist")))
    }

    /// Switches `pipeline` to `version` of its module at every partition's next batch boundary
    /// and waits (up to `wait`) until each reports; a version that fails is rolled back.
    pub fn swap_module(&self, pipeline: &str, version: &str, wait: Duration) -> Result<SwapResult> {
        let (generation, target) = {
            let _g = self.control.lock();
            let record = self.pipeline(pipeline)?;
            let spec = &record.spec;
            let sha256 = self.module_address(&spec.module, version).ok_or_else(|| {
                Error::NotFound(format!(
                    "module `{}` version `{version}` is not uploaded; POST it to /api/v1/modules?name={}&version={version} first",
                    spec.module, spec.module
                ))
            })?;
            let module = self.modules.read().get(&sha256).cloned().ok_or_else(|| {
                Error::Internal(format!("module {sha256} is in the catalog but not loaded"))
            })?;
            let target = self.targets.read().get(pipeline).cloned().ok_or_else(|| {
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
            self.append_control(&event)?;
            self.catalog.lock().apply(event);
            tracing::info!(pipeline, from = %spec.version, version, "hot swap requested");
            (target.set(version.into(), module), target)
        };
        let parts: Vec<_> = self
            .partitions
            .read()
            .values()
            .filter(|h| h.pipeline == pipeline)
            .cloned()
            .collect();
        let deadline = Instant::now() + wait;
        let reported = |h: &PartitionHandle| {
            h.status
                .swap
                .last
                .lock()
                .clone()
                .filter(|r| r.generation >= generation)
        };
        loop {
            let moved_on = target.generation() != generation;
            let all = parts.iter().all(|h| reported(h).is_some());
            if all || moved_on || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        // A rollback by any partition takes the whole pipeline back.
        let mut reason = None;
        let partitions: Vec<SwapPartition> = parts
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
            // An automatic rollback holds the control lock from moving the target until it is
            // recorded: once the lock is ours, its reason is in the catalog.
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
            .events
            .read()
            .get(pipeline)
            .map(|e| e.since(after, limit))
            .unwrap_or_default())
    }

    /// Called by a partition that refused `generation`: takes the pipeline back to the version
    /// it ran before, unless something newer was asked for meanwhile, and records why.
    /// Records a partition's rollback in the control log, then applies it. Until the record is
    /// in the log nothing changes (each partition keeps refusing the version on its own); a
    /// failed append is retried every second for up to five minutes.
    fn auto_rollback(&self, pipeline: &str, generation: u64, reason: &str) {
        let deadline = Instant::now() + Duration::from_secs(300);
        while !self.try_auto_rollback(pipeline, generation, reason) {
            if Instant::now() > deadline {
                tracing::error!(pipeline, "giving up recording the rollback: {reason}");
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// One attempt of [`Baton::auto_rollback`]: false when the append failed.
    fn try_auto_rollback(&self, pipeline: &str, generation: u64, reason: &str) -> bool {
        let _g = self.control.lock();
        let Some(target) = self.targets.read().get(pipeline).cloned() else {
            return true;
        };
        let from = target.get().version;
        let Some(back) = target.rollback_target(generation) else {
            return true;
        };
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
        // which each partition keeps refusing on its own until a rollback is recorded.
        if let Err(e) = self.append_control(&event) {
            tracing::error!(
                pipeline,
                "recording the rollback in the control log failed (retrying): {e}"
            );
            return false;
        }
        target.roll_back(generation);
        self.catalog.lock().apply(event);
        true
    }

    /// Changes a running pipeline's limits, config, swap policy or WASI grants: checked (the
    /// new config must pass the module's `init`), recorded in the control log, then applied at
    /// each partition's next batch boundary, as a swap is. Waits up to `wait` for every
    /// partition; `Ok((info, false))` when some had not reached a batch boundary by then.
    pub fn update_pipeline(
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
        {
            return Err(Error::BadRequest(
                "nothing to change: send any of limits, config, swap, wasi, commit_interval_ms"
                    .into(),
            ));
        }
        // Read, checked and recorded under the control lock, so that two changes (or a change
        // and a rollback) cannot interleave and leave the partitions on other settings than
        // the catalog.
        let control = self.control.lock();
        let record = self.pipeline(name)?;
        let update = PipelineUpdate {
            pipeline: name.to_string(),
            limits: patch.limits,
            config: patch.config,
            swap: patch.swap,
            wasi: patch.wasi,
            commit_interval_ms: patch.commit_interval_ms,
            at: now_ms(),
            rollback_reason: None,
        };
        let mut spec = record.spec.clone();
        update.apply_to(&mut spec);
        spec.validate(&self.config.cluster)
            .map_err(Error::BadRequest)?;
        let settings = Settings::of(&spec);
        let target =
            self.targets.read().get(name).cloned().ok_or_else(|| {
                Error::Unavailable(format!("pipeline `{name}` is not running here"))
            })?;
        // The new config must pass `init` before anything changes.
        if let Some(db) = self
            .partitions
            .read()
            .values()
            .find(|h| h.pipeline == name)
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
        let generation = {
            let event = ControlEvent::PipelineUpdated(update);
            self.append_control(&event)?;
            self.catalog.lock().apply(event);
            target.set_settings(settings)
        };
        drop(control);
        tracing::info!(pipeline = name, generation, "pipeline settings changed");
        let parts: Vec<_> = self
            .partitions
            .read()
            .values()
            .filter(|h| h.pipeline == name)
            .cloned()
            .collect();
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
        let record = self.pipeline(name)?;
        Ok((self.pipeline_info(&record), applied))
    }

    /// The content address of a module version (uploaded or native).
    fn module_address(&self, name: &str, version: &str) -> Option<String> {
        if let Some(m) = self
            .catalog
            .lock()
            .modules
            .get(&(name.to_string(), version.to_string()))
        {
            return Some(m.sha256.clone());
        }
        self.config
            .native_modules
            .iter()
            .find(|m| m.name == name && m.version == version)
            .map(NativeModule::address)
    }

    fn start_pipeline(&self, record: Arc<PipelineRecord>) -> anyhow::Result<()> {
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
                if s == crate::cluster::pipeline::TIME_STORE
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

    /// Appends records to `topic`; each goes to slot murmur2(key) mod partitions (round-robin
    /// without a key). Returns once they are on disk.
    pub fn produce(&self, topic: &str, records: Vec<ProduceRecord>) -> Result<Vec<Produced>> {
        crate::cluster::names::check_user_topic(&self.config.cluster, topic)
            .map_err(Error::BadRequest)?;
        let partitions = self.transport.partitions(topic)?.ok_or_else(|| {
            Error::NotFound(format!(
                "topic `{topic}` does not exist; create a pipeline that reads it first"
            ))
        })?;
        let now = now_ms();
        let mut by_slot: BTreeMap<u32, Vec<(usize, Record)>> = BTreeMap::new();
        let n = records.len();
        for (i, r) in records.into_iter().enumerate() {
            let slot = match &r.key {
                Some(k) => partition_for_key(k, partitions),
                None => self.round_robin.fetch_add(1, Ordering::Relaxed) % partitions,
            };
            let record = Record {
                key: r.key,
                value: r.value,
                headers: r.headers,
                timestamp: r.timestamp.unwrap_or(now),
            };
            by_slot.entry(slot).or_default().push((i, record));
        }
        let mut out = vec![Produced { slot: 0, offset: 0 }; n];
        for (slot, recs) in by_slot {
            let (idx, recs): (Vec<usize>, Vec<Record>) = recs.into_iter().unzip();
            let first = self.transport.append(topic, slot, &recs)?;
            for (j, i) in idx.into_iter().enumerate() {
                out[i] = Produced {
                    slot,
                    offset: first + j as u64,
                };
            }
        }
        Ok(out)
    }

    /// Reads records of one slot of `topic`.
    pub fn read_records(
        &self,
        topic: &str,
        slot: u32,
        offset: u64,
        limit: usize,
    ) -> Result<(Vec<LogRecord>, u64)> {
        let partitions = self
            .transport
            .partitions(topic)?
            .ok_or_else(|| Error::NotFound(format!("topic `{topic}` does not exist")))?;
        if slot >= partitions {
            return Err(Error::NotFound(format!(
                "topic `{topic}` has {partitions} partitions; slot {slot} does not exist"
            )));
        }
        let records = self.transport.read(topic, slot, offset, limit)?;
        let end = self.transport.end_offset(topic, slot)?;
        Ok((records, end))
    }

    /// Stops every partition at its next batch boundary and waits for them.
    pub fn shutdown(&self) {
        let parts: Vec<_> = self.partitions.read().values().cloned().collect();
        for p in &parts {
            p.stop.store(true, Ordering::Relaxed);
        }
        for p in &parts {
            if let Some(t) = p.thread.lock().take() {
                let _ = t.join();
            }
        }
        tracing::info!("baton host stopped");
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.config.data_dir
    }
}

impl Drop for Baton {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// How long control-log replay waits for a record it knows exists before it gives up.
const CONTROL_REPLAY_STALL: Duration = Duration::from_secs(60);

/// Replays the control log up to its end offset taken now. A host must never start on a
/// partial catalog: a read that stays empty for `stall` before that end, or a log whose first
/// records are gone, fails loudly with the offsets.
fn replay_control(
    transport: &dyn Transport,
    topic: &str,
    stall: Duration,
) -> anyhow::Result<Catalog> {
    let mut catalog = Catalog::default();
    let end = transport.end_offset(topic, 0)?;
    let mut offset = 0;
    let mut progress_at = Instant::now();
    while offset < end {
        let records = transport.read(topic, 0, offset, 1024)?;
        if records.is_empty() {
            anyhow::ensure!(
                progress_at.elapsed() < stall,
                "control log `{topic}`: replay stalled at offset {offset} of {end} (no record                  for {stall:?}); refusing to start on a partial catalog"
            );
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        progress_at = Instant::now();
        for r in records {
            anyhow::ensure!(
                offset > 0 || r.offset == 0,
                "control log `{topic}`: its first {} records are gone (deleted or expired);                  refusing to start on a partial catalog. The control log must keep every record                  (retention.ms=-1)",
                r.offset
            );
            offset = r.offset + 1;
            let bytes = r.record.value.unwrap_or_default();
            let event = crate::cluster::parse_event(&bytes)
                .map_err(|e| anyhow::anyhow!("control log `{topic}` record {}: {e}", r.offset))?;
            catalog.apply(event);
        }
    }
    Ok(catalog)
}

/// Writes a file atomically: temp file, fsync, rename.
fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// A pipeline name held by a creation in progress.
struct NameReservation<'a> {
    set: &'a Mutex<std::collections::BTreeSet<String>>,
    name: String,
}

impl Drop for NameReservation<'_> {
    fn drop(&mut self) {
        self.set.lock().remove(&self.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::TransportError;

    /// The embedded log, except that reads from `hole` on return nothing (a broker that stops
    /// answering fetches).
    struct Stalling {
        log: EmbeddedLog,
        hole: u64,
    }

    impl Transport for Stalling {
        fn kind(&self) -> &'static str {
            "embedded"
        }
        fn ensure_topic(&self, t: &str, n: u32, _: TopicKind) -> Result<bool, TransportError> {
            self.log.ensure_topic(t, n)
        }
        fn partitions(&self, t: &str) -> Result<Option<u32>, TransportError> {
            Ok(self.log.partitions(t))
        }
        fn topics(&self) -> Result<Vec<(String, u32)>, TransportError> {
            Ok(self.log.topics())
        }
        fn end_offset(&self, t: &str, p: u32) -> Result<u64, TransportError> {
            self.log.end_offset(t, p)
        }
        fn append(&self, t: &str, p: u32, r: &[Record]) -> Result<u64, TransportError> {
            Transport::append(&self.log, t, p, r)
        }
        fn delete_topics(&self, t: &[String]) -> Result<(), TransportError> {
            Transport::delete_topics(&self.log, t)
        }
        fn read(
            &self,
            t: &str,
            p: u32,
            o: u64,
            max: usize,
        ) -> Result<Vec<LogRecord>, TransportError> {
            let mut v = self.log.read(t, p, o, max)?;
            v.retain(|r| r.offset < self.hole);
            Ok(v)
        }
    }

    fn module_event(i: usize) -> Record {
        let e = ControlEvent::Module(ModuleRecord {
            name: format!("m{i}"),
            version: "1".into(),
            sha256: "00".into(),
            size: 1,
            wit: "baton:processor@0.1.0".into(),
            uploaded_at: 0,
        });
        Record {
            key: None,
            value: Some(serde_json::to_vec(&e).unwrap()),
            headers: vec![],
            timestamp: 0,
        }
    }

    #[test]
    fn control_replay_reads_to_the_end_or_fails_loudly() {
        let dir = tempfile::tempdir().unwrap();
        let t = Stalling {
            log: EmbeddedLog::open(dir.path()).unwrap(),
            hole: u64::MAX,
        };
        t.ensure_topic("c", 1, TopicKind::Forever).unwrap();
        let records: Vec<_> = (0..3000).map(module_event).collect();
        Transport::append(&t, "c", 0, &records).unwrap();
        let catalog = replay_control(&t, "c", Duration::from_millis(300)).unwrap();
        assert_eq!(catalog.modules.len(), 3000);
        let t = Stalling { hole: 2000, ..t };
        let e = replay_control(&t, "c", Duration::from_millis(300))
            .unwrap_err()
            .to_string();
        assert!(e.contains("stalled at offset 2000 of 3000"), "{e}");
    }
}
