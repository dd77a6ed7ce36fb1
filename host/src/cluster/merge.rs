//! Online merges: two adjacent partitions become one, on one host.
//!
//! A merge is a decision of the control log, like a split ([`crate::control::MergeRecord`]).
//! Two partitions on two hosts are first brought together: the right one (the one not on the
//! host asked) moves, warm, to the host of the other. Then, on that host:
//!
//! 1. **Begun.** The owner records the merge; the catalog allocates the merged id. It counts
//!    only from the owner of both, at their epochs, with no move, split or other merge of either
//!    under way.
//! 2. **Warm.** While both run: the merged database is made from a checkpoint of the left
//!    partition (hard links), into which the right partition's slots are ingested from a
//!    checkpoint of it (SST files written in key order, `IngestExternalFile`), with their
//!    offsets. Its clients are made, with a reader of all its slots' changelogs, caught up.
//!    On the embedded log (no changelog) this is done after step 3.
//! 3. **Quiesce.** Both stop at a batch boundary with their final commits; their producers
//!    commit and close: neither old transactional id has a transaction left open.
//! 4. **Catch up.** The merged partition reads its changelogs to where the two final commits
//!    left them.
//! 5. **Done.** Recorded; it counts only if both still have the owner and epochs the merge began
//!    with. The two are retired; the merged partition, with a new id, epoch and transactional
//!    id, starts at once with its clients.
//!
//! An owner that dies before step 5 leaves both partitions to be failed over, and the merge is
//! given up by the controller, or by the owner when it restarts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::cluster::split::{CATCH_UP_IDLE, Half, Splits};
use crate::control::{ControlEvent, MergeRecord, SplitPhase, now_ms};
use crate::error::{Error, Result};
use crate::partition::kafka::Prepared;
use crate::partition::supervisor::PartitionHandle;
use crate::partition::tail::Tail;

/// How long the move that brings the right partition to the left one's host may take.
const BRING_TIMEOUT: Duration = Duration::from_secs(300);

/// The body of `POST /api/v1/partitions/merge`.
#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeRequest {
    /// One partition.
    pub left: String,
    /// The other, adjacent to it (either order).
    pub right: String,
    /// Why, as the merge's history shows it (default: asked for by hand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Splits {
    /// Merges partitions `a` and `b` (adjacent, of one pipeline) on this host, which owns one of
    /// them; the other is first moved here when it runs elsewhere. Answers the merge as the
    /// control log made it, once the merged partition runs.
    pub fn merge(&self, a: &str, b: &str, cause: &str) -> Result<MergeRecord> {
        let kafka = self.parts.log.is_kafka();
        if kafka {
            self.parts.control.catch_up(Duration::from_secs(2));
        }
        let (pipeline, left, right) = self.check_merge(a, b)?;
        // The side that runs elsewhere comes here first.
        for side in [&left, &right] {
            let owner = self
                .parts
                .catalog
                .lock()
                .assignments
                .get(&side.0)
                .map(|a| a.owner.clone());
            if let Some(owner) = owner
                && owner != self.parts.host_id
            {
                self.bring_here(&side.0)?;
            }
        }
        let (_, left, right) = self.check_merge(&left.0, &right.0)?;
        let handles = [&left.0, &right.0].map(|id| {
            self.parts
                .peers
                .running(id)
                .filter(|h| !h.stopping())
                .ok_or_else(|| Error::Conflict(format!("partition `{id}` is not running here")))
        });
        let [hl, hr] = handles;
        let (hl, hr) = (hl?, hr?);
        let id = format!(
            "{}+{}.{:x}.{}",
            left.0,
            right.0,
            now_ms(),
            self.parts.host_id
        );
        let begun = MergeRecord {
            id: id.clone(),
            pipeline: pipeline.clone(),
            left: left.0.clone(),
            right: right.0.clone(),
            slots: [left.1[0], right.1[1]],
            slot: right.1[0],
            owner: self.parts.host_id.clone(),
            epochs: [left.2, right.2],
            phase: SplitPhase::Begun,
            merged: None,
            pause_ms: None,
            steps: Vec::new(),
            reason: None,
            cause: Some(cause.to_string()),
            at: now_ms(),
        };
        self.commit(ControlEvent::Merge(Box::new(begun)))?;
        let merge = self
            .parts
            .catalog
            .lock()
            .merge(&pipeline, &id)
            .cloned()
            .filter(|m| m.phase == SplitPhase::Begun && m.merged.is_some())
            .ok_or_else(|| {
                Error::Conflict(format!(
                    "`{}` or `{}` changed owner, or began a move, split or merge, before this \
                     merge in the control log",
                    left.0, right.0
                ))
            })?;
        tracing::info!(merge = %id, left = %left.0, right = %right.0, merged = ?merge.merged, "merge begun");
        self.drive_merge(merge, [hl, hr])
    }

    /// The pipeline and the two partitions as (id, slots, epoch), lower slots first, checked
    /// for a merge: adjacent, of one pipeline, with nothing else under way.
    #[allow(clippy::type_complexity)]
    fn check_merge(
        &self,
        a: &str,
        b: &str,
    ) -> Result<(String, (String, [u32; 2], u64), (String, [u32; 2], u64))> {
        if a == b {
            return Err(Error::BadRequest(format!(
                "`left` and `right` are both `{a}`: name two partitions"
            )));
        }
        let catalog = self.parts.catalog.lock();
        let find = |id: &str| {
            catalog
                .pipelines
                .values()
                .find_map(|p| Some((p.spec.name.clone(), p.shape(id)?)))
                .ok_or_else(|| Error::NotFound(format!("no partition `{id}`")))
        };
        let (pa, sa) = find(a)?;
        let (pb, sb) = find(b)?;
        if pa != pb {
            return Err(Error::BadRequest(format!(
                "`{a}` is of pipeline `{pa}` and `{b}` of `{pb}`: only partitions of one pipeline \
                 merge"
            )));
        }
        let epoch = |id: &str| catalog.assignments.get(id).map_or(1, |x| x.epoch);
        let (left, right) = if sa[1] == sb[0] {
            ((a.to_string(), sa, epoch(a)), (b.to_string(), sb, epoch(b)))
        } else if sb[1] == sa[0] {
            ((b.to_string(), sb, epoch(b)), (a.to_string(), sa, epoch(a)))
        } else {
            return Err(Error::Conflict(format!(
                "`{a}` (slots {}..{}) and `{b}` (slots {}..{}) are not adjacent: only \
                 neighbours merge",
                sa[0], sa[1], sb[0], sb[1]
            )));
        };
        for id in [a, b] {
            if let Some(m) = catalog.move_under_way(id) {
                return Err(Error::Conflict(format!(
                    "`{id}` is moving (move {} to `{}`); merge once the move ends",
                    m.id, m.to
                )));
            }
            if catalog.reshaping(id) {
                return Err(Error::Conflict(format!(
                    "`{id}` is splitting or merging already"
                )));
            }
        }
        Ok((pa, left, right))
    }

    /// Moves `partition` here, warm, and waits until it runs here.
    fn bring_here(&self, partition: &str) -> Result<()> {
        let move_id = self
            .parts
            .moves
            .request_move(partition, &self.parts.host_id)?;
        tracing::info!(partition, move_id, "moving here to merge");
        let deadline = Instant::now() + BRING_TIMEOUT;
        while Instant::now() < deadline {
            let (phase, reason) = {
                let catalog = self.parts.catalog.lock();
                let m = catalog
                    .moves
                    .get(partition)
                    .and_then(|ms| ms.iter().find(|m| m.id == move_id));
                (m.map(|m| m.phase), m.and_then(|m| m.reason.clone()))
            };
            match phase {
                Some(crate::control::MovePhase::Abandoned) => {
                    return Err(Error::Conflict(format!(
                        "moving `{partition}` here to merge it was given up: {}",
                        reason.unwrap_or_default()
                    )));
                }
                Some(crate::control::MovePhase::Done)
                    if self
                        .parts
                        .peers
                        .running(partition)
                        .is_some_and(|h| !h.stopping()) =>
                {
                    return Ok(());
                }
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        Err(Error::Unavailable(format!(
            "moving `{partition}` here to merge it took over {} s",
            BRING_TIMEOUT.as_secs()
        )))
    }

    /// Records a later phase of `merge`.
    fn record_merge(
        &self,
        merge: &MergeRecord,
        phase: SplitPhase,
        change: impl Fn(&mut MergeRecord),
    ) -> Result<u64> {
        let mut m = MergeRecord {
            phase,
            at: now_ms(),
            merged: None,
            pause_ms: None,
            steps: Vec::new(),
            reason: None,
            ..merge.clone()
        };
        change(&mut m);
        self.commit(ControlEvent::Merge(Box::new(m)))
    }

    fn effective_merge(&self, merge: &MergeRecord) -> Option<MergeRecord> {
        self.parts
            .catalog
            .lock()
            .merge(&merge.pipeline, &merge.id)
            .cloned()
    }

    /// Makes the merged partition's database from checkpoints of `left` and `right`.
    fn make_merged(
        &self,
        merge: &MergeRecord,
        left: &PartitionHandle,
        right: &PartitionHandle,
    ) -> Result<Half> {
        let id = merge.merged.clone().unwrap_or_default();
        let record = self
            .parts
            .catalog
            .lock()
            .pipelines
            .get(&merge.pipeline)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("pipeline `{}` is gone", merge.pipeline)))?;
        let path = self.parts.supervisor.partition_path(&merge.pipeline, &id);
        let side = path.with_file_name(format!(".{id}.right"));
        let _ = std::fs::remove_dir_all(&side);
        let internal = |what: &str, e: &dyn std::fmt::Display| {
            Error::Internal(format!("{what} for merged `{id}`: {e}"))
        };
        left.db
            .create_checkpoint(&path)
            .map_err(|e| internal("checkpoint of the left side", &e))?;
        right
            .db
            .create_checkpoint(&side)
            .map_err(|e| internal("checkpoint of the right side", &e))?;
        let db = self
            .parts
            .state
            .open_shared(&path, &record.spec.state_stores())
            .map_err(|e| internal("opening", &e))?;
        let slots = merge.slot..merge.slots[1];
        let meta = crate::partition::io::meta_keys_of(&record, slots.clone());
        let copied = db.ingest_slots_from(&side, slots, &meta);
        let _ = std::fs::remove_dir_all(&side);
        let copied = copied.map_err(|e| internal("ingesting the right side", &e))?;
        tracing::info!(merge = %merge.id, entries = copied, "the right side's state ingested");
        Ok(Half {
            id,
            slots: merge.slots[0]..merge.slots[1],
            path,
            db,
        })
    }

    /// Gives `merge` up after it began: records it abandoned (unless the log ended it),
    /// removes the merged database, and resumes both sides if they are still this host's.
    fn give_up_merge(&self, merge: &MergeRecord, merged: Option<Half>, reason: &str) {
        tracing::warn!(merge = %merge.id, "merge given up: {reason}");
        if self
            .effective_merge(merge)
            .is_some_and(|m| m.phase == SplitPhase::Begun)
            && let Err(e) = self.record_merge(merge, SplitPhase::Abandoned, |m| {
                m.reason = Some(reason.to_string())
            })
        {
            tracing::warn!(merge = %merge.id, "recording the merge given up: {e}");
        }
        let extra: Vec<std::path::PathBuf> = merged.iter().map(|h| h.path.clone()).collect();
        drop(merged);
        let ids: Vec<String> = merge.merged.iter().cloned().collect();
        self.remove_halves(&merge.pipeline, &ids, &extra);
        for side in [&merge.left, &merge.right] {
            self.parts.peers.unrelease(side);
        }
        self.parts.supervisor.follow_assignments(&merge.pipeline);
    }

    fn drive_merge(
        &self,
        merge: MergeRecord,
        [left, right]: [Arc<PartitionHandle>; 2],
    ) -> Result<MergeRecord> {
        let merged_id = merge.merged.clone().unwrap_or_default();
        self.remove_halves(&merge.pipeline, std::slice::from_ref(&merged_id), &[]);
        for h in [&left, &right] {
            if let Err(e) = h.db.flush() {
                tracing::warn!(merge = %merge.id, "flushing before the merge: {e}");
            }
        }
        // Warm, on Kafka: the merged database and its clients while both sides run.
        let mut warm: Option<(Half, Prepared)> = None;
        if let Some(kafka) = self.parts.log.as_kafka() {
            let made = (|| -> anyhow::Result<(Half, Prepared)> {
                let half = self.make_merged(&merge, &left, &right)?;
                let record = self
                    .parts
                    .catalog
                    .lock()
                    .pipelines
                    .get(&merge.pipeline)
                    .cloned()
                    .ok_or_else(|| anyhow::anyhow!("pipeline `{}` is gone", merge.pipeline))?;
                let tail = Tail::open(kafka, &record, half.slots.clone(), &half.db)?;
                let mut p = Prepared::new(kafka, &record, &half.id, half.slots.clone(), tail)?;
                let tail = p.tail();
                if tail.refresh()? > 0 {
                    tail.read_to_end(&half.db, CATCH_UP_IDLE, &mut |_| {})?;
                }
                Ok((half, p))
            })();
            match made {
                Ok(w) => warm = Some(w),
                Err(e) => {
                    let reason = format!("making the merged partition ready: {e:#}");
                    self.give_up_merge(&merge, None, &reason);
                    return Err(Error::Unavailable(reason));
                }
            }
        }
        self.parts
            .steps
            .pass(crate::steps::MERGE_QUIESCE, &merge.left);
        if self
            .effective_merge(&merge)
            .is_none_or(|m| m.phase != SplitPhase::Begun)
        {
            self.give_up_merge(
                &merge,
                warm.map(|w| w.0),
                "given up before the sides stopped",
            );
            return Err(Error::Conflict(format!(
                "merge {} was given up before the sides stopped",
                merge.id
            )));
        }
        // Both stop, at once.
        let mut released = Vec::new();
        for side in [&merge.left, &merge.right] {
            match self.parts.peers.release(side) {
                Ok(h) => released.push(h),
                Err(e) => {
                    self.give_up_merge(&merge, warm.map(|w| w.0), &e);
                    return Err(Error::Conflict(e));
                }
            }
        }
        let drained: Vec<Option<(Vec<crate::partition::SlotProgress>, Instant)>> =
            std::thread::scope(|scope| {
                let threads: Vec<_> = released
                    .iter()
                    .map(|h| {
                        scope.spawn(move || {
                            h.drain(crate::cluster::moves::DRAIN_TIMEOUT)
                                .map(|o| (o, Instant::now()))
                        })
                    })
                    .collect();
                threads
                    .into_iter()
                    .map(|t| t.join().ok().flatten())
                    .collect()
            });
        if drained.iter().any(Option::is_none) {
            let reason = format!(
                "a side did not reach a batch boundary and commit within {}s",
                crate::cluster::moves::DRAIN_TIMEOUT.as_secs()
            );
            self.give_up_merge(&merge, warm.map(|w| w.0), &reason);
            return Err(Error::Unavailable(reason));
        }
        let drained: Vec<_> = drained.into_iter().flatten().collect();
        let final_commit = drained
            .iter()
            .map(|(_, t)| *t)
            .min()
            .unwrap_or_else(Instant::now);
        // The later side's final commit: what the pause waited for both sides to stop.
        let both_stopped = drained
            .iter()
            .map(|(_, t)| *t)
            .max()
            .unwrap_or(final_commit);
        let offsets: Vec<crate::partition::SlotProgress> =
            drained.into_iter().flat_map(|(o, _)| o).collect();
        let mut marks: Vec<(&'static str, Instant)> = vec![("drained", both_stopped)];
        let mut replica = None;
        let merged = match warm {
            Some((half, mut p)) => {
                let sides: Vec<&crate::state::PartitionDb> =
                    released.iter().map(|h| &*h.db).collect();
                let caught_up =
                    crate::cluster::split::catch_up(&half, p.tail(), &sides, &mut marks);
                match caught_up.and_then(|()| self.hand_clients(&half, p, &offsets)) {
                    Ok(r) => replica = Some(r),
                    Err(e) => {
                        self.give_up_merge(&merge, Some(half), &e);
                        return Err(Error::Unavailable(e));
                    }
                }
                marks.push(("caught-up", Instant::now()));
                half
            }
            None => match self.make_merged(&merge, &released[0], &released[1]) {
                Ok(h) => {
                    marks.push(("merged", Instant::now()));
                    h
                }
                Err(e) => {
                    let reason = format!("making the merged partition: {e}");
                    self.give_up_merge(&merge, None, &reason);
                    return Err(Error::Internal(reason));
                }
            },
        };
        self.parts
            .steps
            .pass(crate::steps::MERGE_RECORD, &merge.left);
        let recorded = self.record_merge(&merge, SplitPhase::Done, |_| {});
        marks.push(("read-back", Instant::now()));
        let counted = self
            .effective_merge(&merge)
            .is_some_and(|m| m.phase == SplitPhase::Done);
        if let Some(r) = &replica {
            self.parts.peers.end_warming(r);
        }
        if !counted {
            let why = match recorded {
                Err(e) => format!("recording the merge done: {e}"),
                Ok(_) => "the merge was given up, or a side changed owner, before it was done \
                          in the control log"
                    .to_string(),
            };
            self.give_up_merge(&merge, Some(merged), &why);
            return Err(Error::Conflict(why));
        }
        let paths: Vec<std::path::PathBuf> = released
            .iter()
            .map(|h| self.parts.supervisor.partition_path(&h.pipeline, &h.id))
            .collect();
        for h in &released {
            h.join();
        }
        drop(released);
        drop((left, right));
        // The pause ends at the merged partition's first guest call.
        let ready = self.wait_first_calls(
            &merge.id,
            std::slice::from_ref(&merged_id),
            &["first-call"],
            &mut marks,
        );
        let mut out = self.effective_merge(&merge).unwrap_or(merge.clone());
        if let Some(at) = ready {
            let (pause, steps) = crate::cluster::split::pause_steps(final_commit, at, marks);
            self.merge_pauses.lock().push(pause);
            tracing::info!(merge = %merge.id, pause_ms = pause, ?steps, "merge done");
            if let Err(e) = self.record_merge(&merge, SplitPhase::Done, |m| {
                m.pause_ms = Some(pause);
                m.steps = steps.clone();
            }) {
                tracing::warn!(merge = %merge.id, "recording the merge's pause: {e}");
            }
            out.pause_ms = Some(pause);
            out.steps = steps;
        }
        // The retired sides' databases: their files live on in the merged one's hard links.
        for (side, path) in [&merge.left, &merge.right].into_iter().zip(paths) {
            if self.parts.peers.running(side).is_none()
                && let Err(e) = std::fs::remove_dir_all(&path)
            {
                tracing::warn!("removing the retired {}: {e}", path.display());
            }
        }
        drop(merged);
        Ok(out)
    }

    /// What a merge record means for this host once it took effect: the merged partition of a
    /// done merge starts (on its owner) and the sides stop.
    pub(crate) fn on_merge(&self, m: &MergeRecord) {
        if m.phase == SplitPhase::Done && m.pause_ms.is_none() {
            self.parts.supervisor.follow_assignments(&m.pipeline);
        }
    }

    /// After a restart: merges this host had begun and not done are given up.
    pub(crate) fn settle_merges_left_by_restart(&self) {
        let left: Vec<MergeRecord> = {
            let catalog = self.parts.catalog.lock();
            catalog
                .pipelines
                .values()
                .filter_map(|p| p.layout.as_ref())
                .flat_map(|l| l.merges.iter())
                .filter(|m| m.phase == SplitPhase::Begun && m.owner == self.parts.host_id)
                .cloned()
                .collect()
        };
        for m in left {
            tracing::warn!(merge = %m.id, "a merge was under way when this host stopped: given up");
            if let Err(e) = self.record_merge(&m, SplitPhase::Abandoned, |r| {
                r.reason = Some(format!(
                    "the owner `{}` restarted during the merge",
                    self.parts.host_id
                ))
            }) {
                tracing::warn!(merge = %m.id, "recording the merge given up: {e}");
            }
            let ids: Vec<String> = m.merged.iter().cloned().collect();
            self.remove_halves(&m.pipeline, &ids, &[]);
        }
    }

    /// The controller's part: a merge whose owner left, a side of which changed owner, or that
    /// stayed begun too long, is given up.
    pub(crate) fn stale_merges(&self, alive: &[String]) -> Vec<(MergeRecord, String)> {
        let catalog = self.parts.catalog.lock();
        let mut stale = Vec::new();
        for p in catalog.pipelines.values() {
            let Some(layout) = &p.layout else { continue };
            for m in layout
                .merges
                .iter()
                .filter(|m| m.phase == SplitPhase::Begun)
            {
                let changed = [&m.left, &m.right].iter().zip(m.epochs).any(|(id, e)| {
                    catalog
                        .assignments
                        .get(id.as_str())
                        .is_some_and(|a| a.owner != m.owner || a.epoch != e)
                });
                let why = crate::cluster::split::stale_reason(alive, &m.owner, changed, m.at);
                if let Some(why) = why {
                    stale.push((m.clone(), why));
                }
            }
        }
        stale
    }
}
