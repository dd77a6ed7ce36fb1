//! The cluster: which hosts are alive, which one is the controller, and the load each reports.
//!
//! On Kafka, liveness and the controller's choice come from Kafka's group coordinator, not from
//! a consensus of baton's own: every host is a member of the consumer group `<cluster>.hosts`,
//! subscribed to the one-partition topic of that name. The session timeout decides who is
//! alive; the member assigned partition 0 is the controller. Each host reports its load once a
//! second to the compacted topic `<cluster>.load`, keyed by its id, and tails that topic for the
//! others' reports. On the embedded log the cluster is this host alone.

pub mod balancer;
pub mod membership;
pub mod merge;
pub mod moves;
pub mod split;
pub mod standby;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

pub use membership::{Alone, KafkaMembership};

/// The control-log protocol this host speaks, reported in its load reports:
/// - 1 (reports without a `protocol`): a host applies its own assignments and moves as it
///   appends them, and its owners record no release;
/// - 2: assignments, moves and releases take effect on every host, its own too, only when read
///   back from the control log, in log order.
///
/// A move between hosts of different protocols is refused, naming the older host's version.
pub const CONTROL_PROTOCOL: u32 = 2;

fn protocol_1() -> u32 {
    1
}

/// Why a move of a partition from `from` to `to` cannot run across their protocols (as
/// `reports` say, by host id), or `None` when both speak this host's.
pub fn protocol_mismatch(
    reports: &BTreeMap<String, (u32, String)>,
    from: &str,
    to: &str,
) -> Option<String> {
    [from, to].into_iter().find_map(|h| {
        let (protocol, version) = reports.get(h)?;
        (*protocol != CONTROL_PROTOCOL).then(|| {
            let version = if version.is_empty() {
                "an older baton".to_string()
            } else {
                format!("baton {version}")
            };
            format!(
                "host `{h}` runs {version} (control protocol {protocol}), and this host baton {} \
                 (control protocol {CONTROL_PROTOCOL}): moves between them are refused; upgrade \
                 `{h}` first",
                env!("CARGO_PKG_VERSION")
            )
        })
    })
}

/// What a host says of itself in `<cluster>.load`, once a second.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoadReport {
    /// The base URL of its API.
    pub address: String,
    /// Records processed per second, over the last few seconds.
    pub records_per_s: f64,
    /// Seconds spent in guest calls per second, over the last few seconds.
    pub guest_cpu_s_per_s: f64,
    /// Partitions it runs.
    pub partitions: u32,
    /// When it was sent (ms since the Unix epoch): the host's last heartbeat.
    pub at: i64,
    /// When the host joined the cluster (ms since the Unix epoch): a host that starts again
    /// reports a new time, so the controller knows it joined even if it was never seen gone.
    #[serde(default)]
    pub started_at: i64,
    /// Its control-log protocol ([`CONTROL_PROTOCOL`]); 1 for hosts that do not say.
    #[serde(default = "protocol_1")]
    pub protocol: u32,
    /// Its baton version (empty for hosts that do not say).
    #[serde(default)]
    pub version: String,
    /// Its partitions as the partition table shows them, so that every host shows every
    /// partition.
    #[serde(default)]
    pub detail: Vec<crate::partition::report::PartitionInfo>,
}

/// A host's load, as `GET /api/v1/hosts` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct HostLoad {
    /// Records processed per second, over the last few seconds.
    pub records_per_s: f64,
    /// Seconds spent in guest calls per second, over the last few seconds.
    pub guest_cpu_s_per_s: f64,
    /// Partitions it runs.
    pub partitions: u32,
}

impl From<&LoadReport> for HostLoad {
    fn from(r: &LoadReport) -> Self {
        HostLoad {
            records_per_s: r.records_per_s,
            guest_cpu_s_per_s: r.guest_cpu_s_per_s,
            partitions: r.partitions,
        }
    }
}

/// A host as `GET /api/v1/hosts` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct HostInfo {
    /// Its id (`--host-id`).
    pub id: String,
    /// The base URL of its API (`--advertise`).
    pub address: String,
    /// A member of the cluster now (its group session is live).
    pub alive: bool,
    /// The cluster's controller.
    pub controller: bool,
    /// Its last load report.
    pub load: Option<HostLoad>,
    /// When its last load report was sent (ms since the Unix epoch).
    pub last_heartbeat_ms: Option<i64>,
    /// When it joined the cluster (ms since the Unix epoch), from its load reports.
    pub started_at_ms: Option<i64>,
    /// Its baton version, from its load reports (absent for hosts that do not say).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Its control-log protocol, from its load reports (1 for hosts that do not say).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<u32>,
}

/// Which hosts form the cluster, as this host sees it.
pub trait Membership: Send + Sync {
    /// Every host known: alive members first by id, then hosts that left.
    fn hosts(&self) -> Vec<HostInfo>;
    /// Stops taking part (leaves the group at once rather than by timing out).
    fn leave(&self);
    /// The partitions each other host reported last, by host id.
    fn reported(&self) -> BTreeMap<String, Vec<crate::partition::report::PartitionInfo>> {
        BTreeMap::new()
    }
}

/// The hosts of the cluster as this host sees them: a handle the host's parts share over its
/// membership, which is set once the host joins (before that, no host is known).
#[derive(Clone)]
pub struct Hosts {
    host_id: String,
    membership: Arc<OnceLock<Box<dyn Membership>>>,
}

impl Hosts {
    /// A handle for host `host_id`, with no membership yet.
    pub fn new(host_id: String) -> Self {
        Hosts {
            host_id,
            membership: Arc::new(OnceLock::new()),
        }
    }

    /// Sets the membership, once; a second call is ignored.
    pub fn set(&self, membership: Box<dyn Membership>) {
        let _ = self.membership.set(membership);
    }

    /// This host's id.
    pub fn host_id(&self) -> &str {
        &self.host_id
    }

    /// Every host known ([`Membership::hosts`]).
    pub fn all(&self) -> Vec<HostInfo> {
        self.membership.get().map(|m| m.hosts()).unwrap_or_default()
    }

    /// The ids of the live hosts.
    pub fn live(&self) -> Vec<String> {
        self.all()
            .into_iter()
            .filter(|h| h.alive)
            .map(|h| h.id)
            .collect()
    }

    /// The ids of the live hosts other than this one.
    pub fn live_others(&self) -> Vec<String> {
        let mut others = self.live();
        others.retain(|h| *h != self.host_id);
        others
    }

    /// True if this host is the cluster's controller now (always, alone on the embedded log).
    pub fn is_controller(&self) -> bool {
        self.all()
            .iter()
            .any(|h| h.id == self.host_id && h.alive && h.controller)
    }

    /// The API's base URL of host `id`, if the membership knows it: not before this host has
    /// read that host's first load report.
    pub fn address_of(&self, id: &str) -> Option<String> {
        self.all()
            .into_iter()
            .find(|h| h.id == id)
            .map(|h| h.address)
            .filter(|a| !a.is_empty())
    }

    /// The live controller other than this host, as (id, address), if there is one.
    pub fn other_controller(&self) -> Option<(String, String)> {
        self.all()
            .into_iter()
            .find(|h| h.alive && h.controller && h.id != self.host_id)
            .map(|h| (h.id, h.address))
    }

    /// The partitions each other host reported last ([`Membership::reported`]).
    pub fn reported(&self) -> BTreeMap<String, Vec<crate::partition::report::PartitionInfo>> {
        self.membership
            .get()
            .map(|m| m.reported())
            .unwrap_or_default()
    }

    /// Leaves the cluster ([`Membership::leave`]), if it joined.
    pub fn leave(&self) {
        if let Some(m) = self.membership.get() {
            m.leave();
        }
    }
}

/// One sample of what a host did so far.
#[derive(Debug, Clone, Default)]
pub struct LoadSample {
    /// Records processed since the host started.
    pub records: u64,
    /// Microseconds spent in guest calls since the host started.
    pub guest_us: u64,
    /// Partitions running now.
    pub partitions: u32,
    /// Their rows of the partition table.
    pub detail: Vec<crate::partition::report::PartitionInfo>,
}

/// Where load samples come from (the host's partitions).
pub type Sampler = Box<dyn Fn() -> LoadSample + Send + Sync>;

/// Rates over the last few seconds of samples.
#[derive(Default)]
pub struct LoadMeter {
    samples: Mutex<VecDeque<(Instant, LoadSample)>>,
}

impl LoadMeter {
    /// Takes `now`'s sample and returns the rates since the oldest kept (up to 5 s back).
    pub fn rates(&self, sample: &LoadSample) -> (f64, f64) {
        let now = Instant::now();
        let mut s = self.samples.lock();
        while s.len() > 1
            && s.front()
                .is_some_and(|(t, _)| now - *t > std::time::Duration::from_secs(5))
        {
            s.pop_front();
        }
        let rates = match s.front() {
            Some((t, old)) if now > *t => {
                let secs = (now - *t).as_secs_f64();
                (
                    sample.records.saturating_sub(old.records) as f64 / secs,
                    sample.guest_us.saturating_sub(old.guest_us) as f64 / 1e6 / secs,
                )
            }
            _ => (0.0, 0.0),
        };
        s.push_back((now, sample.clone()));
        rates
    }
}

/// A host id: 1 to 64 of `[A-Za-z0-9._-]`.
pub fn check_host_id(id: &str) -> Result<(), String> {
    if id.is_empty()
        || id.len() > 64
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(format!(
            "host id {id:?} must be 1 to 64 letters, digits, `.`, `_` or `-`"
        ));
    }
    Ok(())
}

/// The id of the host whose data dir is `dir`: the one kept in `dir/host-id`, or a new one
/// kept there, so that a host restarted on its data keeps its id.
pub fn stable_host_id(dir: &std::path::Path) -> std::io::Result<String> {
    let path = dir.join("host-id");
    match std::fs::read_to_string(&path) {
        Ok(id) if check_host_id(id.trim()).is_ok() => return Ok(id.trim().to_string()),
        Ok(_) | Err(_) => {}
    }
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.write_u32(std::process::id());
    let id = format!("host-{:08x}", h.finish() as u32);
    std::fs::create_dir_all(dir)?;
    std::fs::write(&path, &id)?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ids_are_checked_and_kept() {
        assert!(check_host_id("a-1.b_2").is_ok());
        for bad in ["", "a b", "ä", &"x".repeat(65)] {
            assert!(check_host_id(bad).is_err(), "{bad:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        let first = stable_host_id(dir.path()).unwrap();
        assert!(check_host_id(&first).is_ok(), "{first}");
        assert_eq!(stable_host_id(dir.path()).unwrap(), first);
    }
}

#[cfg(test)]
mod protocol_tests {
    use super::*;

    /// A load report of a host from before protocols (no `protocol`, no `version`) reads as
    /// protocol 1, and a move to or from it is refused, naming it and what it runs.
    #[test]
    fn a_host_of_an_older_protocol_is_named_and_refused_for_moves() {
        let old: LoadReport = serde_json::from_value(serde_json::json!({
            "address": "http://127.0.0.1:1", "records_per_s": 0.0, "guest_cpu_s_per_s": 0.0,
            "partitions": 1, "at": 0, "started_at": 0
        }))
        .unwrap();
        assert_eq!((old.protocol, old.version.as_str()), (1, ""));
        let now: LoadReport = serde_json::from_slice(
            &serde_json::to_vec(&LoadReport {
                protocol: CONTROL_PROTOCOL,
                version: env!("CARGO_PKG_VERSION").into(),
                ..old.clone()
            })
            .unwrap(),
        )
        .unwrap();
        assert_eq!(now.protocol, CONTROL_PROTOCOL);
        let reports: BTreeMap<String, (u32, String)> = [
            ("a".to_string(), (old.protocol, old.version)),
            ("b".to_string(), (now.protocol, now.version.clone())),
            ("c".to_string(), (now.protocol, now.version)),
        ]
        .into();
        assert_eq!(protocol_mismatch(&reports, "b", "c"), None);
        for (from, to) in [("a", "b"), ("b", "a")] {
            let why = protocol_mismatch(&reports, from, to).expect("refused");
            assert!(
                why.contains("host `a` runs an older baton (control protocol 1)")
                    && why.contains(env!("CARGO_PKG_VERSION")),
                "{why}"
            );
        }
        // A host not heard from yet is not refused here: its release (or lack of one) is
        // checked by the move's target.
        assert_eq!(protocol_mismatch(&reports, "b", "d"), None);
    }
}
