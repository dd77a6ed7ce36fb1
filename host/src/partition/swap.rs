//! Hot swap: the module version a pipeline's partitions should run, and what each partition
//! reports back. The partition loop switches at a commit boundary (nothing is pending there, so
//! state is untouched), watches the new version through a probation of a few batches, and goes
//! back to the version it ran before when `init` fails or too many records fail.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::Serialize;

use crate::control::pipeline::{GuestLimits, PipelineSpec, SwapPolicy};
use crate::runtime::Module;
use crate::runtime::host::WasiGrants;

/// What of a pipeline's spec can change while it runs (`PATCH /api/v1/pipelines/{p}`): applied
/// at each partition's next batch boundary with a new instance, as a swap is.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The config handed to `init`, as pairs.
    pub config: Vec<(String, String)>,
    /// The config as the spec has it.
    pub config_json: serde_json::Map<String, serde_json::Value>,
    /// Guest limits.
    pub limits: GuestLimits,
    /// When a new version is rolled back.
    pub swap: SwapPolicy,
    /// WASI grants.
    pub wasi: WasiGrants,
    /// How long processed records may wait for their commit.
    pub commit_interval_ms: u64,
}

impl Settings {
    /// The settings of a spec.
    pub fn of(spec: &PipelineSpec) -> Arc<Self> {
        Arc::new(Settings {
            config: spec.config_pairs(),
            config_json: spec.config.clone(),
            limits: spec.limits.clone(),
            swap: spec.swap.clone(),
            wasi: spec.wasi.clone(),
            commit_interval_ms: spec.commit_interval_ms(),
        })
    }
}

/// The module version a pipeline should run; bumping `generation` asks every partition to switch
/// at its next batch boundary.
pub struct ModuleTarget {
    generation: AtomicU64,
    current: Mutex<Target>,
    previous: Mutex<Option<Target>>,
    /// The generations the last changes made, by the control-log offset of the event that
    /// asked for each: how the host that appended a change learns, once it is read back, which
    /// generation its partitions report on.
    made: Mutex<VecDeque<(u64, u64)>>,
}

/// How many changes [`ModuleTarget`] remembers the generation of.
const MADE_KEPT: usize = 64;

/// One generation of a [`ModuleTarget`].
#[derive(Clone)]
pub struct Target {
    /// Bumped on every change.
    pub generation: u64,
    /// Version label.
    pub version: String,
    /// The compiled module.
    pub module: Module,
    /// The settings it runs with.
    pub settings: Arc<Settings>,
}

impl ModuleTarget {
    /// A target starting at `version`.
    pub fn new(version: String, module: Module, settings: Arc<Settings>) -> Arc<Self> {
        Arc::new(ModuleTarget {
            generation: AtomicU64::new(1),
            current: Mutex::new(Target {
                generation: 1,
                version,
                module,
                settings,
            }),
            previous: Mutex::new(None),
            made: Mutex::new(VecDeque::new()),
        })
    }

    /// Notes that the control-log event at offset `at` made `generation`.
    pub fn made(&self, at: u64, generation: u64) {
        let mut made = self.made.lock();
        made.push_back((at, generation));
        while made.len() > MADE_KEPT {
            made.pop_front();
        }
    }

    /// The generation the control-log event at offset `at` made, if it made one here (and not
    /// too many changes ago).
    pub fn made_by(&self, at: u64) -> Option<u64> {
        self.made
            .lock()
            .iter()
            .find(|(offset, _)| *offset == at)
            .map(|(_, g)| *g)
    }

    /// The current generation (a cheap check per batch).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The current target.
    pub fn get(&self) -> Target {
        self.current.lock().clone()
    }

    /// Points the pipeline at `version`; returns the new generation.
    pub fn set(&self, version: String, module: Module) -> u64 {
        let mut cur = self.current.lock();
        *self.previous.lock() = Some(cur.clone());
        cur.generation += 1;
        cur.version = version;
        cur.module = module;
        self.generation.store(cur.generation, Ordering::Release);
        cur.generation
    }

    /// Goes back to `version`, refused `generation`'s predecessor, as an automatic rollback
    /// recorded in the control log asks; returns the new generation. There is nothing to go
    /// back to from there.
    pub fn set_back(&self, version: String, module: Module) -> u64 {
        let generation = self.set(version, module);
        *self.previous.lock() = None;
        generation
    }

    /// Asks for the same version with other settings; returns the new generation.
    pub fn set_settings(&self, settings: Arc<Settings>) -> u64 {
        let mut cur = self.current.lock();
        *self.previous.lock() = Some(cur.clone());
        cur.generation += 1;
        cur.settings = settings;
        self.generation.store(cur.generation, Ordering::Release);
        cur.generation
    }

    /// The version a rollback of `generation` would go back to, without moving the target:
    /// `None` when something newer was asked for or there is nothing to go back to.
    pub fn rollback_target(&self, generation: u64) -> Option<Target> {
        let cur = self.current.lock();
        if cur.generation != generation {
            return None;
        }
        self.previous.lock().clone()
    }
}

/// What a partition did with a generation.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, schemars::JsonSchema)]
pub struct SwapReport {
    /// The generation.
    pub generation: u64,
    /// Its version.
    pub version: String,
    /// `swapped` or `rolled-back`.
    pub outcome: SwapOutcome,
    /// Why it rolled back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Time the partition did not process records while switching, in microseconds.
    pub pause_us: u64,
    /// Timers pending in the partition's slots that the version swapped to cannot take (it
    /// speaks contract 0.1): they stay pending until a version that takes them runs.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub timers_pending: u64,
    /// When it was reached (ms since the Unix epoch).
    #[serde(default)]
    pub at: i64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How a swap ended on a partition.
#[derive(
    Debug, Clone, Copy, Serialize, serde::Deserialize, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum SwapOutcome {
    /// Running the new version.
    Swapped,
    /// Back on the previous version.
    RolledBack,
}

/// Called by a partition that rolled back: (generation rejected, reason).
pub type RollbackHook = Arc<dyn Fn(u64, String) + Send + Sync>;

/// Swap history of a partition.
#[derive(Default)]
pub struct SwapStatus {
    /// The last report.
    pub last: Mutex<Option<SwapReport>>,
    /// Pauses of the last swaps (most recent last), in microseconds.
    pub pauses: Mutex<VecDeque<u64>>,
    /// Swaps completed since start.
    pub swaps: AtomicU64,
    /// Rollbacks since start.
    pub rollbacks: AtomicU64,
}

impl SwapStatus {
    /// Records a report.
    pub fn record(&self, report: SwapReport) {
        match report.outcome {
            SwapOutcome::Swapped => self.swaps.fetch_add(1, Ordering::Relaxed),
            SwapOutcome::RolledBack => self.rollbacks.fetch_add(1, Ordering::Relaxed),
        };
        let mut p = self.pauses.lock();
        p.push_back(report.pause_us);
        if p.len() > 1000 {
            p.pop_front();
        }
        *self.last.lock() = Some(report);
    }
}
