//! The two kinds of membership: a host alone (the embedded log), and the hosts of a Kafka
//! cluster (a consumer group, and a compacted topic of load reports).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use super::{HostInfo, HostLoad, LoadMeter, LoadReport, Membership, Sampler};
use crate::transport::kafka::{KafkaConfig, KafkaTransport};
use crate::transport::{TopicKind, Transport};

fn now_ms() -> i64 {
    crate::control::now_ms()
}

/// The cluster of one host.
pub struct Alone {
    id: String,
    address: Arc<RwLock<String>>,
    sampler: Sampler,
    meter: LoadMeter,
    started_at: i64,
}

impl Alone {
    /// This host, reachable at `address`, with its load from `sampler`.
    pub fn new(id: String, address: Arc<RwLock<String>>, sampler: Sampler) -> Self {
        Alone {
            id,
            address,
            sampler,
            meter: LoadMeter::default(),
            started_at: now_ms(),
        }
    }
}

impl Membership for Alone {
    fn hosts(&self) -> Vec<HostInfo> {
        let sample = (self.sampler)();
        let (records_per_s, guest_cpu_s_per_s) = self.meter.rates(&sample);
        let at = now_ms();
        vec![HostInfo {
            id: self.id.clone(),
            address: self.address.read().clone(),
            alive: true,
            controller: true,
            load: Some(HostLoad {
                records_per_s,
                guest_cpu_s_per_s,
                partitions: sample.partitions,
            }),
            last_heartbeat_ms: Some(at),
            started_at_ms: Some(self.started_at),
            version: Some(env!("CARGO_PKG_VERSION").to_string()),
            protocol: Some(super::CONTROL_PROTOCOL),
        }]
    }

    fn leave(&self) {}
}

/// The group's members as last described: host id → whether it holds partition 0.
type Members = BTreeMap<String, bool>;

/// What the membership thread has learnt.
#[derive(Default)]
struct Seen {
    members: Members,
    reports: BTreeMap<String, LoadReport>,
}

/// The hosts of a cluster on Kafka.
pub struct KafkaMembership {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// The prefix of a member's `client.id`, followed by its host id.
const CLIENT_PREFIX: &str = "baton-host:";

/// How often a host reports its load.
const TICK: Duration = Duration::from_secs(1);

/// How often a host describes the group: how soon it sees a host come or go.
const DESCRIBE: Duration = Duration::from_millis(250);

impl KafkaMembership {
    /// Joins the cluster `cluster` as `id`: creates `<cluster>.hosts` and `<cluster>.load` when
    /// missing, joins the group and starts the thread that keeps the membership.
    pub fn join(
        kafka: &KafkaTransport,
        config: &KafkaConfig,
        cluster: &str,
        id: &str,
        address: Arc<RwLock<String>>,
        session_timeout: Duration,
        sampler: Sampler,
    ) -> anyhow::Result<Self> {
        let hosts_topic = format!("{cluster}.hosts");
        let load_topic = format!("{cluster}.load");
        kafka.ensure_topic(&hosts_topic, 1, TopicKind::Forever)?;
        kafka.ensure_topic(&load_topic, 1, TopicKind::Compacted)?;
        let session_ms = session_timeout.as_millis().max(1).to_string();
        let heartbeat_ms = (session_timeout.as_millis() / 4).max(100).to_string();
        let group: BaseConsumer = config
            .client_config(&[
                ("group.id", &hosts_topic),
                ("client.id", &format!("{CLIENT_PREFIX}{id}")),
                ("session.timeout.ms", &session_ms),
                ("heartbeat.interval.ms", &heartbeat_ms),
                ("enable.auto.commit", "false"),
                ("partition.assignment.strategy", "range"),
            ])
            .create()?;
        group.subscribe(&[&hosts_topic])?;
        let reader: BaseConsumer = config
            .client_config(&[
                ("enable.auto.commit", "false"),
                ("group.id", &format!("{cluster}.load-readers")),
            ])
            .create()?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&load_topic, 0, Offset::Beginning)?;
        reader.assign(&tpl)?;
        let producer: BaseProducer = config
            .client_config(&[("linger.ms", "0"), ("acks", "all")])
            .create()?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (seen, stop, id) = (seen.clone(), stop.clone(), id.to_string());
            std::thread::Builder::new()
                .name("baton-membership".into())
                .spawn(move || {
                    let mut m = Member {
                        id,
                        hosts_topic,
                        load_topic,
                        group,
                        reader,
                        producer,
                        address,
                        sampler,
                        meter: LoadMeter::default(),
                        seen,
                        started_at: now_ms(),
                    };
                    m.run(&stop);
                })?
        };
        Ok(KafkaMembership {
            seen,
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }
}

impl Membership for KafkaMembership {
    fn hosts(&self) -> Vec<HostInfo> {
        let seen = self.seen.lock();
        let mut ids: Vec<&String> = seen.members.keys().chain(seen.reports.keys()).collect();
        ids.sort_by_key(|id| (!seen.members.contains_key(*id), id.as_str()));
        ids.dedup();
        ids.into_iter()
            .map(|id| {
                let report = seen.reports.get(id);
                HostInfo {
                    id: id.clone(),
                    address: report.map(|r| r.address.clone()).unwrap_or_default(),
                    alive: seen.members.contains_key(id),
                    controller: seen.members.get(id).copied().unwrap_or(false),
                    load: report.map(HostLoad::from),
                    last_heartbeat_ms: report.map(|r| r.at),
                    started_at_ms: report.map(|r| r.started_at).filter(|t| *t > 0),
                    version: report.map(|r| r.version.clone()).filter(|v| !v.is_empty()),
                    protocol: report.map(|r| r.protocol),
                }
            })
            .collect()
    }

    fn reported(&self) -> BTreeMap<String, Vec<crate::partition::report::PartitionInfo>> {
        self.seen
            .lock()
            .reports
            .iter()
            .map(|(id, r)| (id.clone(), r.detail.clone()))
            .collect()
    }

    fn leave(&self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl Drop for KafkaMembership {
    fn drop(&mut self) {
        self.leave();
    }
}

/// The membership thread's side.
struct Member {
    id: String,
    hosts_topic: String,
    load_topic: String,
    group: BaseConsumer,
    reader: BaseConsumer,
    producer: BaseProducer,
    address: Arc<RwLock<String>>,
    sampler: Sampler,
    meter: LoadMeter,
    seen: Arc<Mutex<Seen>>,
    /// When this host joined (ms since the Unix epoch), in every load report.
    started_at: i64,
}

impl Member {
    fn run(&mut self, stop: &AtomicBool) {
        let (mut next_report, mut next_describe) = (Instant::now(), Instant::now());
        while !stop.load(Ordering::Relaxed) {
            // Polling keeps the group session (and runs rebalances); the topic holds nothing.
            if let Some(Err(e)) = self.group.poll(Duration::from_millis(50)) {
                tracing::debug!("membership: {e}");
            }
            self.read_reports();
            if Instant::now() >= next_report {
                next_report = Instant::now() + TICK;
                self.report();
            }
            if Instant::now() >= next_describe {
                next_describe = Instant::now() + DESCRIBE;
                match self.describe() {
                    Ok(members) => self.seen.lock().members = members,
                    Err(e) => tracing::warn!("membership: describing the group: {e:#}"),
                }
            }
        }
        // Leave at once: the others see it gone without waiting for the session to time out.
        self.group.unsubscribe();
        let _ = self.producer.flush(Duration::from_secs(5));
    }

    fn read_reports(&mut self) {
        while let Some(m) = self.reader.poll(Duration::ZERO) {
            let Ok(m) = m else { continue };
            let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok()) else {
                continue;
            };
            let mut seen = self.seen.lock();
            match m.payload().map(serde_json::from_slice::<LoadReport>) {
                Some(Ok(r)) => {
                    seen.reports.insert(key.to_string(), r);
                }
                None => {
                    seen.reports.remove(key);
                }
                Some(Err(e)) => tracing::debug!("membership: a load report of {key}: {e}"),
            }
        }
    }

    fn report(&mut self) {
        let sample = (self.sampler)();
        let (records_per_s, guest_cpu_s_per_s) = self.meter.rates(&sample);
        let report = LoadReport {
            address: self.address.read().clone(),
            records_per_s,
            guest_cpu_s_per_s,
            partitions: sample.partitions,
            at: now_ms(),
            started_at: self.started_at,
            protocol: super::CONTROL_PROTOCOL,
            version: env!("CARGO_PKG_VERSION").to_string(),
            detail: sample.detail,
        };
        let Ok(value) = serde_json::to_vec(&report) else {
            return;
        };
        let r = BaseRecord::<str, [u8]>::to(&self.load_topic)
            .key(&self.id)
            .payload(&value);
        if let Err((e, _)) = self.producer.send(r) {
            tracing::warn!("membership: reporting load: {e}");
        }
        self.producer.poll(Duration::ZERO);
    }

    /// The group's members now, by host id, and which of them holds partition 0.
    fn describe(&self) -> anyhow::Result<Members> {
        let list = self
            .group
            .fetch_group_list(Some(&self.hosts_topic), Duration::from_secs(5))?;
        let mut members = Members::new();
        for g in list.groups() {
            for m in g.members() {
                let Some(id) = m.client_id().strip_prefix(CLIENT_PREFIX) else {
                    continue;
                };
                let controller = m
                    .assignment()
                    .map(|a| assigned(a, &self.hosts_topic).contains(&0))
                    .unwrap_or(false);
                *members.entry(id.to_string()).or_default() |= controller;
            }
        }
        Ok(members)
    }
}

/// The partitions of `topic` in a consumer-protocol assignment: version (i16), then topics
/// (i32 count; each a string of i16 length and an i32 count of i32 partitions), then user data.
pub fn assigned(bytes: &[u8], topic: &str) -> Vec<i32> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if b.len() < n {
            return None;
        }
        let (head, tail) = b.split_at(n);
        *b = tail;
        Some(head)
    }
    fn i16_(b: &mut &[u8]) -> Option<i16> {
        Some(i16::from_be_bytes(take(b, 2)?.try_into().ok()?))
    }
    fn i32_(b: &mut &[u8]) -> Option<i32> {
        Some(i32::from_be_bytes(take(b, 4)?.try_into().ok()?))
    }
    let parse = || -> Option<Vec<i32>> {
        let mut b = bytes;
        i16_(&mut b)?;
        let mut out = Vec::new();
        for _ in 0..i32_(&mut b)?.max(0) {
            let len = i16_(&mut b)?.max(0) as usize;
            let name = take(&mut b, len)?;
            for _ in 0..i32_(&mut b)?.max(0) {
                let p = i32_(&mut b)?;
                if name == topic.as_bytes() {
                    out.push(p);
                }
            }
        }
        Some(out)
    };
    parse().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assignment_is_read_per_topic() {
        let mut b = Vec::new();
        b.extend_from_slice(&0i16.to_be_bytes());
        b.extend_from_slice(&2i32.to_be_bytes());
        for (t, ps) in [("x.hosts", vec![0i32]), ("other", vec![0, 3])] {
            b.extend_from_slice(&(t.len() as i16).to_be_bytes());
            b.extend_from_slice(t.as_bytes());
            b.extend_from_slice(&(ps.len() as i32).to_be_bytes());
            for p in ps {
                b.extend_from_slice(&p.to_be_bytes());
            }
        }
        b.extend_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(assigned(&b, "x.hosts"), vec![0]);
        assert_eq!(assigned(&b, "other"), vec![0, 3]);
        assert_eq!(assigned(&b, "y"), Vec::<i32>::new());
        assert_eq!(
            assigned(&b[..5], "x.hosts"),
            Vec::<i32>::new(),
            "cut short: nothing"
        );
    }
}
