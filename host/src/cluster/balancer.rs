//! Auto-balance: on the controller, once a second, the partitions of every pipeline whose spec
//! has `balance.enabled` are looked at through their owners' load reports, and at most one
//! decision is taken at a time cluster-wide:
//!
//! 1. **Split a hot partition**: one whose input rate (records/s over `window_s`) or guest CPU
//!    (share of a core spent in guest calls) is at or above `split_records_per_s` or
//!    `split_guest_cpu`. A partition of one slot cannot split: it moves to the least loaded
//!    other host instead, if that host would stay below `host_records_per_s` with it.
//! 2. **Move off an overloaded host**: a host whose partitions take `host_records_per_s` or more
//!    in all gives its busiest partition to the least loaded host, if that lowers the busier of
//!    the two.
//! 3. **Merge cold neighbours**: two adjacent partitions each below `merge_records_per_s`, and
//!    together below half of `split_records_per_s` (so that what a merge makes is never hot
//!    enough to split again), merge.
//!
//! **No flapping.** A partition is looked at only once its rates cover `window_s`, which a new
//! partition (a split's half, a merge's result) does not until it has run that long; and no
//! decision touches a slot that a decision touched less than `cooldown_s` ago. The thresholds
//! leave a band between merging and splitting (hysteresis): a split's halves each carry about
//! half of a hot partition's load, far above `merge_records_per_s`.
//!
//! Every decision is kept with its reason and inputs (the partitions' rates, CPU and slots, the
//! hosts' loads) and its outcome: `GET /api/v1/balancer/log` (answered by the controller) and
//! `baton_balancer_decisions_total` in `/metrics`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::cluster::Hosts;
use crate::cluster::moves::Moves;
use crate::cluster::split::Splits;
use crate::control::pipeline::BalancePolicy;
use crate::control::{Catalog, now_ms};
use crate::partition::report::{PartitionInfo, Role};

/// How often the balancer looks.
const TICK: Duration = Duration::from_secs(1);

/// Decisions kept in the log (the newest).
const LOG_KEPT: usize = 500;

/// What the balancer decided.
#[derive(
    Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Split a partition.
    Split,
    /// Move a partition to another host.
    Move,
    /// Merge two neighbours.
    Merge,
}

impl Action {
    /// Its name in metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Split => "split",
            Action::Move => "move",
            Action::Merge => "merge",
        }
    }
}

/// A partition as the balancer saw it.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Seen {
    /// Partition id.
    pub id: String,
    /// Its slots.
    pub slots: [u32; 2],
    /// Its owner.
    pub owner: String,
    /// Input records per second over the window.
    pub records_per_s: f64,
    /// Share of one core spent in guest calls over the window.
    pub guest_cpu: f64,
}

/// One decision of the balancer.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Decision {
    /// When (ms since the Unix epoch).
    pub at: i64,
    /// The pipeline.
    pub pipeline: String,
    /// What.
    pub action: Action,
    /// The partitions it is about (two for a merge).
    pub partitions: Vec<String>,
    /// For a move: the host it goes to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Why, with the numbers and the setting that decided it.
    pub reason: String,
    /// The partitions it looked at, with their rates.
    pub inputs: Vec<Seen>,
    /// Each live host's input records per second, over every balanced pipeline.
    pub host_loads: BTreeMap<String, f64>,
    /// What came of it: `asked` until the split, move or merge answers, then `done` (with
    /// its id) or the error.
    pub outcome: String,
}

/// Where the balancer's decisions outlive the controller that took them: a new controller
/// starts its log from what the last one kept.
pub trait DecisionStore: Send + Sync {
    /// The decisions kept, oldest first.
    fn load(&self) -> anyhow::Result<Vec<Decision>>;
    /// Keeps `log` (the newest decisions, oldest first) in place of what was kept.
    fn save(&self, log: &[Decision]) -> anyhow::Result<()>;
}

/// How long after a failed read of the kept decisions the balancer tries again.
const LOAD_RETRY: Duration = Duration::from_secs(30);

/// Most decisions [`KafkaDecisions`] keeps.
const STORED_KEPT: usize = 100;
/// Most bytes of the record that holds them.
const STORED_BYTES: usize = 768 << 10;

/// The decisions in the compacted topic `<cluster>.balancer`: one record, keyed `log`, holds
/// the newest of them ([`STORED_KEPT`] at most).
pub struct KafkaDecisions {
    topic: String,
    config: crate::transport::kafka::KafkaConfig,
    producer: rdkafka::producer::BaseProducer,
}

impl KafkaDecisions {
    /// The store of cluster `cluster`, creating its topic when missing.
    pub fn new(
        kafka: &crate::transport::kafka::KafkaTransport,
        cluster: &str,
    ) -> anyhow::Result<Self> {
        use crate::transport::Transport;
        let topic = format!("{cluster}.balancer");
        kafka.ensure_topic(&topic, 1, crate::transport::TopicKind::Compacted)?;
        let config = kafka.config().clone();
        let producer = config
            .client_config(&[("linger.ms", "0"), ("acks", "all")])
            .create()?;
        Ok(KafkaDecisions {
            topic,
            config,
            producer,
        })
    }
}

impl DecisionStore for KafkaDecisions {
    fn load(&self) -> anyhow::Result<Vec<Decision>> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::message::Message;
        let consumer: BaseConsumer = self
            .config
            .client_config(&[
                ("enable.auto.commit", "false"),
                ("group.id", &format!("{}-readers", self.topic)),
            ])
            .create()?;
        let (_, high) = consumer.fetch_watermarks(&self.topic, 0, Duration::from_secs(5))?;
        if high <= 0 {
            return Ok(Vec::new());
        }
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset(&self.topic, 0, rdkafka::Offset::Beginning)?;
        consumer.assign(&tpl)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = None;
        while Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    if let Some(v) = m.payload() {
                        last = Some(v.to_vec());
                    }
                    if m.offset() + 1 >= high {
                        break;
                    }
                }
                Some(Err(e)) => return Err(e.into()),
                None => {}
            }
        }
        Ok(match last {
            Some(v) => serde_json::from_slice(&v)?,
            None => Vec::new(),
        })
    }

    fn save(&self, log: &[Decision]) -> anyhow::Result<()> {
        use rdkafka::producer::{BaseRecord, Producer};
        // The newest that fit in one record well under the broker's default limit (1 MiB).
        let mut from = log.len().saturating_sub(STORED_KEPT);
        let value = loop {
            let value = serde_json::to_vec(&log[from..])?;
            if value.len() <= STORED_BYTES || from == log.len() {
                break value;
            }
            from += (log.len() - from).div_ceil(4);
        };
        self.producer
            .send(
                BaseRecord::<str, [u8]>::to(&self.topic)
                    .key("log")
                    .payload(&value),
            )
            .map_err(|(e, _)| e)?;
        self.producer.flush(Duration::from_secs(10))?;
        Ok(())
    }
}

/// Asks host `host` to `POST path` with a JSON body: its answer, or why not.
pub type Ask =
    Box<dyn Fn(&str, &str, serde_json::Value) -> Result<serde_json::Value, String> + Send + Sync>;

/// Samples of one partition's counters: (when, records, guest ms).
type Samples = VecDeque<(Instant, u64, u64)>;

/// What the balancer works over.
pub struct BalancerParts {
    /// This host's id.
    pub host_id: String,
    /// The hosts of the cluster.
    pub hosts: Hosts,
    /// The catalog.
    pub catalog: Arc<Mutex<Catalog>>,
    /// Splits and merges (made here, or asked of the owner).
    pub splits: Arc<Splits>,
    /// Moves.
    pub moves: Arc<Moves>,
    /// The partition table (every host's partitions, as their owners report them).
    pub rows: Box<dyn Fn() -> Vec<PartitionInfo> + Send + Sync>,
    /// Asks the owner of a partition to split or merge it.
    pub ask: Ask,
    /// Where the decisions outlive this host's time as the controller (none on the embedded
    /// log, where the host is alone).
    pub store: Option<Box<dyn DecisionStore>>,
}

/// The balancer of a host (it acts while the host is the controller).
pub struct Balancer {
    parts: BalancerParts,
    me: Weak<Balancer>,
    /// Per partition: samples of (when, records, guest ms) from its owner's reports.
    samples: Mutex<BTreeMap<String, Samples>>,
    /// Per pipeline and slot: when a decision last touched it.
    touched: Mutex<BTreeMap<(String, u32), Instant>>,
    /// The decisions, oldest first.
    log: Mutex<VecDeque<Decision>>,
    /// Decisions per (pipeline, action).
    counts: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// A decision is being carried out: no other is taken meanwhile.
    busy: Arc<AtomicBool>,
    /// The log was read from the store since this host became the controller.
    loaded: AtomicBool,
    /// When reading it last failed: tried again after [`LOAD_RETRY`].
    load_failed: Mutex<Option<Instant>>,
}

impl Balancer {
    /// A balancer over `parts`.
    pub fn new(parts: BalancerParts) -> Arc<Self> {
        Arc::new_cyclic(|me| Balancer {
            parts,
            me: me.clone(),
            samples: Mutex::new(BTreeMap::new()),
            touched: Mutex::new(BTreeMap::new()),
            log: Mutex::new(VecDeque::new()),
            counts: Mutex::new(BTreeMap::new()),
            busy: Arc::new(AtomicBool::new(false)),
            loaded: AtomicBool::new(false),
            load_failed: Mutex::new(None),
        })
    }

    /// As the new controller: the decisions the last one kept, before this host's own.
    fn load_kept(&self) {
        let Some(store) = &self.parts.store else {
            self.loaded.store(true, Ordering::Relaxed);
            return;
        };
        if self
            .load_failed
            .lock()
            .is_some_and(|t| t.elapsed() < LOAD_RETRY)
        {
            return;
        }
        match store.load() {
            Ok(kept) => {
                let mut log = self.log.lock();
                let mine: Vec<Decision> = log.drain(..).collect();
                for d in kept.into_iter().chain(mine) {
                    if !log.iter().any(|e| e.at == d.at && e.pipeline == d.pipeline) {
                        log.push_back(d);
                    }
                }
                log.make_contiguous().sort_by_key(|d| d.at);
                while log.len() > LOG_KEPT {
                    log.pop_front();
                }
                self.loaded.store(true, Ordering::Relaxed);
            }
            Err(e) => {
                *self.load_failed.lock() = Some(Instant::now());
                tracing::warn!("balancer: reading the decisions kept: {e:#}");
            }
        }
    }

    /// Writes the log to the store: only as the controller, and once what the last one kept
    /// is in it (else this would overwrite it).
    fn keep(&self) {
        if !self.loaded.load(Ordering::Relaxed) || !self.parts.hosts.is_controller() {
            return;
        }
        if let Some(store) = &self.parts.store {
            let log: Vec<Decision> = self.log.lock().iter().cloned().collect();
            if let Err(e) = store.save(&log) {
                tracing::warn!("balancer: keeping the decisions: {e:#}");
            }
        }
    }

    /// The decisions, oldest first.
    pub fn log(&self) -> Vec<Decision> {
        self.log.lock().iter().cloned().collect()
    }

    /// Decisions taken per (pipeline, action).
    pub fn counts(&self) -> Vec<(String, &'static str, u64)> {
        self.counts
            .lock()
            .iter()
            .map(|((p, a), n)| (p.clone(), *a, *n))
            .collect()
    }

    /// Runs the balancer on a thread of its own until `stop` is set.
    pub fn run(
        self: &Arc<Self>,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let me = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("baton-balancer".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(TICK);
                    let Some(b) = me.upgrade() else { return };
                    if b.parts.hosts.is_controller() {
                        if !b.loaded.load(Ordering::Relaxed) {
                            b.load_kept();
                        }
                        b.tick();
                    } else {
                        b.samples.lock().clear();
                        b.loaded.store(false, Ordering::Relaxed);
                    }
                }
            })
    }

    /// One look: samples the rates and takes at most one decision.
    fn tick(&self) {
        let policies: BTreeMap<String, BalancePolicy> = {
            let catalog = self.parts.catalog.lock();
            catalog
                .pipelines
                .values()
                .filter(|p| p.spec.balance.enabled)
                .map(|p| (p.spec.name.clone(), p.spec.balance.clone()))
                .collect()
        };
        if policies.is_empty() {
            return;
        }
        let rows: Vec<PartitionInfo> = (self.parts.rows)()
            .into_iter()
            .filter(|r| r.role == Role::Active && policies.contains_key(&r.pipeline))
            .collect();
        let now = Instant::now();
        let window = policies.values().map(|p| p.window_s).max().unwrap_or(10);
        {
            let mut samples = self.samples.lock();
            samples.retain(|id, _| rows.iter().any(|r| r.id == *id));
            for r in &rows {
                let s = samples.entry(r.id.clone()).or_default();
                // A counter that went back (the partition restarted or moved): start again.
                if s.back()
                    .is_some_and(|&(_, n, g)| r.records < n || r.time_ms.process < g)
                {
                    s.clear();
                }
                s.push_back((now, r.records, r.time_ms.process));
                while s.len() > 2
                    && s.front().is_some_and(|(t, _, _)| {
                        now.duration_since(*t) > Duration::from_secs(window + 2)
                    })
                {
                    s.pop_front();
                }
            }
        }
        if self.busy.load(Ordering::Acquire) {
            return;
        }
        let alive = self.parts.hosts.live();
        let seen: Vec<(String, Seen, bool)> = {
            let samples = self.samples.lock();
            rows.iter()
                .filter_map(|r| {
                    let policy = &policies[&r.pipeline];
                    let s = samples.get(&r.id)?;
                    let (first, last) = (s.front()?, s.back()?);
                    let span = last.0.duration_since(first.0).as_secs_f64();
                    // Known over its whole window only.
                    let known = span + 1.5 >= policy.window_s as f64;
                    let span = span.max(1e-3);
                    Some((
                        r.pipeline.clone(),
                        Seen {
                            id: r.id.clone(),
                            slots: r.slots,
                            owner: r.owner.clone(),
                            records_per_s: last.1.saturating_sub(first.1) as f64 / span,
                            guest_cpu: last.2.saturating_sub(first.2) as f64 / 1e3 / span,
                        },
                        known,
                    ))
                })
                .collect()
        };
        let mut host_loads: BTreeMap<String, f64> =
            alive.iter().map(|h| (h.clone(), 0.0)).collect();
        for (_, s, _) in &seen {
            if let Some(l) = host_loads.get_mut(&s.owner) {
                *l += s.records_per_s;
            }
        }
        for (pipeline, policy) in &policies {
            let busy = {
                let catalog = self.parts.catalog.lock();
                catalog
                    .assignments
                    .values()
                    .filter(|a| a.pipeline == *pipeline)
                    .any(|a| {
                        catalog.move_under_way(&a.partition).is_some()
                            || catalog.reshaping(&a.partition)
                    })
            };
            if busy {
                continue;
            }
            let mine: Vec<&Seen> = seen
                .iter()
                .filter(|(p, _, known)| p == pipeline && *known)
                .map(|(_, s, _)| s)
                .collect();
            let all_known = seen.iter().filter(|(p, _, _)| p == pipeline).count() == mine.len();
            if let Some(d) = self.decide(pipeline, policy, &mine, all_known, &host_loads, &alive) {
                self.carry_out(d);
                return;
            }
        }
    }

    /// Whether a decision touched any of `slots` of `pipeline` within `cooldown`.
    fn cooling(&self, pipeline: &str, slots: [u32; 2], cooldown: Duration) -> bool {
        let touched = self.touched.lock();
        (slots[0]..slots[1]).any(|s| {
            touched
                .get(&(pipeline.to_string(), s))
                .is_some_and(|t| t.elapsed() < cooldown)
        })
    }

    /// The decision for one pipeline, if one is due.
    fn decide(
        &self,
        pipeline: &str,
        policy: &BalancePolicy,
        seen: &[&Seen],
        all_known: bool,
        host_loads: &BTreeMap<String, f64>,
        alive: &[String],
    ) -> Option<Decision> {
        let cooldown = Duration::from_secs(policy.cooldown_s);
        let free: Vec<&Seen> = seen
            .iter()
            .copied()
            .filter(|s| !self.cooling(pipeline, s.slots, cooldown))
            .collect();
        let decision = |action, partitions: Vec<String>, to: Option<String>, reason: String| {
            Some(Decision {
                at: now_ms(),
                pipeline: pipeline.to_string(),
                action,
                partitions,
                to,
                reason,
                inputs: seen.iter().map(|s| (*s).clone()).collect(),
                host_loads: host_loads.clone(),
                outcome: "asked".into(),
            })
        };
        let least_loaded = |but: &str| {
            host_loads
                .iter()
                .filter(|(h, _)| *h != but && alive.contains(h))
                .min_by(|a, b| a.1.total_cmp(b.1))
                .map(|(h, l)| (h.clone(), *l))
        };
        // 1. The hottest partition at or over a split threshold.
        let hot = free
            .iter()
            .filter(|s| {
                s.records_per_s >= policy.split_records_per_s
                    || s.guest_cpu >= policy.split_guest_cpu
            })
            .max_by(|a, b| a.records_per_s.total_cmp(&b.records_per_s));
        if let Some(s) = hot {
            let why = format!(
                "{:.0} records/s and {:.2} of a core in guest calls over {} s, at or over \
                 split_records_per_s {} or split_guest_cpu {}",
                s.records_per_s,
                s.guest_cpu,
                policy.window_s,
                policy.split_records_per_s,
                policy.split_guest_cpu
            );
            if s.slots[1] - s.slots[0] >= 2 {
                return decision(
                    Action::Split,
                    vec![s.id.clone()],
                    None,
                    format!("hot: {why}"),
                );
            }
            let owner_has_more = seen.iter().filter(|o| o.owner == s.owner).count() > 1;
            if let Some((to, load)) = least_loaded(&s.owner)
                && owner_has_more
                && load + s.records_per_s < policy.host_records_per_s
            {
                return decision(
                    Action::Move,
                    vec![s.id.clone()],
                    Some(to.clone()),
                    format!(
                        "hot, of one slot (it cannot split): {why}; host `{to}` takes {load:.0} \
                         records/s"
                    ),
                );
            }
        }
        // 2. An overloaded host gives its busiest partition to the least loaded one.
        if let Some((host, load)) = host_loads
            .iter()
            .filter(|(_, l)| **l >= policy.host_records_per_s)
            .max_by(|a, b| a.1.total_cmp(b.1))
            && let Some(s) = free
                .iter()
                .filter(|s| s.owner == *host)
                .max_by(|a, b| a.records_per_s.total_cmp(&b.records_per_s))
            && let Some((to, to_load)) = least_loaded(host)
            && (to_load + s.records_per_s).max(load - s.records_per_s) < *load
        {
            return decision(
                Action::Move,
                vec![s.id.clone()],
                Some(to.clone()),
                format!(
                    "host `{host}` takes {load:.0} records/s, at or over host_records_per_s {}; \
                     `{to}` takes {to_load:.0}",
                    policy.host_records_per_s
                ),
            );
        }
        // 3. Cold neighbours merge, once every partition of the pipeline is known.
        if all_known && policy.merge_records_per_s > 0.0 {
            let mut by_slot: Vec<&Seen> = free.clone();
            by_slot.sort_by_key(|s| s.slots[0]);
            for w in by_slot.windows(2) {
                let (l, r) = (w[0], w[1]);
                let sum = l.records_per_s + r.records_per_s;
                if l.slots[1] == r.slots[0]
                    && l.records_per_s < policy.merge_records_per_s
                    && r.records_per_s < policy.merge_records_per_s
                    && sum < policy.split_records_per_s / 2.0
                    && l.guest_cpu + r.guest_cpu < policy.split_guest_cpu / 2.0
                {
                    return decision(
                        Action::Merge,
                        vec![l.id.clone(), r.id.clone()],
                        None,
                        format!(
                            "cold neighbours: {:.0} and {:.0} records/s, each under \
                             merge_records_per_s {}, together under half of \
                             split_records_per_s {}",
                            l.records_per_s,
                            r.records_per_s,
                            policy.merge_records_per_s,
                            policy.split_records_per_s
                        ),
                    );
                }
            }
        }
        None
    }

    /// Records `d`, marks its slots, and carries it out on a thread of its own.
    fn carry_out(&self, d: Decision) {
        tracing::info!(
            pipeline = %d.pipeline, action = d.action.name(), partitions = ?d.partitions,
            to = ?d.to, reason = %d.reason, "balancer decision"
        );
        {
            let mut touched = self.touched.lock();
            for s in d.inputs.iter().filter(|s| d.partitions.contains(&s.id)) {
                for slot in s.slots[0]..s.slots[1] {
                    touched.insert((d.pipeline.clone(), slot), Instant::now());
                }
            }
        }
        *self
            .counts
            .lock()
            .entry((d.pipeline.clone(), d.action.name()))
            .or_default() += 1;
        let at = d.at;
        {
            let mut log = self.log.lock();
            log.push_back(d.clone());
            while log.len() > LOG_KEPT {
                log.pop_front();
            }
        }
        self.keep();
        self.busy.store(true, Ordering::Release);
        let (me, busy) = (self.me.clone(), self.busy.clone());
        let spawned = std::thread::Builder::new()
            .name("baton-balance".into())
            .spawn(move || {
                let outcome = match me.upgrade() {
                    Some(b) => b.execute(&d),
                    None => Err("the host stops".into()),
                };
                let outcome = match outcome {
                    Ok(what) => format!("done: {what}"),
                    Err(e) => format!("failed: {e}"),
                };
                if let Some(b) = me.upgrade()
                    && let Some(entry) = b.log.lock().iter_mut().rev().find(|e| e.at == at)
                {
                    entry.outcome = outcome;
                }
                if let Some(b) = me.upgrade() {
                    b.keep();
                }
                busy.store(false, Ordering::Release);
            });
        if let Err(e) = spawned {
            tracing::error!("carrying out a balancer decision: {e}");
            self.busy.store(false, Ordering::Release);
        }
    }

    /// Carries out `d`: the split or merge on the owner (here, or asked of it), the move from
    /// here. Answers what was made.
    fn execute(&self, d: &Decision) -> Result<String, String> {
        let owner = |id: &str| {
            self.parts
                .catalog
                .lock()
                .assignments
                .get(id)
                .map(|a| a.owner.clone())
                .ok_or_else(|| format!("no partition `{id}`"))
        };
        match d.action {
            Action::Split => {
                let id = &d.partitions[0];
                let owner = owner(id)?;
                if owner == self.parts.host_id {
                    let s = self
                        .parts
                        .splits
                        .split(id, None, &format!("balancer: {}", d.reason))
                        .map_err(|e| e.to_string())?;
                    Ok(format!("split {} into {}", s.id, s.halves.join(", ")))
                } else {
                    let v = (self.parts.ask)(
                        &owner,
                        &format!("/api/v1/partitions/{id}/split"),
                        serde_json::json!({"reason": format!("balancer: {}", d.reason)}),
                    )?;
                    Ok(format!("split {} into {}", v["id"], v["halves"]))
                }
            }
            Action::Merge => {
                let (l, r) = (&d.partitions[0], &d.partitions[1]);
                let owner = owner(l)?;
                if owner == self.parts.host_id {
                    let m = self
                        .parts
                        .splits
                        .merge(l, r, &format!("balancer: {}", d.reason))
                        .map_err(|e| e.to_string())?;
                    Ok(format!(
                        "merge {} into {}",
                        m.id,
                        m.merged.unwrap_or_default()
                    ))
                } else {
                    let v = (self.parts.ask)(
                        &owner,
                        "/api/v1/partitions/merge",
                        serde_json::json!({
                            "left": l, "right": r,
                            "reason": format!("balancer: {}", d.reason),
                        }),
                    )?;
                    Ok(format!("merge {} into {}", v["id"], v["merged"]))
                }
            }
            Action::Move => {
                let to = d.to.clone().unwrap_or_default();
                let id = self
                    .parts
                    .moves
                    .request_move(&d.partitions[0], &to)
                    .map_err(|e| e.to_string())?;
                Ok(format!("move {id}"))
            }
        }
    }
}
