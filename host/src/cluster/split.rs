//! Online splits: a partition becomes two, on its owner, with no state copied.
//!
//! A split is a decision of the control log, like a move: every host reads the same records in
//! the same order and agrees whether it happened ([`crate::control::SplitRecord`]).
//!
//! 1. **Begun.** The owner records the split. At its place in the log it counts only from the
//!    partition's owner at its epoch, with no move or other split of it under way; the catalog
//!    then allocates the halves' ids (`<pipeline>-<n>`, never used twice).
//! 2. **Warm halves.** While the partition runs, its memtables are flushed and each half is
//!    made: a RocksDB checkpoint of the partition (hard links, one commit's state and offsets),
//!    opened and cut to the half's slots (range tombstones over the other slots, the SST files
//!    that hold nothing else dropped, the other slots' offsets deleted). No state is copied.
//!    Each half gets its clients (consumer, producer of its own transactional id, and a reader
//!    of its slots' changelogs, caught up with what the partition committed since).
//!    On the embedded log, which has no changelog, the halves are made in step 4 instead.
//! 3. **Quiesce.** The partition stops at a batch boundary with what was pending committed (its
//!    final commit: the pause starts). Its transaction is committed and its producer closes: no
//!    transaction of the old transactional id is left open.
//! 4. **Catch up.** Each half reads its slots' changelogs to where the final commit left them
//!    (the stopped partition's own positions), which takes the last few records.
//! 5. **Done.** The owner records the split done. It counts only while the split is under way
//!    and the partition still has the owner and epoch it began with: a failover (or the
//!    controller giving the split up) before it in the log, and the owner resumes the partition
//!    instead. Once it counts, the partition is retired and its halves are assigned to the
//!    owner at epoch 1, with new transactional ids, and start there at once: their databases are
//!    open already.
//! 6. **After.** The pause ends at the later of the halves' first guest calls, and is recorded;
//!    then the halves compact away the other half's data in the background, and the disk
//!    reclaimed is recorded.
//!
//! A split whose owner dies or stops before step 5 is given up by the controller (the owner
//! left, or the partition changed owner), or by the owner itself when it restarts; a partition
//! taken over meanwhile is fenced by its new owner as in any failover. Either half may then move
//! like any partition.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Deserialize;

use crate::cluster::Hosts;
use crate::control::log::ControlLog;
use crate::control::{Catalog, ControlEvent, MoveStep, SplitPhase, SplitRecord, now_ms};
use crate::error::{Error, Result};
use crate::partition::kafka::Prepared;
use crate::partition::peers::{Peers, Replica};
use crate::partition::report::Role;
use crate::partition::supervisor::{PartitionHandle, Supervisor};
use crate::partition::tail::Tail;
use crate::state::{PartitionDb, StateEnv};

/// How long a split waits for the halves' first guest calls before it records no pause.
const FIRST_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A half whose first fetch found nothing to process for this long ends the pause there.
const IDLE_AFTER: Duration = Duration::from_secs(1);

/// How long the load is sampled to choose a split's slot when none is given.
const LOAD_SAMPLE: Duration = Duration::from_secs(1);

/// How long a split may stay begun before the controller gives it up.
pub const SPLIT_TIMEOUT: Duration = Duration::from_secs(120);

/// The body of `POST /api/v1/partitions/{id}/split`.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SplitRequest {
    /// The first slot of the right half. Without it, the slot that halves the partition's
    /// measured load (records/s per slot over a second), or its middle when it is idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<u32>,
    /// Why, as the split's history shows it (default: asked for by hand). The balancer names
    /// its decision's reason when it asks another host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What splits work over: narrow handles on this host's parts.
pub struct SplitsParts {
    /// This host's id.
    pub host_id: String,
    /// The log the host runs on.
    pub log: crate::transport::Log,
    /// The shared state environment, where the halves' databases open.
    pub state: Arc<StateEnv>,
    /// The catalog, as the follower applies it.
    pub catalog: Arc<Mutex<Catalog>>,
    /// The control log.
    pub control: Arc<ControlLog>,
    /// What this host is for each partition.
    pub peers: Arc<Peers>,
    /// The partitions this host runs.
    pub supervisor: Arc<Supervisor>,
    /// Protocol steps where tests hold a thread.
    pub steps: Arc<crate::steps::Steps>,
    /// The hosts of the cluster.
    pub hosts: Hosts,
    /// Set when the host stops.
    pub stop: Arc<AtomicBool>,
    /// Live moves: a merge first brings its two sides to one host.
    pub moves: Arc<crate::cluster::moves::Moves>,
}

/// The splits this host makes as a partition's owner.
pub struct Splits {
    pub(super) parts: SplitsParts,
    pub(super) me: Weak<Splits>,
    pauses: Mutex<crate::cluster::moves::Pauses>,
    /// Pauses (ms) of the merges this host made, oldest first.
    pub(super) merge_pauses: Mutex<crate::cluster::moves::Pauses>,
}

/// A partition made ready (a half of a split, a merged partition): its id, slots and open
/// database.
pub(super) struct Half {
    pub(super) id: String,
    pub(super) slots: Range<u32>,
    pub(super) path: PathBuf,
    pub(super) db: Arc<PartitionDb>,
}

impl Splits {
    /// Splits over `parts`.
    pub fn new(parts: SplitsParts) -> Arc<Self> {
        Arc::new_cyclic(|me| Splits {
            parts,
            me: me.clone(),
            pauses: Mutex::new(Default::default()),
            merge_pauses: Mutex::new(Default::default()),
        })
    }

    /// Pauses (ms) of the splits this host made, oldest first.
    pub fn pauses(&self) -> Vec<f64> {
        self.pauses.lock().all().to_vec()
    }

    /// Pauses (ms) of the merges this host made, oldest first.
    pub fn merge_pauses(&self) -> Vec<f64> {
        self.merge_pauses.lock().all().to_vec()
    }

    /// Splits `partition`, which runs here, at slot `at` (or where it halves the load), and
    /// answers the split as the control log made it, once the halves run (with its pause once
    /// their first guest calls came).
    pub fn split(&self, partition: &str, at: Option<u32>, cause: &str) -> Result<SplitRecord> {
        if self.parts.log.is_kafka() {
            self.parts.control.catch_up(Duration::from_secs(2));
        }
        let (pipeline, slots, epoch) = self.check(partition)?;
        let handle = self
            .parts
            .peers
            .running(partition)
            .filter(|h| !h.stopping())
            .ok_or_else(|| {
                Error::Conflict(format!(
                    "partition `{partition}` is not running on this host"
                ))
            })?;
        let slot = match at {
            Some(s) if s > slots[0] && s < slots[1] => s,
            Some(s) => {
                return Err(Error::BadRequest(format!(
                    "`at` must be a slot strictly inside the partition's slots {}..{} (got {s}): \
                     each half keeps at least one slot",
                    slots[0], slots[1]
                )));
            }
            None => halving_slot(&handle, slots),
        };
        let id = format!("{partition}.s{epoch}.{:x}.{}", now_ms(), self.parts.host_id);
        let begun = SplitRecord {
            id: id.clone(),
            pipeline: pipeline.clone(),
            partition: partition.to_string(),
            slots,
            slot,
            owner: self.parts.host_id.clone(),
            epoch,
            phase: SplitPhase::Begun,
            halves: Vec::new(),
            pause_ms: None,
            steps: Vec::new(),
            reclaimed_bytes: None,
            reason: None,
            cause: Some(cause.to_string()),
            at: now_ms(),
        };
        self.record(&begun)?;
        let split = self
            .parts
            .catalog
            .lock()
            .split(&pipeline, &id)
            .cloned()
            .filter(|s| s.phase == SplitPhase::Begun && s.halves.len() == 2)
            .ok_or_else(|| {
                Error::Conflict(format!(
                    "partition `{partition}` changed owner, or began a move or another split, \
                     before this split in the control log"
                ))
            })?;
        tracing::info!(split = %id, partition, slot, halves = ?split.halves, "split begun");
        self.drive(split, handle)
    }

    /// The pipeline, slots and epoch of `partition`, checked for a split here.
    fn check(&self, partition: &str) -> Result<(String, [u32; 2], u64)> {
        let catalog = self.parts.catalog.lock();
        let Some((pipeline, slots)) = catalog
            .pipelines
            .values()
            .find_map(|p| Some((p.spec.name.clone(), p.shape(partition)?)))
        else {
            return Err(Error::NotFound(format!("no partition `{partition}`")));
        };
        let epoch = match catalog.assignments.get(partition) {
            Some(a) if a.owner != self.parts.host_id => {
                return Err(Error::Conflict(format!(
                    "partition `{partition}` runs on host `{}`, not this one",
                    a.owner
                )));
            }
            Some(a) => a.epoch,
            None => 1,
        };
        if slots[1] - slots[0] < 2 {
            return Err(Error::Conflict(format!(
                "partition `{partition}` has one slot ({}), and a slot is one input partition: \
                 it cannot split; move it to another host instead",
                slots[0]
            )));
        }
        if let Some(m) = catalog.move_under_way(partition) {
            return Err(Error::Conflict(format!(
                "partition `{partition}` is moving (move {} to `{}`); split it once the move ends",
                m.id, m.to
            )));
        }
        if let Some(s) = catalog.split_under_way(partition) {
            return Err(Error::Conflict(format!(
                "partition `{partition}` is splitting already (split {})",
                s.id
            )));
        }
        Ok((pipeline, slots, epoch))
    }

    /// Records `s` in the control log and waits until it took effect here.
    fn record(&self, s: &SplitRecord) -> Result<u64> {
        self.commit(ControlEvent::Split(Box::new(s.clone())))
    }

    /// Records `event` in the control log and waits until it took effect here.
    pub(super) fn commit(&self, event: ControlEvent) -> Result<u64> {
        let _control = self.parts.control.lock();
        self.parts.control.commit(event)
    }

    /// Records a later phase of `split` (again after a failed append, until the host stops).
    fn record_phase(
        &self,
        split: &SplitRecord,
        phase: SplitPhase,
        change: impl Fn(&mut SplitRecord),
    ) {
        let mut s = SplitRecord {
            phase,
            at: now_ms(),
            halves: Vec::new(),
            pause_ms: None,
            steps: Vec::new(),
            reclaimed_bytes: None,
            reason: None,
            ..split.clone()
        };
        change(&mut s);
        loop {
            match self.record(&s) {
                Ok(_) => return,
                Err(e) if !self.parts.stop.load(Ordering::Relaxed) => {
                    tracing::warn!(split = %split.id, "recording the split {phase:?}: {e}; again in 1 s");
                    std::thread::sleep(Duration::from_secs(1));
                }
                Err(_) => return,
            }
        }
    }

    /// The split as the log made it.
    fn effective(&self, split: &SplitRecord) -> Option<SplitRecord> {
        self.parts
            .catalog
            .lock()
            .split(&split.pipeline, &split.id)
            .cloned()
    }

    /// The owner's side of a begun split, from the prepare to the halves running.
    fn drive(&self, split: SplitRecord, handle: Arc<PartitionHandle>) -> Result<SplitRecord> {
        let partition = split.partition.clone();
        // Leftovers of an earlier attempt under these ids go first.
        self.remove_halves(&split.pipeline, &split.halves, &[]);
        if let Some(parent) = self
            .parts
            .supervisor
            .partition_path(&split.pipeline, &partition)
            .parent()
            && let Err(e) = std::fs::create_dir_all(parent)
        {
            tracing::warn!("{}: {e}", parent.display());
        }
        // Before the pause: what a checkpoint would flush.
        if let Err(e) = handle.db.flush() {
            tracing::warn!(split = %split.id, "flushing before the split: {e}");
        }
        // On Kafka the halves are made while the partition runs, warm: each from a checkpoint
        // of the running partition, cut to its slots, with its clients and a changelog reader
        // that keeps it up with the partition; after the final commit each reads the last
        // records of its slots. On the embedded log (no changelog) they are made after it.
        let mut warm: Vec<(Half, Option<Prepared>)> = Vec::new();
        if self.parts.log.is_kafka() {
            match self.warm_halves(&split, &handle) {
                Ok(w) => warm = w,
                Err(e) => {
                    let reason = format!("making the halves ready: {e:#}");
                    self.give_up(&split, Vec::new(), &reason);
                    return Err(Error::Unavailable(reason));
                }
            }
        }
        self.parts
            .steps
            .pass(crate::steps::SPLIT_QUIESCE, &partition);
        if self
            .effective(&split)
            .is_none_or(|s| s.phase != SplitPhase::Begun)
        {
            let halves = warm.into_iter().map(|(h, _)| h).collect();
            self.give_up(&split, halves, "given up before the partition stopped");
            return Err(Error::Conflict(format!(
                "split {} was given up before the partition stopped",
                split.id
            )));
        }
        let released = match self.parts.peers.release(&partition) {
            Ok(h) => h,
            Err(e) => {
                let reason = format!("the partition could not be stopped: {e}");
                let halves = warm.into_iter().map(|(h, _)| h).collect();
                self.give_up(&split, halves, &reason);
                return Err(Error::Conflict(reason));
            }
        };
        let Some(offsets) = released.drain(crate::cluster::moves::DRAIN_TIMEOUT) else {
            let reason = format!(
                "partition `{partition}` did not reach a batch boundary and commit within {}s",
                crate::cluster::moves::DRAIN_TIMEOUT.as_secs()
            );
            let halves = warm.into_iter().map(|(h, _)| h).collect();
            self.give_up(&split, halves, &reason);
            return Err(Error::Unavailable(reason));
        };
        let final_commit = Instant::now();
        let mut marks: Vec<(&'static str, Instant)> = Vec::new();
        let mut replicas = Vec::new();
        let halves = if warm.is_empty() {
            match self.make_halves(&split, &released, &mut marks) {
                Ok(h) => h,
                Err(e) => {
                    let reason = format!("making the halves: {e}");
                    self.give_up(&split, Vec::new(), &reason);
                    return Err(Error::Internal(reason));
                }
            }
        } else {
            // Each half reads its slots' changelogs to where the final commit left them (the
            // partition's own positions), then takes its clients as a move's target does.
            let mut halves = Vec::new();
            let mut failed = None;
            for (half, prepared) in warm {
                if let Some(mut p) = prepared {
                    let caught_up = catch_up(&half, p.tail(), &[&released.db], &mut marks);
                    match caught_up.and_then(|()| self.hand_clients(&half, p, &offsets)) {
                        Ok(r) => replicas.push(r),
                        Err(e) => failed = Some(format!("half `{}`: {e}", half.id)),
                    }
                }
                halves.push(half);
            }
            marks.push(("caught-up", Instant::now()));
            if let Some(reason) = failed {
                for r in &replicas {
                    self.parts.peers.end_warming(r);
                }
                self.give_up(&split, halves, &reason);
                return Err(Error::Unavailable(reason));
            }
            halves
        };
        self.parts
            .steps
            .pass(crate::steps::SPLIT_RECORD, &partition);
        let done = SplitRecord {
            phase: SplitPhase::Done,
            at: now_ms(),
            halves: Vec::new(),
            ..split.clone()
        };
        let recorded = self.record(&done);
        marks.push(("read-back", Instant::now()));
        let counted = self
            .effective(&split)
            .is_some_and(|s| s.phase == SplitPhase::Done);
        // Clients a half did not take (its session did not start) are let go.
        for r in &replicas {
            self.parts.peers.end_warming(r);
        }
        if !counted {
            let why = match recorded {
                Err(e) => format!("recording the split done: {e}"),
                Ok(_) => "the split was given up, or the partition changed owner, before it \
                          was done in the control log"
                    .to_string(),
            };
            // Given up in the log already: nothing more to record.
            self.give_up(&split, halves, &why);
            return Err(Error::Conflict(why));
        }
        // The halves started as the record took effect here; the old session is forgotten.
        released.join();
        drop(released);
        drop(handle);
        let ready = self.wait_first_calls(
            &split.id,
            &split.halves,
            &["left-first-call", "right-first-call"],
            &mut marks,
        );
        let mut out = self.effective(&split).unwrap_or(done);
        if let Some(at) = ready {
            let (pause, steps) = pause_steps(final_commit, at, marks);
            self.pauses.lock().push(pause);
            tracing::info!(split = %split.id, partition, pause_ms = pause, ?steps, "split done");
            self.record_phase(&split, SplitPhase::Done, |s| {
                s.pause_ms = Some(pause);
                s.steps = steps.clone();
            });
            out.pause_ms = Some(pause);
            out.steps = steps;
        }
        self.reclaim_later(&split, halves, &partition);
        Ok(out)
    }

    /// On Kafka, while the partition runs: per half, a database made from a checkpoint of it
    /// and cut to the half's slots, and the half's clients with a changelog reader positioned
    /// where that database is, caught up with what the partition committed since.
    fn warm_halves(
        &self,
        split: &SplitRecord,
        handle: &PartitionHandle,
    ) -> anyhow::Result<Vec<(Half, Option<Prepared>)>> {
        let kafka = self
            .parts
            .log
            .as_kafka()
            .ok_or_else(|| anyhow::anyhow!("no Kafka"))?;
        let record = self
            .parts
            .catalog
            .lock()
            .pipelines
            .get(&split.pipeline)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("pipeline `{}` is gone", split.pipeline))?;
        let halves = self.make_halves(split, handle, &mut Vec::new())?;
        let mut out = Vec::new();
        for half in halves {
            let tail = Tail::open(kafka, &record, half.slots.clone(), &half.db)?;
            let mut p = Prepared::new(kafka, &record, &half.id, half.slots.clone(), tail)?;
            let tail = p.tail();
            if tail.refresh()? > 0 {
                tail.read_to_end(&half.db, CATCH_UP_IDLE, &mut |_| {})?;
            }
            out.push((half, Some(p)));
        }
        Ok(out)
    }

    /// Hands `half` its `prepared` clients: its reader positioned where its database is, and
    /// the group's offsets of its slots as the final commit stored them (`offsets`). Answers
    /// the half's peer, to let go once its session started.
    pub(super) fn hand_clients(
        &self,
        half: &Half,
        mut prepared: Prepared,
        offsets: &[crate::partition::SlotProgress],
    ) -> std::result::Result<Arc<Replica>, String> {
        let mine: Vec<&crate::partition::SlotProgress> = offsets
            .iter()
            .filter(|o| half.slots.contains(&o.slot))
            .collect();
        let tps: Vec<(String, u32)> = mine.iter().map(|o| (o.topic.clone(), o.slot)).collect();
        let committed: Vec<Option<u64>> = mine.iter().map(|o| Some(o.offset)).collect();
        prepared.checked(&tps, &committed);
        let replica = Arc::new(Replica::new(&half.id, Role::Warming));
        self.parts.peers.warm(&half.id, replica.clone())?;
        if let Err(e) = self.parts.peers.take_over(&replica, prepared) {
            self.parts.peers.end_warming(&replica);
            return Err(e);
        }
        Ok(replica)
    }

    /// Makes the halves' databases from `handle`'s stopped partition: a checkpoint each (hard
    /// links), opened and cut to the half's slots.
    fn make_halves(
        &self,
        split: &SplitRecord,
        handle: &PartitionHandle,
        marks: &mut Vec<(&'static str, Instant)>,
    ) -> Result<Vec<Half>> {
        let record = self
            .parts
            .catalog
            .lock()
            .pipelines
            .get(&split.pipeline)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("pipeline `{}` is gone", split.pipeline)))?;
        let stores = record.spec.state_stores();
        let ranges = [split.slots[0]..split.slot, split.slot..split.slots[1]];
        // The checkpoints one after the other (the first flushes what the final commit left in
        // the memtables), then each half opened and cut on a thread of its own.
        let mut made = Vec::new();
        for (id, slots) in split.halves.iter().zip(ranges) {
            let path = self.parts.supervisor.partition_path(&split.pipeline, id);
            handle
                .db
                .create_checkpoint(&path)
                .map_err(|e| Error::Internal(format!("checkpoint for half `{id}`: {e}")))?;
            made.push((id.clone(), slots, path));
            marks.push(("checkpoint", Instant::now()));
        }
        let state = &self.parts.state;
        let (record, stores) = (&record, &stores);
        let opened: Vec<Result<Half>> = std::thread::scope(|scope| {
            let threads: Vec<_> = made
                .into_iter()
                .map(|(id, slots, path)| {
                    scope.spawn(move || {
                        let db = state
                            .open_shared(&path, stores)
                            .map_err(|e| Error::Internal(format!("opening half `{id}`: {e}")))?;
                        let meta = crate::partition::io::meta_keys_outside(
                            record,
                            split.slots[0]..split.slots[1],
                            slots.clone(),
                        );
                        db.keep_slots(slots.clone(), &meta)
                            .map_err(|e| Error::Internal(format!("cutting half `{id}`: {e}")))?;
                        Ok(Half {
                            id,
                            slots,
                            path,
                            db,
                        })
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| {
                    t.join()
                        .unwrap_or_else(|_| Err(Error::Internal("a half's thread panicked".into())))
                })
                .collect()
        });
        let halves = opened.into_iter().collect::<Result<Vec<_>>>()?;
        Ok(halves)
    }

    /// Gives the split up after the partition stopped: records it abandoned (when the log has
    /// not ended it already), removes the halves' databases, and resumes the partition if it
    /// is still this host's.
    fn give_up(&self, split: &SplitRecord, halves: Vec<Half>, reason: &str) {
        tracing::warn!(split = %split.id, partition = %split.partition, "split given up: {reason}");
        if self
            .effective(split)
            .is_some_and(|s| s.phase == SplitPhase::Begun)
        {
            self.record_phase(split, SplitPhase::Abandoned, |s| {
                s.reason = Some(reason.to_string())
            });
        }
        let paths: Vec<PathBuf> = halves.iter().map(|h| h.path.clone()).collect();
        let ids: Vec<String> = split.halves.clone();
        drop(halves);
        self.remove_halves(&split.pipeline, &ids, &paths);
        self.parts.peers.unrelease(&split.partition);
        self.parts.supervisor.follow_assignments(&split.pipeline);
    }

    /// Removes the databases of halves that never ran.
    pub(super) fn remove_halves(&self, pipeline: &str, ids: &[String], extra: &[PathBuf]) {
        let mut paths: Vec<PathBuf> = ids
            .iter()
            .map(|id| self.parts.supervisor.partition_path(pipeline, id))
            .collect();
        paths.extend(extra.iter().cloned());
        for p in paths {
            if self
                .parts
                .peers
                .running(p.file_name().and_then(|n| n.to_str()).unwrap_or(""))
                .is_none()
                && p.exists()
                && let Err(e) = std::fs::remove_dir_all(&p)
            {
                tracing::warn!("removing {}: {e}", p.display());
            }
        }
    }

    /// Waits for the first guest call of each of `ids`, named `names` in the pause's steps (or a
    /// first fetch that found nothing for a while); answers the latest. The first one's session
    /// steps join `marks`.
    pub(super) fn wait_first_calls(
        &self,
        what: &str,
        ids: &[String],
        names: &[&'static str],
        marks: &mut Vec<(&'static str, Instant)>,
    ) -> Option<Instant> {
        let until = Instant::now() + FIRST_CALL_TIMEOUT;
        let mut ready: Vec<Option<Instant>> = vec![None; ids.len()];
        while Instant::now() < until {
            for (i, id) in ids.iter().enumerate() {
                if ready[i].is_some() {
                    continue;
                }
                let Some(h) = self.parts.peers.running(id) else {
                    continue;
                };
                let call = *h.status.first_call.lock();
                let idle = h
                    .status
                    .first_fetch
                    .lock()
                    .filter(|t| t.elapsed() > IDLE_AFTER);
                if let Some(t) = call.or(idle) {
                    ready[i] = Some(t);
                    if i == 0 {
                        marks.extend(h.status.steps.lock().iter().copied());
                    }
                    marks.push((names[i.min(names.len() - 1)], t));
                }
            }
            if ready.iter().all(Option::is_some) {
                return ready.into_iter().flatten().max();
            }
            if self.parts.stop.load(Ordering::Relaxed) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        tracing::warn!("{what}: no first guest call within 30 s");
        None
    }

    /// After the halves run: removes the retired partition's database, then compacts each
    /// half's dropped range on a thread of its own, one half at a time, and records the disk
    /// reclaimed.
    fn reclaim_later(&self, split: &SplitRecord, halves: Vec<Half>, partition: &str) {
        let old = self
            .parts
            .supervisor
            .partition_path(&split.pipeline, partition);
        let (me, split) = (self.me.clone(), split.clone());
        let spawned = std::thread::Builder::new()
            .name("baton-split-reclaim".into())
            .spawn(move || {
                let Some(s) = me.upgrade() else { return };
                // The retired partition's files live on in the halves' hard links.
                if s.parts.peers.running(&split.partition).is_none()
                    && let Err(e) = std::fs::remove_dir_all(&old)
                {
                    tracing::warn!("removing the retired {}: {e}", old.display());
                }
                let mut reclaimed = 0u64;
                for h in &halves {
                    let before = dir_bytes(&h.path);
                    if let Err(e) = h.db.compact_dropped(h.slots.clone()) {
                        tracing::warn!(half = %h.id, "compacting the other half's data away: {e}");
                    }
                    reclaimed += before.saturating_sub(dir_bytes(&h.path));
                }
                drop(halves);
                tracing::info!(split = %split.id, reclaimed, "the halves dropped each other's data");
                s.record_phase(&split, SplitPhase::Done, |r| {
                    r.reclaimed_bytes = Some(reclaimed)
                });
            });
        if let Err(e) = spawned {
            tracing::error!("starting a split's compaction: {e}");
        }
    }

    /// What a split record means for this host once it took effect: the halves of a done
    /// split start (on its owner) and the retired partition stops; a standby here follows.
    pub(crate) fn on_split(&self, s: &SplitRecord) {
        if s.phase == SplitPhase::Done && s.pause_ms.is_none() && s.reclaimed_bytes.is_none() {
            self.parts.supervisor.follow_assignments(&s.pipeline);
        }
    }

    /// After a restart: splits this host had begun and not done are given up (the process that
    /// made them is gone), and their halves' leftovers removed.
    pub(crate) fn settle_splits_left_by_restart(&self) {
        let left: Vec<SplitRecord> = {
            let catalog = self.parts.catalog.lock();
            catalog
                .pipelines
                .values()
                .filter_map(|p| p.layout.as_ref())
                .flat_map(|l| l.splits.iter())
                .filter(|s| s.phase == SplitPhase::Begun && s.owner == self.parts.host_id)
                .cloned()
                .collect()
        };
        for s in left {
            tracing::warn!(split = %s.id, partition = %s.partition, "a split was under way when this host stopped: given up");
            self.record_phase(&s, SplitPhase::Abandoned, |r| {
                r.reason = Some(format!(
                    "the owner `{}` restarted during the split",
                    self.parts.host_id
                ))
            });
            self.remove_halves(&s.pipeline, &s.halves, &[]);
        }
    }

    /// The controller's part: a split whose owner left, whose partition changed owner, or that
    /// stayed begun too long, is given up.
    pub(crate) fn stale_splits(&self, alive: &[String]) -> Vec<(SplitRecord, String)> {
        let catalog = self.parts.catalog.lock();
        let mut stale = Vec::new();
        for p in catalog.pipelines.values() {
            let Some(layout) = &p.layout else { continue };
            for s in layout
                .splits
                .iter()
                .filter(|s| s.phase == SplitPhase::Begun)
            {
                let a = catalog.assignments.get(&s.partition);
                let changed = a.is_some_and(|a| a.owner != s.owner || a.epoch != s.epoch);
                let why = stale_reason(alive, &s.owner, changed, s.at);
                if let Some(why) = why {
                    stale.push((s.clone(), why));
                }
            }
        }
        stale
    }
}

/// Reads `half`'s changelogs with `tail` to where the `stopped` partitions (each after its
/// final commit) hold them: the last records of their slots. They become readable once the
/// final transactions are complete, which the broker's ends for committed reads say first
/// (a fetch asked for them earlier waits out its long poll).
pub(super) fn catch_up(
    half: &Half,
    tail: &mut Tail,
    stopped: &[&PartitionDb],
    marks: &mut Vec<(&'static str, Instant)>,
) -> std::result::Result<(), String> {
    for db in stopped {
        tail.expect_ends(db)
            .map_err(|e| format!("reading the final changelog positions: {e:#}"))?;
    }
    if !tail.caught_up() {
        tail.wait_stable(Instant::now() + CATCH_UP_IDLE)
            .map_err(|e| format!("waiting for the final changelog records: {e:#}"))?;
        marks.push(("stable", Instant::now()));
        tail.read_to_end(&half.db, CATCH_UP_IDLE, &mut |_| {})
            .map_err(|e| format!("reading the last changelog records: {e:#}"))?;
    }
    Ok(())
}

/// How long a half's catch-up may go without a record while records are still to be read.
pub(super) const CATCH_UP_IDLE: Duration = Duration::from_secs(10);

/// The slot that halves `handle`'s load: per slot, the records processed over
/// [`LOAD_SAMPLE`] (what waits, when nothing was processed), and the middle when idle.
fn halving_slot(handle: &PartitionHandle, slots: [u32; 2]) -> u32 {
    let sample = || -> std::collections::BTreeMap<u32, (u64, u64)> {
        let mut m = std::collections::BTreeMap::new();
        for p in handle.status.progress.lock().iter() {
            let e = m.entry(p.slot).or_insert((0, 0));
            e.0 += p.offset;
            e.1 += p.end.saturating_sub(p.offset);
        }
        m
    };
    let before = sample();
    std::thread::sleep(LOAD_SAMPLE);
    let after = sample();
    let mut load: Vec<u64> = (slots[0]..slots[1])
        .map(|s| {
            let a = after.get(&s).map_or(0, |x| x.0);
            let b = before.get(&s).map_or(0, |x| x.0);
            a.saturating_sub(b)
        })
        .collect();
    if load.iter().all(|l| *l == 0) {
        load = (slots[0]..slots[1])
            .map(|s| after.get(&s).map_or(0, |x| x.1))
            .collect();
    }
    split_point(slots, &load)
}

/// The slot strictly inside `slots` where the running sum of `load` (one per slot) comes
/// closest to half its total; the middle when the total is 0.
pub fn split_point(slots: [u32; 2], load: &[u64]) -> u32 {
    let total: u64 = load.iter().sum();
    if total == 0 {
        return slots[0] + (slots[1] - slots[0]) / 2;
    }
    let mut best = (u64::MAX, slots[0] + 1);
    let mut left = 0u64;
    for (i, l) in load.iter().enumerate().take(load.len().saturating_sub(1)) {
        left += l;
        let off = (2 * left).abs_diff(total);
        if off < best.0 {
            best = (off, slots[0] + i as u32 + 1);
        }
    }
    best.1
}

/// Why the controller gives up a split or merge that `owner` began at `at` (ms), if it does:
/// its owner left the cluster, a partition of it `changed` owner or epoch, or it stayed begun
/// longer than [`SPLIT_TIMEOUT`].
pub(super) fn stale_reason(
    alive: &[String],
    owner: &str,
    changed: bool,
    at: i64,
) -> Option<String> {
    if !alive.iter().any(|h| h == owner) {
        Some(format!("the owner `{owner}` left the cluster"))
    } else if changed {
        Some("a partition of it changed owner".to_string())
    } else if now_ms() - at > SPLIT_TIMEOUT.as_millis() as i64 {
        Some(format!(
            "not done within {} s of its start",
            SPLIT_TIMEOUT.as_secs()
        ))
    } else {
        None
    }
}

/// The pause from `from` to `to` (ms), and its steps: the time between each of `marks` (in
/// time order) and the one before it, from `from` on.
pub(super) fn pause_steps(
    from: Instant,
    to: Instant,
    mut marks: Vec<(&'static str, Instant)>,
) -> (f64, Vec<MoveStep>) {
    marks.sort_by_key(|(_, t)| *t);
    let mut steps = Vec::new();
    let mut prev = from;
    for (step, t) in marks {
        steps.push(MoveStep {
            step: step.to_string(),
            ms: t.saturating_duration_since(prev).as_secs_f64() * 1e3,
        });
        prev = prev.max(t);
    }
    (
        to.saturating_duration_since(from).as_secs_f64() * 1e3,
        steps,
    )
}

/// Bytes of the files in `dir` (not below).
pub(super) fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_point_halves_the_load() {
        assert_eq!(split_point([0, 8], &[0; 8]), 4);
        assert_eq!(split_point([4, 6], &[5, 5]), 5);
        // One hot slot first: it goes alone.
        assert_eq!(split_point([0, 4], &[100, 1, 1, 1]), 1);
        assert_eq!(split_point([0, 4], &[1, 1, 1, 100]), 3);
        assert_eq!(split_point([2, 6], &[10, 10, 10, 10]), 4);
    }
}
