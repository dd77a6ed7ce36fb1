//! The API's types: what the HTTP API (and the CLI, and the Rust API of [`crate::Baton`])
//! answers and takes. Enums where a field has a closed set of values.

use serde::Serialize;

pub use crate::app::{ProduceRecord, Produced};
pub use crate::control::pipelines::{PipelineInfo, PipelinePatch, PipelinePhase};
use crate::partition::SwapReport;
pub use crate::partition::checkpoints::RewindReport;
pub use crate::partition::report::{CheckpointInfo, Manifest, Restored};
pub use crate::partition::report::{PartitionInfo, PartitionState, ReplicaInfo, Role};

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
