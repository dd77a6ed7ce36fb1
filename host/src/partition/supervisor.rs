//! The partitions this host runs. The supervisor starts and stops partition loops to match a
//! list of [`Assignment`]s per pipeline, and talks to each loop through its command channel
//! (stop, drain, flush, fence). Today's host is a cluster of one: every partition of every
//! pipeline is assigned here, at epoch 1.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;
use std::time::Duration;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Weak;
use std::sync::atomic::AtomicBool;

use parking_lot::{Mutex, RwLock};

use crate::cluster::standby::Standbys;
use crate::control::log::ControlLog;
use crate::control::modules::Registry;
use crate::control::{Catalog, PipelineRecord};
use crate::partition::TaskConfig;
use crate::partition::kafka::{CommitAudit, KafkaIo};
use crate::partition::peers::Peers;
use crate::partition::peers::{Claim, Claimed};
use crate::partition::report::{PartitionInfo, PartitionState, ReplicaInfo, Role};
use crate::partition::{
    Command, EmbeddedIo, EventLog, Inbox, IoFactory, ModuleTarget, PartitionIo, PartitionStatus,
    PartitionTask, Phase, ReplayPlan, RollbackHook, Settings, SlotProgress,
};
use crate::runtime::{OutputTopic, Runtime, WriteLimits};
use crate::state::{PartitionDb, StateEnv};
use crate::steps::Steps;
use crate::transport::{Log, TopicKind};

/// A running partition.
pub struct PartitionHandle {
    /// Partition id.
    pub id: String,
    /// Pipeline name.
    pub pipeline: String,
    /// Slots `[start, end)`.
    pub slots: std::ops::Range<u32>,
    /// Epoch: bumped on each change of owner or shape.
    pub epoch: AtomicU64,
    /// The database.
    pub db: Arc<PartitionDb>,
    /// Live status.
    pub status: Arc<PartitionStatus>,
    /// The loop was told to stop (a stop, a drain or a fence): it ends without being started
    /// again, whatever the assignments say meanwhile.
    stopping: std::sync::atomic::AtomicBool,
    commands: Sender<Command>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl PartitionHandle {
    /// Tells the loop `command`; `false` when the loop has ended.
    pub fn send(&self, command: Command) -> bool {
        let sent = self.commands.send(command).is_ok();
        if let Some(w) = self.status.fetch_waker.lock().as_ref() {
            w.wake();
        }
        sent
    }

    /// Asks the loop to commit what is pending and stop (without waiting: see [`Self::join`]).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.send(Command::Stop);
    }

    /// Asks the loop to stop at once, committing nothing more: another owner took over.
    pub fn fence(&self) {
        self.stopping.store(true, Ordering::Release);
        self.send(Command::Fence);
    }

    /// Commits what is pending, stops, and answers with the offsets committed last (where the
    /// next owner resumes). `None` when no answer came within `timeout`.
    pub fn drain(&self, timeout: Duration) -> Option<Vec<SlotProgress>> {
        self.stopping.store(true, Ordering::Release);
        self.ask(Command::Drain, timeout)
    }

    /// Whether the loop was told to stop, or has ended.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire) || self.ended()
    }

    /// Commits what is pending now and goes on; answers with the offsets committed. `None`
    /// when no answer came within `timeout`.
    pub fn flush(&self, timeout: Duration) -> Option<Vec<SlotProgress>> {
        self.ask(Command::Flush, timeout)
    }

    fn ask(
        &self,
        command: fn(Sender<Vec<SlotProgress>>) -> Command,
        timeout: Duration,
    ) -> Option<Vec<SlotProgress>> {
        let (reply, answer) = std::sync::mpsc::channel();
        if !self.send(command(reply)) {
            // The loop has ended: what it committed last stands.
            return Some(self.status.progress.lock().clone());
        }
        match answer.recv_timeout(timeout) {
            Ok(at) => Some(at),
            // The loop ended without answering (the command was queued behind a stop).
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Some(self.status.progress.lock().clone())
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
        }
    }

    /// Whether the loop has ended (stopped, fenced, or failed for good).
    pub fn ended(&self) -> bool {
        self.thread.lock().as_ref().is_none_or(|t| t.is_finished())
    }

    /// Waits for the loop to end (after a stop, drain or fence).
    pub fn join(&self) {
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

/// A partition a host should run: its pipeline, id and slots, at an epoch (bumped on each
/// change of owner or shape).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// Partition id.
    pub id: String,
    /// Slots `[start, end)`.
    pub slots: Range<u32>,
    /// Epoch.
    pub epoch: u64,
}

/// What a pipeline's partitions share on a host, kept while it runs here so that partitions
/// can be started on it later (as assignments change).
pub(crate) struct PipelineRun {
    record: Arc<PipelineRecord>,
    outputs: Arc<WriteLimits>,
    target: Arc<ModuleTarget>,
    replays: Arc<ReplayPlan>,
    events: Arc<EventLog>,
    on_rollback: RollbackHook,
}

/// Joins and forgets released sessions when dropped: after the sessions that replace them
/// started.
struct JoinLast<'a>(&'a [Arc<PartitionHandle>], &'a Peers);

impl Drop for JoinLast<'_> {
    fn drop(&mut self) {
        for h in self.0 {
            h.stop();
            h.join();
            self.1.forget(h);
        }
    }
}

/// The assignments of a cluster of one host: every partition of the pipeline, at epoch 1.
pub fn single_host_assignments(record: &PipelineRecord) -> Vec<Assignment> {
    record
        .shapes()
        .into_iter()
        .map(|s| Assignment {
            id: s.id,
            slots: s.slots[0]..s.slots[1],
            epoch: 1,
        })
        .collect()
}

/// What a pipeline that refused a swapped-in version does: records the automatic rollback
/// (pipeline, the refused generation, the reason). Wired in by the host.
pub type RollbackRecorder = Box<dyn Fn(&str, u64, &str) + Send + Sync>;

/// The partitions this host runs, per pipeline, over narrow handles: the log, the state
/// environment, the runtime, the module registry, the catalog, the control log, the peers and
/// the standbys.
pub struct Supervisor {
    /// What it works over.
    parts: SupervisorParts,
    /// Held while partitions start and stop: two callers that find one partition not running
    /// must not both start a loop for it.
    assigning: Mutex<()>,
    /// Set when the host shuts down: assignments start nothing more.
    closing: AtomicBool,
    /// Per pipeline running here: what its partitions share.
    runs: RwLock<BTreeMap<String, Arc<PipelineRun>>>,
    /// Per pipeline: the module version its partitions should run.
    targets: RwLock<BTreeMap<String, Arc<ModuleTarget>>>,
    /// Per pipeline: the dead letters its partitions replay.
    replay_plans: RwLock<BTreeMap<String, Arc<ReplayPlan>>>,
    /// Per pipeline: recent events.
    events: RwLock<BTreeMap<String, Arc<EventLog>>>,
    /// Pipelines whose partitions could not start here, with the reason.
    start_failures: RwLock<BTreeMap<String, String>>,
    /// Records automatic rollbacks ([`Self::set_rollback_recorder`]).
    rollbacks: std::sync::OnceLock<RollbackRecorder>,
    /// Itself, for the hooks partitions call back through.
    me: Weak<Supervisor>,
}

/// What a [`Supervisor`] works over.
pub struct SupervisorParts {
    /// This host's id.
    pub host_id: String,
    /// The log the host runs on.
    pub log: Log,
    /// The shared state environment.
    pub state: Arc<StateEnv>,
    /// The Wasm runtime.
    pub runtime: Arc<Runtime>,
    /// The modules, compiled ones loaded here.
    pub registry: Arc<Registry>,
    /// The catalog.
    pub catalog: Arc<Mutex<Catalog>>,
    /// The control log (for catching up before an ownership check).
    pub control: Arc<ControlLog>,
    /// What this host is for each partition.
    pub peers: Arc<Peers>,
    /// This host's standby replicas.
    pub standbys: Arc<Standbys>,
    /// Protocol steps where tests hold a thread.
    pub steps: Arc<Steps>,
    /// Per-partition settings.
    pub task: TaskConfig,
    /// `<data dir>/state`: each partition's RocksDB under `<pipeline>/<partition>`.
    pub state_dir: PathBuf,
}

impl Supervisor {
    /// A supervisor that runs nothing yet.
    pub fn new(parts: SupervisorParts) -> Arc<Self> {
        Arc::new_cyclic(|me| Supervisor {
            parts,
            assigning: Mutex::new(()),
            closing: AtomicBool::new(false),
            runs: RwLock::new(BTreeMap::new()),
            targets: RwLock::new(BTreeMap::new()),
            replay_plans: RwLock::new(BTreeMap::new()),
            events: RwLock::new(BTreeMap::new()),
            start_failures: RwLock::new(BTreeMap::new()),
            rollbacks: std::sync::OnceLock::new(),
            me: me.clone(),
        })
    }

    /// Wires in what records an automatic rollback; set once, before pipelines start.
    pub fn set_rollback_recorder(&self, record: RollbackRecorder) {
        if self.rollbacks.set(record).is_err() {
            tracing::error!("the rollback recorder was set twice; the first one stays");
        }
    }

    /// Starts nothing more: the host shuts down. Waits for an assignment under way.
    pub fn close(&self) {
        let _one_at_a_time = self.assigning.lock();
        self.closing.store(true, Ordering::SeqCst);
    }

    /// Whether `pipeline` runs here (its partitions may start here as assignments change).
    pub fn runs(&self, pipeline: &str) -> bool {
        self.runs.read().contains_key(pipeline)
    }

    /// The module version `pipeline`'s partitions here should run.
    pub fn target(&self, pipeline: &str) -> Option<Arc<ModuleTarget>> {
        self.targets.read().get(pipeline).cloned()
    }

    /// The dead letters `pipeline`'s partitions here replay.
    pub fn replay_plan(&self, pipeline: &str) -> Option<Arc<ReplayPlan>> {
        self.replay_plans.read().get(pipeline).cloned()
    }

    /// `pipeline`'s recent events here.
    pub fn events(&self, pipeline: &str) -> Option<Arc<EventLog>> {
        self.events.read().get(pipeline).cloned()
    }

    /// Why `pipeline`'s partitions could not start here, if they could not.
    pub fn start_failure(&self, pipeline: &str) -> Option<String> {
        self.start_failures.read().get(pipeline).cloned()
    }

    /// Where a partition's RocksDB lives on this host.
    pub fn partition_path(&self, pipeline: &str, partition: &str) -> PathBuf {
        self.parts.state_dir.join(pipeline).join(partition)
    }

    /// The copies of partitions this host keeps (standbys, warming replicas), with their role.
    pub fn local_replicas(&self) -> Vec<(String, ReplicaInfo)> {
        self.parts.peers.replicas(&self.parts.host_id)
    }

    /// This host's assignments of `pipeline`: on the embedded log every partition; on Kafka
    /// the ones the catalog gives it. A partition no assignment names yet (its pipeline's
    /// creator has not assigned it, or the pipeline was created before assignments existed)
    /// runs nowhere until the controller assigns it, within a tick: never on two hosts.
    pub fn local_assignments(&self, pipeline: &str) -> Vec<Assignment> {
        let catalog = self.parts.catalog.lock();
        let Some(record) = catalog.pipelines.get(pipeline) else {
            return Vec::new();
        };
        let all = single_host_assignments(record);
        if !self.parts.log.is_kafka() {
            return all;
        }
        catalog
            .assignments
            .values()
            .filter(|a| a.pipeline == pipeline && a.owner == self.parts.host_id)
            .map(|a| Assignment {
                id: a.partition.clone(),
                slots: a.slots[0]..a.slots[1],
                epoch: a.epoch,
            })
            .collect()
    }

    /// Starts and stops this host's partitions of `pipeline` to match the catalog's
    /// assignments.
    pub fn follow_assignments(&self, pipeline: &str) {
        // A standby of a partition this host now owns stops before the partition starts.
        self.parts.standbys.follow();
        if !self.runs(pipeline) {
            return;
        }
        let mine = self.local_assignments(pipeline);
        if let Err(e) = self.assign(pipeline, &mine) {
            tracing::error!(pipeline, "following its assignments: {e:#}");
        }
    }

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

    /// The partitions of `pipeline` running here.
    pub(crate) fn pipeline_partitions(&self, pipeline: &str) -> Vec<Arc<PartitionHandle>> {
        self.parts
            .peers
            .handles()
            .into_iter()
            .filter(|h| h.pipeline == pipeline)
            .collect()
    }

    /// Stops a pipeline's partitions here and forgets them.
    pub(crate) fn stop_pipeline(&self, name: &str) {
        let _one_at_a_time = self.assigning.lock();
        let parts = self.pipeline_partitions(name);
        for p in &parts {
            p.stop();
        }
        for p in &parts {
            p.join();
            self.parts.peers.forget(p);
        }
        for id in self.parts.peers.released_without_session(name) {
            self.parts.peers.forget_release(&id);
        }
        self.runs.write().remove(name);
        self.targets.write().remove(name);
        self.replay_plans.write().remove(name);
        self.events.write().remove(name);
        self.start_failures.write().remove(name);
    }

    pub(crate) fn start_pipeline(&self, record: Arc<PipelineRecord>) -> anyhow::Result<()> {
        let module = self.parts.registry.get(&record.sha256).ok_or_else(|| {
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
                .parts
                .log
                .partitions(t)?
                .ok_or_else(|| anyhow::anyhow!("topic `{t}` is missing"))?;
            let max_record_bytes = self.parts.log.max_record_bytes(t)?;
            limits.outputs.insert(
                t.clone(),
                OutputTopic {
                    partitions,
                    max_record_bytes,
                },
            );
        }
        if self.parts.log.is_kafka() {
            for s in &spec.state_stores() {
                let changelog = record.changelog_topic(s);
                // Pipelines created before the host kept a store of its own lack its changelog.
                if s == crate::control::pipeline::TIME_STORE
                    && self.parts.log.partitions(&changelog)?.is_none()
                {
                    self.parts
                        .log
                        .ensure_topic(&changelog, spec.slots, TopicKind::Compacted)?;
                }
                limits
                    .changelog_record_bytes
                    .push(self.parts.log.max_record_bytes(&changelog)?);
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
                        if let Some(supervisor) = me.upgrade()
                            && let Some(record) = supervisor.rollbacks.get()
                        {
                            record(&pipeline, generation, &reason);
                        }
                    });
                if let Err(e) = spawned {
                    tracing::error!("starting the rollback recorder: {e}");
                }
            })
        };
        let run = Arc::new(PipelineRun {
            record: record.clone(),
            outputs,
            target,
            replays,
            events,
            on_rollback,
        });
        self.runs.write().insert(spec.name.clone(), run);
        self.assign(&spec.name, &self.local_assignments(&spec.name))?;
        self.parts.standbys.follow();
        Ok(())
    }

    /// Starts and stops this host's partitions of `pipeline` to match `assignments`: one not
    /// running starts; one running that is not assigned any more drains (commits, stops) and is
    /// forgotten; one running at an older epoch takes the new one.
    ///
    /// Calls are serialized: the control log's follower, a move and an admin call may assign
    /// at once, and each must see what the one before it started.
    pub fn assign(&self, pipeline: &str, assignments: &[Assignment]) -> anyhow::Result<()> {
        let _one_at_a_time = self.assigning.lock();
        if self.closing.load(Ordering::SeqCst) {
            return Ok(());
        }
        let run = self
            .runs
            .read()
            .get(pipeline)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("pipeline `{pipeline}` is not running here"))?;
        // A partition runs one shape: a different one for a running partition is refused
        // before anything changes.
        for a in assignments {
            if let Some(h) = self.parts.peers.running(&a.id)
                && h.slots != a.slots
            {
                anyhow::bail!(
                    "partition `{}` runs slots {:?} here, and its assignment says {:?}",
                    a.id,
                    h.slots,
                    a.slots
                );
            }
        }
        let wanted: BTreeSet<&str> = assignments.iter().map(|a| a.id.as_str()).collect();
        // Sessions here that are not assigned any more (a released one included: its move's
        // target took it over) stop and are forgotten.
        // A released one (drained for a move or a split: its final commit is done) is joined
        // after the new ones start: its loop closing its clients must not hold them back.
        let (drained, gone): (Vec<_>, Vec<_>) = self
            .parts
            .peers
            .handles()
            .into_iter()
            .filter(|h| h.pipeline == pipeline && !wanted.contains(h.id.as_str()))
            .partition(|h| {
                self.parts.peers.state(&h.id) == crate::partition::peers::PeerState::Released
            });
        for h in &gone {
            h.stop();
        }
        for h in &gone {
            h.join();
            self.parts.peers.forget(h);
        }
        let _join_drained_last = JoinLast(&drained, &self.parts.peers);
        for id in self.parts.peers.released_without_session(pipeline) {
            if !wanted.contains(id.as_str()) {
                self.parts.peers.forget_release(&id);
            }
        }
        for a in assignments {
            match self.parts.peers.claim(&a.id) {
                Claimed::Running(h) if !h.stopping() => {
                    h.epoch.fetch_max(a.epoch, Ordering::Relaxed);
                }
                // Its loop ended or is ending (fenced, or failed for good; or drained for a
                // move that was then abandoned): a new one starts once it has.
                Claimed::Running(h) => {
                    h.join();
                    let new = self.start_partition(&run, a, Claim::default())?;
                    self.parts.peers.restarted(&h, new);
                }
                // Released for a move (before a restart, too): it never processes at the
                // released epoch again, and resumes only once the move is abandoned.
                Claimed::Released => {}
                Claimed::Start(claim) => match self.start_partition(&run, a, claim) {
                    Ok(h) => self.parts.peers.started(h),
                    Err(e) => {
                        self.parts.peers.not_started(&a.id);
                        return Err(e);
                    }
                },
            }
        }
        Ok(())
    }

    /// Starts one partition's loop on a thread of its own.
    /// Its peer has given way already ([`crate::partition::peers::Peers::claim`]): a replica
    /// of the partition here writes nothing more into the database the session uses.
    fn start_partition(
        &self,
        run: &PipelineRun,
        a: &Assignment,
        claim: Claim,
    ) -> anyhow::Result<Arc<PartitionHandle>> {
        let Claim {
            prepared,
            taken_over,
        } = claim;
        let record = &run.record;
        let spec = &record.spec;
        let (id, slots) = (a.id.clone(), a.slots.clone());
        let path = self.partition_path(&spec.name, &id);
        let (db, restored) = self.parts.state.open_partition_db(
            &path,
            &spec.state_stores(),
            &crate::state::checkpoint::PartitionRef::new(
                &record.spec.name,
                record.created_at,
                &id,
                [slots.start, slots.end],
            ),
        )?;
        let status = Arc::new(PartitionStatus::new());
        // A move's target restored its replica before the take-over.
        *status.restored_from.lock() =
            restored.or_else(|| prepared.as_ref().and_then(|p| p.restored().cloned()));
        let (commands, inbox) = Inbox::channel();
        let io: IoFactory = {
            let (pipeline, id, slots) = (record.clone(), id.clone(), slots.clone());
            match (self.parts.log.as_embedded(), self.parts.log.as_kafka()) {
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
                    // Clients a move's target made ready while warming: for the first session.
                    let prepared = Mutex::new(prepared);
                    let steps = self.parts.steps.clone();
                    let audit = steps.commits_topic().map(|topic| CommitAudit {
                        topic: topic.to_string(),
                        host: self.parts.host_id.clone(),
                        partition: id.clone(),
                        epoch: a.epoch,
                        session: 0,
                    });
                    Box::new(move || {
                        let audit = audit.clone().map(|a| CommitAudit {
                            session: crate::control::now_ms(),
                            ..a
                        });
                        Ok(Box::new(KafkaIo::open(
                            k.clone(),
                            pipeline.clone(),
                            &id,
                            slots.clone(),
                            prepared.lock().take().map(|p| *p),
                            audit,
                            steps.clone(),
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
            outputs: run.outputs.clone(),
            runtime: self.parts.runtime.clone(),
            target: run.target.clone(),
            on_rollback: run.on_rollback.clone(),
            events: run.events.clone(),
            config: self.parts.task.clone(),
            status: status.clone(),
            inbox,
            isolate: Mutex::new(None),
            replays: run.replays.clone(),
            rejected: AtomicU64::new(0),
            initial: Mutex::new(Some(run.target.get())),
            steps: self.parts.steps.clone(),
            owns: {
                let (me, id) = (self.me.clone(), id.clone());
                // A move's target just recorded its own assignment and read it back: its
                // first ownership check needs no control-log catch-up.
                let fresh = std::sync::atomic::AtomicBool::new(taken_over);
                Arc::new(move || {
                    me.upgrade()
                        .is_some_and(|s| s.owns(&id, fresh.swap(false, Ordering::Relaxed)))
                })
            },
        };
        let thread = std::thread::Builder::new()
            .name(format!("baton-{id}"))
            .spawn(move || task.run())?;
        let handle = PartitionHandle {
            id: id.clone(),
            pipeline: record.spec.name.clone(),
            slots,
            epoch: AtomicU64::new(a.epoch),
            db,
            status,
            stopping: Default::default(),
            commands,
            thread: Mutex::new(Some(thread)),
        };
        Ok(Arc::new(handle))
    }

    /// Deletes every checkpoint of pipeline `pipeline` created at `created_at` from the host's
    /// checkpoint store (a purge).
    pub fn purge_checkpoints(&self, pipeline: &str, created_at: i64) -> Result<(), String> {
        match self.parts.state.checkpoints() {
            Some(store) => store
                .delete_pipeline(pipeline, created_at)
                .map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    /// Whether this host owns partition `id` at its newest epoch, with the control log read to
    /// its end first (for at most 5 s; not when `read_back`, this host's own assignment just
    /// read back). On the embedded log, and for a pipeline no assignment
    /// names, it does.
    pub(crate) fn owns(&self, id: &str, read_back: bool) -> bool {
        if !self.parts.log.is_kafka() {
            return true;
        }
        // A move's target just recorded its own assignment: the catalog has it already.
        if !read_back {
            self.parts
                .control
                .catch_up(std::time::Duration::from_secs(5));
        }
        self.parts
            .catalog
            .lock()
            .assignments
            .get(id)
            .is_none_or(|a| a.owner == self.parts.host_id)
    }

    /// The running partitions with their live status (for metrics).
    pub fn partition_handles(&self) -> Vec<Arc<PartitionHandle>> {
        self.parts.peers.handles()
    }

    /// The partitions running on this host.
    pub fn local_partitions(&self) -> Vec<PartitionInfo> {
        self.parts
            .peers
            .handles()
            .iter()
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
                    owner: self.parts.host_id.clone(),
                    epoch: h.epoch.load(Ordering::Relaxed),
                    state,
                    restore: h.status.restore.lock().clone(),
                    error,
                    offsets,
                    lag,
                    records: h.status.records.load(Ordering::Relaxed),
                    dead_letters: h.status.dead_letters.load(Ordering::Relaxed),
                    state_bytes: h.db.approximate_size(),
                    memory_bytes: h.db.memtable_bytes(),
                    last_error: h.status.last_error.lock().clone(),
                    time_ms: h.status.time.snapshot(),
                    version: h.status.version.lock().clone(),
                    last_swap: h.status.swap.last.lock().clone(),
                    replay: h.status.replay.lock().clone(),
                    role: Role::Active,
                    replicas: Vec::new(),
                    last_pause_ms: None,
                    moves: Vec::new(),
                    last_checkpoint: h.status.last_checkpoint.lock().clone(),
                    checkpoint_error: h.status.checkpoint_error.lock().clone(),
                    restored_from: h.status.restored_from.lock().clone(),
                    splitting: None,
                    merging: None,
                }
            })
            .collect()
    }
}
