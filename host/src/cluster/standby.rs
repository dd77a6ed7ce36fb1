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
use crate::partition::peers::{Replica, Standby};
use crate::partition::tail::Tail;

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

    /// Starts and stops this host's standbys to match the assignments. A partition with
    /// another peer here (it runs, warms or is released here) gets no standby; a standby of a
    /// partition that starts here is stopped and joined by the session's start.
    pub(crate) fn follow_standbys(&self) {
        if !self.log.is_kafka() {
            return;
        }
        let wanted = self.wanted_standbys();
        for p in self.peers.standbys() {
            if !wanted.contains_key(&p) {
                self.stop_standby(&p);
            }
        }
        for (partition, (pipeline, slots)) in wanted {
            let started = self.peers.keep_standby(&partition, |replica| {
                let stop = Arc::new(AtomicBool::new(false));
                let (me, flag, r) = (self.me.clone(), stop.clone(), replica.clone());
                let thread = std::thread::Builder::new()
                    .name(format!("baton-standby-{partition}"))
                    .spawn(move || run_standby(me, &r, &pipeline, slots, &flag))?;
                Ok(Standby {
                    replica,
                    stop,
                    thread,
                })
            });
            match started {
                Ok(true) => tracing::info!(%partition, "keeping a standby"),
                Ok(false) => {}
                Err(e) => tracing::error!(%partition, "starting a standby: {e}"),
            }
        }
    }

    /// Stops this host's standby of `partition`, if any, and waits for its thread.
    pub(crate) fn stop_standby(&self, partition: &str) {
        if self.peers.stop_standby(partition) {
            tracing::info!(partition, "standby stopped");
        }
    }
}

/// A standby's loop: tails the partition's changelogs into its RocksDB here until stopped,
/// starting over after an error.
fn run_standby(
    me: std::sync::Weak<Baton>,
    replica: &Replica,
    pipeline: &str,
    slots: [u32; 2],
    stop: &AtomicBool,
) {
    let partition = replica.partition.as_str();
    let stopped =
        |b: &Baton| stop.load(Ordering::Relaxed) || b.background_stop.load(Ordering::Relaxed);
    loop {
        let Some(b) = me.upgrade() else { return };
        if stopped(&b) {
            return;
        }
        let outcome = (|| -> anyhow::Result<()> {
            let kafka = b
                .log
                .as_kafka()
                .cloned()
                .ok_or_else(|| anyhow::anyhow!("no Kafka"))?;
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
            replica.behind.store(tail.behind(), Ordering::Relaxed);
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
