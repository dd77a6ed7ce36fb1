//! The controller: the host that holds partition 0 of `<cluster>.hosts` gives every partition
//! of every pipeline an owner among the live hosts, and writes each change as an `assigned`
//! event, with the partition's epoch bumped, to the control log.
//!
//! Its authority comes from a transactional producer, `transactional.id = <cluster>.controller`:
//! a host that becomes the controller calls `init_transactions`, which fences the producer of
//! any earlier controller, so two hosts that both believe they are the controller cannot both
//! write. Assignments are written in a transaction and read `read_committed`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use parking_lot::Mutex;

use crate::cluster::Hosts;
use crate::cluster::moves::Moves;
use crate::control::Catalog;
use crate::control::log::ControlLog;
use crate::control::{AssignmentRecord, ControlEvent, PipelineRecord, now_ms};
use crate::transport::Log;
use crate::transport::kafka::KafkaConfig;

/// How often the controller looks at the hosts and the assignments.
const TICK: Duration = Duration::from_millis(250);

/// The assignments that give every partition of `pipelines` a live owner and its standbys: a
/// partition keeps an owner that is alive; one without (new, or its owner gone) goes to its
/// first live standby (warm already) or else to the live host with the fewest partitions (ties
/// by id), at the next epoch. Each keeps `standbys` live standbys other than its owner, the
/// ones it has first, then the live hosts with the fewest copies; a change of standbys alone
/// keeps the epoch. `alive` must not be empty.
pub fn plan(
    pipelines: &[PipelineRecord],
    current: &BTreeMap<String, AssignmentRecord>,
    alive: &[String],
) -> Vec<AssignmentRecord> {
    let mut load: BTreeMap<&str, usize> = alive.iter().map(|h| (h.as_str(), 0)).collect();
    let mut copies: BTreeMap<&str, usize> = alive.iter().map(|h| (h.as_str(), 0)).collect();
    for a in current.values() {
        if let Some(n) = load.get_mut(a.owner.as_str()) {
            *n += 1;
        }
        for s in &a.standbys {
            if let Some(n) = copies.get_mut(s.as_str()) {
                *n += 1;
            }
        }
    }
    let mut changes = Vec::new();
    for p in pipelines {
        for crate::control::Shape { id, slots } in p.shapes() {
            let old = current.get(&id);
            let owner = match old {
                Some(a) if load.contains_key(a.owner.as_str()) => a.owner.clone(),
                _ => {
                    let standby = old.and_then(|a| {
                        a.standbys
                            .iter()
                            .find(|s| load.contains_key(s.as_str()))
                            .cloned()
                    });
                    let owner = match standby {
                        Some(s) => s,
                        None => match load.iter().min_by_key(|(h, n)| (**n, **h)) {
                            Some((h, _)) => h.to_string(),
                            None => return changes,
                        },
                    };
                    *load.get_mut(owner.as_str()).expect("a live host") += 1;
                    owner
                }
            };
            let want = (p.spec.standbys as usize).min(alive.len().saturating_sub(1));
            let mut standbys: Vec<String> = old
                .map(|a| {
                    a.standbys
                        .iter()
                        .filter(|s| **s != owner && copies.contains_key(s.as_str()))
                        .take(want)
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            while standbys.len() < want {
                let Some((&h, _)) = copies
                    .iter()
                    .filter(|(h, _)| **h != owner && !standbys.iter().any(|s| s == *h))
                    .min_by_key(|(h, n)| (**n, **h))
                else {
                    break;
                };
                *copies.get_mut(h).expect("a live host") += 1;
                standbys.push(h.to_string());
            }
            let moved = old.is_none_or(|a| a.owner != owner);
            if moved || old.is_some_and(|a| a.standbys != standbys) {
                changes.push(AssignmentRecord {
                    pipeline: p.spec.name.clone(),
                    partition: id,
                    slots,
                    owner,
                    epoch: match old {
                        Some(a) if moved => a.epoch + 1,
                        Some(a) => a.epoch,
                        None => 1,
                    },
                    standbys,
                    at: now_ms(),
                    move_id: None,
                    after_release: false,
                });
            }
        }
    }
    changes
}

/// How long a host must be live before the controller moves partitions to it.
const JOIN_SETTLE: Duration = Duration::from_secs(2);

/// How long after it joins a host is topped up to its fair share (moves under way delay it).
const JOIN_WINDOW: Duration = Duration::from_secs(120);

/// A host that joined while this host was the controller, not yet at its fair share.
#[derive(Debug, Clone, Copy)]
struct Joiner {
    /// When it was first seen live.
    since: std::time::Instant,
    /// When to look at its share next.
    next: std::time::Instant,
    /// Rounds of moves asked for it so far.
    rounds: u32,
}

/// The live hosts the controller knows: by id, when each joined (its load reports say), and
/// for one that joined since this host became the controller, its top-up to a fair share.
type Known = BTreeMap<String, (Option<i64>, Option<Joiner>)>;

/// Rounds of moves a joining host gets before the controller stops topping it up (its moves
/// keep being abandoned: it refuses replicas over its `--state-disk` bound, say).
const JOIN_ROUNDS: u32 = 3;

/// Moves that give each host of `joined` a fair share of the partitions (the total over the
/// live hosts, rounded down), each taken from the live host that has the most, and not from a
/// partition that is moving already.
pub fn fair_share(
    catalog: &crate::control::Catalog,
    alive: &[String],
    joined: &[String],
) -> Vec<(String, String)> {
    let mut owned: BTreeMap<&str, Vec<&str>> =
        alive.iter().map(|h| (h.as_str(), Vec::new())).collect();
    for a in catalog.assignments.values() {
        if catalog.move_under_way(&a.partition).is_none()
            && let Some(v) = owned.get_mut(a.owner.as_str())
        {
            v.push(a.partition.as_str());
        }
    }
    let total: usize = catalog.assignments.len();
    let fair = total / alive.len().max(1);
    let mut moves = Vec::new();
    for j in joined {
        while owned.get(j.as_str()).map_or(fair, Vec::len) < fair {
            let Some((&from, _)) = owned
                .iter()
                .filter(|(h, _)| **h != j.as_str())
                .max_by_key(|(h, v)| (v.len(), std::cmp::Reverse(**h)))
            else {
                break;
            };
            if owned[from].len() <= fair {
                break;
            }
            let p = owned.get_mut(from).and_then(Vec::pop).expect("a partition");
            owned.get_mut(j.as_str()).expect("a live host").push(p);
            moves.push((p.to_string(), j.clone()));
        }
    }
    moves
}

/// The controller's loop and the assignments a host writes itself (a new pipeline's first
/// ones, and its partitions given away on a clean stop), over narrow handles.
pub struct Controller {
    host_id: String,
    cluster: String,
    kafka: Option<KafkaConfig>,
    log: Log,
    hosts: Hosts,
    catalog: Arc<Mutex<Catalog>>,
    control: Arc<ControlLog>,
    moves: Arc<Moves>,
    splits: Arc<crate::cluster::split::Splits>,
}

impl Controller {
    /// The controller of host `host_id` in cluster `cluster` (its fenced producer's
    /// transactional id is `<cluster>.controller`, on `kafka`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        host_id: String,
        cluster: String,
        kafka: Option<KafkaConfig>,
        log: Log,
        hosts: Hosts,
        catalog: Arc<Mutex<Catalog>>,
        control: Arc<ControlLog>,
        moves: Arc<Moves>,
        splits: Arc<crate::cluster::split::Splits>,
    ) -> Arc<Self> {
        Arc::new(Controller {
            host_id,
            cluster,
            kafka,
            log,
            hosts,
            catalog,
            control,
            moves,
            splits,
        })
    }

    /// Runs the controller's loop on a thread of its own until `stop` is set: while this host
    /// is the controller, it keeps every partition assigned to a live host.
    pub(crate) fn run(
        self: &Arc<Self>,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let me = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("baton-controller".into())
            .spawn(move || {
                let mut producer: Option<BaseProducer> = None;
                // The live hosts at the last look; for one that joined since this host became
                // the controller, when it joined and when to look at its share again, until it
                // has its fair share or JOIN_WINDOW has passed.
                let mut known: Option<Known> = None;
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(TICK);
                    let Some(c) = me.upgrade() else { return };
                    let hosts = c.hosts.all();
                    let controller = hosts
                        .iter()
                        .any(|h| h.alive && h.controller && h.id == c.host_id);
                    if !controller {
                        producer = None;
                        known = None;
                        continue;
                    }
                    let alive: Vec<String> = hosts
                        .iter()
                        .filter(|h| h.alive)
                        .map(|h| h.id.clone())
                        .collect();
                    // Abandonments the controller decides go through its fenced producer: a
                    // stale controller cannot abandon a healthy move. They take effect on every
                    // host (this one too) when read from the log.
                    let stale: Vec<ControlEvent> = c.moves
                        .stale_moves(&alive)
                        .into_iter()
                        .map(|(m, reason)| {
                            tracing::warn!(move_id = %m.id, partition = %m.partition, "move abandoned: {reason}");
                            ControlEvent::Move(crate::control::MoveRecord {
                                phase: crate::control::MovePhase::Abandoned,
                                reason: Some(reason),
                                pause_ms: None,
                                steps: Vec::new(),
                                at: crate::control::now_ms(),
                                taken_over: false,
                                release: None,
                                ..m
                            })
                        })
                        .collect();
                    if !stale.is_empty() && !c.write_fenced(&mut producer, &stale) {
                        continue;
                    }
                    // So are splits whose owner left, whose partition changed owner, or that
                    // stayed begun too long.
                    let stale: Vec<ControlEvent> = c
                        .splits
                        .stale_splits(&alive)
                        .into_iter()
                        .map(|(s, reason)| {
                            tracing::warn!(split = %s.id, partition = %s.partition, "split given up: {reason}");
                            ControlEvent::Split(Box::new(crate::control::SplitRecord {
                                phase: crate::control::SplitPhase::Abandoned,
                                reason: Some(reason),
                                halves: Vec::new(),
                                at: now_ms(),
                                ..s
                            }))
                        })
                        .collect();
                    if !stale.is_empty() && !c.write_fenced(&mut producer, &stale) {
                        continue;
                    }
                    let stale: Vec<ControlEvent> = c
                        .splits
                        .stale_merges(&alive)
                        .into_iter()
                        .map(|(m, reason)| {
                            tracing::warn!(merge = %m.id, "merge given up: {reason}");
                            ControlEvent::Merge(Box::new(crate::control::MergeRecord {
                                phase: crate::control::SplitPhase::Abandoned,
                                reason: Some(reason),
                                merged: None,
                                at: now_ms(),
                                ..m
                            }))
                        })
                        .collect();
                    if !stale.is_empty() && !c.write_fenced(&mut producer, &stale) {
                        continue;
                    }
                    // Hosts live when this host became the controller count as known; one
                    // that joins later gets a fair share, by warm moves. While any move is
                    // under way (one of these, or one asked for by hand) the shares wait, and
                    // they are looked at again after each round of moves: a move abandoned,
                    // or a partition that was moving when the host joined, does not leave it
                    // short.
                    // A host is known by its id and when it joined: one that stopped and
                    // started again between two looks (never seen gone) joined again too.
                    let now = std::time::Instant::now();
                    let live: Vec<(String, Option<i64>)> = hosts
                        .iter()
                        .filter(|h| h.alive)
                        .map(|h| (h.id.clone(), h.started_at_ms))
                        .collect();
                    let seen = known.get_or_insert_with(|| {
                        live.iter()
                            .map(|(h, started)| (h.clone(), (*started, None)))
                            .collect()
                    });
                    seen.retain(|h, _| alive.contains(h));
                    for (h, started) in &live {
                        let joiner = Joiner {
                            since: now,
                            next: now + JOIN_SETTLE,
                            rounds: 0,
                        };
                        match seen.get_mut(h) {
                            None => {
                                seen.insert(h.clone(), (*started, Some(joiner)));
                            }
                            Some((known_start, state)) => {
                                if started.is_some() && *known_start != *started {
                                    if known_start.is_some() {
                                        *state = Some(joiner);
                                    }
                                    *known_start = *started;
                                }
                            }
                        }
                    }
                    let moving = {
                        let catalog = c.catalog.lock();
                        catalog
                            .assignments
                            .keys()
                            .any(|p| catalog.move_under_way(p).is_some())
                    };
                    for (h, (_, joiner)) in seen.iter_mut() {
                        let Some(j) = joiner else { continue };
                        if now.duration_since(j.since) > JOIN_WINDOW {
                            tracing::warn!(
                                host = %h,
                                rounds = j.rounds,
                                "a joining host did not get its fair share; its partitions stay where they are"
                            );
                            *joiner = None;
                            continue;
                        }
                        if moving || now < j.next {
                            continue;
                        }
                        let moves = {
                            let catalog = c.catalog.lock();
                            fair_share(&catalog, &alive, std::slice::from_ref(h))
                        };
                        if moves.is_empty() {
                            *joiner = None;
                            continue;
                        }
                        if j.rounds >= JOIN_ROUNDS {
                            tracing::warn!(
                                host = %h,
                                rounds = j.rounds,
                                "a joining host did not get its fair share; its partitions stay where they are"
                            );
                            *joiner = None;
                            continue;
                        }
                        j.next = now + JOIN_SETTLE;
                        j.rounds += 1;
                        let mut begun = Vec::new();
                        for (partition, to) in moves {
                            match c.moves.new_move(&partition, &to) {
                                Ok(m) => {
                                    tracing::info!(
                                        partition, to, move_id = %m.id, "moving to a joining host"
                                    );
                                    begun.push(ControlEvent::Move(m));
                                }
                                Err(e) => {
                                    tracing::warn!(partition, to, "moving to a joining host: {e}")
                                }
                            }
                        }
                        if !begun.is_empty() {
                            c.write_fenced(&mut producer, &begun);
                        }
                        // One joiner's round at a time: the next looks once these are done.
                        break;
                    }
                    let changes = {
                        let catalog = c.catalog.lock();
                        let pipelines: Vec<PipelineRecord> =
                            catalog.pipelines.values().cloned().collect();
                        plan(&pipelines, &catalog.assignments, &alive)
                    };
                    if changes.is_empty() {
                        continue;
                    }
                    let events: Vec<ControlEvent> =
                        changes.iter().cloned().map(ControlEvent::Assigned).collect();
                    if c.write_fenced(&mut producer, &events) {
                        for c in &changes {
                            tracing::info!(
                                partition = %c.partition, owner = %c.owner, epoch = c.epoch,
                                "assigned"
                            );
                        }
                    }
                }
            })
    }

    fn controller_producer(&self) -> anyhow::Result<BaseProducer> {
        let cfg = self
            .kafka
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("no Kafka"))?;
        let p: BaseProducer = cfg
            .client_config(&[
                ("transactional.id", &format!("{}.controller", self.cluster)),
                ("enable.idempotence", "true"),
                ("acks", "all"),
                ("linger.ms", "0"),
                // A controller that dies mid-transaction holds every control-log reader
                // (read_committed) back until its transaction is aborted: by the next
                // controller's init_transactions, or by the broker after this long.
                ("transaction.timeout.ms", "10000"),
            ])
            .create()?;
        p.init_transactions(Duration::from_secs(30))?;
        Ok(p)
    }

    /// Writes the controller's `events` in one transaction of its fenced producer (made first
    /// when there is none); false, with the producer dropped, when that fails (fenced by a
    /// newer controller, or the broker failed): the next tick starts over.
    fn write_fenced(&self, producer: &mut Option<BaseProducer>, events: &[ControlEvent]) -> bool {
        if producer.is_none() {
            match self.controller_producer() {
                Ok(p) => *producer = Some(p),
                Err(e) => {
                    tracing::warn!("becoming the controller: {e:#}");
                    return false;
                }
            }
        }
        let p = producer.as_ref().expect("set above");
        match self.write_events(p, events) {
            Ok(()) => {
                self.control.wake_follower();
                true
            }
            Err(e) => {
                tracing::warn!("writing the controller's decisions: {e:#}");
                *producer = None;
                false
            }
        }
    }

    fn write_events(&self, p: &BaseProducer, events: &[ControlEvent]) -> anyhow::Result<()> {
        p.begin_transaction()?;
        for c in events {
            let value = serde_json::to_vec(c)?;
            let rec = BaseRecord::<(), [u8]>::to(self.control.topic())
                .partition(0)
                .payload(&value);
            if let Err((e, _)) = p.send(rec) {
                let _ = p.abort_transaction(Duration::from_secs(10));
                return Err(e.into());
            }
        }
        p.commit_transaction(Duration::from_secs(30))?;
        Ok(())
    }

    /// On a clean stop, once this host's partitions have committed and stopped: gives each of
    /// them to the live host with the fewest partitions, at the next epoch, so that they start
    /// there at once rather than once the controller sees this host gone.
    pub(crate) fn hand_off(&self) {
        if !self.log.is_kafka() {
            return;
        }
        let others = self.hosts.live_others();
        if others.is_empty() {
            return;
        }
        let _control = self.control.lock();
        let (pipelines, current) = {
            let catalog = self.catalog.lock();
            let pipelines: Vec<PipelineRecord> = catalog.pipelines.values().cloned().collect();
            (pipelines, catalog.assignments.clone())
        };
        // Without this host among the live ones, the plan moves exactly what it owns (and what
        // other gone hosts own, which the controller would move anyway).
        for a in plan(&pipelines, &current, &others) {
            let event = ControlEvent::Assigned(a.clone());
            // Takes effect when read back, here as everywhere.
            match self.control.append(&event) {
                Ok(_) => {
                    tracing::info!(partition = %a.partition, to = %a.owner, "handed off");
                }
                // The controller gives it away once this host has left the group.
                Err(e) => tracing::warn!(partition = %a.partition, "handing off: {e}"),
            }
        }
    }

    /// The first assignments of a new pipeline, written by the host that creates it (the
    /// controller corrects them later if their owners are gone): its partitions spread over the
    /// live hosts, or all here when none is known yet.
    pub(crate) fn initial_assignments(&self, record: &PipelineRecord) -> Vec<AssignmentRecord> {
        let mut alive = self.hosts.live();
        if !alive.contains(&self.host_id) {
            alive.push(self.host_id.clone());
        }
        let current = self.catalog.lock().assignments.clone();
        plan(std::slice::from_ref(record), &current, &alive)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::PipelineSpec;

    fn pipeline(name: &str, partitions: u32) -> PipelineRecord {
        let spec: PipelineSpec = serde_json::from_value(serde_json::json!({
            "name": name, "module": "m", "version": "1", "inputs": ["in"],
            "slots": 8, "partitions": partitions
        }))
        .unwrap();
        PipelineRecord {
            spec,
            sha256: String::new(),
            start_offsets: Default::default(),
            created_at: 0,
            prefix: "baton".into(),
            swaps: Vec::new(),
            incarnation: None,
            replays: Default::default(),
            layout: None,
        }
    }

    #[test]
    fn a_joining_host_gets_a_fair_share_from_the_most_loaded() {
        let hosts = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut catalog = crate::control::Catalog::default();
        catalog.apply(ControlEvent::Pipeline(Box::new(pipeline("p", 7))));
        for a in plan(&[pipeline("p", 7)], &BTreeMap::new(), &hosts(&["a", "b"])) {
            catalog.apply(ControlEvent::Assigned(a));
        }
        // a has 4, b 3; c joins: fair is 7 / 3 = 2, taken from a, then from the larger again.
        let moves = fair_share(&catalog, &hosts(&["a", "b", "c"]), &hosts(&["c"]));
        assert_eq!(moves.len(), 2, "{moves:?}");
        assert!(moves.iter().all(|(_, to)| to == "c"), "{moves:?}");
        let from: Vec<String> = moves
            .iter()
            .map(|(p, _)| catalog.assignments[p].owner.clone())
            .collect();
        assert_eq!(from, ["a", "a"].map(String::from).to_vec(), "{moves:?}");
        // Nobody joined, or the joiner has its share: nothing moves.
        assert!(fair_share(&catalog, &hosts(&["a", "b"]), &[]).is_empty());
        assert!(fair_share(&catalog, &hosts(&["a", "b"]), &hosts(&["b"])).is_empty());
    }

    #[test]
    fn partitions_spread_over_live_hosts_and_leave_dead_ones() {
        let hosts = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let p = [pipeline("p", 4)];
        let first = plan(&p, &BTreeMap::new(), &hosts(&["a", "b"]));
        let owners: Vec<(&str, &str, u64)> = first
            .iter()
            .map(|a| (a.partition.as_str(), a.owner.as_str(), a.epoch))
            .collect();
        assert_eq!(
            owners,
            vec![
                ("p-0", "a", 1),
                ("p-1", "b", 1),
                ("p-2", "a", 1),
                ("p-3", "b", 1)
            ]
        );
        let current: BTreeMap<String, AssignmentRecord> = first
            .into_iter()
            .map(|a| (a.partition.clone(), a))
            .collect();
        // Nothing changes while the owners live; a new host gets nothing by itself.
        assert!(plan(&p, &current, &hosts(&["a", "b", "c"])).is_empty());
        // b is gone: its partitions go to the least loaded live hosts, at the next epoch.
        let moved = plan(&p, &current, &hosts(&["a", "c"]));
        let owners: Vec<(&str, &str, u64)> = moved
            .iter()
            .map(|a| (a.partition.as_str(), a.owner.as_str(), a.epoch))
            .collect();
        assert_eq!(owners, vec![("p-1", "c", 2), ("p-3", "c", 2)]);
        assert!(
            plan(&p, &current, &[]).is_empty(),
            "no live host: nothing to do"
        );
    }
}
