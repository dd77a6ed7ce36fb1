//! Standby replicas: for a pipeline with `standbys: N`, the controller names N hosts besides
//! the owner of each partition (in its assignment). Each of them keeps a warm copy of the
//! partition's state: it tails the changelogs into its own RocksDB, as a move's warming replica
//! does, and never processes. When the owner leaves, the controller gives the partition to its
//! first live standby, whose session then restores only the last records.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::control::Catalog;
use crate::partition::peers::{Peers, Replica, Standby};
use crate::partition::tail::Tail;
use crate::state::StateEnv;
use crate::transport::kafka::KafkaTransport;

/// Refuses a replica of a partition when this host's disk bound would break, with the reason.
pub type DiskCheck = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// This host's standby replicas. Narrow handles: the catalog says which partitions want one
/// here, the peers keep them, the state environment opens their databases.
pub struct Standbys {
    host_id: String,
    catalog: Arc<Mutex<Catalog>>,
    peers: Arc<Peers>,
    /// `None` on the embedded log, where a host has no standbys.
    kafka: Option<Arc<KafkaTransport>>,
    state: Arc<StateEnv>,
    /// `<data dir>/state`: a partition's database is `<pipeline>/<partition>` under it.
    state_dir: PathBuf,
    /// The host stops.
    stopping: Arc<AtomicBool>,
    check_disk: DiskCheck,
    me: Weak<Standbys>,
}

impl Standbys {
    /// The standbys of host `host_id`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        host_id: String,
        catalog: Arc<Mutex<Catalog>>,
        peers: Arc<Peers>,
        kafka: Option<Arc<KafkaTransport>>,
        state: Arc<StateEnv>,
        state_dir: PathBuf,
        stopping: Arc<AtomicBool>,
        check_disk: DiskCheck,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Standbys {
            host_id,
            catalog,
            peers,
            kafka,
            state,
            state_dir,
            stopping,
            check_disk,
            me: me.clone(),
        })
    }

    /// The partitions this host should keep a standby of: named in their assignment, not
    /// owned here, with no move to this host under way, of a pipeline known here.
    pub(crate) fn wanted(&self) -> BTreeMap<String, (String, [u32; 2])> {
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
    pub(crate) fn follow(&self) {
        if self.kafka.is_none() {
            return;
        }
        let wanted = self.wanted();
        for p in self.peers.standbys() {
            if !wanted.contains_key(&p) {
                self.stop(&p);
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
    pub(crate) fn stop(&self, partition: &str) {
        if self.peers.stop_standby(partition) {
            tracing::info!(partition, "standby stopped");
        }
    }
}

/// A standby's loop: tails the partition's changelogs into its RocksDB here until stopped,
/// starting over after an error.
fn run_standby(
    me: Weak<Standbys>,
    replica: &Replica,
    pipeline: &str,
    slots: [u32; 2],
    stop: &AtomicBool,
) {
    let partition = replica.partition.as_str();
    let stopped = |b: &Standbys| stop.load(Ordering::Relaxed) || b.stopping.load(Ordering::Relaxed);
    loop {
        let Some(b) = me.upgrade() else { return };
        if stopped(&b) {
            return;
        }
        let outcome = (|| -> anyhow::Result<()> {
            let kafka = b.kafka.clone().ok_or_else(|| anyhow::anyhow!("no Kafka"))?;
            (b.check_disk)(partition).map_err(anyhow::Error::msg)?;
            let record = b
                .catalog
                .lock()
                .pipelines
                .get(pipeline)
                .cloned()
                .ok_or_else(|| anyhow::anyhow!("pipeline `{pipeline}` is gone"))?;
            let path = b.state_dir.join(pipeline).join(partition);
            let (db, _) = b.state.open_partition_db(
                &path,
                &record.spec.state_stores(),
                &crate::state::checkpoint::PartitionRef::new(
                    &record.spec.name,
                    record.created_at,
                    partition,
                    slots,
                ),
            )?;
            let mut tail = Tail::open(&kafka, &record, slots[0]..slots[1], &db)?;
            replica.behind.store(tail.behind(), Ordering::Relaxed);
            let mut refreshed = Instant::now() - Duration::from_secs(1);
            while !stopped(&b) {
                tail.poll(&db, Duration::from_millis(100))?;
                if refreshed.elapsed() >= Duration::from_secs(1) {
                    replica.behind.store(tail.refresh()?, Ordering::Relaxed);
                    refreshed = Instant::now();
                    // Not wanted any more (the pipeline went, say): ends by itself.
                    if !b.wanted().contains_key(partition) {
                        break;
                    }
                }
            }
            tail.close_in_background();
            Ok(())
        })();
        // Stopped, or not wanted any more.
        if let Err(e) = outcome {
            if !b.wanted().contains_key(partition) {
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
