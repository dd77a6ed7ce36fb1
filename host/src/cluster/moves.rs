//! Live moves of a partition from its owner to another host.
//!
//! 1. **Warming.** `POST /api/v1/partitions/{id}/move` records a `move` event (phase `warming`)
//!    in the control log. The target opens the partition's RocksDB, restores it from the
//!    changelogs and keeps tailing them (a warming replica) while the owner goes on processing.
//! 2. **Handoff.** Once the target is at most [`HANDOFF_LAG`] records behind, it records
//!    `handoff` and asks the owner to drain: the owner's loop stops at a batch boundary, commits
//!    what is pending, and records its **release** in the control log: the epoch it gives up,
//!    the input offsets its final commit stored, and the changelog offsets its state holds.
//!    It answers with the release's place in the log, and holds the drained partition (does
//!    not restart it) while the move goes on.
//! 3. **Take-over.** The target reads the release back from the log; it counts only if it
//!    came while the move was under way. The target then waits until every changelog is
//!    readable to its released end (the owner's last transaction is complete: `read_committed`
//!    ends are last stable offsets), reads to there, and checks that its replica is at exactly
//!    the released ends and the group's offsets are the released ones; any difference gives
//!    the move up, with the reason. Then it records the partition's assignment to itself at
//!    the next epoch and, once that is read back and counts, starts it: the session's producer
//!    fences the old owner's transactional id, the restore finds nothing left to read, and
//!    processing goes on from the released offsets. The move is `done` with its pause: from
//!    the old owner's final commit to the new owner's first guest call (or its first empty
//!    fetch when no record waits).
//!
//! A move that fails (the target cannot warm up in time, the owner does not drain, a host
//! leaves) is `abandoned` with a reason, and the owner carries on: it restarts a partition it
//! drained when it reads the abandonment, or when [`DRAINED_HOLD`] passes without a new owner
//! (it then records the abandonment itself).
//!
//! The take-over and an abandonment may race (the target takes over just as the owner gives
//! up waiting). The control log's order decides, the same way on every host: a take-over
//! (an assignment naming its move) counts only while its move is under way and after the
//! owner's release, and an abandonment that comes after the take-over reads as the move done.
//! Each side acts on its own append only once it read it back, by the log-ordered catalog.
//! Abandonments the controller decides (a host left) are written by its fenced producer.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cluster::Hosts;
use crate::cluster::standby::Standbys;
use crate::control::Catalog;
use crate::control::log::ControlLog;
use crate::control::{
    AssignmentRecord, ChangelogEnd, ControlEvent, InputOffset, MovePhase, MoveRecord, MoveStep,
    PipelineRecord, ReleaseRecord, now_ms,
};
use crate::error::{Error, Result};
use crate::partition::kafka::Prepared;
use crate::partition::peers::{PeerState, Peers, Replica};
use crate::partition::report::Role;
use crate::partition::supervisor::Supervisor;
use crate::partition::tail::Tail;

/// A target this many changelog records (or fewer) behind the owner asks it to hand off.
pub const HANDOFF_LAG: u64 = 2_000;
/// A target that is not within [`HANDOFF_LAG`] of the owner this long after the move began
/// gives up: it cannot keep up.
pub const WARMING_TIMEOUT: Duration = Duration::from_secs(180);
/// How long an owner waits for its partition's loop to drain.
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// How long an owner holds a drained partition for its new owner before it records the move
/// abandoned (the default of `HostConfig::drained_hold`).
pub const DRAINED_HOLD: Duration = Duration::from_secs(20);
/// How long the new owner waits for its first guest call before it records the move done
/// without a pause.
const FIRST_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a move's target waits to learn its owner's address (from the owner's load reports,
/// once a second) before it gives the move up.
const ADDRESS_WAIT: Duration = Duration::from_secs(5);

/// How long a target waits, after the owner's release, for the released changelog ends to
/// become readable (the owner's last transaction complete) and for the group's offsets to be
/// the released ones, before it gives the move up.
const RELEASE_SETTLE: Duration = Duration::from_secs(10);

/// A take-over whose first fetch found nothing to process for this long ends its pause there.
const IDLE_AFTER: Duration = Duration::from_secs(1);

/// The owner's answer to a drain: it stopped and committed.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Drained {
    /// The move.
    #[serde(rename = "move")]
    pub move_id: String,
    /// Microseconds from the final commit to this answer.
    pub since_commit_us: u64,
    /// The offsets the final commit stored, where the new owner goes on.
    pub offsets: Vec<crate::partition::SlotProgress>,
    /// The control-log offset of the owner's release (absent from hosts before releases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<u64>,
    /// The release as recorded there, for the target to check at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<ReleaseRecord>,
}

/// The body of `POST /api/v1/partitions/{id}/move`.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    /// The host id to move the partition to.
    pub to: String,
}

/// The answer to a move request: the move's id, to follow in the partition's `moves`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MoveAccepted {
    /// The move's id.
    #[serde(rename = "move")]
    pub move_id: String,
}

/// The body of the owner's drain call (`POST /api/v1/partitions/{id}/drain`).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    /// The move the drain is for.
    #[serde(rename = "move")]
    pub move_id: String,
}

/// What moves work over: narrow handles on this host's parts, and its settings for moves.
pub struct MovesParts {
    /// This host's id.
    pub host_id: String,
    /// The log the host runs on (moves need Kafka).
    pub log: crate::transport::Log,
    /// The shared state environment, where a target opens the partition's database.
    pub state: Arc<crate::state::StateEnv>,
    /// The catalog, as the follower applies it.
    pub catalog: Arc<Mutex<Catalog>>,
    /// The control log.
    pub control: Arc<ControlLog>,
    /// What this host is for each partition.
    pub peers: Arc<Peers>,
    /// The partitions this host runs.
    pub supervisor: Arc<Supervisor>,
    /// This host's standby replicas.
    pub standbys: Arc<Standbys>,
    /// Protocol steps where tests hold a thread.
    pub steps: Arc<crate::steps::Steps>,
    /// The hosts of the cluster.
    pub hosts: Hosts,
    /// Set when the host stops.
    pub stop: Arc<AtomicBool>,
    /// The API token, for the drain call to the owner.
    pub token: Option<String>,
    /// How long an owner holds a drained partition (`HostConfig::drained_hold`).
    pub drained_hold: Duration,
    /// How long moving this host's partitions away on a clean stop may take.
    pub handoff_timeout: Duration,
    /// The bound of this host's state on disk (`--state-disk`).
    pub state_disk: Option<u64>,
    /// Where partitions keep their state.
    pub state_dir: std::path::PathBuf,
    /// The bytes of a partition's state, as its owner reports it (0 when unknown).
    pub partition_bytes: Box<dyn Fn(&str) -> u64 + Send + Sync>,
}

/// Live moves on this host: the requests it makes, the moves it drives as their target, the
/// drains and releases it answers as an owner, and what each move's events mean here.
pub struct Moves {
    parts: MovesParts,
    me: Weak<Moves>,
    pauses: Mutex<Pauses>,
}

impl Moves {
    /// Moves over `parts`.
    pub fn new(parts: MovesParts) -> Arc<Self> {
        Arc::new_cyclic(|me| Moves {
            parts,
            me: me.clone(),
            pauses: Mutex::new(Pauses::default()),
        })
    }

    /// Pauses (ms) of the moves this host took over, oldest first.
    pub fn pauses(&self) -> Vec<f64> {
        self.pauses.lock().all().to_vec()
    }

    /// A new move of `partition` to host `to`, checked against the catalog; not recorded.
    pub(crate) fn new_move(&self, partition: &str, to: &str) -> Result<MoveRecord> {
        if !self.parts.log.is_kafka() {
            return Err(Error::BadRequest(
                "moves need a cluster: this host runs on the embedded log, alone".into(),
            ));
        }
        let (assignment, under_way) = {
            let catalog = self.parts.catalog.lock();
            (
                catalog.assignments.get(partition).cloned(),
                catalog.move_under_way(partition).cloned(),
            )
        };
        let Some(a) = assignment else {
            return Err(Error::NotFound(format!("no partition `{partition}`")));
        };
        if a.owner == to {
            return Err(Error::Conflict(format!(
                "host `{to}` owns partition `{partition}` already"
            )));
        }
        let alive = self.parts.hosts.live();
        if !alive.iter().any(|h| h == to) {
            return Err(Error::BadRequest(format!(
                "host `{to}` is not a live member of the cluster (live: {})",
                alive.join(", ")
            )));
        }
        let protocols = self
            .parts
            .hosts
            .all()
            .into_iter()
            .filter_map(|h| Some((h.id, (h.protocol?, h.version.unwrap_or_default()))))
            .collect();
        if let Some(why) = crate::cluster::protocol_mismatch(&protocols, &a.owner, to) {
            return Err(Error::Conflict(why));
        }
        if let Some(m) = under_way {
            return Err(Error::Conflict(format!(
                "partition `{partition}` is moving already (move {} to `{}`, {:?})",
                m.id, m.to, m.phase
            )));
        }
        let record = MoveRecord {
            // Unique across hosts: two requests in one millisecond are two moves.
            id: format!(
                "{partition}.{}.{:x}.{}",
                a.epoch,
                now_ms(),
                self.parts.host_id
            ),
            pipeline: a.pipeline.clone(),
            partition: partition.to_string(),
            from: a.owner.clone(),
            to: to.to_string(),
            phase: MovePhase::Warming,
            pause_ms: None,
            reason: None,
            steps: Vec::new(),
            at: now_ms(),
            taken_over: false,
            release: None,
        };
        Ok(record)
    }

    /// Begins moving `partition` to host `to`; answers the move's id at once. The move goes on
    /// in the background: its phases show in the partition's `moves`.
    ///
    /// The move begins when its event is read back from the control log, and only if it came
    /// there from the partition's owner while no other move of it was under way (two requests
    /// that raced on two hosts start one move everywhere): else the request is refused.
    pub fn request_move(&self, partition: &str, to: &str) -> Result<String> {
        self.parts.control.catch_up(Duration::from_secs(2));
        let (record, at) = {
            let _control = self.parts.control.lock();
            let record = self.new_move(partition, to)?;
            let at = self
                .parts
                .control
                .append(&ControlEvent::Move(record.clone()))?;
            (record, at)
        };
        if !self.read_back_until_stopped(at) {
            return Err(Error::Unavailable("the host is stopping".into()));
        }
        let began = self
            .parts
            .catalog
            .lock()
            .moves
            .get(partition)
            .is_some_and(|ms| ms.iter().any(|m| m.id == record.id && m.to == record.to));
        if !began {
            return Err(Error::Conflict(format!(
                "partition `{partition}` changed owner or began another move before this one in                  the control log"
            )));
        }
        tracing::info!(move_id = %record.id, partition, from = %record.from, to, "move requested");
        Ok(record.id)
    }

    /// What a move record means for this host: a target starts warming; an owner whose move
    /// was abandoned resumes the partition it drained.
    pub(crate) fn on_move(&self, m: &MoveRecord) {
        match m.phase {
            MovePhase::Warming if m.to == self.parts.host_id => {
                let (me, m) = (self.me.clone(), m.clone());
                let spawned = std::thread::Builder::new()
                    .name(format!("baton-move-{}", m.partition))
                    .spawn(move || {
                        if let Some(b) = me.upgrade() {
                            b.drive_move(m);
                        }
                    });
                if let Err(e) = spawned {
                    tracing::error!("starting a move: {e}");
                }
            }
            MovePhase::Abandoned | MovePhase::Done
                if m.from == self.parts.host_id
                    && self.parts.peers.state(&m.partition) == PeerState::Released =>
            {
                if self.released_in_vain(&m.partition, &m.id) {
                    // Called on the follower's thread, which the read-back needs.
                    let (me, m) = (self.me.clone(), m.clone());
                    let spawned = std::thread::Builder::new()
                        .name("baton-resume".into())
                        .spawn(move || {
                            if let Some(b) = me.upgrade() {
                                b.resume_released(&m.partition, &m.pipeline, &m.id);
                            }
                        });
                    if let Err(e) = spawned {
                        tracing::error!("resuming a released partition: {e}");
                    }
                } else {
                    // Taken over (the session here is let go), or abandoned before the
                    // release counted (it goes on at its epoch).
                    self.parts.peers.unrelease(&m.partition);
                    self.parts.supervisor.follow_assignments(&m.pipeline);
                }
            }
            MovePhase::Abandoned | MovePhase::Done => self.parts.standbys.follow(),
            _ => {}
        }
    }

    /// Records a later phase of `m`: appends it (again after a failed append, until the host
    /// stops) and waits until it is read back, which is when it takes effect here as on every
    /// host (`on_move`), in log order: after a take-over, an abandonment is the move done.
    fn record_move(
        &self,
        m: &MoveRecord,
        phase: MovePhase,
        pause: Option<(f64, Vec<MoveStep>)>,
        reason: Option<String>,
    ) {
        let (pause_ms, steps) = match pause {
            Some((ms, steps)) => (Some(ms), steps),
            None => (None, Vec::new()),
        };
        let event = ControlEvent::Move(MoveRecord {
            phase,
            pause_ms,
            reason,
            steps,
            at: now_ms(),
            taken_over: false,
            release: None,
            ..m.clone()
        });
        loop {
            match self.append_and_read_back(&event, true) {
                Ok(_) => return,
                Err(e) if self.retry_after(&m.partition, &format!("the move {phase:?}"), &e) => {}
                Err(_) => return,
            }
        }
    }

    /// Whether this host released `partition` to move `move_id` and the move was abandoned
    /// after that, in log order, with the partition still this host's.
    fn released_in_vain(&self, partition: &str, move_id: &str) -> bool {
        self.released_epoch(partition, move_id).is_some()
            && self
                .parts
                .control
                .ordered()
                .assignments
                .get(partition)
                .is_some_and(|a| a.owner == self.parts.host_id)
    }

    /// The epoch this host released `partition` at for move `move_id`, if the move was
    /// abandoned after that release, in log order.
    fn released_epoch(&self, partition: &str, move_id: &str) -> Option<u64> {
        self.parts
            .control
            .ordered()
            .moves
            .get(partition)
            .and_then(|ms| ms.iter().find(|m| m.id == move_id))
            .filter(|m| m.phase == MovePhase::Abandoned)
            .and_then(|m| m.release.as_ref())
            .filter(|r| r.owner == self.parts.host_id)
            .map(|r| r.epoch)
    }

    /// The owner's way back to a partition it released in vain: it never processes at the
    /// epoch it released again, but records its own assignment at the next one, and resumes
    /// once that is read back and still names it.
    fn resume_released(&self, partition: &str, pipeline: &str, move_id: &str) {
        let released = self.released_epoch(partition, move_id).unwrap_or(0);
        loop {
            let a = self
                .parts
                .control
                .ordered()
                .assignments
                .get(partition)
                .cloned();
            // Not this host's any more, or assigned to it again already.
            let Some(a) = a.filter(|a| a.owner == self.parts.host_id && a.epoch <= released) else {
                break;
            };
            let event = ControlEvent::Assigned(AssignmentRecord {
                epoch: a.epoch + 1,
                at: now_ms(),
                move_id: None,
                after_release: false,
                ..a
            });
            match self.append_and_read_back(&event, false) {
                Ok(true) => break,
                Ok(false) => return,
                Err(e) if self.retry_after(partition, "this host's assignment", &e) => {}
                Err(_) => return,
            }
        }
        self.parts.peers.unrelease(partition);
        tracing::info!(
            partition,
            "the move was abandoned after the release: resuming at the next epoch"
        );
        self.parts.supervisor.follow_assignments(pipeline);
    }

    /// Appends `event` (under the control lock when `locked`) and waits until the follower has
    /// read it back (and applied it, with its effects here); false when the host stops first.
    fn append_and_read_back(&self, event: &ControlEvent, locked: bool) -> Result<bool> {
        let at = {
            let _control = locked.then(|| self.parts.control.lock());
            self.parts.control.append(event)?
        };
        Ok(self.read_back_until_stopped(at))
    }

    /// After a failed append of `what` for `partition`: waits 1 s and answers true, or false
    /// when the host stops.
    fn retry_after(&self, partition: &str, what: &str, e: &Error) -> bool {
        if self.parts.stop.load(Ordering::Relaxed) {
            return false;
        }
        tracing::warn!(partition, "recording {what}: {e}; again in 1 s");
        std::thread::sleep(Duration::from_secs(1));
        true
    }

    /// Waits until the follower has read the control log past `offset` (waking it first);
    /// false when the host stops first.
    fn read_back_until_stopped(&self, offset: u64) -> bool {
        self.parts.control.wake_follower();
        let waited = Instant::now();
        while !self.parts.control.read_back(offset, Duration::from_secs(5)) {
            if self.parts.stop.load(Ordering::Relaxed) {
                return false;
            }
            tracing::warn!(
                offset,
                secs = waited.elapsed().as_secs(),
                "an append is not read back from the control log yet"
            );
        }
        true
    }

    /// The target's side of a move, from warming to done or abandoned.
    fn drive_move(&self, m: MoveRecord) {
        let started = Instant::now();
        let replica = Arc::new(Replica::new(&m.partition, Role::Warming));
        let mut times = MoveTimes::default();
        let outcome = self.warm_and_take_over(&m, &replica, &mut times);
        self.parts.peers.end_warming(&replica);
        if crate::otlp::enabled() {
            trace_move(&m, started, &times, &outcome);
        }
        match outcome {
            Ok(pause) => {
                if let Some((p, steps)) = &pause {
                    self.pauses.lock().push(*p);
                    tracing::info!(
                        move_id = %m.id, partition = %m.partition, pause_ms = p,
                        secs = started.elapsed().as_secs_f64(), ?steps, "move done"
                    );
                }
                self.record_move(&m, MovePhase::Done, pause, None);
            }
            Err(reason) => {
                tracing::warn!(move_id = %m.id, partition = %m.partition, "move abandoned: {reason}");
                self.record_move(&m, MovePhase::Abandoned, None, Some(reason));
            }
        }
    }

    /// Whether move `m` is still under way in the catalog (nobody abandoned it).
    fn still_moving(&self, m: &MoveRecord) -> bool {
        self.parts
            .catalog
            .lock()
            .move_under_way(&m.partition)
            .is_some_and(|u| u.id == m.id)
    }

    /// Warms a replica of `m`'s partition, has the owner drain it, and takes it over; answers
    /// the pause (ms) when the first guest call came in time.
    fn warm_and_take_over(
        &self,
        m: &MoveRecord,
        replica: &Arc<Replica>,
        times: &mut MoveTimes,
    ) -> std::result::Result<Option<(f64, Vec<MoveStep>)>, String> {
        let kafka = self.parts.log.as_kafka().cloned().ok_or("no Kafka")?;
        let (record, assignment) = {
            let catalog = self.parts.catalog.lock();
            (
                catalog.pipelines.get(&m.pipeline).cloned(),
                catalog.assignments.get(&m.partition).cloned(),
            )
        };
        let record = record.ok_or_else(|| format!("pipeline `{}` is gone", m.pipeline))?;
        let assignment = assignment.ok_or("the partition has no assignment")?;
        if assignment.owner != m.from {
            return Err(format!(
                "the partition's owner is `{}` now, not `{}`",
                assignment.owner, m.from
            ));
        }
        let slots = assignment.slots[0]..assignment.slots[1];
        self.check_state_disk(&m.partition)?;
        // The partition's peer here before it touches the database: a standby of it stops
        // (one writer at a time), and a session of the partition that starts here from now on
        // supersedes it.
        self.parts.peers.warm(&m.partition, replica.clone())?;
        let path = self
            .parts
            .supervisor
            .partition_path(&m.pipeline, &m.partition);
        // With a store shared by the hosts, a database this host lacks starts from the newest
        // checkpoint, and warming reads only the changelogs' tail after it.
        let (db, restored) = self
            .parts
            .state
            .open_partition_db(
                &path,
                &record.spec.state_stores(),
                &crate::state::checkpoint::PartitionRef::new(
                    &record.spec.name,
                    record.created_at,
                    &m.partition,
                    assignment.slots,
                ),
            )
            .map_err(|e| format!("opening the partition's state here: {e}"))?;
        let mut prepared = replica.write(|| {
            // Opening the reader may wipe a slot whose state is ahead of its changelog.
            let tail = Tail::open(&kafka, &record, slots.clone(), &db)
                .map_err(|e| format!("reading the changelogs: {e:#}"))?;
            // The session's clients, made ready now so that the take-over does not wait.
            Prepared::new(&kafka, &record, &m.partition, slots.clone(), tail)
                .map(|p| p.with_restored(restored.clone()))
                .map_err(|e| format!("opening the partition's clients: {e:#}"))
        })?;
        let tail = prepared.tail();
        replica.behind.store(tail.behind(), Ordering::Relaxed);

        // Warming: keep up with the owner until close enough.
        let deadline = Instant::now() + WARMING_TIMEOUT;
        let mut refreshed = Instant::now();
        loop {
            if !self.still_moving(m) {
                return Err("abandoned while warming".into());
            }
            self.parts
                .steps
                .pass(crate::steps::MOVE_WARMING, &m.partition);
            replica.poll(tail, &db, Duration::from_millis(50))?;
            if refreshed.elapsed() >= Duration::from_millis(200) || tail.caught_up() {
                let behind = tail
                    .refresh()
                    .map_err(|e| format!("reading the changelogs' ends: {e:#}"))?;
                replica.behind.store(behind, Ordering::Relaxed);
                refreshed = Instant::now();
                if behind <= HANDOFF_LAG {
                    break;
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the target stayed {} changelog records behind the owner for {}s",
                    replica.behind.load(Ordering::Relaxed),
                    WARMING_TIMEOUT.as_secs()
                ));
            }
        }

        // Handoff: the owner stops at a batch boundary and commits.
        times.handoff = Some(Instant::now());
        self.record_move(m, MovePhase::Handoff, None, None);
        // A host that just joined (this one, after a restart, or the owner) knows another's
        // address once it has read that host's next load report (one a second): wait for it.
        let known_by = Instant::now() + ADDRESS_WAIT;
        let owner_url = loop {
            let url = self
                .parts
                .hosts
                .all()
                .into_iter()
                .find(|h| h.id == m.from && h.alive)
                .map(|h| h.address)
                .ok_or_else(|| format!("the owner `{}` left the cluster", m.from))?;
            if !url.is_empty() {
                break url;
            }
            if Instant::now() > known_by {
                return Err(format!(
                    "the owner `{}` reported no address within {}s (it or this host just joined)",
                    m.from,
                    ADDRESS_WAIT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let drained: Drained = post_json(
            &owner_url,
            &format!("/api/v1/partitions/{}/drain", m.partition),
            &DrainRequest {
                move_id: m.id.clone(),
            },
            self.parts.token.as_deref(),
            DRAIN_TIMEOUT + Duration::from_secs(5),
        )
        .map_err(|e| format!("the owner `{}` did not drain: {e}", m.from))?;
        let answered = Instant::now();
        let final_commit = answered
            .checked_sub(Duration::from_micros(drained.since_commit_us))
            .unwrap_or(answered);
        let mut marks: Vec<(&'static str, Instant)> = vec![("answered", answered)];
        times.final_commit = Some(final_commit);

        // The release is in the control log (the owner answers once it is acknowledged), so
        // the take-over appended below lands after it. Whether it counts (it came while the
        // move was under way) the log decides for every host: an assignment that follows a
        // release counts only after a release that counted, which the read-back of the
        // take-over shows. Its content, checked here, is what the owner recorded.
        let release = drained
            .release
            .clone()
            .filter(|_| drained.released_at.is_some())
            .ok_or_else(|| {
                format!(
                    "the owner `{}` runs an older baton, which records no release in the \
                     control log: upgrade it to baton {} (or later) to move its partitions",
                    m.from,
                    env!("CARGO_PKG_VERSION")
                )
            })?;
        if release.move_id != m.id || release.owner != m.from || release.partition != m.partition {
            return Err(format!(
                "the owner answered with a release of move `{}` of `{}` by `{}`",
                release.move_id, release.partition, release.owner
            ));
        }

        // Before the take-over: the owner's last transaction is complete, and this replica
        // holds exactly what the owner released.
        check_release(&release, &record, &mut prepared, replica, &db, &mut marks)?;
        marks.push(("checked", Instant::now()));
        // The replica's last write is done: the peer hands the clients to the session that
        // starts here if the take-over counts (and lets them go if not).
        self.parts.peers.take_over(replica, prepared)?;

        // Take over, at the next epoch.
        let current = self
            .parts
            .catalog
            .lock()
            .assignments
            .get(&m.partition)
            .cloned();
        let epoch = current.map_or(assignment.epoch, |a| a.epoch.max(assignment.epoch)) + 1;
        let a = AssignmentRecord {
            owner: self.parts.host_id.clone(),
            epoch,
            at: now_ms(),
            move_id: Some(m.id.clone()),
            after_release: true,
            ..assignment
        };
        self.parts
            .steps
            .pass(crate::steps::MOVE_TAKE_OVER, &m.partition);
        let event = ControlEvent::Assigned(a.clone());
        let at = self
            .parts
            .control
            .append(&event)
            .map_err(|e| format!("recording the new owner: {e}"))?;
        self.parts.control.wake_follower();
        marks.push(("assigned", Instant::now()));

        // The take-over takes effect when read back: the control log's order decides between
        // it and an abandonment of the move (the owner's, after holding the partition in
        // vain, or the controller's), the same way on every host. Read back, it starts the
        // session here (the follower follows the assignment, and the peer hands the session
        // the prepared clients).
        if !self.read_back_until_stopped(at) {
            return Err("the host stops".into());
        }
        let won = self
            .parts
            .control
            .ordered()
            .assignments
            .get(&m.partition)
            .is_some_and(|x| x.owner == self.parts.host_id && x.epoch == epoch);
        if !won {
            return Err(
                "the move was abandoned before the take-over in the control log: the owner \
                 goes on"
                    .into(),
            );
        }
        marks.push(("read-back", Instant::now()));
        self.parts.supervisor.follow_assignments(&m.pipeline);
        // Clients the session did not take (it could not start) are let go.
        self.parts.peers.end_warming(replica);
        marks.push(("started", Instant::now()));
        drop(db);

        // The pause ends at the new owner's first guest call.
        let until = Instant::now() + FIRST_CALL_TIMEOUT;
        while Instant::now() < until {
            let handle = self.parts.peers.running(&m.partition);
            // The first guest call; or, when nothing waits to be processed a while after the
            // first fetch, that fetch.
            let ready = handle.as_ref().and_then(|h| {
                let call = *h.status.first_call.lock();
                let idle = h
                    .status
                    .first_fetch
                    .lock()
                    .filter(|t| t.elapsed() > IDLE_AFTER);
                call.map(|t| ("first-call", t))
                    .or_else(|| idle.map(|t| ("first-fetch-idle", t)))
            });
            if let (Some((name, at)), Some(h)) = (ready, handle) {
                marks.extend(h.status.steps.lock().iter().copied());
                let name =
                    if name == "first-call" && !h.status.waiting_at_start.load(Ordering::Relaxed) {
                        // Nothing was waiting: ready at its first fetch.
                        "first-fetch"
                    } else {
                        name
                    };
                marks.push((name, at));
                marks.sort_by_key(|(_, t)| *t);
                let mut steps = Vec::new();
                let mut prev = final_commit;
                for (step, t) in marks {
                    steps.push(MoveStep {
                        step: step.to_string(),
                        ms: t.saturating_duration_since(prev).as_secs_f64() * 1e3,
                    });
                    prev = prev.max(t);
                }
                let pause = at.saturating_duration_since(final_commit).as_secs_f64() * 1e3;
                return Ok(Some((pause, steps)));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        tracing::warn!(partition = %m.partition, "no first guest call within 30 s of the take-over");
        Ok(None)
    }

    /// The owner's side of a handoff: stops the partition's loop at a batch boundary with what
    /// was pending committed, holds it stopped for the new owner, and answers the offsets
    /// committed.
    pub fn drain_for_move(&self, partition: &str, move_id: &str) -> Result<Drained> {
        self.parts.control.catch_up(Duration::from_secs(2));
        let under_way = self.parts.catalog.lock().move_under_way(partition).cloned();
        match under_way {
            Some(m) if m.id == move_id && m.from == self.parts.host_id => {}
            Some(m) if m.id == move_id => {
                return Err(Error::Conflict(format!(
                    "move {move_id} is from `{}`, not this host (`{}`)",
                    m.from, self.parts.host_id
                )));
            }
            _ => {
                return Err(Error::Conflict(format!(
                    "move {move_id} of partition `{partition}` is not under way"
                )));
            }
        }
        // Released from here on: it never processes again at this epoch.
        let handle = self
            .parts
            .peers
            .release(partition)
            .map_err(Error::Conflict)?;
        let Some(offsets) = handle.drain(DRAIN_TIMEOUT) else {
            return Err(Error::Unavailable(format!(
                "partition `{partition}` did not reach a batch boundary and commit within {}s",
                DRAIN_TIMEOUT.as_secs()
            )));
        };
        let committed = Instant::now();
        let released = self
            .release(&handle, move_id, &offsets)
            .map_err(|e| Error::Unavailable(format!("recording the release: {e}")));
        // Resumed if nobody takes it over in time. The loop's clients close meanwhile: the
        // final commit is done, and the new owner need not wait for them.
        let (me, p, pipeline, id) = (
            self.me.clone(),
            partition.to_string(),
            handle.pipeline.clone(),
            move_id.to_string(),
        );
        let hold = self.parts.drained_hold;
        let _ = std::thread::Builder::new()
            .name("baton-hold".into())
            .spawn(move || {
                handle.join();
                std::thread::sleep(hold);
                if let Some(b) = me.upgrade() {
                    let expired = b.parts.peers.released_for(&p).is_some_and(|t| t >= hold);
                    if expired {
                        b.resume_unless_taken_over(&p, &pipeline, &id);
                    }
                }
            });
        let (released_at, release) = released?;
        tracing::info!(partition, move_id, "drained and released for a move");
        Ok(Drained {
            move_id: move_id.to_string(),
            since_commit_us: committed.elapsed().as_micros() as u64,
            offsets,
            released_at: Some(released_at),
            release: Some(release),
        })
    }

    /// Records the release of the drained partition of `handle` to move `move_id` in the
    /// control log: where its input and changelogs ended. Answers the event's offset and the
    /// release.
    fn release(
        &self,
        handle: &crate::partition::supervisor::PartitionHandle,
        move_id: &str,
        offsets: &[crate::partition::SlotProgress],
    ) -> std::result::Result<(u64, ReleaseRecord), String> {
        let stores = self
            .parts
            .catalog
            .lock()
            .pipelines
            .get(&handle.pipeline)
            .map(|p| p.spec.state_stores())
            .ok_or_else(|| format!("pipeline `{}` is gone", handle.pipeline))?;
        let ahead = u64::from(
            self.parts
                .steps
                .injected(crate::steps::RELEASE_CHANGELOG_AHEAD, &handle.id),
        );
        let short = u64::from(
            self.parts
                .steps
                .injected(crate::steps::RELEASE_OFFSETS_BEHIND, &handle.id),
        );
        let mut changelogs = Vec::new();
        for store in &stores {
            for slot in handle.slots.clone() {
                let key = crate::partition::changelog_offset_key(store, slot);
                let end = handle
                    .db
                    .get_meta_u64(&key)
                    .map_err(|e| format!("reading the changelog position {key}: {e}"))?
                    .unwrap_or(0);
                changelogs.push(ChangelogEnd {
                    store: store.clone(),
                    slot,
                    end: end + ahead,
                });
            }
        }
        let release = ReleaseRecord {
            move_id: move_id.to_string(),
            pipeline: handle.pipeline.clone(),
            partition: handle.id.clone(),
            owner: self.parts.host_id.clone(),
            epoch: self
                .parts
                .catalog
                .lock()
                .assignments
                .get(&handle.id)
                .filter(|a| a.owner == self.parts.host_id)
                .map_or(handle.epoch.load(Ordering::Relaxed), |a| a.epoch),
            offsets: offsets
                .iter()
                .map(|o| InputOffset {
                    topic: o.topic.clone(),
                    slot: o.slot,
                    offset: o.offset.saturating_sub(short),
                })
                .collect(),
            changelogs,
            at: now_ms(),
        };
        // It takes effect when read back, like every host's: this host's part (never to process
        // again at the epoch) is done already, and the target appends after it.
        let event = ControlEvent::Released(release.clone());
        let at = self
            .parts
            .control
            .append(&event)
            .map_err(|e| e.to_string())?;
        Ok((at, release))
    }

    /// The moves under way that this host was part of when it stopped, as the replayed
    /// catalog has them. A partition it released stays held: it never processes at the
    /// released epoch again (its process that released it is gone, not the release).
    pub(crate) fn moves_left_by_restart(&self) -> Vec<MoveRecord> {
        let catalog = self.parts.catalog.lock();
        let mut left = Vec::new();
        for moves in catalog.moves.values() {
            for m in moves.iter().filter(|m| !m.phase.ended()) {
                let released = m
                    .release
                    .as_ref()
                    .is_some_and(|r| r.owner == self.parts.host_id);
                if m.from == self.parts.host_id && released {
                    self.parts
                        .peers
                        .released_before_restart(&m.partition, &m.pipeline);
                    left.push(m.clone());
                } else if m.to == self.parts.host_id {
                    left.push(m.clone());
                }
            }
        }
        left
    }

    /// After the restart, with the control log followed: a move whose target this host is
    /// has nobody driving it, and is abandoned (its owner then resumes at once); a partition
    /// this host released is resumed at the next epoch if nobody takes it over within the
    /// drained hold, as after a drain.
    pub(crate) fn settle_moves_left_by_restart(&self, left: Vec<MoveRecord>) {
        for m in left {
            let me = self.me.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("baton-restart-{}", m.partition))
                .spawn(move || {
                    let Some(b) = me.upgrade() else { return };
                    if m.to == b.parts.host_id {
                        tracing::warn!(
                            move_id = %m.id, partition = %m.partition,
                            "a move to this host was under way when it stopped: abandoned"
                        );
                        b.record_move(
                            &m,
                            MovePhase::Abandoned,
                            None,
                            Some(format!(
                                "the target `{}` restarted during the move",
                                b.parts.host_id
                            )),
                        );
                        return;
                    }
                    tracing::info!(
                        move_id = %m.id, partition = %m.partition,
                        "released before this host restarted: held for the move's target"
                    );
                    let hold = b.parts.drained_hold;
                    drop(b);
                    std::thread::sleep(hold);
                    if let Some(b) = me.upgrade()
                        && b.parts.peers.state(&m.partition) == PeerState::Released
                    {
                        b.resume_unless_taken_over(&m.partition, &m.pipeline, &m.id);
                    }
                });
            if let Err(e) = spawned {
                tracing::error!("settling a move after the restart: {e}");
            }
        }
    }

    /// The owner's side when nobody took its drained partition over in time: it records the
    /// move abandoned. Read back, the abandonment resumes the partition only if the control
    /// log has it before any take-over (else the target owns it, and the partition is let go).
    /// Until the abandonment is recorded the partition stays held.
    fn resume_unless_taken_over(&self, partition: &str, pipeline: &str, move_id: &str) {
        loop {
            let m = self
                .parts
                .catalog
                .lock()
                .moves
                .get(partition)
                .and_then(|ms| ms.iter().find(|m| m.id == move_id))
                .cloned();
            let Some(m) = m.filter(|m| !m.phase.ended()) else {
                break;
            };
            let event = ControlEvent::Move(MoveRecord {
                phase: MovePhase::Abandoned,
                reason: Some(format!(
                    "nobody took the drained partition over within {}s",
                    self.parts.drained_hold.as_secs()
                )),
                pause_ms: None,
                steps: Vec::new(),
                at: now_ms(),
                taken_over: false,
                release: None,
                ..m
            });
            match self.append_and_read_back(&event, true) {
                Ok(true) => break,
                Ok(false) => return,
                Err(e) if self.retry_after(partition, "the move abandoned", &e) => {}
                Err(_) => return,
            }
        }
        // Read back, the move's end took effect here as on every host (`on_move`): the
        // partition resumes at the next epoch if the abandonment counted, and is let go if a
        // take-over came first.
        tracing::info!(
            partition,
            pipeline,
            move_id,
            "nobody took the drained partition over in time"
        );
    }

    /// Before a clean stop: moves every partition this host owns to the live hosts (the least
    /// loaded first), warm, and waits for the moves to end, for at most the handoff timeout.
    /// What is left when it ends stops and is given away cold by the host's shutdown.
    pub fn move_away(&self) {
        if !self.parts.log.is_kafka() {
            return;
        }
        let others = self.parts.hosts.live_others();
        if others.is_empty() {
            return;
        }
        let mut load: BTreeMap<String, usize> = others.iter().map(|h| (h.clone(), 0)).collect();
        let mine: Vec<String> = {
            let catalog = self.parts.catalog.lock();
            for a in catalog.assignments.values() {
                if let Some(n) = load.get_mut(&a.owner) {
                    *n += 1;
                }
            }
            catalog
                .assignments
                .values()
                .filter(|a| a.owner == self.parts.host_id)
                .map(|a| a.partition.clone())
                .collect()
        };
        if mine.is_empty() {
            return;
        }
        tracing::info!(
            partitions = mine.len(),
            "moving this host's partitions away"
        );
        let started = Instant::now();
        for p in &mine {
            let Some(to) = load
                .iter()
                .min_by_key(|(h, n)| (**n, (*h).clone()))
                .map(|(h, _)| h.clone())
            else {
                break;
            };
            match self.request_move(p, &to) {
                Ok(_) => *load.entry(to).or_default() += 1,
                Err(e) => tracing::warn!(partition = %p, "moving away: {e}"),
            }
        }
        let deadline = started + self.parts.handoff_timeout;
        loop {
            let left = {
                let catalog = self.parts.catalog.lock();
                mine.iter()
                    .filter(|p| {
                        catalog
                            .move_under_way(p)
                            .is_some_and(|m| m.from == self.parts.host_id)
                    })
                    .count()
            };
            if left == 0 {
                break;
            }
            if Instant::now() > deadline {
                tracing::warn!(
                    left,
                    "moves away did not end within the handoff timeout; the rest stop cold"
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::info!(
            secs = started.elapsed().as_secs_f64(),
            "partitions moved away"
        );
    }

    /// Refuses a replica of `partition` here when this host's state on disk, with the
    /// partition's state as its owner reports it, would break `--state-disk`.
    pub(crate) fn check_state_disk(&self, partition: &str) -> std::result::Result<(), String> {
        let Some(bound) = self.parts.state_disk else {
            return Ok(());
        };
        let used = dir_size(&self.parts.state_dir);
        let adds = (self.parts.partition_bytes)(partition);
        if used + adds > bound {
            return Err(format!(
                "host `{}` refuses a replica of `{partition}`: its state takes {used} bytes on disk \
                 and the partition's about {adds} more, over its --state-disk bound of {bound} bytes",
                self.parts.host_id
            ));
        }
        Ok(())
    }

    /// The controller's part: a move whose target left, or whose partition changed owner
    /// otherwise, is abandoned.
    pub(crate) fn stale_moves(&self, alive: &[String]) -> Vec<(MoveRecord, String)> {
        let catalog = self.parts.catalog.lock();
        let mut stale = Vec::new();
        for moves in catalog.moves.values() {
            for m in moves.iter().filter(|m| !m.phase.ended()) {
                let owner = catalog
                    .assignments
                    .get(&m.partition)
                    .map(|a| a.owner.as_str());
                if !alive.contains(&m.to) {
                    stale.push((m.clone(), format!("the target `{}` left the cluster", m.to)));
                } else if owner != Some(m.from.as_str()) && owner != Some(m.to.as_str()) {
                    stale.push((
                        m.clone(),
                        format!(
                            "the partition's owner changed to `{}`",
                            owner.unwrap_or("-")
                        ),
                    ));
                }
            }
        }
        stale
    }
}

/// When a move passed its phases, for its trace.
#[derive(Default)]
struct MoveTimes {
    /// The target asked the owner to drain.
    handoff: Option<Instant>,
    /// The owner's final commit: the pause starts.
    final_commit: Option<Instant>,
}

/// Exports move `m`'s trace ([`crate::otlp`]): a `move` span from its start here to its end,
/// with a child for warming, one for the owner's drain, and one for each step of the pause.
fn trace_move(
    m: &MoveRecord,
    started: Instant,
    times: &MoveTimes,
    outcome: &std::result::Result<Option<(f64, Vec<MoveStep>)>, String>,
) {
    use crate::otlp::Span;
    let end = Instant::now();
    let mut root = Span::root("move", started, end)
        .attr("baton.move", m.id.as_str())
        .attr("baton.partition", m.partition.as_str())
        .attr("baton.pipeline", m.pipeline.as_str())
        .attr("baton.from", m.from.as_str())
        .attr("baton.to", m.to.as_str());
    root = match outcome {
        Ok(Some((pause, _))) => root
            .attr("baton.outcome", "done")
            .attr("baton.pause_ms", *pause),
        Ok(None) => root.attr("baton.outcome", "done"),
        Err(reason) => root
            .attr("baton.outcome", "abandoned")
            .error(reason.as_str()),
    };
    let mut children = vec![root.child("move.warming", started, times.handoff.unwrap_or(end))];
    if let Some(handoff) = times.handoff {
        children.push(root.child(
            "move.drain",
            handoff,
            times.final_commit.unwrap_or(end).max(handoff),
        ));
    }
    if let (Some(mut at), Ok(Some((_, steps)))) = (times.final_commit, outcome) {
        for step in steps {
            let next = at + Duration::from_secs_f64(step.ms.max(0.0) / 1e3);
            children.push(
                root.child(format!("move.{}", step.step), at, next)
                    .attr("baton.ms", step.ms),
            );
            at = next;
        }
    }
    root.export();
    for c in children {
        c.export();
    }
}

/// The target's checks of the owner's release before its take-over; the reason for giving
/// the move up when one fails:
/// 1. the owner's last transaction is complete: for committed reads, every changelog slot
///    ends at or past its released end (the transaction's records are readable);
/// 2. the replica read the changelogs to those ends, and is at exactly the released ends;
/// 3. the group's committed offsets are the released input offsets.
fn check_release(
    r: &ReleaseRecord,
    pipeline: &PipelineRecord,
    prepared: &mut Prepared,
    replica: &Replica,
    db: &crate::state::PartitionDb,
    marks: &mut Vec<(&'static str, Instant)>,
) -> std::result::Result<(), String> {
    let deadline = Instant::now() + RELEASE_SETTLE;
    let tail = prepared.tail();
    loop {
        tail.refresh()
            .map_err(|e| format!("reading the changelogs' ends: {e:#}"))?;
        let mut short = None;
        for c in &r.changelogs {
            let topic = pipeline.changelog_topic(&c.store);
            let Some(end) = tail.end(&topic, c.slot) else {
                return Err(format!(
                    "the owner released changelog {topic}/{}, which this partition does not read",
                    c.slot
                ));
            };
            if end < c.end {
                short = Some((topic, c.slot, end, c.end));
                break;
            }
        }
        let Some((topic, slot, end, released)) = short else {
            break;
        };
        if Instant::now() > deadline {
            return Err(format!(
                "changelog {topic}/{slot} ends at {end} for committed reads, before the end \
                 {released} the owner released: its last transaction did not complete within {}s",
                RELEASE_SETTLE.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    marks.push(("stable", Instant::now()));
    while !tail.caught_up() {
        replica.poll(tail, db, Duration::from_millis(2))?;
        if Instant::now() > deadline {
            return Err(format!(
                "the final changelog records were not read within {}s",
                RELEASE_SETTLE.as_secs()
            ));
        }
    }
    marks.push(("caught-up", Instant::now()));
    for c in &r.changelogs {
        let topic = pipeline.changelog_topic(&c.store);
        let key = crate::partition::changelog_offset_key(&c.store, c.slot);
        let applied = db
            .get_meta_u64(&key)
            .map_err(|e| format!("reading the changelog position {key}: {e}"))?
            .unwrap_or(0)
            .max(tail.start(&topic, c.slot).unwrap_or(0));
        if applied != c.end {
            return Err(format!(
                "the replica holds changelog {topic}/{} up to offset {applied}, but the owner \
                 released it at {}",
                c.slot, c.end
            ));
        }
    }
    let tps: Vec<(String, u32)> = r
        .offsets
        .iter()
        .map(|o| (o.topic.clone(), o.slot))
        .collect();
    loop {
        let got = prepared
            .committed(&tps)
            .map_err(|e| format!("reading the group's offsets: {e}"))?;
        let mut behind = None;
        for (o, &g) in r.offsets.iter().zip(&got) {
            // No offset: the owner never committed one, and started where the new owner will.
            let Some(g) = g else { continue };
            if g > o.offset {
                return Err(format!(
                    "the group's offset of {}/{} is {g}, past the {} the owner released: a \
                     commit came after the release",
                    o.topic, o.slot, o.offset
                ));
            }
            if g < o.offset {
                behind = Some((o, g));
            }
        }
        let Some((o, g)) = behind else {
            prepared.checked(&tps, &got);
            return Ok(());
        };
        if Instant::now() > deadline {
            return Err(format!(
                "the group's offset of {}/{} is {g}, not the {} the owner released, after {}s",
                o.topic,
                o.slot,
                o.offset,
                RELEASE_SETTLE.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Pauses of the moves this host took over, in ms (for `/metrics`).
#[derive(Default)]
pub struct Pauses {
    all: Vec<f64>,
}

impl Pauses {
    pub(crate) fn push(&mut self, ms: f64) {
        self.all.push(ms);
        if self.all.len() > 1000 {
            self.all.remove(0);
        }
    }

    /// The pauses kept, oldest first.
    pub fn all(&self) -> &[f64] {
        &self.all
    }
}

/// Bytes of the files under `dir`, recursively (0 when it does not exist).
fn dir_size(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

/// The `q` quantile (0 to 1) of `values`, nearest rank; `None` when empty.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len().max(1)) - 1;
    v.get(i).copied()
}

/// Posts `body` as JSON to `path` of the host at `base`; answers the JSON reply.
pub(crate) fn post_json<B: Serialize, T: serde::de::DeserializeOwned>(
    base: &str,
    path: &str,
    body: &B,
    token: Option<&str>,
    timeout: Duration,
) -> std::result::Result<T, String> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let call = async {
        let mut req = reqwest::Client::new()
            .post(&url)
            .json(body)
            .timeout(timeout);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        // reqwest's message alone is a word ("builder error"): its causes name the problem.
        let r = req.send().await.map_err(|e| {
            let mut msg = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                msg.push_str(&format!(": {c}"));
                cause = c.source();
            }
            msg
        })?;
        let status = r.status();
        if status.is_success() {
            r.json::<T>().await.map_err(|e| e.to_string())
        } else {
            Err(format!("{status}: {}", r.text().await.unwrap_or_default()))
        }
    };
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?
        .block_on(call)
}
