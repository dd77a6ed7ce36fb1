//! Pipeline specs: what a user asks for, checked before anything is created.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::transport::validate_topic_name;

/// Delivery guarantee of a pipeline.
#[derive(
    Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Guarantee {
    /// Each input record affects state and outputs exactly once (default).
    #[default]
    ExactlyOnce,
    /// No record is lost; after a crash some may be processed again.
    AtLeastOnce,
}

impl Guarantee {
    /// The commit interval of a pipeline that sets none.
    pub fn default_commit_interval_ms(self) -> u64 {
        match self {
            Guarantee::ExactlyOnce => DEFAULT_COMMIT_INTERVAL_MS,
            Guarantee::AtLeastOnce => DEFAULT_AT_LEAST_ONCE_COMMIT_INTERVAL_MS,
        }
    }
}

/// Where a new pipeline starts reading its inputs.
#[derive(
    Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Start {
    /// From the first record (default).
    #[default]
    Earliest,
    /// From the end at creation time.
    Latest,
}

/// The body of `POST /api/v1/pipelines`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// `name = "word-count"`: letters, digits, `-` and `_`, at most 64.
    pub name: String,
    /// `module = "word-count"`: a module uploaded before.
    pub module: String,
    /// `version = "1"`: a version of that module.
    pub version: String,
    /// `inputs = ["words"]`: source topics, each with `slots` partitions.
    pub inputs: Vec<String>,
    /// `outputs = ["shouting"]`: topics the processor may send to.
    #[serde(default)]
    pub outputs: Vec<String>,
    /// `stores = ["counts"]`: state stores the processor may open.
    #[serde(default)]
    pub stores: Vec<String>,
    /// `slots = 8`: partitions of the source topics; fixed for the pipeline's life.
    #[serde(default = "default_slots")]
    pub slots: u32,
    /// `partitions = 1`: how many partitions (slot ranges) to start with.
    #[serde(default = "default_partitions")]
    pub partitions: u32,
    /// `standbys = 1`: warm copies of each partition kept on other hosts (Kafka clusters),
    /// which a failover promotes instead of restoring from the changelogs; 0 to 3.
    #[serde(default)]
    pub standbys: u32,
    /// `guarantee = "exactly-once"` or `"at-least-once"`.
    #[serde(default)]
    pub guarantee: Guarantee,
    /// `config = { output = "shouting" }`: handed to the processor's `init`.
    #[serde(default)]
    pub config: serde_json::Map<String, serde_json::Value>,
    /// `start = "earliest"` or `"latest"`.
    #[serde(default)]
    pub start: Start,
    /// `limits = { memory_bytes = 67108864, cpu_ms = 2000, max_key_bytes = 4096,
    /// max_value_bytes = 1000000 }`: what one instance may use and write.
    #[serde(default)]
    pub limits: GuestLimits,
    /// `swap = { probation_batches = 3, max_failure_share = 0.5 }`: when a new version is
    /// rolled back.
    #[serde(default)]
    pub swap: SwapPolicy,
    /// `wasi = { clocks = true, random = true }`: what of WASI the guests get beyond nothing.
    #[serde(default)]
    pub wasi: crate::runtime::host::WasiGrants,
    /// `partitioner = "any"`: how the inputs' producers place keys, so that a state lookup
    /// knows which slots to read: `murmur2` (Java clients, baton's produce API), `crc32`
    /// (librdkafka clients: Python, Go, C, .NET) or `any` (default: the murmur2 slot first, then
    /// every other).
    #[serde(default)]
    pub partitioner: crate::transport::partitioner::Partitioner,
    /// `commit_interval_ms = 10`: how long processed records may wait for their commit (one
    /// Kafka transaction or flush, one RocksDB write). Shorter gives lower end-to-end latency,
    /// longer fewer commits; 0 commits after every fetched batch. Records also commit at once
    /// when the input runs dry. Unset: the guarantee's default
    /// ([`Guarantee::default_commit_interval_ms`]), which a new pipeline records in its spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_interval_ms: Option<u64>,
    /// `checkpoint_interval_s = 300`: how often each partition's owner takes an incremental
    /// checkpoint of its state into the host's checkpoint store (`--checkpoints`); 0 takes
    /// none but those asked for. Unset: [`DEFAULT_CHECKPOINT_INTERVAL_S`], which a new
    /// pipeline records in its spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_interval_s: Option<u64>,
    /// `balance = { enabled = true, ... }`: auto-balance of this pipeline's partitions (off by
    /// default): see [`BalancePolicy`].
    #[serde(default, skip_serializing_if = "BalancePolicy::is_off_by_default")]
    pub balance: BalancePolicy,
}

/// Auto-balance of a pipeline (`balance = { ... }` in the spec; `PATCH` changes it). The
/// controller splits hot partitions, moves partitions off overloaded hosts and merges cold
/// neighbours, from its hosts' load reports; see `cluster::balancer`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BalancePolicy {
    /// Whether the controller balances this pipeline. Default false.
    pub enabled: bool,
    /// A partition taking at least this many input records/s splits (one of one slot moves).
    /// Default 20,000.
    pub split_records_per_s: f64,
    /// A partition spending at least this share of a core in guest calls splits. Default 0.8.
    pub split_guest_cpu: f64,
    /// Two neighbours each below this many records/s, and together below half of
    /// `split_records_per_s`, merge; 0 never merges. Default 100.
    pub merge_records_per_s: f64,
    /// A host whose partitions take at least this many records/s in all moves its busiest one
    /// to the least loaded host. Default 100,000.
    pub host_records_per_s: f64,
    /// No decision touches a slot that a decision touched less than this long ago (seconds).
    /// Default 300.
    pub cooldown_s: u64,
    /// The rates are measured over this long (seconds), and a partition is looked at once it
    /// has run that long. Default 30.
    pub window_s: u64,
}

impl Default for BalancePolicy {
    fn default() -> Self {
        BalancePolicy {
            enabled: false,
            split_records_per_s: 20_000.0,
            split_guest_cpu: 0.8,
            merge_records_per_s: 100.0,
            host_records_per_s: 100_000.0,
            cooldown_s: 300,
            window_s: 30,
        }
    }
}

impl BalancePolicy {
    /// The default, left out of a spec's JSON.
    pub fn is_off_by_default(&self) -> bool {
        *self == BalancePolicy::default()
    }

    /// Checks the settings; the error names the one out of range.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("split_records_per_s", self.split_records_per_s),
            ("split_guest_cpu", self.split_guest_cpu),
            ("host_records_per_s", self.host_records_per_s),
        ];
        for (name, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("`balance.{name}` must be above 0 (got {v})"));
            }
        }
        if !(self.merge_records_per_s.is_finite() && self.merge_records_per_s >= 0.0) {
            return Err(format!(
                "`balance.merge_records_per_s` must be 0 or more (got {})",
                self.merge_records_per_s
            ));
        }
        if self.merge_records_per_s * 2.0 >= self.split_records_per_s {
            return Err(format!(
                "`balance.merge_records_per_s` ({}) must be under half of split_records_per_s ({}), \
                 or what a merge makes could split again",
                self.merge_records_per_s, self.split_records_per_s
            ));
        }
        if !(2..=3600).contains(&self.window_s) {
            return Err(format!(
                "`balance.window_s` must be 2 to 3600 (got {})",
                self.window_s
            ));
        }
        if self.cooldown_s > 86_400 {
            return Err(format!(
                "`balance.cooldown_s` must be at most 86400 (got {})",
                self.cooldown_s
            ));
        }
        Ok(())
    }
}

pub use crate::runtime::time::TIME_STORE;

impl PipelineSpec {
    /// How long processed records may wait for their commit: the spec's, or its guarantee's
    /// default.
    pub fn commit_interval_ms(&self) -> u64 {
        self.commit_interval_ms
            .unwrap_or_else(|| self.guarantee.default_commit_interval_ms())
    }

    /// How often each partition is checkpointed (seconds; 0: only on demand).
    pub fn checkpoint_interval_s(&self) -> u64 {
        self.checkpoint_interval_s
            .unwrap_or(DEFAULT_CHECKPOINT_INTERVAL_S)
    }

    /// Every store a partition keeps: the declared ones, then [`TIME_STORE`].
    pub fn state_stores(&self) -> Vec<String> {
        let mut all = self.stores.clone();
        all.push(TIME_STORE.to_string());
        all
    }
}

/// Limits of a pipeline's instances. A guest over a limit traps; the record goes to the DLQ.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GuestLimits {
    /// Linear memory of one instance, in bytes (default 256 MiB).
    pub memory_bytes: u64,
    /// Time budget of one guest call, in milliseconds (default 10,000), enforced by epoch
    /// interruption every 10 ms. A call of many records that runs out is retried record by
    /// record, each with the whole budget; only a record over the budget alone is dead-lettered.
    pub cpu_ms: u64,
    /// Most bytes of a state key (default 4096). A longer key gets a `too-large` error.
    pub max_key_bytes: u64,
    /// Most bytes of a state value (default 1,000,000; on Kafka also at most what the store's
    /// changelog topic takes). A larger value gets a `too-large` error.
    pub max_value_bytes: u64,
    /// Most timers pending per slot (default 100,000). Scheduling one more gets a `limit`
    /// error.
    pub max_timers: u64,
}

impl Default for GuestLimits {
    fn default() -> Self {
        GuestLimits {
            memory_bytes: 256 << 20,
            cpu_ms: 10_000,
            max_key_bytes: 4096,
            max_value_bytes: 1_000_000,
            max_timers: 100_000,
        }
    }
}

fn default_slots() -> u32 {
    8
}

fn default_partitions() -> u32 {
    1
}

/// The default of `commit_interval_ms` under exactly-once.
pub const DEFAULT_COMMIT_INTERVAL_MS: u64 = 10;

/// The default of `commit_interval_ms` under at-least-once: its commits are transactions too
/// (for the fence), with the input offsets in them, and a longer interval pays for them over more
/// records, at the cost of more records processed again after a crash (Kafka Streams' own
/// at-least-once default is 30 s).
pub const DEFAULT_AT_LEAST_ONCE_COMMIT_INTERVAL_MS: u64 = 100;

/// The default of `checkpoint_interval_s`: five minutes.
pub const DEFAULT_CHECKPOINT_INTERVAL_S: u64 = 300;

/// The longest `checkpoint_interval_s` (a day): a checkpoint older than the changelog's
/// tombstones is not restored.
pub const MAX_CHECKPOINT_INTERVAL_S: u64 = 86_400;

/// The longest `commit_interval_ms` (a minute).
pub const MAX_COMMIT_INTERVAL_MS: u64 = 60_000;

/// Most slots a pipeline may have.
pub const MAX_SLOTS: u32 = 4096;

use super::names::{self, is_simple_name as valid_name};

impl PipelineSpec {
    /// Checks everything that can be checked without the catalog, for a pipeline of cluster
    /// `cluster`; the message says how to fix it.
    pub fn validate(&self, cluster: &str) -> Result<(), String> {
        names::check_pipeline_name(&self.name)?;
        if self.inputs.is_empty() {
            return Err("`inputs` must name at least one topic".into());
        }
        if self.standbys > 3 {
            return Err(format!(
                "standbys = {} is out of range: use 0 to 3",
                self.standbys
            ));
        }
        for t in self.inputs.iter().chain(self.outputs.iter()) {
            validate_topic_name(t).map_err(|e| e.to_string())?;
            names::check_user_topic(cluster, t)?;
        }
        if let Some(t) = self.outputs.iter().find(|t| self.inputs.contains(t)) {
            return Err(format!("topic `{t}` is both an input and an output"));
        }
        for s in &self.stores {
            if !valid_name(s, 64) {
                return Err(format!(
                    "invalid store name `{s}`: use 1 to 64 ASCII letters, digits, '-' and '_'"
                ));
            }
            if s.starts_with("__") {
                return Err(format!(
                    "invalid store name `{s}`: names starting with `__` are the host's own"
                ));
            }
        }
        if self.limits.max_timers == 0 || self.limits.max_timers > 100_000_000 {
            return Err(format!(
                "limits.max_timers = {} is out of range: use 1 to 100000000",
                self.limits.max_timers
            ));
        }
        if self.limits.memory_bytes < (1 << 20) || self.limits.memory_bytes > (4 << 30) {
            return Err(format!(
                "limits.memory_bytes = {} is out of range: use 1 MiB (1048576) to 4 GiB",
                self.limits.memory_bytes
            ));
        }
        if self.commit_interval_ms() > MAX_COMMIT_INTERVAL_MS {
            return Err(format!(
                "commit_interval_ms = {} is out of range: use 0 to {MAX_COMMIT_INTERVAL_MS}",
                self.commit_interval_ms()
            ));
        }
        self.balance.validate()?;
        if self.checkpoint_interval_s() > MAX_CHECKPOINT_INTERVAL_S {
            return Err(format!(
                "checkpoint_interval_s = {} is out of range: use 0 (only on demand) to \
                 {MAX_CHECKPOINT_INTERVAL_S}",
                self.checkpoint_interval_s()
            ));
        }
        if self.limits.cpu_ms < 10 || self.limits.cpu_ms > 600_000 {
            return Err(format!(
                "limits.cpu_ms = {} is out of range: use 10 to 600000",
                self.limits.cpu_ms
            ));
        }
        if self.limits.max_key_bytes == 0 || self.limits.max_key_bytes > 1 << 20 {
            return Err(format!(
                "limits.max_key_bytes = {} is out of range: use 1 to 1 MiB (1048576)",
                self.limits.max_key_bytes
            ));
        }
        if self.limits.max_value_bytes == 0 || self.limits.max_value_bytes > 64 << 20 {
            return Err(format!(
                "limits.max_value_bytes = {} is out of range: use 1 to 64 MiB (67108864)",
                self.limits.max_value_bytes
            ));
        }
        if !(0.0..=1.0).contains(&self.swap.max_failure_share) {
            return Err(format!(
                "swap.max_failure_share = {} must be between 0 and 1",
                self.swap.max_failure_share
            ));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(d) = self.stores.iter().find(|s| !seen.insert(*s)) {
            return Err(format!("store `{d}` is declared twice"));
        }
        if self.slots == 0 || self.slots > MAX_SLOTS {
            return Err(format!(
                "`slots` must be between 1 and {MAX_SLOTS}, not {}",
                self.slots
            ));
        }
        if self.partitions == 0 || self.partitions > self.slots {
            return Err(format!(
                "`partitions` must be between 1 and `slots` ({}), not {}",
                self.slots, self.partitions
            ));
        }
        Ok(())
    }

    /// The config as pairs for `init`: strings as they are, other values as JSON text.
    pub fn config_pairs(&self) -> Vec<(String, String)> {
        self.config
            .iter()
            .map(|(k, v)| {
                let s = match v {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (k.clone(), s)
            })
            .collect()
    }

    /// The initial slot ranges: `partitions` contiguous ranges of near-equal size.
    pub fn initial_ranges(&self) -> Vec<Range<u32>> {
        let (s, p) = (self.slots as u64, self.partitions as u64);
        (0..p)
            .map(|i| (i * s / p) as u32..((i + 1) * s / p) as u32)
            .collect()
    }
}

/// A created pipeline as the control log records it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PipelineRecord {
    /// The spec as accepted.
    pub spec: PipelineSpec,
    /// sha256 of the module version the pipeline runs.
    pub sha256: String,
    /// Per input topic, per slot: the offset to start from when a slot has no committed offset.
    pub start_offsets: BTreeMap<String, Vec<u64>>,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at: i64,
    /// Prefix of the pipeline's own Kafka names (changelogs, dead letters, consumer group,
    /// transactional ids): the cluster's name when the pipeline was created, `baton` by default.
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// The last swaps of its module version, oldest first.
    #[serde(default)]
    pub swaps: Vec<super::SwapRecord>,
    /// Tells this pipeline from an earlier one of the same name (purged, then created again),
    /// so that their idempotent producers on the embedded log never share an id. Absent in
    /// pipelines created before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<u64>,
    /// Dead letters to process again, per slot: ranges `[from, to)` of the slot's partition of
    /// the dead-letter topic, in the order requested.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub replays: BTreeMap<u32, Vec<(u64, u64)>>,
    /// The partitions once the first split changed them, with what was split; absent while
    /// the pipeline has its initial ranges. Set by the catalog, never appended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<Box<super::Layout>>,
}

fn default_prefix() -> String {
    "baton".into()
}

impl PipelineRecord {
    /// The pipeline's partitions, in slot order: `<pipeline>-<i>` over the initial ranges
    /// until the first split, then as the splits left them.
    pub fn shapes(&self) -> Vec<super::Shape> {
        match &self.layout {
            Some(l) => l.partitions.clone(),
            None => self
                .spec
                .initial_ranges()
                .into_iter()
                .enumerate()
                .map(|(i, r)| super::Shape {
                    id: format!("{}-{i}", self.spec.name),
                    slots: [r.start, r.end],
                })
                .collect(),
        }
    }

    /// The slots of partition `id`, if it is one of the pipeline's now.
    pub fn shape(&self, id: &str) -> Option<[u32; 2]> {
        self.shapes()
            .into_iter()
            .find(|s| s.id == id)
            .map(|s| s.slots)
    }

    /// The dead-letter topic: `<prefix>.<pipeline>.dlq`.
    pub fn dlq_topic(&self) -> String {
        dlq_topic(&self.prefix, &self.spec.name)
    }

    /// The changelog topic of `store`: `<prefix>.<pipeline>.<store>.changelog`.
    ///
    /// The host's own store [`TIME_STORE`] has one too.
    pub fn changelog_topic(&self, store: &str) -> String {
        changelog_topic(&self.prefix, &self.spec.name, store)
    }

    /// The consumer group holding the input offsets: `<prefix>.<pipeline>`.
    pub fn group_id(&self) -> String {
        format!("{}.{}", self.prefix, self.spec.name)
    }

    /// The transactional id of a partition's producer: `<prefix>.<pipeline>.<partition>`.
    pub fn transactional_id(&self, partition: &str) -> String {
        format!("{}.{}.{partition}", self.prefix, self.spec.name)
    }
}

/// The dead-letter topic of `pipeline` under `prefix`.
pub fn dlq_topic(prefix: &str, pipeline: &str) -> String {
    format!("{prefix}.{pipeline}.dlq")
}

/// The changelog topic of `store` of `pipeline` under `prefix`.
pub fn changelog_topic(prefix: &str, pipeline: &str, store: &str) -> String {
    format!("{prefix}.{pipeline}.{store}.changelog")
}

/// When a new version is judged, per pipeline (`swap = { ... }` in the spec).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SwapPolicy {
    /// Batches after a swap during which the failure share is watched.
    pub probation_batches: u32,
    /// A probation batch in which more than this share of records fails (goes to the DLQ) is
    /// not committed: the partition goes back to the old version and processes it again.
    pub max_failure_share: f64,
}

impl Default for SwapPolicy {
    fn default() -> Self {
        SwapPolicy {
            probation_batches: 3,
            max_failure_share: 0.5,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> PipelineSpec {
        serde_json::from_value(serde_json::json!({
            "name": "wc", "module": "word-count", "version": "1", "inputs": ["words"],
            "stores": ["counts"], "slots": 8, "partitions": 3
        }))
        .unwrap()
    }

    #[test]
    fn ranges_cover_all_slots() {
        let r = spec().initial_ranges();
        assert_eq!(r, vec![0..2, 2..5, 5..8]);
    }

    #[test]
    fn validation_names_the_problem() {
        let mut s = spec();
        assert!(s.validate("baton").is_ok());
        s.partitions = 9;
        assert!(s.validate("baton").unwrap_err().contains("partitions"));
        s.partitions = 3;
        s.outputs = vec!["prod.control".into()];
        assert!(s.validate("prod").unwrap_err().contains("reserved"));
        let bad: Result<PipelineSpec, _> = serde_json::from_value(serde_json::json!({
            "name": "wc", "module": "m", "version": "1", "inputs": ["a"], "colour": "red"
        }));
        assert!(bad.unwrap_err().to_string().contains("colour"));
    }
}
