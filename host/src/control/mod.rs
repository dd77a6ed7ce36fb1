//! The control plane: pipeline specs, the module registry and the partition table, recorded as
//! events in the control log (`<cluster>.control`, by default `baton.control`, one partition,
//! read from the start on every boot). The log's total order is the source of truth; the in-memory catalog is its replay.

pub mod controller;
pub(crate) mod log;
pub(crate) mod modules;
pub mod names;
pub mod pipeline;
pub mod pipelines;
pub mod swap;

pub use pipeline::{Guarantee, PipelineRecord, PipelineSpec, Start};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A module version in the registry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModuleRecord {
    /// Module name.
    pub name: String,
    /// Version label chosen by the uploader.
    pub version: String,
    /// Hex sha256 of the component bytes (the content address).
    pub sha256: String,
    /// Size in bytes.
    pub size: usize,
    /// The WIT package the component was validated against.
    pub wit: String,
    /// Upload time, milliseconds since the Unix epoch.
    pub uploaded_at: i64,
}

/// One record of the control log.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum ControlEvent {
    /// A module version was uploaded.
    Module(ModuleRecord),
    /// A pipeline was created.
    Pipeline(Box<PipelineRecord>),
    /// A pipeline switched module version.
    Swap(SwapRecord),
    /// A pipeline was deleted (with `purge`, its state too, and its name is free again).
    PipelineDeleted(PipelineDeletion),
    /// A module version was deleted.
    ModuleDeleted(ModuleDeletion),
    /// A running pipeline's settings changed (`PATCH`).
    PipelineUpdated(PipelineUpdate),
    /// Dead letters of a pipeline are to be processed again.
    DeadLettersReplayed(DeadLetterReplay),
    /// The controller gave a partition to a host, from an epoch on.
    Assigned(AssignmentRecord),
    /// A live move of a partition to another host began or went on to a new phase.
    Move(MoveRecord),
    /// A move's owner drained the partition: it stopped and committed, and processes it at
    /// this epoch no more. Where its input and changelogs ended, for the target to check.
    Released(ReleaseRecord),
    /// A split of a partition in two began, was done or was given up.
    Split(Box<SplitRecord>),
    /// A merge of two adjacent partitions into one began, was done or was given up.
    Merge(Box<MergeRecord>),
}

/// One partition of a pipeline: its id and slots `[start, end)`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Shape {
    /// Partition id, `<pipeline>-<n>`.
    pub id: String,
    /// Slots `[start, end)`.
    pub slots: [u32; 2],
}

/// A pipeline's partitions once the first split changed them, as the control log made them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Layout {
    /// The partitions, in slot order.
    pub partitions: Vec<Shape>,
    /// The number the next new partition id gets: ids are never used twice.
    pub next: u32,
    /// The last splits, oldest first.
    #[serde(default)]
    pub splits: Vec<SplitRecord>,
    /// Partitions split or merged away, oldest first, with their history.
    #[serde(default)]
    pub retired: Vec<RetiredPartition>,
    /// The last merges, oldest first.
    #[serde(default)]
    pub merges: Vec<MergeRecord>,
}

/// A merge of two adjacent partitions of one host into one, as the control log records it:
/// one record per phase, under one id. It begins only from the owner of both, at their epochs,
/// with no move, split or other merge of either under way; it is done only if both still have
/// that owner and those epochs then. Partitions on two hosts are first brought to one by a
/// move.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeRecord {
    /// The merge's id.
    pub id: String,
    /// The pipeline.
    pub pipeline: String,
    /// The partition of the lower slots.
    pub left: String,
    /// The partition of the higher slots, which starts where `left` ends.
    pub right: String,
    /// The slots of the two together `[start, end)`.
    pub slots: [u32; 2],
    /// The slot where `right` starts.
    pub slot: u32,
    /// The owner of both, which merges them.
    pub owner: String,
    /// Their epochs when the merge began.
    pub epochs: [u64; 2],
    /// The phase reached.
    pub phase: SplitPhase,
    /// The merged partition's id: allocated by the catalog when the merge begins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged: Option<String>,
    /// Once done: ms during which none of them processed, from the earlier of the two final
    /// commits to the merged partition's first guest call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_ms: Option<f64>,
    /// Once done: where the pause went, step by step (ms each).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<MoveStep>,
    /// With `abandoned`: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why it was asked for (by hand, or the balancer's reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// When the phase was reached (ms since the Unix epoch).
    pub at: i64,
}

/// Splits kept per pipeline in the catalog (the newest).
pub const SPLITS_KEPT: usize = 50;

/// Retired partitions kept per pipeline in the catalog (the newest).
pub const RETIRED_KEPT: usize = 200;

/// Where a split is.
#[derive(
    Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum SplitPhase {
    /// Recorded: its halves' ids are allocated, and the partition neither moves nor splits
    /// again until it ends. The owner prepares, then stops the partition at a batch boundary.
    Begun,
    /// The halves replace the partition: it is retired, and they run on its owner.
    Done,
    /// Given up (see `reason`): the partition goes on as it was.
    Abandoned,
}

impl SplitPhase {
    /// Done or abandoned.
    pub fn ended(self) -> bool {
        matches!(self, SplitPhase::Done | SplitPhase::Abandoned)
    }
}

/// A split of a partition in two at a slot, as the control log records it: one record per
/// phase, under one id. It counts at its place in the log: it begins only from the partition's
/// owner at its epoch with no move or other split of it under way, and is done only if the
/// partition still has that owner and epoch then.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SplitRecord {
    /// The split's id.
    pub id: String,
    /// The pipeline.
    pub pipeline: String,
    /// The partition split.
    pub partition: String,
    /// Its slots `[start, end)`.
    pub slots: [u32; 2],
    /// The first slot of the right half.
    pub slot: u32,
    /// The partition's owner, which splits it.
    pub owner: String,
    /// The partition's epoch when the split began.
    pub epoch: u64,
    /// The phase reached.
    pub phase: SplitPhase,
    /// The halves' ids, left then right: allocated by the catalog when the split begins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub halves: Vec<String>,
    /// Once done: ms during which neither the partition nor a half processed, from the
    /// partition's final commit to the later of the halves' first guest calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_ms: Option<f64>,
    /// Once done: where the pause went, step by step (ms each).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<MoveStep>,
    /// Once done and compacted: the disk the halves freed by dropping each other's data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaimed_bytes: Option<u64>,
    /// With `abandoned`: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why it was asked for (by hand, or the balancer's reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// When the phase was reached (ms since the Unix epoch).
    pub at: i64,
}

/// A partition split away: its last shape and owner, what replaced it, and its moves.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetiredPartition {
    /// Its id (never used again).
    pub id: String,
    /// The pipeline.
    pub pipeline: String,
    /// Its slots.
    pub slots: [u32; 2],
    /// Its last owner.
    pub owner: String,
    /// Its last epoch.
    pub epoch: u64,
    /// The split or merge that retired it.
    pub by: String,
    /// The partitions that replaced it.
    pub into: Vec<String>,
    /// When (ms since the Unix epoch).
    pub at: i64,
    /// Its last moves, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moves: Vec<MoveRecord>,
}

/// The owner's release of a partition to a move's target, as the control log records it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRecord {
    /// The move.
    #[serde(rename = "move")]
    pub move_id: String,
    /// The pipeline.
    pub pipeline: String,
    /// The partition.
    pub partition: String,
    /// The owner that released it.
    pub owner: String,
    /// The epoch it released (the owner's).
    pub epoch: u64,
    /// Per input slot: the next offset to process, which the final commit stored.
    pub offsets: Vec<InputOffset>,
    /// Per store and slot: the changelog offset after the last record the owner's state holds
    /// (its own final writes included).
    pub changelogs: Vec<ChangelogEnd>,
    /// When (ms since the epoch).
    pub at: i64,
}

/// Where an input slot's processing ended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputOffset {
    /// Input topic.
    pub topic: String,
    /// Slot.
    pub slot: u32,
    /// Next offset to process.
    pub offset: u64,
}

/// Where a store's changelog slot ended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChangelogEnd {
    /// The store.
    pub store: String,
    /// Slot.
    pub slot: u32,
    /// The offset after the last record applied.
    pub end: u64,
}

/// Where a live move of a partition is.
#[derive(
    Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum MovePhase {
    /// The target restores the partition's state from its changelog and tails it, while the
    /// owner goes on processing.
    Warming,
    /// The owner stopped at a batch boundary and committed; the target catches up to the final
    /// offsets and takes over.
    Handoff,
    /// The target owns the partition and processes it.
    Done,
    /// Given up (see `reason`): the owner goes on.
    Abandoned,
}

impl MovePhase {
    /// Done or abandoned: nothing more happens to the move.
    pub fn ended(self) -> bool {
        matches!(self, MovePhase::Done | MovePhase::Abandoned)
    }
}

/// A live move of a partition from its owner to another host, as the control log records it:
/// one record per phase, under one id.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveRecord {
    /// The move's id.
    pub id: String,
    /// The pipeline.
    pub pipeline: String,
    /// The partition.
    pub partition: String,
    /// The owner when the move began.
    pub from: String,
    /// The host it moves to.
    pub to: String,
    /// The phase reached.
    pub phase: MovePhase,
    /// With `done`: milliseconds during which neither host processed the partition, from the
    /// old owner's final commit to the new owner's first guest call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_ms: Option<f64>,
    /// With `abandoned`: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// With `done`: where the pause went, step by step (ms each), from the final commit on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<MoveStep>,
    /// When the phase was reached (ms since the Unix epoch).
    pub at: i64,
    /// The target's take-over came in the control log while the move was under way: an
    /// abandonment after it reads as the move done. Set by the catalog, never appended.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub taken_over: bool,
    /// The owner's release, once it came in the control log while the move was under way.
    /// Set by the catalog, never appended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<Box<ReleaseRecord>>,
}

/// One step of a move's pause.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveStep {
    /// What ended: `answered` (the owner's drain answer, with its release, arrived), `stable`
    /// (the changelogs' last stable offsets reached the released ends: the owner's last
    /// transaction is complete), `caught-up` (the final changelog records applied), `checked`
    /// (the replica's positions and the group's offsets found equal to the released ones;
    /// earlier hosts recorded the three as one `checked`), `assigned` (the new
    /// owner recorded), `read-back` (that read back from the control log), `started` (its loop
    /// started), `session`, `instance`, `clients` (producer fenced the old one, consumer open),
    /// `restore`, `positions`, `first-call`.
    pub step: String,
    /// Milliseconds since the previous step ended.
    pub ms: f64,
}

/// Moves kept per partition in the catalog (the newest).
pub const MOVES_KEPT: usize = 10;

/// A partition's owner from an epoch on, as the controller decided it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AssignmentRecord {
    /// The pipeline.
    pub pipeline: String,
    /// The partition's id.
    pub partition: String,
    /// Its slots `[start, end)`.
    pub slots: [u32; 2],
    /// The host that runs it.
    pub owner: String,
    /// Bumped on each change of owner: a host acts only on the newest epoch it has read.
    pub epoch: u64,
    /// Hosts that keep a warm copy (standbys), in the order a failover promotes them. A change
    /// of standbys alone keeps the epoch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub standbys: Vec<String>,
    /// When (ms since the epoch).
    pub at: i64,
    /// The move whose target took the partition over with this assignment. It takes effect
    /// only if it comes before any abandonment of that move in the control log; an
    /// abandonment that comes after it is read as the move done.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "move")]
    pub move_id: Option<String>,
    /// With `move`: the take-over follows the owner's release (hosts that record releases
    /// set it), and counts only if that release came in the log while the move was under way.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub after_release: bool,
}

/// A request to process dead letters again through the pipeline's current version.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterReplay {
    /// The pipeline.
    pub pipeline: String,
    /// Per slot (partition of the dead-letter topic): the offsets `[from, to)` to replay.
    pub ranges: Vec<ReplayRange>,
    /// When (ms since the epoch).
    pub at: i64,
}

/// Dead letters of one slot to replay.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayRange {
    /// The slot, which is also the partition of the dead-letter topic.
    pub slot: u32,
    /// The first offset.
    pub from: u64,
    /// The end (exclusive).
    pub to: u64,
}

/// A change of a running pipeline's settings: the fields given replace the spec's.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineUpdate {
    /// The pipeline.
    pub pipeline: String,
    /// New guest limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<pipeline::GuestLimits>,
    /// New config for `init`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_json::Map<String, serde_json::Value>>,
    /// New swap policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap: Option<pipeline::SwapPolicy>,
    /// New WASI grants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wasi: Option<crate::runtime::host::WasiGrants>,
    /// New commit interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_interval_ms: Option<u64>,
    /// New checkpoint interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_interval_s: Option<u64>,
    /// New auto-balance settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance: Option<pipeline::BalancePolicy>,
    /// When (ms since the epoch).
    pub at: i64,
    /// Set when a partition refused the settings before and this puts the previous ones back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_reason: Option<String>,
}

impl PipelineUpdate {
    /// Applies the change to a spec.
    pub fn apply_to(&self, spec: &mut PipelineSpec) {
        if let Some(l) = &self.limits {
            spec.limits = l.clone();
        }
        if let Some(c) = &self.config {
            spec.config = c.clone();
        }
        if let Some(s) = &self.swap {
            spec.swap = s.clone();
        }
        if let Some(w) = &self.wasi {
            spec.wasi = w.clone();
        }
        if let Some(c) = self.commit_interval_ms {
            spec.commit_interval_ms = Some(c);
        }
        if let Some(c) = self.checkpoint_interval_s {
            spec.checkpoint_interval_s = Some(c);
        }
        if let Some(b) = &self.balance {
            spec.balance = b.clone();
        }
    }
}

/// The deletion of a pipeline.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineDeletion {
    /// The pipeline.
    pub pipeline: String,
    /// True when its changelogs, dead letters and consumer group are deleted too.
    pub purge: bool,
    /// When (ms since the epoch).
    pub at: i64,
}

/// The deletion of a module version.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModuleDeletion {
    /// Module name.
    pub name: String,
    /// Version.
    pub version: String,
    /// When (ms since the epoch).
    pub at: i64,
}

/// A pipeline's switch to another version of its module.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SwapRecord {
    /// The pipeline.
    pub pipeline: String,
    /// The version before.
    pub from: String,
    /// The version after.
    pub version: String,
    /// sha256 of the version after.
    pub sha256: String,
    /// When (ms since the epoch).
    pub at: i64,
    /// Set for an automatic rollback: why the version `from` was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Partition p-0 of pipeline `p` assigned to `owner` at `epoch`, by move `move_id`.
    fn assigned(owner: &str, epoch: u64, move_id: Option<&str>) -> ControlEvent {
        ControlEvent::Assigned(AssignmentRecord {
            pipeline: "p".into(),
            partition: "p-0".into(),
            slots: [0, 2],
            owner: owner.into(),
            epoch,
            standbys: Vec::new(),
            at: 0,
            move_id: move_id.map(str::to_string),
            after_release: false,
        })
    }

    /// Move m1 of p-0 from a to b at `phase`.
    fn move_phase(phase: MovePhase) -> ControlEvent {
        ControlEvent::Move(MoveRecord {
            id: "m1".into(),
            pipeline: "p".into(),
            partition: "p-0".into(),
            from: "a".into(),
            to: "b".into(),
            phase,
            pause_ms: None,
            reason: (phase == MovePhase::Abandoned).then(|| "gave up".into()),
            steps: Vec::new(),
            at: 0,
            taken_over: false,
            release: None,
        })
    }

    /// `owner`'s release of p-0 at `epoch` for move m1.
    fn released(owner: &str, epoch: u64) -> ControlEvent {
        ControlEvent::Released(ReleaseRecord {
            move_id: "m1".into(),
            pipeline: "p".into(),
            partition: "p-0".into(),
            owner: owner.into(),
            epoch,
            offsets: vec![InputOffset {
                topic: "in".into(),
                slot: 0,
                offset: 7,
            }],
            changelogs: Vec::new(),
            at: 0,
        })
    }

    /// b's take-over of p-0 at epoch 2 for move m1, after a release.
    fn taken_over_after_release() -> ControlEvent {
        match assigned("b", 2, Some("m1")) {
            ControlEvent::Assigned(a) => ControlEvent::Assigned(AssignmentRecord {
                after_release: true,
                ..a
            }),
            e => e,
        }
    }

    /// Pipeline `p`: one partition of two slots.
    fn one_partition_pipeline() -> PipelineRecord {
        serde_json::from_value(serde_json::json!({
            "spec": {"name": "p", "module": "m", "version": "1", "inputs": ["in"],
                     "slots": 2, "partitions": 1},
            "sha256": "", "start_offsets": {}, "created_at": 0
        }))
        .unwrap()
    }

    #[test]
    fn assignments_end_the_same_whatever_order_they_are_applied_in() {
        let pipeline = one_partition_pipeline();
        let a = |owner: &str, epoch: u64| assigned(owner, epoch, None);
        let orders = [
            vec![a("b", 1), a("a", 1), a("c", 2)],
            vec![a("a", 1), a("c", 2), a("b", 1)],
            vec![a("c", 2), a("b", 1), a("a", 1)],
        ];
        let mut ends = Vec::new();
        for order in orders {
            let mut c = Catalog::default();
            c.apply(ControlEvent::Pipeline(Box::new(pipeline.clone())));
            for e in order {
                c.apply(e);
            }
            ends.push(c.assignments["p-0"].clone());
        }
        assert!(
            ends.iter().all(|e| e.owner == "c" && e.epoch == 2),
            "{ends:?}"
        );
        let mut c = Catalog::default();
        c.apply(ControlEvent::Pipeline(Box::new(pipeline)));
        c.apply(a("b", 1));
        c.apply(a("a", 1));
        assert_eq!(c.assignments["p-0"].owner, "a", "one epoch: the smaller id");
    }

    /// What two hosts may append at once, each after checking only its own view, is settled by
    /// the order in the log: the first registration of a module version and the first creation
    /// of a pipeline name count; a rollback counts only while its refused version still runs;
    /// dead letters are replayed once even when two replays of one slot overlap.
    #[test]
    fn concurrent_admin_events_are_settled_by_their_order_in_the_log() {
        let module = |sha: &str| {
            ControlEvent::Module(ModuleRecord {
                name: "m".into(),
                version: "2".into(),
                sha256: sha.into(),
                size: 1,
                wit: String::new(),
                uploaded_at: 0,
            })
        };
        let mut c = Catalog::default();
        c.apply(module("aaa"));
        assert!(
            !c.applies(&module("bbb")),
            "other content under a taken version"
        );
        assert!(c.applies(&module("aaa")), "the same content again");
        c.apply(module("bbb"));
        assert_eq!(c.modules[&("m".into(), "2".into())].sha256, "aaa");

        let first = one_partition_pipeline();
        let mut second = one_partition_pipeline();
        second.spec.inputs = vec!["other".into()];
        second.incarnation = Some(2);
        c.apply(ControlEvent::Pipeline(Box::new(first.clone())));
        assert!(!c.applies(&ControlEvent::Pipeline(Box::new(second.clone()))));
        c.apply(ControlEvent::Pipeline(Box::new(second)));
        assert_eq!(c.pipelines["p"].spec.inputs, first.spec.inputs);

        let swap = |from: &str, to: &str, rollback: bool| {
            ControlEvent::Swap(SwapRecord {
                pipeline: "p".into(),
                from: from.into(),
                version: to.into(),
                sha256: format!("sha-{to}"),
                at: 0,
                rollback_reason: rollback.then(|| "init failed".into()),
            })
        };
        // Version 2 is refused and rolled back, but a swap to 3 came first in the log.
        c.apply(swap("1", "2", false));
        c.apply(swap("2", "3", false));
        let late_rollback = swap("2", "1", true);
        assert!(!c.applies(&late_rollback));
        c.apply(late_rollback);
        assert_eq!(c.pipelines["p"].spec.version, "3");
        // A rollback of what runs counts.
        c.apply(swap("3", "2", true));
        assert_eq!(c.pipelines["p"].spec.version, "2");

        let replay = |from: u64, to: u64| DeadLetterReplay {
            pipeline: "p".into(),
            ranges: vec![ReplayRange { slot: 0, from, to }],
            at: 0,
        };
        c.apply(ControlEvent::DeadLettersReplayed(replay(0, 10)));
        assert!(c.replay_ranges(&replay(5, 12)).is_empty(), "overlaps 0..10");
        c.apply(ControlEvent::DeadLettersReplayed(replay(5, 12)));
        c.apply(ControlEvent::DeadLettersReplayed(replay(10, 12)));
        assert_eq!(c.pipelines["p"].replays[&0], vec![(0, 10), (10, 12)]);
    }

    /// A control log as hosts of protocol 1 wrote it (no releases, take-overs without
    /// `after_release`, a move abandoned by its owner, two pipelines' assignments) replays into
    /// the catalog those hosts had: the single apply path reads old logs as they were meant.
    #[test]
    fn a_protocol_1_control_log_replays_as_its_hosts_read_it() {
        let lines = [
            r#"{"type":"pipeline","spec":{"name":"p","module":"m","version":"1","inputs":["in"],"slots":2,"partitions":1},"sha256":"","start_offsets":{},"created_at":0}"#,
            r#"{"type":"assigned","pipeline":"p","partition":"p-0","slots":[0,2],"owner":"a","epoch":1,"at":1}"#,
            r#"{"type":"move","id":"p-0.1.a","pipeline":"p","partition":"p-0","from":"a","to":"b","phase":"warming","at":2}"#,
            r#"{"type":"move","id":"p-0.1.a","pipeline":"p","partition":"p-0","from":"a","to":"b","phase":"handoff","at":3}"#,
            r#"{"type":"assigned","pipeline":"p","partition":"p-0","slots":[0,2],"owner":"b","epoch":2,"at":4,"move":"p-0.1.a"}"#,
            r#"{"type":"move","id":"p-0.1.a","pipeline":"p","partition":"p-0","from":"a","to":"b","phase":"done","pause_ms":12.5,"at":5}"#,
            r#"{"type":"move","id":"p-0.2.b","pipeline":"p","partition":"p-0","from":"b","to":"c","phase":"warming","at":6}"#,
            r#"{"type":"move","id":"p-0.2.b","pipeline":"p","partition":"p-0","from":"b","to":"c","phase":"abandoned","reason":"nobody took the drained partition over within 20s","at":7}"#,
        ];
        let mut c = Catalog::default();
        for l in lines {
            c.apply(parse_event(l.as_bytes()).expect(l));
        }
        let a = &c.assignments["p-0"];
        assert_eq!((a.owner.as_str(), a.epoch), ("b", 2));
        let moves: Vec<(&str, MovePhase)> = c.moves["p-0"]
            .iter()
            .map(|m| (m.id.as_str(), m.phase))
            .collect();
        assert_eq!(
            moves,
            [
                ("p-0.1.a", MovePhase::Done),
                ("p-0.2.b", MovePhase::Abandoned)
            ]
        );
        assert!(c.move_under_way("p-0").is_none());
    }

    #[test]
    fn a_move_begins_only_from_the_owner_and_while_no_other_is_under_way() {
        let mut c = Catalog::default();
        c.apply(ControlEvent::Pipeline(Box::new(one_partition_pipeline())));
        c.apply(assigned("a", 1, None));
        let warming = |id: &str, from: &str, to: &str| match move_phase(MovePhase::Warming) {
            ControlEvent::Move(m) => ControlEvent::Move(MoveRecord {
                id: id.into(),
                from: from.into(),
                to: to.into(),
                ..m
            }),
            _ => unreachable!(),
        };
        // From a host that does not own the partition: no move.
        c.apply(warming("m0", "b", "c"));
        assert!(c.move_under_way("p-0").is_none());
        c.apply(warming("m1", "a", "b"));
        // A second request that raced the first lands after it in the log: refused everywhere.
        c.apply(warming("m2", "a", "c"));
        assert_eq!(c.move_under_way("p-0").map(|m| m.id.as_str()), Some("m1"));
        assert_eq!(c.moves["p-0"].len(), 1);
        // Once the first ended, another may begin.
        c.apply(move_phase(MovePhase::Abandoned));
        c.apply(warming("m2", "a", "c"));
        assert_eq!(c.move_under_way("p-0").map(|m| m.id.as_str()), Some("m2"));
    }

    #[test]
    fn a_take_over_and_an_abandonment_of_one_move_are_decided_by_their_order() {
        let pipeline = one_partition_pipeline();
        let phase = move_phase;
        let run = |events: Vec<ControlEvent>| {
            let mut c = Catalog::default();
            c.apply(ControlEvent::Pipeline(Box::new(pipeline.clone())));
            c.apply(assigned("a", 1, None));
            c.apply(phase(MovePhase::Warming));
            c.apply(phase(MovePhase::Handoff));
            for e in events {
                c.apply(e);
            }
            let a = c.assignments["p-0"].clone();
            let m = c.moves["p-0"][0].clone();
            (a.owner, a.epoch, m.phase)
        };
        // The take-over first: the abandonment after it reads as the move done.
        assert_eq!(
            run(vec![
                assigned("b", 2, Some("m1")),
                phase(MovePhase::Abandoned)
            ]),
            ("b".into(), 2, MovePhase::Done)
        );
        // The abandonment first: the owner goes on, and the late take-over does not count.
        assert_eq!(
            run(vec![
                phase(MovePhase::Abandoned),
                assigned("b", 2, Some("m1"))
            ]),
            ("a".into(), 1, MovePhase::Abandoned)
        );
        // A standby rewrite of the take-over's assignment (same owner and epoch, no move
        // named) does not make a later abandonment count.
        assert_eq!(
            run(vec![
                assigned("b", 2, Some("m1")),
                assigned("b", 2, None),
                phase(MovePhase::Abandoned)
            ]),
            ("b".into(), 2, MovePhase::Done)
        );
        // An assignment that names no move (the controller's failover) is not held back.
        assert_eq!(
            run(vec![phase(MovePhase::Abandoned), assigned("b", 2, None)]),
            ("b".into(), 2, MovePhase::Abandoned)
        );
    }

    #[test]
    fn a_take_over_after_a_release_counts_only_after_the_owners_release_in_time() {
        let pipeline = one_partition_pipeline();
        let run = |events: Vec<ControlEvent>| {
            let mut c = Catalog::default();
            c.apply(ControlEvent::Pipeline(Box::new(pipeline.clone())));
            c.apply(assigned("a", 1, None));
            c.apply(move_phase(MovePhase::Warming));
            c.apply(move_phase(MovePhase::Handoff));
            for e in events {
                c.apply(e);
            }
            let a = c.assignments["p-0"].clone();
            let m = c.moves["p-0"][0].clone();
            (a.owner, a.epoch, m.phase, m.release.is_some())
        };
        // Released, then taken over: done, the release kept through later phases.
        assert_eq!(
            run(vec![
                released("a", 1),
                taken_over_after_release(),
                move_phase(MovePhase::Done)
            ]),
            ("b".into(), 2, MovePhase::Done, true)
        );
        // A take-over that follows a release which is not in the log does not count.
        assert_eq!(
            run(vec![taken_over_after_release()]),
            ("a".into(), 1, MovePhase::Handoff, false)
        );
        // A release after the abandonment does not count, nor the take-over after it.
        assert_eq!(
            run(vec![
                move_phase(MovePhase::Abandoned),
                released("a", 1),
                taken_over_after_release()
            ]),
            ("a".into(), 1, MovePhase::Abandoned, false)
        );
        // Only the owner, at its epoch, releases.
        assert_eq!(
            run(vec![released("b", 1), released("a", 0)]),
            ("a".into(), 1, MovePhase::Handoff, false)
        );
        // Released, then abandoned before any take-over: the owner keeps the partition.
        assert_eq!(
            run(vec![
                released("a", 1),
                move_phase(MovePhase::Abandoned),
                taken_over_after_release()
            ]),
            ("a".into(), 1, MovePhase::Abandoned, true)
        );
        // A release record round-trips through the log's JSON.
        let bytes = serde_json::to_vec(&released("a", 1)).unwrap();
        assert!(String::from_utf8_lossy(&bytes).contains(r#""type":"released""#));
        assert!(matches!(
            parse_event(&bytes).unwrap(),
            ControlEvent::Released(r) if r.offsets[0].offset == 7
        ));
    }

    /// Split `id` of p-0 (slots 0..2, at slot 1) by `owner` at `epoch`, at `phase`.
    fn split(
        id: &str,
        partition: &str,
        owner: &str,
        epoch: u64,
        phase: SplitPhase,
    ) -> ControlEvent {
        ControlEvent::Split(Box::new(SplitRecord {
            id: id.into(),
            pipeline: "p".into(),
            partition: partition.into(),
            slots: [0, 2],
            slot: 1,
            owner: owner.into(),
            epoch,
            phase,
            halves: Vec::new(),
            pause_ms: None,
            steps: Vec::new(),
            reclaimed_bytes: None,
            reason: None,
            cause: None,
            at: 0,
        }))
    }

    #[test]
    fn a_split_counts_at_its_place_in_the_log_and_retires_its_partition() {
        let run = |events: Vec<ControlEvent>| {
            let mut c = Catalog::default();
            c.apply(ControlEvent::Pipeline(Box::new(one_partition_pipeline())));
            c.apply(assigned("a", 1, None));
            for e in events {
                c.apply(e);
            }
            c
        };
        // From a host that does not own the partition, or at an old epoch: never begun.
        let c = run(vec![
            split("s0", "p-0", "b", 1, SplitPhase::Begun),
            split("s1", "p-0", "a", 0, SplitPhase::Begun),
        ]);
        assert!(c.split_under_way("p-0").is_none());
        // Begun: the halves get the next ids; a second split and a move are refused meanwhile.
        let c = run(vec![
            split("s1", "p-0", "a", 1, SplitPhase::Begun),
            split("s2", "p-0", "a", 1, SplitPhase::Begun),
            move_phase(MovePhase::Warming),
        ]);
        let s = c.split_under_way("p-0").expect("under way");
        assert_eq!(
            (s.id.as_str(), s.halves.clone()),
            ("s1", vec!["p-1".to_string(), "p-2".into()])
        );
        assert!(c.move_under_way("p-0").is_none(), "no move while splitting");
        // A failover before the done record: the split does not count, the partition goes on.
        let c = run(vec![
            split("s1", "p-0", "a", 1, SplitPhase::Begun),
            assigned("b", 2, None),
            split("s1", "p-0", "a", 1, SplitPhase::Done),
        ]);
        assert_eq!(c.assignments["p-0"].owner, "b");
        assert_eq!(c.pipelines["p"].shapes().len(), 1);
        assert!(
            c.split("p", "s1")
                .is_some_and(|s| s.phase == SplitPhase::Begun)
        );
        // Given up first: the done record after it does not count.
        let c = run(vec![
            split("s1", "p-0", "a", 1, SplitPhase::Begun),
            split("s1", "p-0", "a", 1, SplitPhase::Abandoned),
            split("s1", "p-0", "a", 1, SplitPhase::Done),
        ]);
        assert_eq!(
            c.split("p", "s1").map(|s| s.phase),
            Some(SplitPhase::Abandoned)
        );
        assert!(c.assignments.contains_key("p-0"));
        // Done: the halves replace the partition, on its owner at epoch 1; the partition is
        // retired with its moves, and a late assignment of it does not bring it back.
        let c = run(vec![
            move_phase(MovePhase::Warming),
            move_phase(MovePhase::Abandoned),
            split("s1", "p-0", "a", 1, SplitPhase::Begun),
            split("s1", "p-0", "a", 1, SplitPhase::Done),
            split("s1", "p-0", "a", 1, SplitPhase::Abandoned),
            assigned("b", 2, None),
        ]);
        let shapes: Vec<(String, [u32; 2])> = c.pipelines["p"]
            .shapes()
            .into_iter()
            .map(|s| (s.id, s.slots))
            .collect();
        assert_eq!(shapes, vec![("p-1".into(), [0, 1]), ("p-2".into(), [1, 2])]);
        assert!(!c.assignments.contains_key("p-0"));
        for h in ["p-1", "p-2"] {
            let a = &c.assignments[h];
            assert_eq!((a.owner.as_str(), a.epoch), ("a", 1), "{h}");
        }
        let layout = c.pipelines["p"].layout.as_ref().unwrap();
        assert_eq!(layout.retired.len(), 1);
        assert_eq!(
            layout.retired[0].into,
            vec!["p-1".to_string(), "p-2".into()]
        );
        assert_eq!(
            layout.retired[0].moves.len(),
            1,
            "its history stays readable"
        );
        assert_eq!(c.split("p", "s1").map(|s| s.phase), Some(SplitPhase::Done));
        // Ids are never used twice, and survive a snapshot.
        let mut c = Catalog::from_snapshot(
            serde_json::from_value(serde_json::to_value(c.snapshot(9)).unwrap()).unwrap(),
        );
        let ControlEvent::Split(mut one_slot) = split("s2", "p-2", "a", 1, SplitPhase::Begun)
        else {
            unreachable!()
        };
        one_slot.slots = [1, 2];
        c.apply(ControlEvent::Split(one_slot));
        assert!(
            c.split_under_way("p-2").is_none(),
            "a partition of one slot does not split"
        );
        c.apply(assigned_to("p-2", [0, 2]));
        assert_eq!(
            c.assignments["p-2"].slots,
            [1, 2],
            "an assignment of another shape does not count"
        );
        let ControlEvent::Split(mut next) = split("s3", "p-1", "a", 1, SplitPhase::Begun) else {
            unreachable!()
        };
        next.slots = [0, 1];
        next.slot = 1;
        c.apply(ControlEvent::Split(next));
        assert!(
            c.split_under_way("p-1").is_none(),
            "the split slot must be inside"
        );
        assert_eq!(
            c.pipelines["p"].layout.as_ref().unwrap().next,
            3,
            "ids never used twice"
        );
    }

    /// Merge `id` of p-1 and p-2 (slots 0..1 and 1..2) by `owner` at epochs 1, at `phase`.
    fn merge(id: &str, owner: &str, phase: SplitPhase) -> ControlEvent {
        ControlEvent::Merge(Box::new(MergeRecord {
            id: id.into(),
            pipeline: "p".into(),
            left: "p-1".into(),
            right: "p-2".into(),
            slots: [0, 2],
            slot: 1,
            owner: owner.into(),
            epochs: [1, 1],
            phase,
            merged: None,
            pause_ms: None,
            steps: Vec::new(),
            reason: None,
            cause: None,
            at: 0,
        }))
    }

    #[test]
    fn a_merge_counts_at_its_place_in_the_log_and_retires_both_sides() {
        let run = |events: Vec<ControlEvent>| {
            let mut c = Catalog::default();
            c.apply(ControlEvent::Pipeline(Box::new(one_partition_pipeline())));
            c.apply(assigned("a", 1, None));
            c.apply(split("s1", "p-0", "a", 1, SplitPhase::Begun));
            c.apply(split("s1", "p-0", "a", 1, SplitPhase::Done));
            for e in events {
                c.apply(e);
            }
            c
        };
        // From a host that owns neither: never begun.
        let c = run(vec![merge("m0", "b", SplitPhase::Begun)]);
        assert!(c.merge_under_way("p-1").is_none());
        // Begun: the next id; a split of a side is refused meanwhile.
        let ControlEvent::Split(mut s2) = split("s2", "p-1", "a", 1, SplitPhase::Begun) else {
            unreachable!()
        };
        s2.slots = [0, 1];
        let c = run(vec![
            merge("m1", "a", SplitPhase::Begun),
            ControlEvent::Split(s2),
        ]);
        assert_eq!(
            c.merge_under_way("p-2").and_then(|m| m.merged.clone()),
            Some("p-3".to_string())
        );
        assert!(c.split_under_way("p-1").is_none());
        // A side failed over before the done record: it does not count.
        let c = run(vec![
            merge("m1", "a", SplitPhase::Begun),
            assigned_to("p-2", [1, 2]),
            merge("m1", "a", SplitPhase::Done),
        ]);
        assert!(c.assignments.contains_key("p-1") && c.assignments.contains_key("p-2"));
        assert!(!c.assignments.contains_key("p-3"));
        // Done: both retired, the merged partition on the owner at epoch 1.
        let c = run(vec![
            merge("m1", "a", SplitPhase::Begun),
            merge("m1", "a", SplitPhase::Done),
            merge("m1", "a", SplitPhase::Abandoned),
        ]);
        let shapes: Vec<(String, [u32; 2])> = c.pipelines["p"]
            .shapes()
            .into_iter()
            .map(|s| (s.id, s.slots))
            .collect();
        assert_eq!(shapes, vec![("p-3".into(), [0, 2])]);
        let a = &c.assignments["p-3"];
        assert_eq!((a.owner.as_str(), a.epoch), ("a", 1));
        let retired: Vec<&str> = c.pipelines["p"]
            .layout
            .as_ref()
            .unwrap()
            .retired
            .iter()
            .map(|r| r.id.as_str())
            .collect();
        assert_eq!(retired, ["p-0", "p-1", "p-2"]);
        assert_eq!(c.merge("p", "m1").map(|m| m.phase), Some(SplitPhase::Done));
    }

    /// An assignment of `partition` with `slots` to host c at epoch 5.
    fn assigned_to(partition: &str, slots: [u32; 2]) -> ControlEvent {
        ControlEvent::Assigned(AssignmentRecord {
            pipeline: "p".into(),
            partition: partition.into(),
            slots,
            owner: "c".into(),
            epoch: 5,
            standbys: Vec::new(),
            at: 0,
            move_id: None,
            after_release: false,
        })
    }

    #[test]
    fn events_of_a_newer_host_replay_without_their_new_fields() {
        let e = parse_event(
            br#"{"type":"module","name":"m","version":"1","sha256":"ab","size":1,
                 "wit":"baton:processor@0.1.0","uploaded_at":0,"signed_by":"ops"}"#,
        )
        .unwrap();
        assert!(matches!(e, ControlEvent::Module(m) if m.name == "m"));
        let e = parse_event(
            br#"{"type":"pipeline","sha256":"ab","start_offsets":{},"created_at":0,"zone":"eu",
                 "spec":{"name":"p","module":"m","version":"1","inputs":["a"],"colour":"red",
                         "limits":{"cpu_ms":100,"gpu_ms":5}}}"#,
        )
        .unwrap();
        let ControlEvent::Pipeline(p) = e else {
            panic!("a pipeline")
        };
        assert_eq!(p.spec.limits.cpu_ms, 100);
        let err = parse_event(br#"{"type":"teleport","partition":"p-0"}"#).unwrap_err();
        assert!(err.contains("event kind `teleport`"), "{err}");
        assert!(parse_event(br#"{"type":"module","name":1}"#).is_err());
    }
}

/// The replayed state of the control log.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Catalog {
    /// Modules by (name, version).
    pub modules: BTreeMap<(String, String), ModuleRecord>,
    /// Pipelines by name.
    pub pipelines: BTreeMap<String, PipelineRecord>,
    /// Pipelines deleted without purge: their state still exists, so their names stay taken.
    pub deleted: BTreeMap<String, PipelineRecord>,
    /// The newest assignment of every partition of the pipelines, by partition id.
    pub assignments: BTreeMap<String, AssignmentRecord>,
    /// The last moves of every partition, oldest first, by partition id.
    pub moves: BTreeMap<String, Vec<MoveRecord>>,
}

impl Catalog {
    /// Pipeline `name`'s record, or the API's 404 naming it.
    pub fn pipeline(&self, name: &str) -> crate::error::Result<PipelineRecord> {
        self.pipelines.get(name).cloned().ok_or_else(|| {
            crate::error::Error::NotFound(format!("pipeline `{name}` does not exist"))
        })
    }

    /// The split of `partition` under way (begun, not done nor abandoned), if any.
    pub fn split_under_way(&self, partition: &str) -> Option<&SplitRecord> {
        self.pipelines
            .values()
            .filter_map(|p| p.layout.as_ref())
            .flat_map(|l| l.splits.iter())
            .find(|s| s.partition == partition && !s.phase.ended())
    }

    /// The merge under way that `partition` is a side of, if any.
    pub fn merge_under_way(&self, partition: &str) -> Option<&MergeRecord> {
        self.pipelines
            .values()
            .filter_map(|p| p.layout.as_ref())
            .flat_map(|l| l.merges.iter())
            .find(|m| (m.left == partition || m.right == partition) && !m.phase.ended())
    }

    /// Whether a split or merge of `partition` is under way.
    pub fn reshaping(&self, partition: &str) -> bool {
        self.split_under_way(partition).is_some() || self.merge_under_way(partition).is_some()
    }

    /// The merge `id` of `pipeline`, as the log made it.
    pub fn merge(&self, pipeline: &str, id: &str) -> Option<&MergeRecord> {
        self.pipelines
            .get(pipeline)?
            .layout
            .as_ref()?
            .merges
            .iter()
            .find(|m| m.id == id)
    }

    /// Applies a merge's record at its place in the log: see [`MergeRecord`].
    fn apply_merge(&mut self, mut m: MergeRecord) {
        let Some(p) = self.pipelines.get(&m.pipeline) else {
            return;
        };
        let shapes = [p.shape(&m.left), p.shape(&m.right)];
        let owned = [&m.left, &m.right].iter().zip(m.epochs).all(|(id, epoch)| {
            self.assignments
                .get(id.as_str())
                .is_none_or(|a| a.owner == m.owner && a.epoch == epoch)
        });
        let busy = [&m.left, &m.right]
            .iter()
            .any(|id| self.move_under_way(id).is_some() || self.reshaping(id));
        let known = self.merge(&m.pipeline, &m.id).cloned();
        let p = self
            .pipelines
            .get_mut(&m.pipeline)
            .expect("looked up above");
        let fits = matches!(shapes, [Some(l), Some(r)]
            if l[1] == r[0] && l[1] == m.slot && [l[0], r[1]] == m.slots);
        match m.phase {
            SplitPhase::Begun => {
                if known.is_some() || !fits || !owned || busy {
                    return;
                }
                let current = p.shapes();
                let layout = p.layout.get_or_insert_with(|| {
                    Box::new(Layout {
                        partitions: current,
                        next: p.spec.partitions,
                        splits: Vec::new(),
                        retired: Vec::new(),
                        merges: Vec::new(),
                    })
                });
                m.merged = Some(format!("{}-{}", m.pipeline, layout.next));
                layout.next += 1;
                layout.merges.push(m);
                if layout.merges.len() > SPLITS_KEPT {
                    layout.merges.remove(0);
                }
            }
            SplitPhase::Done => {
                let Some(layout) = p.layout.as_mut() else {
                    return;
                };
                let Some(old) = layout.merges.iter_mut().find(|o| o.id == m.id) else {
                    return;
                };
                match old.phase {
                    SplitPhase::Done => {
                        if m.pause_ms.is_some() {
                            old.pause_ms = m.pause_ms;
                            old.steps = m.steps;
                        }
                        return;
                    }
                    SplitPhase::Abandoned => return,
                    SplitPhase::Begun if !owned || !fits => return,
                    SplitPhase::Begun => {}
                }
                old.phase = SplitPhase::Done;
                old.at = m.at;
                let old = old.clone();
                let merged = old.merged.clone().unwrap_or_default();
                let at = layout
                    .partitions
                    .iter()
                    .position(|sh| sh.id == old.left)
                    .expect("a current partition");
                layout.partitions.splice(
                    at..at + 2,
                    [Shape {
                        id: merged.clone(),
                        slots: old.slots,
                    }],
                );
                for (id, epoch, slots) in [
                    (&old.left, old.epochs[0], [old.slots[0], old.slot]),
                    (&old.right, old.epochs[1], [old.slot, old.slots[1]]),
                ] {
                    layout.retired.push(RetiredPartition {
                        id: id.clone(),
                        pipeline: old.pipeline.clone(),
                        slots,
                        owner: old.owner.clone(),
                        epoch,
                        by: old.id.clone(),
                        into: vec![merged.clone()],
                        at: old.at,
                        moves: self.moves.remove(id).unwrap_or_default(),
                    });
                }
                while layout.retired.len() > RETIRED_KEPT {
                    layout.retired.remove(0);
                }
                let left = self.assignments.remove(&old.left);
                let right = self.assignments.remove(&old.right);
                if let Some(a) = left.or(right) {
                    self.assignments.insert(
                        merged.clone(),
                        AssignmentRecord {
                            partition: merged,
                            slots: old.slots,
                            epoch: 1,
                            standbys: Vec::new(),
                            at: old.at,
                            move_id: None,
                            after_release: false,
                            ..a
                        },
                    );
                }
            }
            SplitPhase::Abandoned => {
                if let Some(old) = p
                    .layout
                    .as_mut()
                    .and_then(|l| l.merges.iter_mut().find(|o| o.id == m.id))
                    && old.phase == SplitPhase::Begun
                {
                    old.phase = SplitPhase::Abandoned;
                    old.reason = m.reason;
                    old.at = m.at;
                }
            }
        }
    }

    /// The split `id` of `pipeline`, as the log made it.
    pub fn split(&self, pipeline: &str, id: &str) -> Option<&SplitRecord> {
        self.pipelines
            .get(pipeline)?
            .layout
            .as_ref()?
            .splits
            .iter()
            .find(|s| s.id == id)
    }

    /// Applies a split's record at its place in the log: see [`SplitRecord`].
    fn apply_split(&mut self, mut s: SplitRecord) {
        let Some(p) = self.pipelines.get(&s.pipeline) else {
            return;
        };
        let shape = p.shape(&s.partition);
        let assignment = self.assignments.get(&s.partition).cloned();
        let owned = assignment
            .as_ref()
            .is_none_or(|a| a.owner == s.owner && a.epoch == s.epoch);
        let moving = self.move_under_way(&s.partition).is_some();
        let splitting = self.reshaping(&s.partition).then(|| s.partition.clone());
        let known = self.split(&s.pipeline, &s.id).cloned();
        let p = self
            .pipelines
            .get_mut(&s.pipeline)
            .expect("looked up above");
        match s.phase {
            SplitPhase::Begun => {
                let fits =
                    shape.is_some_and(|sh| sh == s.slots && sh[0] < s.slot && s.slot < sh[1]);
                if known.is_some() || !fits || !owned || moving || splitting.is_some() {
                    return;
                }
                let shapes = p.shapes();
                let layout = p.layout.get_or_insert_with(|| {
                    Box::new(Layout {
                        partitions: shapes,
                        next: p.spec.partitions,
                        splits: Vec::new(),
                        retired: Vec::new(),
                        merges: Vec::new(),
                    })
                });
                s.halves = (0..2)
                    .map(|i| format!("{}-{}", s.pipeline, layout.next + i))
                    .collect();
                layout.next += 2;
                layout.splits.push(s);
                if layout.splits.len() > SPLITS_KEPT {
                    layout.splits.remove(0);
                }
            }
            SplitPhase::Done => {
                let Some(layout) = p.layout.as_mut() else {
                    return;
                };
                let Some(old) = layout.splits.iter_mut().find(|o| o.id == s.id) else {
                    return;
                };
                match old.phase {
                    // A later record of a done split adds what was measured after it.
                    SplitPhase::Done => {
                        if s.pause_ms.is_some() {
                            old.pause_ms = s.pause_ms;
                            old.steps = s.steps;
                        }
                        if s.reclaimed_bytes.is_some() {
                            old.reclaimed_bytes = s.reclaimed_bytes;
                        }
                        return;
                    }
                    SplitPhase::Abandoned => return,
                    SplitPhase::Begun if !owned || shape.is_none() => return,
                    SplitPhase::Begun => {}
                }
                old.phase = SplitPhase::Done;
                old.at = s.at;
                old.pause_ms = s.pause_ms;
                old.steps = s.steps;
                let old = old.clone();
                let [start, end] = old.slots;
                let halves = [
                    Shape {
                        id: old.halves[0].clone(),
                        slots: [start, old.slot],
                    },
                    Shape {
                        id: old.halves[1].clone(),
                        slots: [old.slot, end],
                    },
                ];
                let at = layout
                    .partitions
                    .iter()
                    .position(|sh| sh.id == old.partition)
                    .expect("a current partition");
                layout.partitions.splice(at..=at, halves.clone());
                layout.retired.push(RetiredPartition {
                    id: old.partition.clone(),
                    pipeline: old.pipeline.clone(),
                    slots: old.slots,
                    owner: old.owner.clone(),
                    epoch: old.epoch,
                    by: old.id.clone(),
                    into: old.halves.clone(),
                    at: old.at,
                    moves: self.moves.remove(&old.partition).unwrap_or_default(),
                });
                if layout.retired.len() > RETIRED_KEPT {
                    layout.retired.remove(0);
                }
                if let Some(a) = self.assignments.remove(&old.partition) {
                    for h in halves {
                        self.assignments.insert(
                            h.id.clone(),
                            AssignmentRecord {
                                partition: h.id,
                                slots: h.slots,
                                epoch: 1,
                                standbys: Vec::new(),
                                at: old.at,
                                move_id: None,
                                after_release: false,
                                ..a.clone()
                            },
                        );
                    }
                }
            }
            SplitPhase::Abandoned => {
                if let Some(old) = p
                    .layout
                    .as_mut()
                    .and_then(|l| l.splits.iter_mut().find(|o| o.id == s.id))
                    && old.phase == SplitPhase::Begun
                {
                    old.phase = SplitPhase::Abandoned;
                    old.reason = s.reason;
                    old.at = s.at;
                }
            }
        }
    }

    /// The move of `partition` under way (not done nor abandoned), if any.
    pub fn move_under_way(&self, partition: &str) -> Option<&MoveRecord> {
        self.moves
            .get(partition)
            .and_then(|m| m.iter().rev().find(|m| !m.phase.ended()))
    }
}

/// The catalog as the control log's records before `offset` make it, applied in log order:
/// replay starts from the newest snapshot instead of the log's first record.
#[derive(Debug, Serialize, Deserialize)]
pub struct Snapshot {
    /// The layout of this record (1).
    pub format: u32,
    /// The control-log offset the snapshot reaches: replay goes on from here.
    pub offset: u64,
    /// When it was taken, ms since the Unix epoch.
    pub at: i64,
    /// The module registry.
    pub modules: Vec<ModuleRecord>,
    /// The pipelines.
    pub pipelines: Vec<PipelineRecord>,
    /// Pipelines deleted without purge.
    pub deleted: Vec<PipelineRecord>,
    /// The newest assignment of every partition.
    pub assignments: Vec<AssignmentRecord>,
    /// The last moves of every partition, oldest first.
    pub moves: Vec<MoveRecord>,
}

impl Catalog {
    /// The catalog as a snapshot reaching control-log offset `offset`.
    pub fn snapshot(&self, offset: u64) -> Snapshot {
        Snapshot {
            format: 1,
            offset,
            at: now_ms(),
            modules: self.modules.values().cloned().collect(),
            pipelines: self.pipelines.values().cloned().collect(),
            deleted: self.deleted.values().cloned().collect(),
            assignments: self.assignments.values().cloned().collect(),
            moves: self.moves.values().flatten().cloned().collect(),
        }
    }

    /// The catalog a snapshot holds.
    pub fn from_snapshot(s: Snapshot) -> Catalog {
        let mut c = Catalog::default();
        for m in s.modules {
            c.modules.insert((m.name.clone(), m.version.clone()), m);
        }
        for p in s.pipelines {
            c.pipelines.insert(p.spec.name.clone(), p);
        }
        for p in s.deleted {
            c.deleted.insert(p.spec.name.clone(), p);
        }
        for a in s.assignments {
            c.assignments.insert(a.partition.clone(), a);
        }
        for m in s.moves {
            c.moves.entry(m.partition.clone()).or_default().push(m);
        }
        c
    }
}

impl Catalog {
    /// Whether `e` takes effect at this point of the log. The events two hosts may append at
    /// once, each after checking its own view, are settled here by their order, the same way on
    /// every host: the first registration of a module version and the first creation of a
    /// pipeline name count, a later one of other content does not; an automatic rollback counts
    /// only while the pipeline still runs the version it refused (a swap that came before it in
    /// the log is not undone). Assignments, moves and releases are settled in [`Catalog::apply`].
    pub fn applies(&self, e: &ControlEvent) -> bool {
        match e {
            ControlEvent::Module(m) => self
                .modules
                .get(&(m.name.clone(), m.version.clone()))
                .is_none_or(|old| old.sha256 == m.sha256),
            ControlEvent::Pipeline(p) => !self.pipelines.contains_key(&p.spec.name),
            ControlEvent::Swap(s) if s.rollback_reason.is_some() => self
                .pipelines
                .get(&s.pipeline)
                .is_some_and(|p| p.spec.version == s.from),
            _ => true,
        }
    }

    /// The ranges of a dead-letter replay that count at this point of the log: each must start
    /// at or after the end of the slot's last replay, so that no dead letter is replayed twice
    /// even when two hosts recorded overlapping replays at once.
    pub fn replay_ranges(&self, r: &DeadLetterReplay) -> Vec<ReplayRange> {
        let Some(p) = self.pipelines.get(&r.pipeline) else {
            return Vec::new();
        };
        let mut done: BTreeMap<u32, u64> = p
            .replays
            .iter()
            .map(|(slot, rs)| (*slot, rs.last().map_or(0, |(_, to)| *to)))
            .collect();
        let mut out = Vec::new();
        for range in &r.ranges {
            let end = done.entry(range.slot).or_insert(0);
            if range.from >= *end && range.from < range.to {
                *end = range.to;
                out.push(range.clone());
            }
        }
        out
    }

    /// Applies one event.
    pub fn apply(&mut self, e: ControlEvent) {
        if !self.applies(&e) {
            return;
        }
        match e {
            ControlEvent::Module(m) => {
                self.modules.insert((m.name.clone(), m.version.clone()), m);
            }
            ControlEvent::Pipeline(p) => {
                self.pipelines.insert(p.spec.name.clone(), *p);
            }
            ControlEvent::Assigned(a) => {
                // The newer epoch wins; at one epoch (the creator of a pipeline and the
                // controller may both write epoch 1), the smaller host id, so that every host
                // keeps the same one whatever order it applied them in.
                // A new list of standbys for the same owner at the same epoch replaces the old.
                let newer = self.assignments.get(&a.partition).is_none_or(|old| {
                    (a.epoch, std::cmp::Reverse(&a.owner))
                        > (old.epoch, std::cmp::Reverse(&old.owner))
                        || (a.epoch == old.epoch
                            && a.owner == old.owner
                            && (a.at, &a.standbys) >= (old.at, &old.standbys))
                });
                // A take-over counts only while its move is under way: the owner resumes
                // once it reads the move abandoned, and must stay the only writer.
                let taken_over_in_time = a.move_id.as_ref().is_none_or(|id| {
                    self.move_under_way(&a.partition)
                        .is_some_and(|m| m.id == *id && (!a.after_release || m.release.is_some()))
                });
                // Only a partition the pipeline has now: a split retires one for good.
                let current = self
                    .pipelines
                    .get(&a.pipeline)
                    .is_some_and(|p| p.shape(&a.partition) == Some(a.slots));
                if newer && taken_over_in_time && current {
                    if let Some(id) = &a.move_id
                        && let Some(m) = self
                            .moves
                            .get_mut(&a.partition)
                            .and_then(|ms| ms.iter_mut().find(|m| m.id == *id))
                    {
                        m.taken_over = true;
                    }
                    self.assignments.insert(a.partition.clone(), a);
                }
            }
            ControlEvent::Move(mut m) => {
                if !self.pipelines.contains_key(&m.pipeline) {
                    return;
                }
                // A move begins only from the partition's owner, and only while no other move
                // of it is under way, at its place in the log: two requests that raced on two
                // hosts start one move everywhere.
                let refused = m.phase == MovePhase::Warming
                    && (self
                        .assignments
                        .get(&m.partition)
                        .is_none_or(|a| a.owner != m.from)
                        || self.reshaping(&m.partition));
                let moves = self.moves.entry(m.partition.clone()).or_default();
                let refused = refused
                    || (m.phase == MovePhase::Warming
                        && moves.iter().any(|old| !old.phase.ended() && old.id != m.id));
                let known = moves.iter().find(|old| old.id == m.id);
                m.taken_over = known.is_some_and(|old| old.taken_over);
                m.release = known.and_then(|old| old.release.clone());
                // Abandoned after its target's take-over came in the log: done.
                if m.phase == MovePhase::Abandoned && m.taken_over {
                    m.phase = MovePhase::Done;
                    m.reason = None;
                }
                match moves.iter_mut().find(|old| old.id == m.id) {
                    // A phase never goes back, and an ended move stays ended.
                    Some(old) if !old.phase.ended() && m.phase > old.phase => *old = m,
                    Some(_) => {}
                    None if refused => {}
                    None => {
                        moves.push(m);
                        if moves.len() > MOVES_KEPT {
                            moves.remove(0);
                        }
                    }
                }
            }
            ControlEvent::Released(r) => {
                // Counts only while the move is under way and the releasing host owns the
                // partition at the epoch it names.
                let owns = self
                    .assignments
                    .get(&r.partition)
                    .is_some_and(|a| a.owner == r.owner && a.epoch == r.epoch);
                let under_way = self
                    .move_under_way(&r.partition)
                    .is_some_and(|m| m.id == r.move_id && m.from == r.owner);
                if owns
                    && under_way
                    && let Some(m) = self
                        .moves
                        .get_mut(&r.partition)
                        .and_then(|ms| ms.iter_mut().find(|m| m.id == r.move_id))
                    && m.release.is_none()
                {
                    m.release = Some(Box::new(r));
                }
            }
            ControlEvent::Split(split) => self.apply_split(*split),
            ControlEvent::Merge(merge) => self.apply_merge(*merge),
            ControlEvent::PipelineDeleted(d) => {
                self.assignments.retain(|_, a| a.pipeline != d.pipeline);
                self.moves
                    .retain(|_, m| m.iter().all(|m| m.pipeline != d.pipeline));
                let record = self
                    .pipelines
                    .remove(&d.pipeline)
                    .or_else(|| self.deleted.remove(&d.pipeline));
                if let (false, Some(r)) = (d.purge, record) {
                    self.deleted.insert(d.pipeline, r);
                }
            }
            ControlEvent::DeadLettersReplayed(r) => {
                let ranges = self.replay_ranges(&r);
                if let Some(p) = self.pipelines.get_mut(&r.pipeline) {
                    for range in ranges {
                        p.replays
                            .entry(range.slot)
                            .or_default()
                            .push((range.from, range.to));
                    }
                }
            }
            ControlEvent::PipelineUpdated(u) => {
                if let Some(p) = self.pipelines.get_mut(&u.pipeline) {
                    u.apply_to(&mut p.spec);
                }
            }
            ControlEvent::ModuleDeleted(d) => {
                self.modules.remove(&(d.name, d.version));
            }
            ControlEvent::Swap(s) => {
                if let Some(p) = self.pipelines.get_mut(&s.pipeline) {
                    p.spec.version = s.version.clone();
                    p.sha256 = s.sha256.clone();
                    p.swaps.push(s);
                    let n = p.swaps.len();
                    if n > 20 {
                        p.swaps.drain(..n - 20);
                    }
                }
            }
        }
    }
}

/// Parses one control-log record. Fields this host does not know (written by a newer host) are
/// dropped with a warning, at any depth, so that an older host can replay a newer log; an event
/// kind it does not know stops it, naming the kind.
pub fn parse_event(bytes: &[u8]) -> Result<ControlEvent, String> {
    let mut value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    for _ in 0..64 {
        let err = match serde_path_to_error::deserialize::<_, ControlEvent>(&value) {
            Ok(event) => return Ok(event),
            Err(e) => e,
        };
        let msg = err.inner().to_string();
        let Some(field) = msg
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split('`').next())
            .map(str::to_string)
        else {
            let at_kind = matches!(err.path().to_string().as_str(), "." | "type");
            if msg.starts_with("unknown variant") && at_kind {
                let kind = value["type"].as_str().unwrap_or("?").to_string();
                return Err(format!(
                    "event kind `{kind}` is unknown to this host (baton {}); it was written by a \
                     newer host: upgrade this one",
                    env!("CARGO_PKG_VERSION")
                ));
            }
            return Err(format!("{msg} (at {})", err.path()));
        };
        // The path names the struct holding the unknown field.
        let mut at = &mut value;
        for seg in err.path().iter() {
            at = match seg {
                serde_path_to_error::Segment::Seq { index } => &mut at[*index],
                serde_path_to_error::Segment::Map { key } => &mut at[key.as_str()],
                serde_path_to_error::Segment::Enum { .. }
                | serde_path_to_error::Segment::Unknown => at,
            };
        }
        tracing::warn!(field, path = %err.path(), "control log: ignoring a field this host does not know");
        // Inside an internally tagged event the path can stop short: then the field is removed
        // from the first object below that holds it.
        if !remove_field(at, &field) {
            return Err(format!("{msg} (at {})", err.path()));
        }
    }
    Err("too many unknown fields".into())
}

/// Removes `field` from `v` if it is an object holding it, else from the first object below.
fn remove_field(v: &mut serde_json::Value, field: &str) -> bool {
    match v {
        serde_json::Value::Object(o) => {
            o.remove(field).is_some() || o.values_mut().any(|c| remove_field(c, field))
        }
        serde_json::Value::Array(a) => a.iter_mut().any(|c| remove_field(c, field)),
        _ => false,
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
