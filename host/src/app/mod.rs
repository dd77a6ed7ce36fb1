//! One baton host: the embedded log, the shared state environment, the runtime, the catalog
//! replayed from the control log, and the partition tasks. The HTTP layer and the CLI call the
//! operations here; nothing here knows about HTTP.

mod apply;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::control::log::{CONTROL_REPLAY_STALL, replay_control, snapshot_topic, write_snapshot};
use crate::control::{Catalog, PipelineRecord, now_ms};
use crate::error::{Error, Result};
use crate::partition::TaskConfig;
use crate::partition::report::{PartitionInfo, ReplicaInfo, Role};
pub use crate::partition::supervisor::PartitionHandle;
use crate::partition::supervisor::{Supervisor, SupervisorParts};
use crate::query::LocalResolver;
use crate::runtime::{NativeModule, Runtime};
use crate::state::StateEnv;
use crate::transport::embedded::EmbeddedLog;
use crate::transport::kafka::{KafkaConfig, KafkaTransport};
use crate::transport::partitioner::partition_for_key;
use crate::transport::{Log, LogRecord, Record, TopicKind, Transport};

/// Settings of a host.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Where the log, state, modules and compiled code live.
    pub data_dir: PathBuf,
    /// Bytes of RocksDB block cache and memtables shared by all partitions of the host.
    pub state_memory: usize,
    /// Bytes of disk the state of the host's partitions and replicas may take
    /// (`--state-disk`); `None`: no bound.
    pub state_disk: Option<u64>,
    /// Partition loop tuning.
    pub task: TaskConfig,
    /// Name of this host in the partition table and the cluster (`--host-id`); `None` takes
    /// the id kept in the data dir (`host-id`), made up on first start.
    pub host_id: Option<String>,
    /// The base URL other hosts and clients reach this host's API at (`--advertise`); `None`
    /// takes the address the API listens on, once it does ([`Baton::set_address`]).
    pub advertise: Option<String>,
    /// How long a host may go without a heartbeat before the cluster counts it gone
    /// (`--session-timeout`; Kafka's group session timeout).
    pub session_timeout: std::time::Duration,
    /// On a clean stop, how long moving this host's partitions away (warm) may take before the
    /// rest stop and go cold (`--handoff-timeout`).
    pub handoff_timeout: std::time::Duration,
    /// How long an owner holds a partition it drained for a move before it records the move
    /// abandoned and resumes (unless the target took over first).
    pub drained_hold: std::time::Duration,
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
    /// A catalog snapshot is written once this many control-log records were applied after the
    /// last one, so that a host's replay at start reads at most about this many.
    pub control_snapshot_every: u64,
    /// Where partitions are checkpointed (`--checkpoints`): a directory, or `s3://BUCKET/PREFIX`;
    /// `None` is `<data dir>/checkpoints`.
    pub checkpoints: Option<String>,
    /// Checkpoints kept per partition (`--checkpoint-retain`).
    pub checkpoint_retain: usize,
}

/// Checkpoints kept per partition unless `--checkpoint-retain` says otherwise.
pub const DEFAULT_CHECKPOINT_RETAIN: usize = 3;

impl HostConfig {
    /// The checkpoint store's URL: `--checkpoints`, or a directory under the data dir.
    pub fn checkpoints_url(&self) -> String {
        self.checkpoints.clone().unwrap_or_else(|| {
            self.data_dir
                .join("checkpoints")
                .to_string_lossy()
                .into_owned()
        })
    }

    /// Defaults for `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        HostConfig {
            data_dir: data_dir.into(),
            state_memory: 512 << 20,
            state_disk: None,
            task: TaskConfig::default(),
            host_id: None,
            advertise: None,
            session_timeout: std::time::Duration::from_secs(10),
            handoff_timeout: std::time::Duration::from_secs(60),
            drained_hold: crate::cluster::moves::DRAINED_HOLD,
            kafka: None,
            cluster: "baton".into(),
            native_modules: Vec::new(),
            token: None,
            control_snapshot_every: 1000,
            checkpoints: None,
            checkpoint_retain: DEFAULT_CHECKPOINT_RETAIN,
        }
    }
}

/// A baton host.
pub struct Baton {
    pub(crate) config: HostConfig,
    /// The log the host runs on (embedded or Kafka): one handle.
    pub(crate) log: Log,
    pub(crate) state: Arc<StateEnv>,
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) catalog: Arc<Mutex<Catalog>>,
    /// Registered modules, their bytes, and the compiled ones loaded here.
    pub(crate) registry: Arc<crate::control::modules::Registry>,
    /// What this host is for each partition: one peer each, in one state.
    pub(crate) peers: Arc<crate::partition::peers::Peers>,
    /// Protocol steps where tests hold a thread to inject a fault.
    pub(crate) steps: Arc<crate::steps::Steps>,
    /// Hot swaps and automatic rollbacks.
    pub(crate) swaps: Arc<crate::control::swap::Swaps>,
    /// The partitions this host runs.
    pub(crate) supervisor: Arc<crate::partition::supervisor::Supervisor>,
    /// This host's standby replicas.
    pub(crate) standbys: Arc<crate::cluster::standby::Standbys>,
    /// State lookups and scans, sent to the host that owns a slot.
    pub(crate) queries: crate::query::Queries,
    /// Itself, for the hooks partitions call back through.
    pub(crate) me: std::sync::Weak<Baton>,
    pub(crate) round_robin: AtomicU32,
    /// The control log: appends, read-backs, and the lock that serialises this host's
    /// control-plane changes (never held across topic creation or module chunk appends).
    pub(crate) control: Arc<crate::control::log::ControlLog>,
    /// Pipelines: creation, changes, deletion, dead-letter replays.
    pub(crate) pipelines: Arc<crate::control::pipelines::Pipelines>,
    /// This host's id.
    pub(crate) host_id: String,
    /// The base URL of this host's API, as it advertises it.
    pub(crate) address: Arc<RwLock<String>>,
    /// The hosts of the cluster, over its membership once it joined.
    pub(crate) cluster: crate::cluster::Hosts,
    /// Live moves of partitions.
    pub(crate) moves: Arc<crate::cluster::moves::Moves>,
    /// Splits of the partitions this host owns.
    pub(crate) splits: Arc<crate::cluster::split::Splits>,
    /// Auto-balance, while this host is the controller.
    pub(crate) balancer: Arc<crate::cluster::balancer::Balancer>,
    /// The controller, and the assignments this host writes itself.
    pub(crate) controller: Arc<crate::control::controller::Controller>,
    /// What the replay at start read.
    pub(crate) replay: crate::control::log::ReplayStats,
    /// Stops the follower and the controller.
    pub(crate) background_stop: Arc<std::sync::atomic::AtomicBool>,
    /// The follower's and the controller's threads.
    pub(crate) background: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// The checkpoints of this host's partitions.
    pub(crate) checkpoints: Arc<crate::partition::checkpoints::Checkpoints>,
}

impl Baton {
    /// Opens the host on its data directory: replays the control log, loads modules (from the
    /// compiled-code cache) and starts every pipeline's partitions.
    pub fn open(config: HostConfig) -> anyhow::Result<Arc<Self>> {
        std::fs::create_dir_all(&config.data_dir)?;
        let host_id = match &config.host_id {
            Some(id) => id.clone(),
            None => crate::cluster::stable_host_id(&config.data_dir)?,
        };
        crate::cluster::check_host_id(&host_id).map_err(anyhow::Error::msg)?;
        let steps = Arc::new(crate::steps::Steps::from_env().map_err(anyhow::Error::msg)?);
        let address = Arc::new(RwLock::new(config.advertise.clone().unwrap_or_default()));
        let log = match &config.kafka {
            None => Log::embedded(Arc::new(EmbeddedLog::open(&config.data_dir.join("log"))?)),
            Some(k) => {
                let t = Arc::new(KafkaTransport::connect(k.clone())?);
                tracing::info!(bootstrap = %k.bootstrap, "connected to Kafka");
                Log::kafka(t)
            }
        };
        let transport = log.transport().clone();
        let state = Arc::new(StateEnv::new(config.state_memory));
        let checkpoint_store = Arc::new(
            crate::state::checkpoint::CheckpointStore::open(
                &config.checkpoints_url(),
                config.checkpoint_retain,
            )
            .map_err(anyhow::Error::msg)?,
        );
        state.set_checkpoints(checkpoint_store.clone());
        let runtime = Runtime::new(config.data_dir.join("compiled"))?;
        crate::control::names::check_cluster(&config.cluster).map_err(anyhow::Error::msg)?;
        let control_topic = format!("{}.control", config.cluster);
        let modules_topic = format!("{}.modules", config.cluster);
        transport.ensure_topic(&control_topic, 1, TopicKind::Forever)?;
        // Module bytes in chunks keyed `<sha256>:<i>:<n>`: compaction keeps every chunk.
        transport.ensure_topic(&modules_topic, 1, TopicKind::Compacted)?;
        transport.ensure_topic(&snapshot_topic(&control_topic), 1, TopicKind::Compacted)?;
        let (catalog, replay) =
            replay_control(transport.as_ref(), &control_topic, CONTROL_REPLAY_STALL)?;
        let control_end = replay.to;
        if replay.replayed >= config.control_snapshot_every.max(1) {
            // The next host to start here (or this one, again) reads from here on.
            if let Err(e) = write_snapshot(transport.as_ref(), &control_topic, &catalog, replay.to)
            {
                tracing::warn!("control-log snapshot: {e:#}");
            }
        }
        let control = Arc::new(crate::control::log::ControlLog::new(
            log.clone(),
            control_topic.clone(),
            host_id.clone(),
            steps.clone(),
            control_end,
        ));
        // The control log keeps a catalog of its own applied strictly in log order: for
        // snapshots, and for the decisions hosts must agree on, read back from the log.
        *control.ordered() = catalog.clone();
        let catalog_handle = Arc::new(Mutex::new(Catalog::default()));
        let registry = Arc::new(crate::control::modules::Registry::new(
            config.data_dir.join("modules"),
            log.clone(),
            modules_topic.clone(),
            runtime.clone(),
            catalog_handle.clone(),
            control.clone(),
            config.native_modules.clone(),
        )?);
        let peers = Arc::new(crate::partition::peers::Peers::default());
        let checkpoints = crate::partition::checkpoints::Checkpoints::new(
            checkpoint_store,
            peers.clone(),
            catalog_handle.clone(),
            host_id.clone(),
            steps.clone(),
        );
        let background_stop = Arc::new(AtomicBool::new(false));
        let cluster = crate::cluster::Hosts::new(host_id.clone());
        // Where the balancer's decisions outlive the controller (on Kafka).
        let decisions = log.as_kafka().and_then(|kafka| {
            crate::cluster::balancer::KafkaDecisions::new(kafka, &config.cluster)
                .map_err(|e| {
                    tracing::warn!(
                        "the balancer's decisions will not outlive the controller: {e:#}"
                    )
                })
                .ok()
        });
        let baton = Arc::new_cyclic(|me: &std::sync::Weak<Baton>| {
            let standbys = {
                let me = me.clone();
                crate::cluster::standby::Standbys::new(
                    host_id.clone(),
                    catalog_handle.clone(),
                    peers.clone(),
                    log.as_kafka().cloned(),
                    state.clone(),
                    config.data_dir.join("state"),
                    background_stop.clone(),
                    Box::new(move |partition| match me.upgrade() {
                        Some(b) => b.moves.check_state_disk(partition),
                        None => Err("the host stopped".into()),
                    }),
                )
            };
            let supervisor = Supervisor::new(SupervisorParts {
                host_id: host_id.clone(),
                log: log.clone(),
                state: state.clone(),
                runtime: runtime.clone(),
                registry: registry.clone(),
                catalog: catalog_handle.clone(),
                control: control.clone(),
                peers: peers.clone(),
                standbys: standbys.clone(),
                steps: steps.clone(),
                task: config.task.clone(),
                state_dir: config.data_dir.join("state"),
            });
            let swaps = Arc::new(crate::control::swap::Swaps::new(
                host_id.clone(),
                log.is_kafka(),
                control.clone(),
                catalog_handle.clone(),
                registry.clone(),
                supervisor.clone(),
                {
                    let me = me.clone();
                    Box::new(move || me.upgrade().map(|b| b.partitions()).unwrap_or_default())
                },
            ));
            {
                let swaps = Arc::downgrade(&swaps);
                supervisor.set_rollback_recorder(Box::new(move |pipeline, generation, reason| {
                    if let Some(swaps) = swaps.upgrade() {
                        swaps.auto_rollback(pipeline, generation, reason);
                    }
                }));
            }
            let moves = crate::cluster::moves::Moves::new(crate::cluster::moves::MovesParts {
                host_id: host_id.clone(),
                log: log.clone(),
                state: state.clone(),
                catalog: catalog_handle.clone(),
                control: control.clone(),
                peers: peers.clone(),
                supervisor: supervisor.clone(),
                standbys: standbys.clone(),
                steps: steps.clone(),
                hosts: cluster.clone(),
                stop: background_stop.clone(),
                token: config.token.clone(),
                drained_hold: config.drained_hold,
                handoff_timeout: config.handoff_timeout,
                state_disk: config.state_disk,
                state_dir: config.data_dir.join("state"),
                partition_bytes: {
                    let me = me.clone();
                    Box::new(move |partition| {
                        me.upgrade()
                            .and_then(|b| b.partitions().into_iter().find(|p| p.id == partition))
                            .map_or(0, |p| p.state_bytes)
                    })
                },
            });
            let splits = crate::cluster::split::Splits::new(crate::cluster::split::SplitsParts {
                host_id: host_id.clone(),
                log: log.clone(),
                state: state.clone(),
                catalog: catalog_handle.clone(),
                control: control.clone(),
                peers: peers.clone(),
                supervisor: supervisor.clone(),
                steps: steps.clone(),
                hosts: cluster.clone(),
                stop: background_stop.clone(),
                moves: moves.clone(),
            });
            let balancer =
                crate::cluster::balancer::Balancer::new(crate::cluster::balancer::BalancerParts {
                    host_id: host_id.clone(),
                    hosts: cluster.clone(),
                    catalog: catalog_handle.clone(),
                    splits: splits.clone(),
                    moves: moves.clone(),
                    rows: {
                        let me = me.clone();
                        Box::new(move || me.upgrade().map(|b| b.partitions()).unwrap_or_default())
                    },
                    ask: {
                        let (hosts, token) = (cluster.clone(), config.token.clone());
                        Box::new(move |host: &str, path: &str, body: serde_json::Value| {
                            let url = hosts.address_of(host).ok_or_else(|| {
                                format!("the address of host `{host}` is not known")
                            })?;
                            crate::cluster::moves::post_json(
                                &url,
                                path,
                                &body,
                                token.as_deref(),
                                std::time::Duration::from_secs(120),
                            )
                        })
                    },
                    store: decisions
                        .map(|d| Box::new(d) as Box<dyn crate::cluster::balancer::DecisionStore>),
                });
            let controller = crate::control::controller::Controller::new(
                host_id.clone(),
                config.cluster.clone(),
                config.kafka.clone(),
                log.clone(),
                cluster.clone(),
                catalog_handle.clone(),
                control.clone(),
                moves.clone(),
                splits.clone(),
            );
            let pipelines = Arc::new(crate::control::pipelines::Pipelines::new(
                config.cluster.clone(),
                config.data_dir.join("state"),
                config.native_modules.clone(),
                log.clone(),
                control.clone(),
                catalog_handle.clone(),
                supervisor.clone(),
                runtime.clone(),
                {
                    let controller = controller.clone();
                    Box::new(move |record| controller.initial_assignments(record))
                },
            ));
            Baton {
                swaps,
                me: me.clone(),
                standbys,
                supervisor,
                queries: crate::query::Queries::new(
                    catalog_handle.clone(),
                    peers.clone(),
                    host_id.clone(),
                    if log.is_kafka() {
                        let me = me.clone();
                        Box::new(crate::query::ClusterResolver::new(
                            catalog_handle.clone(),
                            host_id.clone(),
                            Box::new(move |id| {
                                let b: Arc<Baton> = me.upgrade()?;
                                b.cluster.address_of(id)
                            }),
                        ))
                    } else {
                        Box::new(LocalResolver)
                    },
                ),
                config,
                control: control.clone(),
                log,
                state,
                runtime,
                catalog: catalog_handle,
                registry,
                peers,
                steps,
                round_robin: AtomicU32::new(0),
                pipelines,
                host_id,
                address,
                cluster,
                moves,
                splits,
                balancer,
                controller,
                replay,
                background_stop,
                background: Mutex::new(Vec::new()),
                checkpoints,
            }
        });
        {
            // Every control event takes effect through the one apply path.
            let me = Arc::downgrade(&baton);
            control.set_apply(Box::new(move |event, at| match me.upgrade() {
                Some(baton) => {
                    baton.apply_event(event, at);
                    true
                }
                None => false,
            }));
        }
        baton.join_cluster()?;
        for m in catalog.modules.values() {
            baton.registry.load(m)?;
        }
        let pipelines: Vec<PipelineRecord> = catalog.pipelines.values().cloned().collect();
        *baton.catalog.lock() = catalog;
        // Moves this host was part of when it stopped: its releases stay held.
        let unfinished = baton.moves.moves_left_by_restart();
        // A pipeline that cannot start here shows `failed` with the reason; the others run.
        for p in pipelines {
            baton.supervisor.start_or_record(Arc::new(p));
        }
        let scheduler = baton.checkpoints.start()?;
        baton.background.lock().push(scheduler);
        if baton.log.is_kafka() {
            // Other hosts' changes, and the controller's assignments, from here on.
            let stop = baton.background_stop.clone();
            let follower = {
                let me = Arc::downgrade(&baton);
                control.follow(
                    control_end,
                    stop.clone(),
                    crate::control::log::Snapshots {
                        every: baton.config.control_snapshot_every,
                        due: Box::new(move || {
                            me.upgrade().is_some_and(|b| b.cluster.is_controller())
                        }),
                    },
                )?
            };
            let controller = baton.controller.run(stop.clone())?;
            let balancer = baton.balancer.run(stop)?;
            baton
                .background
                .lock()
                .extend([follower, controller, balancer]);
            baton.moves.settle_moves_left_by_restart(unfinished);
        }
        baton.splits.settle_splits_left_by_restart();
        baton.splits.settle_merges_left_by_restart();
        tracing::info!(data_dir = %baton.config.data_dir.display(), "baton host open");
        Ok(baton)
    }

    /// Validates a component against the world, stores it by content and registers
    /// `name`/`version` ([`crate::control::modules::Registry::upload`]).
    pub fn upload_module(
        &self,
        name: &str,
        version: &str,
        bytes: &[u8],
    ) -> Result<crate::control::ModuleRecord> {
        self.registry.upload(name, version, bytes)
    }

    /// Every module version.
    pub fn modules(&self) -> Vec<crate::control::ModuleRecord> {
        self.registry.list()
    }

    /// Deletes a module version; refused (409) while a pipeline runs it.
    pub fn delete_module(
        &self,
        name: &str,
        version: &str,
    ) -> Result<crate::control::ModuleDeletion> {
        self.registry.delete(name, version)
    }

    /// The partition table: on Kafka every partition of the cluster, each as its owner last
    /// reported it (this host's own live), at the epoch of its newest assignment.
    pub fn partitions(&self) -> Vec<PartitionInfo> {
        let mut rows = self.partition_rows();
        let catalog = self.catalog.lock();
        for row in &mut rows {
            row.splitting = catalog.split_under_way(&row.id).cloned().map(Box::new);
            row.merging = catalog.merge_under_way(&row.id).cloned().map(Box::new);
        }
        rows
    }

    fn partition_rows(&self) -> Vec<PartitionInfo> {
        let local = self.supervisor.local_partitions();
        if !self.log.is_kafka() {
            return local;
        }
        let assignments = self.catalog.lock().assignments.clone();
        let reported = self.cluster.reported();
        let mut table: std::collections::BTreeMap<String, PartitionInfo> = local
            .into_iter()
            .filter(|p| {
                assignments
                    .get(&p.id)
                    .is_none_or(|a| a.owner == self.host_id)
            })
            .map(|p| (p.id.clone(), p))
            .collect();
        for a in assignments.values() {
            if a.owner == self.host_id && table.contains_key(&a.partition) {
                continue;
            }
            let seen = reported
                .get(&a.owner)
                .and_then(|ps| {
                    ps.iter()
                        .find(|p| p.id == a.partition && p.role == Role::Active)
                })
                .filter(|p| p.epoch >= a.epoch)
                .cloned();
            let row = seen.unwrap_or_else(|| {
                PartitionInfo::placeholder(&a.partition, &a.pipeline, a.slots, &a.owner, a.epoch)
            });
            table.insert(a.partition.clone(), row);
        }
        // Copies of the state on other hosts than the owner, and the moves.
        let mut replicas: Vec<(String, ReplicaInfo)> = self.supervisor.local_replicas();
        for (host, rows) in &reported {
            if *host == self.host_id {
                continue;
            }
            for r in rows.iter().filter(|r| r.role != Role::Active) {
                replicas.push((
                    r.id.clone(),
                    ReplicaInfo {
                        host: host.clone(),
                        role: r.role,
                        lag: r.lag,
                    },
                ));
            }
        }
        let moves = self.catalog.lock().moves.clone();
        for row in table.values_mut() {
            row.replicas = replicas
                .iter()
                .filter(|(p, r)| *p == row.id && r.host != row.owner)
                .map(|(_, r)| r.clone())
                .collect();
            if let Some(m) = moves.get(&row.id) {
                row.last_pause_ms = m
                    .iter()
                    .rev()
                    .find(|m| m.phase == crate::control::MovePhase::Done)
                    .and_then(|m| m.pause_ms);
                row.moves = m.clone();
            }
        }
        table.into_values().collect()
    }

    /// This host's rows for the other hosts' partition tables: its partitions, and the
    /// copies of partitions it keeps (with their role).
    pub(crate) fn reported_rows(&self) -> Vec<PartitionInfo> {
        let mut rows = self.supervisor.local_partitions();
        let epochs: std::collections::BTreeMap<String, (String, [u32; 2], u64)> = self
            .catalog
            .lock()
            .assignments
            .iter()
            .map(|(id, a)| (id.clone(), (a.pipeline.clone(), a.slots, a.epoch)))
            .collect();
        for (id, r) in self.supervisor.local_replicas() {
            if let Some((pipeline, slots, epoch)) = epochs.get(&id) {
                let mut row = PartitionInfo::placeholder(&id, pipeline, *slots, &r.host, *epoch);
                row.role = r.role;
                row.lag = r.lag;
                rows.push(row);
            }
        }
        rows
    }

    /// Starts and stops this host's partitions of `pipeline` to match `assignments`
    /// ([`Supervisor::assign`]).
    pub fn assign(
        &self,
        pipeline: &str,
        assignments: &[crate::partition::supervisor::Assignment],
    ) -> anyhow::Result<()> {
        self.supervisor.assign(pipeline, assignments)
    }

    /// The running partitions with their live status (for metrics).
    pub fn partition_handles(&self) -> Vec<Arc<crate::partition::supervisor::PartitionHandle>> {
        self.supervisor.partition_handles()
    }

    /// The partitions running on this host.
    pub fn local_partitions(&self) -> Vec<crate::partition::report::PartitionInfo> {
        self.supervisor.local_partitions()
    }

    /// Creates a pipeline ([`crate::control::pipelines::Pipelines::create`]).
    pub fn create_pipeline(
        &self,
        spec: crate::control::PipelineSpec,
    ) -> Result<crate::control::pipelines::PipelineInfo> {
        self.pipelines.create(spec)
    }

    /// Deletes a pipeline; with `purge`, its state too.
    pub fn delete_pipeline(
        &self,
        name: &str,
        purge: bool,
    ) -> Result<crate::control::PipelineDeletion> {
        self.pipelines.delete(name, purge)
    }

    /// Replays a pipeline's dead letters (of one slot, or all; from/to offsets).
    pub fn replay_dead_letters(
        &self,
        name: &str,
        slot: Option<u32>,
        from: Option<u64>,
        to: Option<u64>,
    ) -> Result<crate::control::DeadLetterReplay> {
        self.pipelines.replay(name, slot, from, to)
    }

    /// Every pipeline, as the API shows it.
    pub fn pipelines(&self) -> Vec<crate::control::pipelines::PipelineInfo> {
        self.pipelines.list()
    }

    /// A pipeline's record.
    pub fn pipeline(&self, name: &str) -> Result<PipelineRecord> {
        self.pipelines.get(name)
    }

    /// Changes a running pipeline's settings; `Ok((info, false))` when some partition had not
    /// applied them within `wait`.
    pub fn update_pipeline(
        &self,
        name: &str,
        patch: crate::control::pipelines::PipelinePatch,
        wait: std::time::Duration,
    ) -> Result<(crate::control::pipelines::PipelineInfo, bool)> {
        self.pipelines.update(name, patch, wait)
    }

    /// Hot swaps of this host's pipelines.
    pub fn swaps(&self) -> &crate::control::swap::Swaps {
        &self.swaps
    }

    /// Events of `pipeline` newer than `after`.
    pub fn events(
        &self,
        pipeline: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<crate::partition::Event>> {
        self.swaps.events(pipeline, after, limit)
    }

    /// State lookups and scans.
    pub fn queries(&self) -> &crate::query::Queries {
        &self.queries
    }

    /// The protocol steps where a test holds this host's threads to inject a fault.
    pub fn steps(&self) -> &Arc<crate::steps::Steps> {
        &self.steps
    }

    /// The host's settings.
    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// The transport (embedded log or Kafka).
    pub fn transport(&self) -> &Arc<dyn Transport> {
        self.log.transport()
    }

    /// The shared state environment.
    pub fn state_env(&self) -> &Arc<StateEnv> {
        &self.state
    }

    /// Appends records to `topic`; each goes to slot murmur2(key) mod partitions (round-robin
    /// without a key). Returns once they are on disk.
    pub fn produce(&self, topic: &str, records: Vec<ProduceRecord>) -> Result<Vec<Produced>> {
        crate::control::names::check_user_topic(&self.config.cluster, topic)
            .map_err(Error::BadRequest)?;
        let partitions = self.log.partitions(topic)?.ok_or_else(|| {
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
            let first = self.log.append(topic, slot, &recs)?;
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
            .log
            .partitions(topic)?
            .ok_or_else(|| Error::NotFound(format!("topic `{topic}` does not exist")))?;
        if slot >= partitions {
            return Err(Error::NotFound(format!(
                "topic `{topic}` has {partitions} partitions; slot {slot} does not exist"
            )));
        }
        let records = self.log.read(topic, slot, offset, limit)?;
        let end = self.log.end_offset(topic, slot)?;
        Ok((records, end))
    }

    /// Takes part in the cluster: alone on the embedded log; on Kafka, a member of the group
    /// `<cluster>.hosts` that reports its load to `<cluster>.load`.
    fn join_cluster(&self) -> anyhow::Result<()> {
        let me = self.me.clone();
        let sampler: crate::cluster::Sampler = Box::new(move || {
            let mut s = crate::cluster::LoadSample::default();
            if let Some(b) = me.upgrade() {
                for h in b.peers.handles() {
                    s.records += h.status.records.load(Ordering::Relaxed);
                    s.guest_us += h.status.time.process_us.load(Ordering::Relaxed);
                    s.partitions += 1;
                }
                s.detail = b.reported_rows();
            }
            s
        });
        let membership: Box<dyn crate::cluster::Membership> =
            match (self.log.as_kafka(), &self.config.kafka) {
                (Some(k), Some(cfg)) => Box::new(crate::cluster::KafkaMembership::join(
                    k,
                    cfg,
                    &self.config.cluster,
                    &self.host_id,
                    self.address.clone(),
                    self.config.session_timeout,
                    sampler,
                )?),
                _ => Box::new(crate::cluster::Alone::new(
                    self.host_id.clone(),
                    self.address.clone(),
                    sampler,
                )),
            };
        self.cluster.set(membership);
        Ok(())
    }

    /// This host's id.
    pub fn host_id(&self) -> &str {
        &self.host_id
    }

    /// Sets the address this host advertises, unless `--advertise` gave one: the API's base URL
    /// once it listens.
    pub fn set_address(&self, url: &str) {
        if self.config.advertise.is_none() {
            *self.address.write() = url.to_string();
        }
    }

    /// The hosts of the cluster, as this host sees them.
    pub fn hosts(&self) -> Vec<crate::cluster::HostInfo> {
        self.cluster.all()
    }

    /// The live controller other than this host, as (id, address), if there is one.
    pub(crate) fn other_controller(&self) -> Option<(String, String)> {
        self.cluster.other_controller()
    }

    /// Begins moving `partition` to host `to` ([`crate::cluster::moves::Moves::request_move`]).
    pub fn request_move(&self, partition: &str, to: &str) -> Result<String> {
        self.moves.request_move(partition, to)
    }

    /// Splits partition `id`, which runs on this host, at slot `at` (or where it halves the
    /// load) ([`crate::cluster::split::Splits::split`]).
    pub fn split_partition(
        &self,
        id: &str,
        at: Option<u32>,
        reason: Option<&str>,
    ) -> Result<crate::control::SplitRecord> {
        self.splits
            .split(id, at, reason.unwrap_or("asked for by hand"))
    }

    /// Pauses (ms) of the splits this host made, oldest first.
    pub fn split_pauses(&self) -> Vec<f64> {
        self.splits.pauses()
    }

    /// Merges partitions `left` and `right` (adjacent) on this host, which owns `left`
    /// ([`crate::cluster::split::Splits::merge`]).
    pub fn merge_partitions(
        &self,
        left: &str,
        right: &str,
        reason: Option<&str>,
    ) -> Result<crate::control::MergeRecord> {
        self.splits
            .merge(left, right, reason.unwrap_or("asked for by hand"))
    }

    /// Pauses (ms) of the merges this host made, oldest first.
    pub fn merge_pauses(&self) -> Vec<f64> {
        self.splits.merge_pauses()
    }

    /// The balancer's decisions on this host (while it is the controller), oldest first.
    pub fn balancer_log(&self) -> Vec<crate::cluster::balancer::Decision> {
        self.balancer.log()
    }

    /// The balancer's decisions per (pipeline, action) on this host.
    pub fn balancer_counts(&self) -> Vec<(String, &'static str, u64)> {
        self.balancer.counts()
    }

    /// The partitions of every pipeline retired by splits, with their history (moves, the
    /// split that retired them).
    pub fn retired_partitions(&self) -> Vec<crate::control::RetiredPartition> {
        self.catalog
            .lock()
            .pipelines
            .values()
            .filter_map(|p| p.layout.as_ref())
            .flat_map(|l| l.retired.iter().cloned())
            .collect()
    }

    /// The splits and merges every pipeline's layout keeps (the last ones), oldest first.
    pub fn reshapes(
        &self,
    ) -> (
        Vec<crate::control::SplitRecord>,
        Vec<crate::control::MergeRecord>,
    ) {
        let catalog = self.catalog.lock();
        let layouts: Vec<_> = catalog
            .pipelines
            .values()
            .filter_map(|p| p.layout.as_ref())
            .collect();
        (
            layouts
                .iter()
                .flat_map(|l| l.splits.iter().cloned())
                .collect(),
            layouts
                .iter()
                .flat_map(|l| l.merges.iter().cloned())
                .collect(),
        )
    }

    /// Takes a checkpoint of partition `id`, which runs on this host, now
    /// ([`crate::partition::checkpoints::Checkpoints::take_now`]).
    pub fn checkpoint_partition(
        &self,
        id: &str,
    ) -> Result<crate::state::checkpoint::CheckpointInfo> {
        self.checkpoints.take_now(id)
    }

    /// Puts partition `id`, which runs on this host, back to its checkpoint `seq`
    /// ([`crate::partition::checkpoints::Checkpoints::rewind`]).
    pub fn rewind_partition(
        &self,
        id: &str,
        seq: u64,
    ) -> Result<crate::partition::checkpoints::RewindReport> {
        self.checkpoints.rewind(id, seq)
    }

    /// The host that owns partition `id` by the assignments, with its API's base URL; `None`
    /// when this host does, or no assignment names it.
    pub fn remote_owner(&self, id: &str) -> Option<(String, String)> {
        let owner = self.catalog.lock().assignments.get(id)?.owner.clone();
        if owner == self.host_id {
            return None;
        }
        let url = self.cluster.address_of(&owner).unwrap_or_default();
        Some((owner, url))
    }

    /// The checkpoint store's retained checkpoints of partition `id`, oldest first.
    pub fn partition_checkpoints(
        &self,
        id: &str,
    ) -> Result<Vec<crate::state::checkpoint::Manifest>> {
        let (pipeline, slots) = {
            let catalog = self.catalog.lock();
            match catalog.assignments.get(id) {
                Some(a) => (catalog.pipelines.get(&a.pipeline).cloned(), a.slots),
                None => {
                    let h = self.peers.handles().into_iter().find(|h| h.id == id);
                    match h {
                        Some(h) => (
                            catalog.pipelines.get(&h.pipeline).cloned(),
                            [h.slots.start, h.slots.end],
                        ),
                        None => (None, [0, 0]),
                    }
                }
            }
        };
        let record = pipeline.ok_or_else(|| Error::NotFound(format!("no partition `{id}`")))?;
        let p = crate::state::checkpoint::PartitionRef::new(
            &record.spec.name,
            record.created_at,
            id,
            slots,
        );
        self.checkpoints
            .store()
            .manifests(&p)
            .map_err(|e| Error::Unavailable(e.to_string()))
    }

    /// The owner's side of a handoff ([`crate::cluster::moves::Moves::drain_for_move`]).
    pub fn drain_for_move(
        &self,
        partition: &str,
        move_id: &str,
    ) -> Result<crate::cluster::moves::Drained> {
        self.moves.drain_for_move(partition, move_id)
    }

    /// Before a clean stop: moves this host's partitions away, warm
    /// ([`crate::cluster::moves::Moves::move_away`]).
    pub fn move_away(&self) {
        self.moves.move_away()
    }

    /// Pauses (ms) of the moves this host took over, oldest first.
    pub fn move_pauses(&self) -> Vec<f64> {
        self.moves.pauses()
    }

    /// The next control-log offset this host's follower reads (how far it has applied the log).
    pub fn control_position(&self) -> u64 {
        self.control.applied()
    }

    /// Holds the control lock, as a long admin call does (tests only: no partition may stall
    /// behind it).
    #[doc(hidden)]
    pub fn hold_control_for_test(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.control.lock()
    }

    /// How far this host has seen the control log: what it read, and what it appended itself.
    /// A call it forwards to the controller runs only once the controller has read this far.
    pub(crate) fn control_seen(&self) -> u64 {
        self.control.seen()
    }

    /// What the control-log replay at start read.
    pub(crate) fn control_replay(&self) -> crate::control::log::ReplayStats {
        self.replay
    }

    /// Stops every partition at its next batch boundary and waits for them.
    pub fn shutdown(&self) {
        {
            // No assignment read meanwhile starts a partition again.
            self.supervisor.close();
            let parts = self.peers.handles();
            for p in &parts {
                p.stop();
            }
            for p in &parts {
                p.join();
            }
        }
        // Committed and stopped: their next owners may start now.
        self.controller.hand_off();
        for p in self.peers.standbys() {
            self.standbys.stop(&p);
        }
        self.background_stop.store(true, Ordering::Relaxed);
        self.checkpoints.stop();
        let threads: Vec<_> = self.background.lock().drain(..).collect();
        for t in threads {
            // The last handle of the host may be dropped on one of these threads (a follower
            // that held it when the host was let go): it ends on its own once it sees the stop.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
        self.cluster.leave();
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

/// One record to produce.
#[derive(Debug, Clone)]
pub struct ProduceRecord {
    /// Key; `None` spreads records over slots round-robin.
    pub key: Option<Vec<u8>>,
    /// Value; `None` is a tombstone.
    pub value: Option<Vec<u8>>,
    /// Headers.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Timestamp; `None` is now.
    pub timestamp: Option<i64>,
}

/// Where a produced record landed.
#[derive(Debug, Clone, Copy, serde::Serialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct Produced {
    /// Slot (partition of the topic).
    pub slot: u32,
    /// Offset in it.
    pub offset: u64,
}
