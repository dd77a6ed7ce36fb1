//! The API's types: what the HTTP API (and the CLI, and the Rust API of [`crate::Baton`])
//! answers and takes. Enums where a field has a closed set of values.

use serde::Serialize;

use crate::control::pipeline::{GuestLimits, SwapPolicy};
use crate::control::{PipelineSpec, SwapRecord};
use crate::partition::{LoopTimeMs, ReplayProgress, RestoreProgress, SlotProgress, SwapReport};
use crate::runtime::host::WasiGrants;

/// A partition as `GET /api/v1/partitions` shows it.
#[derive(Debug, Clone, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct PartitionInfo {
    /// Partition id.
    pub id: String,
    /// Pipeline name.
    pub pipeline: String,
    /// `[start, end)`.
    pub slots: [u32; 2],
    /// Owning host.
    pub owner: String,
    /// Epoch.
    pub epoch: u64,
    /// What it is doing.
    pub state: PartitionState,
    /// Progress of the last restore.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreProgress>,
    /// Why it failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Per input slot: next offset to process and the end of the topic partition.
    pub offsets: Vec<SlotProgress>,
    /// Records not yet processed.
    pub lag: u64,
    /// Records processed since the host started.
    pub records: u64,
    /// Records dead-lettered since the host started.
    pub dead_letters: u64,
    /// Approximate bytes of its state on the owner (live SST data and memtables).
    #[serde(default)]
    pub state_bytes: u64,
    /// Last processing error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Milliseconds the partition loop spent fetching, processing and committing.
    pub time_ms: LoopTimeMs,
    /// The module version it runs.
    pub version: String,
    /// Its last hot swap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_swap: Option<SwapReport>,
    /// Replays of dead letters in progress, per slot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replay: Vec<ReplayProgress>,
    /// The owner's role: `active` (it processes the partition).
    #[serde(default)]
    pub role: Role,
    /// Other hosts keeping a copy of its state: warming for a move, or standbys.
    #[serde(default)]
    pub replicas: Vec<ReplicaInfo>,
    /// The pause of its last move (ms): from the old owner's final commit to the new owner's
    /// first guest call.
    #[serde(default)]
    pub last_pause_ms: Option<f64>,
    /// Its last moves, oldest first.
    #[serde(default)]
    pub moves: Vec<crate::control::MoveRecord>,
}

impl PartitionInfo {
    /// A row for a partition nothing is known of yet but its assignment.
    pub fn placeholder(id: &str, pipeline: &str, slots: [u32; 2], owner: &str, epoch: u64) -> Self {
        PartitionInfo {
            id: id.to_string(),
            pipeline: pipeline.to_string(),
            slots,
            owner: owner.to_string(),
            epoch,
            state: PartitionState::Starting,
            restore: None,
            error: None,
            offsets: Vec::new(),
            lag: 0,
            records: 0,
            dead_letters: 0,
            state_bytes: 0,
            last_error: None,
            time_ms: Default::default(),
            version: String::new(),
            last_swap: None,
            replay: Vec::new(),
            role: Role::Active,
            replicas: Vec::new(),
            last_pause_ms: None,
            moves: Vec::new(),
        }
    }
}

/// What a host does with a partition.
#[derive(
    Debug, Clone, Copy, Default, Serialize, serde::Deserialize, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// It processes the partition.
    #[default]
    Active,
    /// It restores and tails the partition's changelog to take it over (a move).
    Warming,
    /// It keeps a warm copy, promoted if the owner fails.
    Standby,
}

/// A copy of a partition's state on another host than its owner.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ReplicaInfo {
    /// The host keeping it.
    pub host: String,
    /// `warming` or `standby`.
    pub role: Role,
    /// Changelog records it has not applied yet.
    pub lag: u64,
}

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
}

/// The answer to a hot swap.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct SwapResult {
    /// The pipeline.
    pub pipeline: String,
    /// The version asked for.
    pub version: String,
    /// The version running now.
    pub running: String,
    /// How it ended.
    pub outcome: SwapStatus,
    /// Why it was rolled back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What the swap leaves that needs attention, e.g. timers the new version cannot take.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Per partition: what it did and its pause.
    pub partitions: Vec<SwapPartition>,
}

/// One partition's part of a swap.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct SwapPartition {
    /// Partition id.
    pub id: String,
    /// Its report, once it reached a batch boundary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<SwapReport>,
}

/// One page of a scan.
#[derive(Debug, Clone, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct ScanPage {
    /// Entries in (slot, key) order.
    pub items: Vec<Lookup>,
    /// Pass as `cursor` to get the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// True if a partition scanned was restoring: values may be older than the changelog.
    pub restoring: bool,
}

/// The answer to a state lookup.
#[derive(Debug, Clone, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Lookup {
    /// The key asked for.
    pub key: String,
    /// The value as UTF-8, or null when it is not UTF-8.
    pub value: Option<String>,
    /// The value in base64.
    pub value_base64: String,
    /// The value as a counter, when it has 8 bytes (Kafka's LongSerializer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_i64: Option<i64>,
    /// The key's slot.
    pub slot: u32,
    /// The partition owning the slot.
    pub partition: String,
    /// The host owning the partition.
    pub owner: String,
    /// True while the partition restores: the value may be older than the changelog.
    pub restoring: bool,
    /// Every slot holding the key (producers with different partitioners put a key in several
    /// slots), in the order searched: the murmur2 slot first. Absent in scan pages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<LookupMatch>,
}

/// One slot holding a looked-up key.
#[derive(Debug, Clone, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct LookupMatch {
    /// The slot.
    pub slot: u32,
    /// The partition owning it.
    pub partition: String,
    /// The host owning the partition.
    pub owner: String,
    /// The value as UTF-8, or null when it is not UTF-8.
    pub value: Option<String>,
    /// The value in base64.
    pub value_base64: String,
    /// The value as a counter, when it has 8 bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_i64: Option<i64>,
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
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct Produced {
    /// Slot (partition of the topic).
    pub slot: u32,
    /// Offset in it.
    pub offset: u64,
}

/// What a partition is doing, as `GET /api/v1/partitions` shows it.
#[derive(
    Debug, Clone, Copy, Serialize, serde::Deserialize, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum PartitionState {
    /// Opening state and instantiating.
    Starting,
    /// Catching state up from the changelog.
    Restoring,
    /// Processing.
    Running,
    /// Between sessions after an error; `error` says which.
    Recovering,
    /// Stopped on request.
    Stopped,
    /// Stopped by an error it cannot get past; `error` says which.
    Failed,
}

/// How a hot swap ended.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SwapStatus {
    /// Every partition runs the new version.
    Swapped,
    /// The pipeline already ran that version.
    Unchanged,
    /// A partition refused it, and every partition runs the old version again.
    RolledBack,
    /// Not every partition reached a batch boundary in time; they swap at their next one.
    Pending,
}
