//! What a host reports of its partitions: the rows of `GET /api/v1/partitions` (re-exported by
//! [`crate::http::model`]), made here by the supervisor without reference to the HTTP server.

use serde::Serialize;

use crate::partition::{LoopTimeMs, ReplayProgress, RestoreProgress, SlotProgress, SwapReport};

/// A partition's checkpoints, as the partition table and the checkpoint calls show them.
pub use crate::state::checkpoint::{CheckpointInfo, Manifest, Restored};

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
    /// Bytes of its memtables on the owner: state in memory not yet flushed to SST files.
    #[serde(default)]
    pub memory_bytes: u64,
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
    /// Its last checkpoint: taken by its owner, or the newest in the owner's checkpoint store
    /// when the owner started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint: Option<crate::state::checkpoint::CheckpointInfo>,
    /// Why its owner's last checkpoint failed, until one succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_error: Option<String>,
    /// The checkpoint its owner restored its state from when it started it (the changelogs
    /// then restored the rest from the checkpoint's offsets), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<crate::state::checkpoint::Restored>,
    /// Its split under way, if one is: its halves' ids, and the slot it splits at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub splitting: Option<Box<crate::control::SplitRecord>>,
    /// The merge under way that it is a side of, if one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merging: Option<Box<crate::control::MergeRecord>>,
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
            memory_bytes: 0,
            last_error: None,
            time_ms: Default::default(),
            version: String::new(),
            last_swap: None,
            replay: Vec::new(),
            role: Role::Active,
            replicas: Vec::new(),
            last_pause_ms: None,
            moves: Vec::new(),
            last_checkpoint: None,
            checkpoint_error: None,
            restored_from: None,
            splitting: None,
            merging: None,
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
