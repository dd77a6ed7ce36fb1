//! Standby replicas: for a pipeline with `standbys: N`, the controller names N hosts besides
//! the owner of each partition (in its assignment). Each of them keeps a warm copy of the
//! partition's state: it tails the changelogs into its own RocksDB, as a move's warming replica
//! does, and never processes. When the owner leaves, the controller gives the partition to its
//! first live standby, whose session then restores only the last records.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::app::Baton;
use crate::cluster::moves::Replica;
use crate::http::model::Role;
use crate::partition::tail::Tail;

/// A standby's thread and its stop flag.
pub struct StandbyRun {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Baton {
    /// The partitions this host should keep a standby of: named in their assignment, not
    /// owned here, with no move to this host under way, of a pipeline known here.
    pub(crate) fn wanted_standbys(&self) -> BTreeMap<String, (String, [u32; 2])> {
        let catalog = self.catalog.lock();
        catalog
            .assignments
            .values()
            .filter(|a| {
                a.owner != self.host_id
                    && a.standbys.contains(&self.host_id)
                    && catalog.pipelines.contains_key(&a.pipeline)
                    && catalog
                        .move_under_way(&a.partition)
                        .is_none_or(|m| m.to != self.host_id)
            })
            .map(|a| (a.partition.clone(), (a.pipeline.clone(), a.slots)))
            .collect()
    }

    /// Starts and stops this host's standbys to match the assignments. A standby of a partition
    /// this host now owns stops (and its thread ends) before the partition starts here.
    pub(crate) fn follow_standbys(&self) {
        if self.kafka.is_none() {
            return;
        }
        let wanted = self.wanted_standbys();
        let stale: Vec<String> = self
            .standbys
            .lock()
            .keys()
            .filter(|p| !wanted.contains_key(*p))
            .cloned()
            .collect();
        for p in stale {
            self.stop_standby(&p);
        }
        for (partition, (pipeline, slots)) in wanted {
            let running = self
                .standbys
                .lock()
                .get(&partition)
                .is_some_and(|r| !r.thread.is_finished());
            if running {
                continue;
            }
            self.stop_standby(&partition);
            let stop = Arc::new(AtomicBool::new(false));
            let (me, flag, p) = (self.me.clone(), stop.clone(), partition.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("baton-standby-{partition}"))
                .spawn(move || run_standby(me, &p, &pipeline, slots, &flag));
            match spawned {
                Ok(thread) => {
                    tracing::info!(%partition, "keeping a standby");
                    self.standbys
                        .lock()
                        .insert(partition, StandbyRun { stop, thread });
                }
                Err(e) => tracing::error!(%partition, "starting a standby: {e}"),
            }
        }
    }

    /// Stops this host's standby of `partition`, if any, and waits for its thread.
    pub(crate) fn stop_standby(&self, partition: &str) {
        let run = self.standbys.lock().remove(partition);
        if let Some(run) = run {
            run.stop.store(true, Ordering::Relaxed);
            let _ = run.thread.join();
            let mut replicas = self.replicas.write();
            if replicas
                .get(partition)
                .is_some_and(|r| r.role == Role::Standby)
            {
                replicas.remove(partition);
            }
            tracing::info!(partition, "standby stopped");
        }
    }
}

/// A standby's loop: tails the partition's changelogs into its RocksDB here until stopped,
/// starting over after an error.
fn run_standby(
    me: std::sync::Weak<Baton>,
    partition: &str,
    pipeline: &str,
    slots: [u32; 2],
    stop: &AtomicBool,
) {
    let stopped =
        |b: &Baton| stop.load(Ordering::Relaxed) || b.background_stop.load(Ordering::Relaxed);
    loop {
        let Some(b) = me.upgrade() else { return };
        if stopped(&b) {
            return;
        }
        let outcome = (|| -> anyhow::Result<()> {
            let kafka = b.kafka.clone().ok_or_else(|| anyhow::anyhow!("no Kafka"))?;
            b.check_state_disk(partition).map_err(anyhow::Error::msg)?;
            let record = b
                .catalog
                .lock()
                .pipelines
                .get(pipeline)
                .cloned()
                .ok_or_else(|| anyhow::anyhow!("pipeline `{pipeline}` is gone"))?;
            let path = b.partition_path(pipeline, partition);
            let db = b.state.open_shared(&path, &record.spec.state_stores())?;
            let mut tail = Tail::open(&kafka, &record, slots[0]..slots[1], &db)?;
            let replica = Arc::new(Replica::new(partition, Role::Standby, tail.behind()));
            b.replicas
                .write()
                .insert(partition.to_string(), replica.clone());
            let mut refreshed = Instant::now() - Duration::from_secs(1);
            while !stopped(&b) {
                tail.poll(&db, Duration::from_millis(100))?;
                if refreshed.elapsed() >= Duration::from_secs(1) {
                    replica.behind.store(tail.refresh()?, Ordering::Relaxed);
                    refreshed = Instant::now();
                    // Not wanted any more (the pipeline went, say): ends by itself.
                    if !b.wanted_standbys().contains_key(partition) {
                        break;
                    }
                }
            }
            tail.close_in_background();
            let mut replicas = b.replicas.write();
            if replicas
                .get(partition)
                .is_some_and(|r| r.role == Role::Standby)
            {
                replicas.remove(partition);
            }
            Ok(())
        })();
        // Stopped, or not wanted any more.
        if let Err(e) = outcome {
            if !b.wanted_standbys().contains_key(partition) {
                return;
            }
            tracing::warn!(partition, "standby: {e:#}; starting over in 5 s");
            drop(b);
            let until = Instant::now() + Duration::from_secs(5);
            while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
        } else {
            return;
        }
    }
}
