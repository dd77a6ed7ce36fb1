//! What this host is for each partition: one **peer** per partition, in exactly one state
//! ([`PeerState`]): `Standby`, `Warming`, `TakingOver`, `Starting`, `Running`, `Released`, or
//! `Stopped` (no entry). docs/ARCHITECTURE.md ("Peers") tables what each state runs and how it
//! is left.
//!
//! Being active and warming at once, or running two loops for one partition, cannot be
//! represented: a partition has one entry. Every change of state goes through a transition
//! below, checked against [`TRANSITIONS`]; a session starts only once the replica before it
//! has written its last record into the partition's database.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::partition::kafka::Prepared;
use crate::partition::report::{ReplicaInfo, Role};
use crate::partition::supervisor::PartitionHandle;
use crate::partition::tail::Tail;

/// A peer's state, without what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PeerState {
    /// Nothing of the partition runs here.
    Stopped,
    /// A standby replica.
    Standby,
    /// A move's target, warming.
    Warming,
    /// A move's target whose take-over won in the control log; its session is next.
    TakingOver,
    /// A session is being started.
    Starting,
    /// A session processes the partition.
    Running,
    /// Drained and released for a move.
    Released,
}

impl PeerState {
    /// The state's name, as the architecture document writes it.
    pub fn name(self) -> &'static str {
        match self {
            PeerState::Stopped => "Stopped",
            PeerState::Standby => "Standby",
            PeerState::Warming => "Warming",
            PeerState::TakingOver => "TakingOver",
            PeerState::Starting => "Starting",
            PeerState::Running => "Running",
            PeerState::Released => "Released",
        }
    }
}

/// Every transition a peer may take, with what makes it. Anything else is refused.
pub const TRANSITIONS: &[(PeerState, PeerState, &str)] = {
    use PeerState::*;
    &[
        (Stopped, Standby, "an assignment names this host a standby"),
        (Stopped, Warming, "a move to this host begins"),
        (Stopped, Starting, "an assignment names this host the owner"),
        (
            Stopped,
            Released,
            "a restart finds this host's release of a move under way",
        ),
        (
            Standby,
            Stopped,
            "no assignment names this host a standby any more",
        ),
        (
            Standby,
            Warming,
            "a move to this host begins: the standby stops and is joined",
        ),
        (
            Standby,
            Starting,
            "promoted to owner: the standby stops and is joined",
        ),
        (Warming, Stopped, "the move is abandoned"),
        (
            Warming,
            TakingOver,
            "the release checked, before the take-over is recorded",
        ),
        (
            Warming,
            Starting,
            "assigned here otherwise (the owner died mid-move): the replica is superseded",
        ),
        (
            TakingOver,
            Starting,
            "the take-over counts: the session starts with the clients the target made ready",
        ),
        (
            TakingOver,
            Stopped,
            "the take-over lost in the log, or the session could not start",
        ),
        (Starting, Running, "the session's loop runs"),
        (Starting, Stopped, "the session could not start"),
        (
            Running,
            Running,
            "a new epoch, or a new loop after the last one ended",
        ),
        (
            Running,
            Released,
            "drained for a move, its release recorded",
        ),
        (
            Running,
            Stopped,
            "not assigned here any more, or the pipeline is deleted",
        ),
        (
            Released,
            Running,
            "the move was abandoned: the ending loop is joined, a new one starts",
        ),
        (
            Released,
            Stopped,
            "taken over by the move's target, or the pipeline is deleted",
        ),
    ]
};

/// Whether `from` may become `to`.
pub fn allowed(from: PeerState, to: PeerState) -> bool {
    TRANSITIONS.iter().any(|(f, t, _)| *f == from && *t == to)
}

/// A copy of a partition's state this host keeps up to date without processing it.
pub struct Replica {
    /// The partition.
    pub partition: String,
    /// `warming` (a move's target) or `standby`.
    pub role: Role,
    /// Changelog records not applied yet.
    pub behind: AtomicU64,
    /// Held while the replica writes into the partition's database.
    writing: Mutex<()>,
    /// Set when a session of the partition starts here: the replica writes nothing more into
    /// the database that session uses.
    superseded: AtomicBool,
}

impl Replica {
    pub(crate) fn new(partition: &str, role: Role) -> Self {
        Replica {
            partition: partition.to_string(),
            role,
            behind: AtomicU64::new(0),
            writing: Default::default(),
            superseded: Default::default(),
        }
    }

    /// Runs `write` (a write into the partition's database) unless a session of the partition
    /// started here; no session starts while it runs.
    pub(crate) fn write<T>(&self, write: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
        let _writing = self.writing.lock();
        if self.superseded.load(Ordering::Acquire) {
            return Err("a session of the partition started on this host meanwhile".into());
        }
        write()
    }

    /// Applies what `tail` reads into `db`, unless a session of the partition started here.
    pub(crate) fn poll(
        &self,
        tail: &mut Tail,
        db: &crate::state::PartitionDb,
        wait: Duration,
    ) -> Result<(), String> {
        self.write(|| {
            tail.poll(db, wait)
                .map(|_| ())
                .map_err(|e| format!("applying the changelogs: {e:#}"))
        })
    }

    /// Makes sure the replica writes nothing more: waits for a write under way to end.
    fn supersede(&self) {
        self.superseded.store(true, Ordering::Release);
        drop(self.writing.lock());
    }
}

/// A standby replica: its copy, its thread and the thread's stop flag.
pub struct Standby {
    /// The copy.
    pub replica: Arc<Replica>,
    /// Set to stop the thread.
    pub stop: Arc<AtomicBool>,
    /// The thread.
    pub thread: std::thread::JoinHandle<()>,
}

impl Standby {
    /// Stops the thread and waits for it: it writes nothing more.
    fn stop_and_join(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// One partition's peer on this host (see the module's table).
enum Peer {
    Standby(Standby),
    Warming(Arc<Replica>),
    TakingOver(Arc<Replica>, Box<Prepared>),
    Starting,
    Running(Arc<PartitionHandle>),
    Released {
        pipeline: String,
        handle: Option<Arc<PartitionHandle>>,
        since: Instant,
    },
}

impl Peer {
    fn state(&self) -> PeerState {
        match self {
            Peer::Standby(_) => PeerState::Standby,
            Peer::Warming(_) => PeerState::Warming,
            Peer::TakingOver(..) => PeerState::TakingOver,
            Peer::Starting => PeerState::Starting,
            Peer::Running(_) => PeerState::Running,
            Peer::Released { .. } => PeerState::Released,
        }
    }
}

/// What a session about to start gets from the peer it replaces.
#[derive(Default)]
pub(crate) struct Claim {
    /// The clients a move's target made ready.
    pub prepared: Option<Box<Prepared>>,
    /// The partition was taken over by this host's own assignment, just read back: its first
    /// ownership check needs no control-log catch-up.
    pub taken_over: bool,
}

/// What [`Peers::claim`] found.
pub(crate) enum Claimed {
    /// The partition runs here (its epoch may be newer now).
    Running(Arc<PartitionHandle>),
    /// Released for a move: nothing starts.
    Released,
    /// Nothing runs: a session is to start, and the peer is `Starting` until
    /// [`Peers::started`] or [`Peers::not_started`].
    Start(Claim),
}

/// The peers of this host, by partition id.
#[derive(Default)]
pub struct Peers {
    map: Mutex<BTreeMap<String, Peer>>,
}

impl Peers {
    /// The state of `partition`'s peer.
    pub fn state(&self, partition: &str) -> PeerState {
        self.map
            .lock()
            .get(partition)
            .map_or(PeerState::Stopped, Peer::state)
    }

    /// Sets `partition`'s peer, checking the transition.
    fn set(map: &mut BTreeMap<String, Peer>, partition: &str, to: Option<Peer>) {
        let from = map.get(partition).map_or(PeerState::Stopped, Peer::state);
        let to_state = to.as_ref().map_or(PeerState::Stopped, Peer::state);
        assert!(
            allowed(from, to_state),
            "partition `{partition}`: no transition from {from:?} to {to_state:?}"
        );
        match to {
            Some(p) => {
                map.insert(partition.to_string(), p);
            }
            None => {
                map.remove(partition);
            }
        }
    }

    /// The session of `partition` running here (its loop may be ending).
    pub fn running(&self, partition: &str) -> Option<Arc<PartitionHandle>> {
        match self.map.lock().get(partition) {
            Some(Peer::Running(h)) => Some(h.clone()),
            _ => None,
        }
    }

    /// Every session here, running or released with its loop not yet forgotten.
    pub fn handles(&self) -> Vec<Arc<PartitionHandle>> {
        self.map
            .lock()
            .values()
            .filter_map(|p| match p {
                Peer::Running(h) => Some(h.clone()),
                Peer::Released { handle, .. } => handle.clone(),
                _ => None,
            })
            .collect()
    }

    /// The copies kept here, as rows of the partition table.
    pub fn replicas(&self, host: &str) -> Vec<(String, ReplicaInfo)> {
        self.map
            .lock()
            .values()
            .filter_map(|p| match p {
                Peer::Warming(r) => Some(r.clone()),
                Peer::Standby(s) if !s.thread.is_finished() => Some(s.replica.clone()),
                _ => None,
            })
            .map(|r| {
                (
                    r.partition.clone(),
                    ReplicaInfo {
                        host: host.to_string(),
                        role: r.role,
                        lag: r.behind.load(Ordering::Relaxed),
                    },
                )
            })
            .collect()
    }

    /// Before a session of `partition` starts: answers what runs already, or makes the peer
    /// `Starting` once the replica before it (a standby, a warming replica) has written its
    /// last record, and hands over a take-over's clients.
    pub(crate) fn claim(&self, partition: &str) -> Claimed {
        let before = {
            let mut map = self.map.lock();
            match map.get(partition) {
                Some(Peer::Running(h)) => return Claimed::Running(h.clone()),
                Some(Peer::Released { .. }) => return Claimed::Released,
                Some(Peer::Starting) => unreachable!("sessions start one at a time"),
                _ => {}
            }
            let before = map.remove(partition);
            let from = before.as_ref().map_or(PeerState::Stopped, Peer::state);
            assert!(allowed(from, PeerState::Starting));
            map.insert(partition.to_string(), Peer::Starting);
            before
        };
        let mut claim = Claim::default();
        match before {
            Some(Peer::Standby(s)) => s.stop_and_join(),
            Some(Peer::Warming(r)) => r.supersede(),
            Some(Peer::TakingOver(_, p)) => {
                claim.prepared = Some(p);
                claim.taken_over = true;
            }
            _ => {}
        }
        Claimed::Start(claim)
    }

    /// The session claimed by [`Self::claim`] runs.
    pub(crate) fn started(&self, handle: Arc<PartitionHandle>) {
        let mut map = self.map.lock();
        let id = handle.id.clone();
        Self::set(&mut map, &id, Some(Peer::Running(handle)));
    }

    /// The session claimed by [`Self::claim`] could not start.
    pub(crate) fn not_started(&self, partition: &str) {
        let mut map = self.map.lock();
        if matches!(map.get(partition), Some(Peer::Starting)) {
            Self::set(&mut map, partition, None);
        }
    }

    /// Replaces the ended loop `old` of a running partition by `new`.
    pub(crate) fn restarted(&self, old: &Arc<PartitionHandle>, new: Arc<PartitionHandle>) {
        let mut map = self.map.lock();
        let id = new.id.clone();
        if let Some(Peer::Running(h)) = map.get(&id)
            && Arc::ptr_eq(h, old)
        {
            Self::set(&mut map, &id, Some(Peer::Running(new)));
        }
    }

    /// Forgets the session `handle` (stopped and joined): the partition no longer runs here.
    pub(crate) fn forget(&self, handle: &Arc<PartitionHandle>) {
        let mut map = self.map.lock();
        let same = match map.get(&handle.id) {
            Some(Peer::Running(h)) => Arc::ptr_eq(h, handle),
            Some(Peer::Released {
                handle: Some(h), ..
            }) => Arc::ptr_eq(h, handle),
            _ => false,
        };
        if same {
            Self::set(&mut map, &handle.id, None);
        }
    }

    /// The partitions of `pipeline` released before a restart (with no session here).
    pub(crate) fn released_without_session(&self, pipeline: &str) -> Vec<String> {
        self.map
            .lock()
            .iter()
            .filter(|(_, p)| {
                matches!(p, Peer::Released { pipeline: q, handle: None, .. } if q == pipeline)
            })
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Forgets a release with no session (a release from before a restart) of `partition`.
    pub(crate) fn forget_release(&self, partition: &str) {
        let mut map = self.map.lock();
        if matches!(
            map.get(partition),
            Some(Peer::Released { handle: None, .. })
        ) {
            Self::set(&mut map, partition, None);
        }
    }

    /// The owner's drain: `partition`'s running session becomes released (the caller drains
    /// its loop). Refused when no session runs here or its loop has ended.
    pub(crate) fn release(&self, partition: &str) -> Result<Arc<PartitionHandle>, String> {
        let mut map = self.map.lock();
        match map.get(partition) {
            Some(Peer::Running(h)) if !h.stopping() => {
                let h = h.clone();
                Self::set(
                    &mut map,
                    partition,
                    Some(Peer::Released {
                        pipeline: h.pipeline.clone(),
                        handle: Some(h.clone()),
                        since: Instant::now(),
                    }),
                );
                Ok(h)
            }
            Some(Peer::Running(_)) => {
                Err(format!("partition `{partition}` is stopping on this host"))
            }
            Some(p) => Err(format!(
                "partition `{partition}` is {} on this host, not running",
                p.state().name()
            )),
            None => Err(format!("partition `{partition}` does not run on this host")),
        }
    }

    /// After a restart: this host released `partition` before it stopped.
    pub(crate) fn released_before_restart(&self, partition: &str, pipeline: &str) {
        let mut map = self.map.lock();
        if !map.contains_key(partition) {
            Self::set(
                &mut map,
                partition,
                Some(Peer::Released {
                    pipeline: pipeline.to_string(),
                    handle: None,
                    since: Instant::now(),
                }),
            );
        }
    }

    /// How long `partition` has been released, if it is.
    pub fn released_for(&self, partition: &str) -> Option<Duration> {
        match self.map.lock().get(partition) {
            Some(Peer::Released { since, .. }) => Some(since.elapsed()),
            _ => None,
        }
    }

    /// The move was abandoned after `partition`'s release: the released peer runs again
    /// (its ending loop is joined and a new one starts when the assignments are next
    /// followed). False when it was not released.
    pub(crate) fn unrelease(&self, partition: &str) -> bool {
        let mut map = self.map.lock();
        match map.get(partition) {
            Some(Peer::Released {
                handle: Some(h), ..
            }) => {
                let h = h.clone();
                Self::set(&mut map, partition, Some(Peer::Running(h)));
                true
            }
            Some(Peer::Released { handle: None, .. }) => {
                Self::set(&mut map, partition, None);
                true
            }
            _ => false,
        }
    }

    /// A move to this host begins: `replica` becomes `partition`'s warming peer. A standby
    /// of it here is stopped and joined first. Refused when a session of it is here.
    pub(crate) fn warm(&self, partition: &str, replica: Arc<Replica>) -> Result<(), String> {
        let standby = {
            let mut map = self.map.lock();
            let from = map.get(partition).map_or(PeerState::Stopped, Peer::state);
            if !allowed(from, PeerState::Warming) {
                return Err(format!(
                    "partition `{partition}` is {} on this host",
                    from.name()
                ));
            }
            let before = map.remove(partition);
            map.insert(partition.to_string(), Peer::Warming(replica));
            before
        };
        if let Some(Peer::Standby(s)) = standby {
            s.stop_and_join();
        }
        Ok(())
    }

    /// The take-over of `replica`'s partition counts: its session starts next, with
    /// `prepared`. Refused when the replica was superseded meanwhile.
    pub(crate) fn take_over(
        &self,
        replica: &Arc<Replica>,
        prepared: Prepared,
    ) -> Result<(), String> {
        let mut map = self.map.lock();
        match map.get(&replica.partition) {
            Some(Peer::Warming(r)) if Arc::ptr_eq(r, replica) => {
                let r = r.clone();
                Self::set(
                    &mut map,
                    &replica.partition,
                    Some(Peer::TakingOver(r.clone(), Box::new(prepared))),
                );
                Ok(())
            }
            other => Err(format!(
                "partition `{}` is {} on this host, not warming",
                replica.partition,
                other.map_or(PeerState::Stopped, Peer::state).name()
            )),
        }
    }

    /// The move of `replica` ended here without a session: the warming peer (or a take-over
    /// whose session did not start) is let go.
    pub(crate) fn end_warming(&self, replica: &Arc<Replica>) {
        let ended = {
            let mut map = self.map.lock();
            let ends = match map.get(&replica.partition) {
                Some(Peer::Warming(r)) | Some(Peer::TakingOver(r, _)) => Arc::ptr_eq(r, replica),
                _ => false,
            };
            if !ends {
                return;
            }
            let from = map.get(&replica.partition).map(Peer::state);
            assert!(from.is_some_and(|f| allowed(f, PeerState::Stopped)));
            map.remove(&replica.partition)
        };
        // A take-over's clients close here, not under the lock: closing Kafka clients takes
        // a while, and every other peer waits on that lock.
        drop(ended);
    }

    /// Starts a standby of `partition` with `start` (given its replica) unless a peer of it is
    /// here already. A standby whose thread ended is started anew.
    pub(crate) fn keep_standby(
        &self,
        partition: &str,
        start: impl FnOnce(Arc<Replica>) -> std::io::Result<Standby>,
    ) -> std::io::Result<bool> {
        let ended = {
            let mut map = self.map.lock();
            match map.get(partition) {
                None => None,
                Some(Peer::Standby(s)) if s.thread.is_finished() => {
                    let Some(Peer::Standby(s)) = map.remove(partition) else {
                        unreachable!()
                    };
                    Some(s)
                }
                Some(_) => return Ok(false),
            }
        };
        if let Some(s) = ended {
            s.stop_and_join();
        }
        let replica = Arc::new(Replica::new(partition, Role::Standby));
        let standby = start(replica)?;
        let mut map = self.map.lock();
        if map.contains_key(partition) {
            // Another peer came meanwhile: it wins.
            drop(map);
            standby.stop_and_join();
            return Ok(false);
        }
        Self::set(&mut map, partition, Some(Peer::Standby(standby)));
        Ok(true)
    }

    /// The partitions kept as standbys here.
    pub fn standbys(&self) -> Vec<String> {
        self.map
            .lock()
            .iter()
            .filter(|(_, p)| matches!(p, Peer::Standby(_)))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Stops the standby of `partition`, if any, and waits for its thread.
    pub(crate) fn stop_standby(&self, partition: &str) -> bool {
        let standby = {
            let mut map = self.map.lock();
            if !matches!(map.get(partition), Some(Peer::Standby(_))) {
                return false;
            }
            let Some(Peer::Standby(s)) = map.remove(partition) else {
                unreachable!()
            };
            s
        };
        standby.stop_and_join();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table of transitions in docs/ARCHITECTURE.md is [`TRANSITIONS`], row for row.
    #[test]
    fn the_architecture_table_lists_every_transition() {
        let doc = include_str!("../../../docs/ARCHITECTURE.md");
        let start = doc
            .find("| from | to | when |")
            .expect("the peer transition table in docs/ARCHITECTURE.md");
        let rows: Vec<(String, String, String)> = doc[start..]
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (
                    cells[1].trim_matches('`').into(),
                    cells[2].trim_matches('`').into(),
                    cells[3].into(),
                )
            })
            .collect();
        let code: Vec<(String, String, String)> = TRANSITIONS
            .iter()
            .map(|(f, t, when)| (f.name().into(), t.name().into(), when.to_string()))
            .collect();
        assert_eq!(rows, code);
    }

    /// What must not exist cannot be reached: a session next to a replica, two sessions.
    #[test]
    fn no_transition_puts_a_session_beside_a_replica() {
        use PeerState::*;
        for from in [Running, Released, Starting] {
            assert!(!allowed(from, Warming), "{from:?} -> Warming");
            assert!(!allowed(from, Standby), "{from:?} -> Standby");
            assert!(!allowed(from, Starting), "{from:?} -> Starting");
        }
        assert!(!allowed(Released, TakingOver));
        // A replica gives way to a session only through `Starting`, which joins it first.
        for from in [Standby, Warming] {
            assert!(!allowed(from, Running));
        }
    }

    #[test]
    fn replicas_and_releases_move_as_the_table_says() {
        let peers = Peers::default();
        let r = Arc::new(Replica::new("p-0", Role::Warming));
        peers.warm("p-0", r.clone()).unwrap();
        assert_eq!(peers.state("p-0"), PeerState::Warming);
        // A second move's replica is refused while one warms.
        let other = Arc::new(Replica::new("p-0", Role::Warming));
        assert!(peers.warm("p-0", other.clone()).is_err());
        // The other replica ending does not end this one.
        peers.end_warming(&other);
        assert_eq!(peers.state("p-0"), PeerState::Warming);
        // A session assigned here supersedes the replica: it writes nothing more.
        let Claimed::Start(claim) = peers.claim("p-0") else {
            panic!("a session should start")
        };
        assert!(claim.prepared.is_none() && !claim.taken_over);
        assert_eq!(peers.state("p-0"), PeerState::Starting);
        let err = r.write(|| Ok(())).unwrap_err();
        assert!(err.contains("session"), "{err}");
        // ...and the move's end leaves the session's peer alone.
        peers.end_warming(&r);
        assert_eq!(peers.state("p-0"), PeerState::Starting);
        assert!(peers.warm("p-0", other).is_err());
        peers.not_started("p-0");
        assert_eq!(peers.state("p-0"), PeerState::Stopped);

        // A release from before a restart holds the partition: no session starts.
        peers.released_before_restart("p-1", "p");
        assert_eq!(peers.released_without_session("p"), ["p-1"]);
        assert!(matches!(peers.claim("p-1"), Claimed::Released));
        assert!(peers.released_for("p-1").is_some());
        assert!(peers.release("p-1").is_err());
        assert!(peers.unrelease("p-1"));
        assert_eq!(peers.state("p-1"), PeerState::Stopped);
    }
}
