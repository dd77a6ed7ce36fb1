//! `Checkpoints`: the checkpoints of the partitions this host runs, on their pipeline's
//! `checkpoint_interval_s` and on demand, into the host's checkpoint store
//! ([`crate::state::checkpoint`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::peers::Peers;
use super::status::Phase;
use super::supervisor::PartitionHandle;
use crate::control::Catalog;
use crate::error::{Error, Result};
use crate::state::checkpoint::{CheckpointInfo, CheckpointStore, PartitionRef};

/// How often the scheduler looks for partitions whose checkpoint is due.
const TICK: Duration = Duration::from_secs(1);
/// How long a checkpoint on demand waits for the partition to commit what is pending.
const FLUSH_WAIT: Duration = Duration::from_secs(30);
/// How long a rewind waits for the partition to reach a batch boundary and commit it.
const REWIND_WAIT: Duration = Duration::from_secs(300);

/// What a rewind of a partition did.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct RewindReport {
    /// The partition.
    pub partition: String,
    /// The checkpoint it was put back to.
    pub seq: u64,
    /// When that checkpoint was taken (ms since the epoch).
    pub taken_at: i64,
    /// Keys put back to the checkpoint's values (or deleted).
    pub keys: u64,
    /// Where its input goes on from: `<topic>/<slot>` to the next offset.
    pub input_offsets: std::collections::BTreeMap<String, u64>,
}

/// Seconds after it starts that a half of a split or a merged partition with no checkpoint of
/// its own gets its first (or its interval, when shorter).
const FIRST_AFTER_RESHAPE_S: u64 = 5;

/// The checkpoints of this host's partitions.
pub struct Checkpoints {
    store: Arc<CheckpointStore>,
    peers: Arc<Peers>,
    catalog: Arc<Mutex<Catalog>>,
    host_id: String,
    steps: Arc<crate::steps::Steps>,
    /// Per partition: when this host started it or last checkpointed it, for the interval.
    last: Mutex<HashMap<String, (Arc<super::status::PartitionStatus>, Instant)>>,
    stop: Arc<AtomicBool>,
}

impl Checkpoints {
    /// Checkpoints of `peers`' partitions into `store`, with their pipelines from `catalog`.
    pub fn new(
        store: Arc<CheckpointStore>,
        peers: Arc<Peers>,
        catalog: Arc<Mutex<Catalog>>,
        host_id: String,
        steps: Arc<crate::steps::Steps>,
    ) -> Arc<Self> {
        Arc::new(Checkpoints {
            store,
            peers,
            catalog,
            host_id,
            steps,
            last: Default::default(),
            stop: Default::default(),
        })
    }

    /// The store.
    pub fn store(&self) -> &Arc<CheckpointStore> {
        &self.store
    }

    /// Starts the thread that takes the checkpoints that are due, until [`Checkpoints::stop`].
    pub fn start(self: &Arc<Self>) -> std::io::Result<std::thread::JoinHandle<()>> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("baton-checkpoints".into())
            .spawn(move || {
                while !me.stop.load(Ordering::Relaxed) {
                    me.take_due();
                    std::thread::sleep(TICK);
                }
            })
    }

    /// Stops the scheduler thread after its current checkpoint.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// The partition's pipeline's interval, and the partition as its checkpoints name it.
    fn of(&self, h: &PartitionHandle) -> Option<(u64, PartitionRef)> {
        let catalog = self.catalog.lock();
        let record = catalog.pipelines.get(&h.pipeline)?;
        Some((
            record.spec.checkpoint_interval_s(),
            PartitionRef::new(
                &record.spec.name,
                record.created_at,
                &h.id,
                [h.slots.start, h.slots.end],
            ),
        ))
    }

    /// Takes a checkpoint of each running partition whose interval has passed since it
    /// started here or was last checkpointed.
    fn take_due(&self) {
        for h in self.peers.handles() {
            if h.stopping() || !matches!(*h.status.phase.lock(), Phase::Running) {
                continue;
            }
            let Some((interval, p)) = self.of(&h) else {
                continue;
            };
            if !self.seen(&h) {
                self.store.forget(&p);
                // Started here since the last look: its interval runs from the newest
                // checkpoint in the store, which the partition table shows until the next. A
                // half of a split or a merged partition with none yet gets its first soon:
                // until then a failover of it restores from the changelogs alone.
                let since = self.newest(&h, &p).unwrap_or_else(|| {
                    let first_in = if self.reshaped(&h) {
                        Duration::from_secs(interval.min(FIRST_AFTER_RESHAPE_S))
                    } else {
                        Duration::from_secs(interval)
                    };
                    Instant::now()
                        .checked_sub(Duration::from_secs(interval).saturating_sub(first_in))
                        .unwrap_or_else(Instant::now)
                });
                self.last
                    .lock()
                    .insert(h.id.clone(), (h.status.clone(), since));
            }
            let due = self.last.lock().get(&h.id).is_some_and(|(_, at)| {
                interval > 0 && at.elapsed() >= Duration::from_secs(interval)
            });
            if due {
                if let Err(e) = self.take(&h, &p) {
                    tracing::warn!(partition = %h.id, "checkpoint: {e}");
                }
            } else if interval > 0 {
                // Between checkpoints, what compactions wrote goes to the store as it appears,
                // so that the next checkpoint has little left to upload.
                match self.store.upload_ahead(&h.db, &p) {
                    Ok(0) => {}
                    Ok(bytes) => tracing::debug!(partition = %h.id, bytes, "uploaded ahead"),
                    Err(e) => {
                        tracing::warn!(partition = %h.id, "upload ahead of a checkpoint: {e}")
                    }
                }
            }
        }
        // Forget the partitions no longer here.
        let here: std::collections::HashSet<String> =
            self.peers.handles().iter().map(|h| h.id.clone()).collect();
        self.last.lock().retain(|id, _| here.contains(id));
    }

    /// Whether the partition is a half of a split or the result of a merge.
    fn reshaped(&self, h: &PartitionHandle) -> bool {
        let catalog = self.catalog.lock();
        let Some(layout) = catalog
            .pipelines
            .get(&h.pipeline)
            .and_then(|r| r.layout.as_ref())
        else {
            return false;
        };
        layout.splits.iter().any(|s| s.halves.contains(&h.id))
            || layout
                .merges
                .iter()
                .any(|m| m.merged.as_deref() == Some(h.id.as_str()))
    }

    /// When the partition's newest checkpoint in the store was taken (now, when the store
    /// cannot say; `None` when it has none), and it goes in the partition's status.
    fn newest(&self, h: &PartitionHandle, p: &PartitionRef) -> Option<Instant> {
        let manifests = match self.store.manifests(p) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(partition = %h.id, "checkpoint store: {e}");
                return Some(Instant::now());
            }
        };
        let newest = manifests.last()?;
        h.status
            .last_checkpoint
            .lock()
            .get_or_insert_with(|| newest.info(manifests.len()));
        let age = crate::control::now_ms()
            .saturating_sub(newest.taken_at)
            .max(0) as u64;
        Some(
            Instant::now()
                .checked_sub(Duration::from_millis(age))
                .unwrap_or_else(Instant::now),
        )
    }

    fn take(&self, h: &PartitionHandle, p: &PartitionRef) -> Result<CheckpointInfo> {
        let taken = self.take_inner(h, p);
        match &taken {
            Ok(info) => {
                h.status.checkpoints.fetch_add(1, Ordering::Relaxed);
                h.status
                    .checkpoint_uploaded_bytes
                    .fetch_add(info.uploaded_bytes, Ordering::Relaxed);
                *h.status.checkpoint_error.lock() = None;
            }
            Err(e) => {
                h.status.checkpoint_failures.fetch_add(1, Ordering::Relaxed);
                *h.status.checkpoint_error.lock() = Some(e.to_string());
                // The next try waits for a full interval, not a tick.
                self.last
                    .lock()
                    .insert(h.id.clone(), (h.status.clone(), Instant::now()));
            }
        }
        taken
    }

    fn take_inner(&self, h: &PartitionHandle, p: &PartitionRef) -> Result<CheckpointInfo> {
        let hold = |seq: u64| {
            self.steps
                .pass(crate::steps::CHECKPOINT_UPLOAD, &format!("{}/{seq}", h.id))
        };
        let info = self
            .store
            .take_with(&h.db, p, &self.host_id, &hold)
            .map_err(|e| Error::Unavailable(format!("checkpoint of `{}`: {e}", h.id)))?;
        tracing::info!(
            partition = %h.id,
            seq = info.seq,
            ms = info.duration_ms,
            uploaded = info.uploaded_bytes,
            reused = info.files_reused,
            "checkpoint taken"
        );
        *h.status.last_checkpoint.lock() = Some(info.clone());
        self.last
            .lock()
            .insert(h.id.clone(), (h.status.clone(), Instant::now()));
        Ok(info)
    }

    /// Partition `id` running on this host, with its checkpoints' name for it.
    fn running(&self, id: &str) -> Result<(Arc<PartitionHandle>, PartitionRef)> {
        let h = self
            .peers
            .handles()
            .into_iter()
            .find(|h| h.id == id && !h.stopping())
            .ok_or_else(|| {
                Error::NotFound(format!("partition `{id}` does not run on this host"))
            })?;
        let (_, p) = self
            .of(&h)
            .ok_or_else(|| Error::NotFound(format!("the pipeline of `{id}` is gone")))?;
        Ok((h, p))
    }

    /// Puts partition `id`, which runs here, back to its retained checkpoint `seq`: its state
    /// and input offsets, committed over the partition's at a batch boundary (the changelogs and
    /// the consumer group too); it then processes again from the checkpoint's offsets.
    pub fn rewind(&self, id: &str, seq: u64) -> Result<RewindReport> {
        let (h, p) = self.running(id)?;
        let manifests = self
            .store
            .manifests(&p)
            .map_err(|e| Error::Unavailable(e.to_string()))?;
        let Some(m) = manifests.iter().find(|m| m.seq == seq) else {
            let retained: Vec<u64> = manifests.iter().map(|m| m.seq).collect();
            return Err(Error::NotFound(format!(
                "partition `{id}` has no checkpoint {seq}; retained: {retained:?}"
            )));
        };
        let dir = h.db.path().with_extension("rewind");
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| Error::Internal(format!("{}: {e}", dir.display())))?;
        }
        let restored = self
            .store
            .restore_from(&p, h.db.stores(), &dir, Some(seq))
            .map_err(|e| Error::Unavailable(e.to_string()))?;
        if restored.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(Error::Conflict(format!(
                "checkpoint {seq} of `{id}` does not restore (its files are missing or fail \
                 their CRC-32; the host's log says which)"
            )));
        }
        let (reply, answer) = std::sync::mpsc::channel();
        let sent = h.send(super::commands::Command::Rewind(Box::new(
            super::commands::Rewind {
                seq,
                dir: dir.clone(),
                input_offsets: m.input_offsets.clone(),
                reply,
            },
        )));
        let answered = if sent {
            answer.recv_timeout(REWIND_WAIT).map_err(|_| {
                Error::Unavailable(format!(
                    "partition `{id}` did not rewind within {REWIND_WAIT:?}"
                ))
            })
        } else {
            Err(Error::Conflict(format!("partition `{id}` stopped")))
        };
        let _ = std::fs::remove_dir_all(&dir);
        let keys = answered?.map_err(|e| Error::Unavailable(format!("rewind of `{id}`: {e}")))?;
        Ok(RewindReport {
            partition: id.to_string(),
            seq,
            taken_at: m.taken_at,
            keys,
            input_offsets: m.input_offsets.clone(),
        })
    }

    /// Takes a checkpoint of partition `id`, which runs here, now: what is pending commits
    /// first, so that the checkpoint holds every record processed until the call.
    pub fn take_now(&self, id: &str) -> Result<CheckpointInfo> {
        let (h, p) = self.running(id)?;
        if !matches!(*h.status.phase.lock(), Phase::Running) {
            return Err(Error::Conflict(format!(
                "partition `{id}` is not running yet (restoring or recovering): try again"
            )));
        }
        if h.flush(FLUSH_WAIT).is_none() {
            return Err(Error::Unavailable(format!(
                "partition `{id}` did not commit within {FLUSH_WAIT:?}"
            )));
        }
        if !self.seen(&h) {
            self.store.forget(&p);
        }
        self.take(&h, &p)
    }

    /// Whether `h` is the session of its partition this scheduler saw last: not when the
    /// partition started here since (again, perhaps, after running elsewhere).
    fn seen(&self, h: &PartitionHandle) -> bool {
        self.last
            .lock()
            .get(&h.id)
            .is_some_and(|(status, _)| Arc::ptr_eq(status, &h.status))
    }
}
