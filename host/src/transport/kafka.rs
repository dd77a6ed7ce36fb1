//! Apache Kafka through rdkafka: the production transport. Topic administration, durable
//! appends and reads for the control plane ([`KafkaTransport`]), and the two clients a partition
//! loop needs: an input consumer with manual assignment ([`InputConsumer`]) and a producer that
//! reports the offsets it wrote, transactional or not ([`BatchProducer`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError as RdError;
use rdkafka::message::{DeliveryResult, Header, Headers, Message as _, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::rdbatch::RecordQueue;
use super::{LogRecord, Record, TopicKind, Transport, TransportError, validate_topic_name};

/// How to reach the cluster: `--kafka` and the repeatable `--kafka-config key=value`, and how
/// baton's topics are replicated. Its `Debug` hides the values of secret settings
/// ([`is_secret`]).
#[derive(Clone, PartialEq, Eq, Default)]
pub struct KafkaConfig {
    /// `bootstrap.servers`.
    pub bootstrap: String,
    /// Extra librdkafka settings, applied to every client (they win over baton's defaults).
    pub settings: Vec<(String, String)>,
    /// Replication factor of the topics baton creates (`--replication-factor`); `None` takes the
    /// broker's `default.replication.factor`.
    pub replication_factor: Option<u16>,
    /// `min.insync.replicas` of baton's own topics (`--min-insync-replicas`); `None` is
    /// `min(2, replication factor)`.
    pub min_insync_replicas: Option<u16>,
    /// How long a partition's input slot may have records to read and deliver none before the
    /// session reopens its clients; `None` is [`INPUT_STALL`].
    pub input_stall: Option<Duration>,
    /// How long a partition's commit may take before its session gives it up and makes its
    /// clients again; `None` is [`COMMIT_HANG`].
    pub commit_hang: Option<Duration>,
}

/// How long a commit may take before its session gives it up. Each of a commit's Kafka calls
/// times out after a minute, but librdkafka's `send_offsets_to_transaction` can wait forever for
/// a group coordinator it lost (librdkafka issues 5456 and 5511; seen here after a broker
/// restart): without a bound of its own, the partition would stop for good, with no error.
pub const COMMIT_HANG: Duration = Duration::from_secs(90);

/// How long an input slot may have records to read and deliver none, while its partition
/// fetches, before the session reopens its clients: librdkafka's assigned consumers have been
/// seen to stop fetching after a broker restart, without an error.
pub const INPUT_STALL: Duration = Duration::from_secs(30);

/// librdkafka settings baton sets itself, per client, and that a user's setting must not
/// override: each with what baton relies on it for.
pub const RESERVED_SETTINGS: &[(&str, &str)] = &[
    (
        "bootstrap.servers",
        "it is `--kafka` (or `kafka` in the config file)",
    ),
    (
        "group.id",
        "each pipeline commits its offsets to its own group, and the hosts join the cluster's",
    ),
    (
        "group.instance.id",
        "a host's membership is its own group session",
    ),
    (
        "transactional.id",
        "each partition's producer fences its older owners with its own transactional id",
    ),
    (
        "enable.idempotence",
        "the control log and the transactions need an idempotent producer",
    ),
    (
        "isolation.level",
        "changelogs and the control log are read committed, or a restore would apply aborted \
         writes",
    ),
    (
        "enable.auto.commit",
        "input offsets are committed in each batch's transaction, never by the consumer",
    ),
    (
        "enable.auto.offset.store",
        "input offsets are committed in each batch's transaction, never by the consumer",
    ),
    (
        "auto.offset.reset",
        "where a pipeline starts is its `start` setting, and changelogs are read from the start",
    ),
    (
        "enable.partition.eof",
        "restores and catch-ups find the end of a partition from its watermarks",
    ),
    ("session.timeout.ms", "it is `--session-timeout`"),
    (
        "partition.assignment.strategy",
        "the hosts' membership group relies on its own assignor",
    ),
];

/// True for a setting whose value is a secret: it is never printed.
pub fn is_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("password")
        || k.contains("secret")
        || k == "sasl.oauthbearer.config"
        || k == "sasl.jaas.config"
        || k.ends_with(".pem")
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let settings: Vec<(&str, &str)> = self
            .settings
            .iter()
            .map(|(k, v)| {
                let v = if is_secret(k) {
                    "[redacted]"
                } else {
                    v.as_str()
                };
                (k.as_str(), v)
            })
            .collect();
        f.debug_struct("KafkaConfig")
            .field("bootstrap", &self.bootstrap)
            .field("settings", &settings)
            .field("replication_factor", &self.replication_factor)
            .field("min_insync_replicas", &self.min_insync_replicas)
            .field("input_stall", &self.input_stall)
            .field("commit_hang", &self.commit_hang)
            .finish()
    }
}

impl KafkaConfig {
    /// Refuses a user's setting of what baton sets itself ([`RESERVED_SETTINGS`]), naming the
    /// setting and what baton relies on it for.
    pub fn check_settings(&self) -> Result<(), TransportError> {
        for (key, _) in &self.settings {
            if let Some((_, why)) = RESERVED_SETTINGS
                .iter()
                .find(|(r, _)| r.eq_ignore_ascii_case(key.trim()))
            {
                return Err(TransportError::Misconfigured(format!(
                    "Kafka setting `{key}` is baton's own and cannot be overridden: {why}. \
                     Remove it from --kafka-config (or kafka_config in the config file)"
                )));
            }
        }
        Ok(())
    }

    /// Settings for `bootstrap` with baton's defaults.
    pub fn new(bootstrap: impl Into<String>) -> Self {
        KafkaConfig {
            bootstrap: bootstrap.into(),
            ..Default::default()
        }
    }

    /// A client config with `defaults`, then the user's settings.
    pub fn client_config(&self, defaults: &[(&str, &str)]) -> ClientConfig {
        self.client(defaults)
    }

    /// A client config with baton's defaults for `role`, then the user's settings.
    fn client(&self, defaults: &[(&str, &str)]) -> ClientConfig {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", &self.bootstrap);
        cfg.set("log_level", "4");
        // librdkafka leaves Nagle's algorithm on; with delayed ACKs a small request (a batch's
        // last records, a transaction's EndTxn) can wait ~40 ms. Java clients disable it too.
        cfg.set("socket.nagle.disable", "true");
        for (k, v) in defaults {
            cfg.set(*k, *v);
        }
        for (k, v) in &self.settings {
            cfg.set(k, v);
        }
        cfg
    }
}

/// Runs a future to completion on this thread. The admin client's futures are completed by
/// librdkafka's own threads, so no async runtime is needed (nor may one be dropped here).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park_timeout(Duration::from_millis(100));
    }
}

fn kerr(what: &str, e: impl std::fmt::Display) -> TransportError {
    TransportError::Kafka(format!("{what}: {e}"))
}

/// True for the error codes with which Kafka refuses a record for good: retrying the same
/// record can never succeed.
fn refuses_for_good(code: Option<RDKafkaErrorCode>) -> bool {
    matches!(
        code,
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::InvalidTimestamp
                | RDKafkaErrorCode::InvalidRecord
        )
    )
}

/// How soon a committed offset still unstable (its transaction's markers being written) is
/// asked for again.
const UNSTABLE_AGAIN: Duration = Duration::from_millis(5);

/// How long a call waits out the errors of a broker that is still settling before it gives up.
pub const SETTLE_FOR: Duration = Duration::from_secs(30);

/// True for the errors a broker returns while it settles, right after it starts or after a
/// topic is created: no leader elected yet, a coordinator still loading its log, metadata not
/// yet propagated to every broker, a connection not yet made. The same call succeeds soon.
pub fn settling(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::LeaderNotAvailable
            | C::NotLeaderForPartition
            | C::PreferredLeaderNotAvailable
            | C::ReplicaNotAvailable
            | C::FencedLeaderEpoch
            | C::UnknownLeaderEpoch
            | C::OffsetNotAvailable
            | C::UnstableOffsetCommit
            | C::CoordinatorLoadInProgress
            | C::CoordinatorNotAvailable
            | C::NotCoordinator
            | C::WaitingForCoordinator
            | C::NotController
            | C::NotEnoughReplicas
            | C::KafkaStorageError
            | C::RequestTimedOut
            | C::OperationTimedOut
            | C::NetworkException
            | C::BrokerNotAvailable
            | C::AllBrokersDown
            | C::BrokerTransportFailure
            | C::Resolve
    )
}

/// An error that may carry a broker's error code.
pub trait BrokerCode: std::fmt::Display {
    /// The code, when the error has one.
    fn code(&self) -> Option<RDKafkaErrorCode>;
}

impl BrokerCode for RdError {
    fn code(&self) -> Option<RDKafkaErrorCode> {
        self.rdkafka_error_code()
    }
}

impl BrokerCode for KafkaError {
    fn code(&self) -> Option<RDKafkaErrorCode> {
        match self {
            KafkaError::Call { err, .. } => err.rdkafka_error_code(),
            KafkaError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// What an admin call answers: per resource, its name or its name and the broker's refusal.
type AdminAnswer<T, U> = Result<Vec<Result<T, (U, RDKafkaErrorCode)>>, RdError>;

/// The answer of an admin call over several resources: the call's error, or the first resource
/// refused with a code not in `ignore`.
fn all_done<T, U>(
    what: &dyn Fn() -> String,
    answer: AdminAnswer<T, U>,
    ignore: &[RDKafkaErrorCode],
) -> Result<(), KafkaError> {
    let results = answer.map_err(|err| KafkaError::Call { what: what(), err })?;
    match results.into_iter().find_map(|r| match r {
        Err((_, code)) if !ignore.contains(&code) => Some(code),
        _ => None,
    }) {
        Some(code) => Err(KafkaError::Refused { what: what(), code }),
        None => Ok(()),
    }
}

/// Calls `f` until it succeeds, fails with an error that is not [`settling`], or `deadline`
/// has passed, backing off from 20 ms to 1 s between calls. Says what it waits for (`what`) at
/// the first retry and every 5 s after, so that a host that waits on its broker shows why.
pub fn settle<T, E: BrokerCode>(
    what: impl Fn() -> String,
    deadline: Duration,
    mut f: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let started = Instant::now();
    let mut backoff = Duration::from_millis(20);
    let mut told: Option<Instant> = None;
    loop {
        match f() {
            Ok(v) => {
                if told.is_some() {
                    tracing::info!(
                        "{}: the broker answered after {:?}",
                        what(),
                        started.elapsed()
                    );
                }
                return Ok(v);
            }
            Err(e) if e.code().is_some_and(settling) && started.elapsed() + backoff < deadline => {
                if told.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
                    tracing::warn!(
                        "{}: {e}; waiting for the broker to settle (up to {:?} more)",
                        what(),
                        deadline.saturating_sub(started.elapsed())
                    );
                    told = Some(Instant::now());
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Errors talking to Kafka.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// A client could not be created from the configuration.
    #[error("kafka client configuration: {0}")]
    Config(String),
    /// The broker answered with an error or did not answer in time.
    #[error("kafka: {0}")]
    Broker(String),
    /// A call to the cluster failed.
    #[error("kafka: {what}: {err}")]
    Call {
        /// What was asked.
        what: String,
        /// The client's error.
        #[source]
        err: RdError,
    },
    /// The broker refused one resource of a call with an error code.
    #[error("kafka: {what}: {code}")]
    Refused {
        /// What was asked.
        what: String,
        /// The broker's code.
        code: RDKafkaErrorCode,
    },
    /// A topic name or count was refused before asking the broker.
    #[error(transparent)]
    Topic(#[from] TransportError),
}

/// Topic administration on a Kafka cluster.
pub struct KafkaAdmin {
    admin: AdminClient<DefaultClientContext>,
    timeout: Duration,
}

/// The partition count and name of a topic as the broker reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    /// Topic name.
    pub name: String,
    /// Number of partitions.
    pub partitions: u32,
}

impl KafkaAdmin {
    /// A client for `bootstrap` (e.g. `127.0.0.1:9092`) with extra librdkafka settings.
    pub fn new(bootstrap: &str, settings: &[(String, String)]) -> Result<Self, KafkaError> {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", bootstrap);
        for (k, v) in settings {
            cfg.set(k, v);
        }
        let admin = cfg
            .create()
            .map_err(|e| KafkaError::Config(e.to_string()))?;
        Ok(KafkaAdmin {
            admin,
            timeout: Duration::from_secs(30),
        })
    }

    /// Creates `name` with `partitions` partitions and the given topic configs (e.g.
    /// `cleanup.policy=compact`). Returns `false` when it already exists with that count, and an
    /// error naming both counts when it exists with another.
    pub async fn ensure_topic(
        &self,
        name: &str,
        partitions: u32,
        replication: i32,
        configs: &[(&str, &str)],
    ) -> Result<bool, KafkaError> {
        validate_topic_name(name)?;
        let mut topic = NewTopic::new(
            name,
            partitions as i32,
            TopicReplication::Fixed(replication),
        );
        for (k, v) in configs {
            topic = topic.set(k, v);
        }
        let opts = AdminOptions::new()
            .operation_timeout(Some(self.timeout))
            .request_timeout(Some(self.timeout));
        let res = self
            .admin
            .create_topics([&topic], &opts)
            .await
            .map_err(|err| KafkaError::Call {
                what: format!("creating topic `{name}`"),
                err,
            })?;
        match res.into_iter().next() {
            Some(Ok(_)) => Ok(true),
            Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => {
                let actual = self.topic(name)?.map(|t| t.partitions).unwrap_or(0);
                if actual == partitions {
                    Ok(false)
                } else {
                    Err(TransportError::PartitionCountMismatch {
                        topic: name.to_string(),
                        actual,
                        wanted: partitions,
                    }
                    .into())
                }
            }
            Some(Err((_, code))) => Err(KafkaError::Refused {
                what: format!("creating topic `{name}`"),
                code,
            }),
            None => Err(KafkaError::Broker(format!(
                "creating topic `{name}`: no answer"
            ))),
        }
    }

    /// The configuration of a topic as the broker reports it (every entry, defaults included).
    pub fn topic_configs(&self, name: &str) -> Result<HashMap<String, String>, KafkaError> {
        self.configs(rdkafka::admin::ResourceSpecifier::Topic(name))
    }

    /// The settings set on a topic itself (not inherited from the broker's defaults).
    pub fn topic_overrides(&self, name: &str) -> Result<HashMap<String, String>, KafkaError> {
        Ok(self
            .describe(rdkafka::admin::ResourceSpecifier::Topic(name))?
            .into_iter()
            .filter(|e| e.source == rdkafka::admin::ConfigSource::DynamicTopic)
            .filter_map(|e| e.value.map(|v| (e.name, v)))
            .collect())
    }

    /// Grows a topic to `total` partitions.
    pub fn grow_partitions(&self, name: &str, total: u32) -> Result<(), KafkaError> {
        let np = rdkafka::admin::NewPartitions::new(name, total as usize);
        let opts = AdminOptions::new().operation_timeout(Some(self.timeout));
        let what = || format!("growing `{name}` to {total} partitions");
        settle(what, SETTLE_FOR, || {
            all_done(
                &what,
                block_on(self.admin.create_partitions([&np], &opts)),
                &[],
            )
        })
    }

    /// Sets configs of a topic (those not named fall back to the broker's defaults).
    pub fn set_topic_configs(
        &self,
        name: &str,
        configs: &[(&str, &str)],
    ) -> Result<(), KafkaError> {
        let mut alter =
            rdkafka::admin::AlterConfig::new(rdkafka::admin::ResourceSpecifier::Topic(name));
        for (k, v) in configs {
            alter = alter.set(k, v);
        }
        let opts = AdminOptions::new().request_timeout(Some(self.timeout));
        let what = || format!("altering the configs of `{name}`");
        settle(what, SETTLE_FOR, || {
            all_done(
                &what,
                block_on(self.admin.alter_configs([&alter], &opts)),
                &[],
            )
        })
    }

    /// The configuration of one broker.
    pub fn broker_configs(&self, broker: i32) -> Result<HashMap<String, String>, KafkaError> {
        self.configs(rdkafka::admin::ResourceSpecifier::Broker(broker))
    }

    fn configs(
        &self,
        what: rdkafka::admin::ResourceSpecifier<'_>,
    ) -> Result<HashMap<String, String>, KafkaError> {
        Ok(self
            .describe(what)?
            .into_iter()
            .filter_map(|e| e.value.map(|v| (e.name, v)))
            .collect())
    }

    fn describe(
        &self,
        what: rdkafka::admin::ResourceSpecifier<'_>,
    ) -> Result<Vec<rdkafka::admin::ConfigEntry>, KafkaError> {
        let opts = AdminOptions::new().request_timeout(Some(self.timeout));
        let asked = || format!("the configs of {what:?}");
        settle(asked, SETTLE_FOR, || {
            let res = block_on(self.admin.describe_configs([&what], &opts))
                .map_err(|err| KafkaError::Call { what: asked(), err })?;
            let resource = res
                .into_iter()
                .next()
                .ok_or_else(|| KafkaError::Broker(format!("no configs for {what:?}")))?
                .map_err(|code| KafkaError::Refused {
                    what: asked(),
                    code,
                })?;
            Ok(resource.entries)
        })
    }

    /// The id of a broker of the cluster.
    pub fn any_broker(&self) -> Result<i32, KafkaError> {
        let md = self.metadata(None)?;
        md.brokers()
            .first()
            .map(|b| b.id())
            .ok_or_else(|| KafkaError::Broker("the cluster metadata lists no broker".into()))
    }

    /// Every topic of the cluster with its partition count, sorted by name.
    pub fn topics(&self) -> Result<Vec<TopicInfo>, KafkaError> {
        let md = self.metadata(None)?;
        let mut v: Vec<_> = md
            .topics()
            .iter()
            .map(|t| TopicInfo {
                name: t.name().to_string(),
                partitions: t.partitions().len() as u32,
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(v)
    }

    /// One topic, or `None` when the broker does not know it.
    pub fn topic(&self, name: &str) -> Result<Option<TopicInfo>, KafkaError> {
        let md = self.metadata(Some(name))?;
        Ok(md
            .topics()
            .iter()
            .find(|t| t.name() == name && t.error().is_none())
            .map(|t| TopicInfo {
                name: t.name().to_string(),
                partitions: t.partitions().len() as u32,
            }))
    }

    /// The cluster's metadata, of one topic or of all, waiting out a settling broker.
    fn metadata(&self, topic: Option<&str>) -> Result<rdkafka::metadata::Metadata, KafkaError> {
        let what = || match topic {
            Some(t) => format!("the metadata of `{t}`"),
            None => "the cluster metadata".to_string(),
        };
        settle(what, SETTLE_FOR, || {
            self.admin
                .inner()
                .fetch_metadata(topic, self.timeout)
                .map_err(|err| KafkaError::Call { what: what(), err })
        })
    }

    /// Deletes topics; missing ones are ignored.
    pub async fn delete_topics(&self, names: &[&str]) -> Result<(), KafkaError> {
        let opts = AdminOptions::new().operation_timeout(Some(self.timeout));
        let res = self
            .admin
            .delete_topics(names, &opts)
            .await
            .map_err(|err| KafkaError::Call {
                what: format!("deleting topics {names:?}"),
                err,
            })?;
        for r in res {
            if let Err((name, code)) = r
                && code != RDKafkaErrorCode::UnknownTopicOrPartition
            {
                return Err(KafkaError::Refused {
                    what: format!("deleting topic `{name}`"),
                    code,
                });
            }
        }
        Ok(())
    }
}

/// How long [`KafkaTransport::connect`] waits for a broker to answer.
const CONNECT_WITHIN: Duration = Duration::from_secs(30);

/// Context of [`probe`]'s client: keeps the first error by which the cluster refused the
/// connection for good (a login refused, a TLS handshake failed), which librdkafka would
/// otherwise retry forever while every call times out.
#[derive(Default)]
struct ProbeContext {
    refused: Mutex<Option<(RDKafkaErrorCode, String)>>,
}

impl ClientContext for ProbeContext {
    fn error(&self, error: RdError, reason: &str) {
        let code = error.rdkafka_error_code();
        if let Some(
            code @ (RDKafkaErrorCode::Authentication
            | RDKafkaErrorCode::SaslAuthenticationFailed
            | RDKafkaErrorCode::SSL),
        ) = code
        {
            self.refused
                .lock()
                .get_or_insert_with(|| (code, reason.to_string()));
        } else {
            tracing::debug!(%error, reason, "Kafka connection error while connecting");
        }
    }
}

impl ProducerContext for ProbeContext {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

/// Reaches the cluster with the user's settings before any other client is made: fails at once
/// with what to fix when the cluster refuses the login or the TLS handshake, and after `within`
/// when no broker answers.
fn probe(config: &KafkaConfig, within: Duration) -> Result<(), TransportError> {
    let client: BaseProducer<ProbeContext> = config
        .client(&[])
        .create_with_context(ProbeContext::default())
        .map_err(|e| TransportError::Misconfigured(format!("Kafka client settings: {e}")))?;
    let deadline = Instant::now() + within;
    loop {
        let answered = client
            .client()
            .fetch_metadata(None, Duration::from_millis(500));
        // Dispatches librdkafka's error events to the context.
        client.poll(Duration::ZERO);
        if let Some((code, reason)) = client.context().refused.lock().take() {
            return Err(TransportError::Misconfigured(refusal(
                config, code, &reason,
            )));
        }
        match answered {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(kerr(
                    &format!(
                        "no broker answered at {} within {within:?}",
                        config.bootstrap
                    ),
                    e,
                ));
            }
            Err(_) => {}
        }
    }
}

/// What the cluster's refusal (`code`, librdkafka's `reason`) means for the user, with the
/// settings that decide it (never a secret).
fn refusal(config: &KafkaConfig, code: RDKafkaErrorCode, reason: &str) -> String {
    let setting = |key: &str| {
        config
            .settings
            .iter()
            .rev()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.as_str())
    };
    let protocol = setting("security.protocol").unwrap_or("plaintext");
    if code == RDKafkaErrorCode::SSL {
        format!(
            "Kafka at {} refused the TLS handshake (security.protocol={protocol}): {reason}. \
             Check ssl.ca.location (the CA that signed the brokers' certificates) and that \
             the bootstrap address is a TLS listener",
            config.bootstrap
        )
    } else {
        let mechanism = setting("sasl.mechanisms")
            .or(setting("sasl.mechanism"))
            .unwrap_or("GSSAPI");
        let user = setting("sasl.username").unwrap_or("(none)");
        format!(
            "Kafka at {} refused the login with SASL mechanism {mechanism} as user `{user}` \
             (security.protocol={protocol}): {reason}. Check sasl.username and sasl.password",
            config.bootstrap
        )
    }
}

/// Results of the deliveries of one append, filled in by the producer's delivery callback.
struct Pending {
    results: Mutex<Vec<Option<Result<i64, String>>>>,
    left: AtomicUsize,
}

/// Producer context of [`KafkaTransport`]: routes each delivery report to its append.
struct AppendContext;

impl ClientContext for AppendContext {}

impl ProducerContext for AppendContext {
    type DeliveryOpaque = Box<(Arc<Pending>, usize)>;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: Self::DeliveryOpaque) {
        let (pending, i) = *opaque;
        let r = match result {
            Ok(m) => Ok(m.offset()),
            Err((e, _)) => Err(e.to_string()),
        };
        pending.results.lock()[i] = Some(r);
        pending.left.fetch_sub(1, Ordering::AcqRel);
    }
}

fn headers_of(r: &Record) -> Option<OwnedHeaders> {
    if r.headers.is_empty() {
        return None;
    }
    let mut h = OwnedHeaders::new_with_capacity(r.headers.len());
    for (k, v) in &r.headers {
        h = h.insert(Header {
            key: k,
            value: Some(v.as_slice()),
        });
    }
    Some(h)
}

fn to_record<M: rdkafka::message::Message>(m: &M) -> Record {
    let headers = m
        .headers()
        .map(|hs| {
            hs.iter()
                .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                .collect()
        })
        .unwrap_or_default();
    Record {
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec),
        headers,
        timestamp: m.timestamp().to_millis().unwrap_or(0),
    }
}

/// Adds a record to its topic partition's group, making one when it is the first; returns the
/// group's index.
fn push_record(groups: &mut Vec<Fetched>, topic: &str, partition: u32, rec: LogRecord) -> usize {
    match groups
        .iter()
        .rposition(|g| g.partition == partition && g.topic == topic)
    {
        Some(i) => {
            groups[i].records.push(rec);
            i
        }
        None => {
            groups.push(Fetched {
                topic: topic.to_string(),
                partition,
                records: vec![rec],
            });
            groups.len() - 1
        }
    }
}

/// Sends one record, waiting for room in the producer's queue when it is full.
#[allow(clippy::result_large_err)] // rdkafka's own error type: the record comes back in it
fn send_record<C: ProducerContext>(
    producer: &BaseProducer<C>,
    topic: &str,
    partition: u32,
    r: &Record,
    opaque: C::DeliveryOpaque,
) -> Result<(), TransportError> {
    send_parts_with(
        |rec| producer.send(rec),
        || producer.poll(Duration::from_millis(10)),
        topic,
        partition,
        Parts::of(r),
        opaque,
    )
}

type SendResult<'a, O> = Result<(), (RdError, BaseRecord<'a, [u8], [u8], O>)>;

/// A record to send, borrowed.
struct Parts<'a> {
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
    headers: Option<OwnedHeaders>,
    timestamp: i64,
}

impl<'a> Parts<'a> {
    fn of(r: &'a Record) -> Self {
        Parts {
            key: r.key.as_deref(),
            value: r.value.as_deref(),
            headers: headers_of(r),
            timestamp: r.timestamp,
        }
    }
}

/// Sends a record made of borrowed parts over any way of sending (`BaseProducer` or
/// `ThreadedProducer`), waiting for room in the queue when it is full.
fn send_parts_with<'a, O: rdkafka::util::IntoOpaque>(
    send: impl Fn(BaseRecord<'a, [u8], [u8], O>) -> SendResult<'a, O>,
    wait: impl Fn(),
    topic: &'a str,
    partition: u32,
    parts: Parts<'a>,
    opaque: O,
) -> Result<(), TransportError> {
    let mut rec = BaseRecord::<[u8], [u8], O>::with_opaque_to(topic, opaque)
        .partition(partition as i32)
        .timestamp(parts.timestamp);
    if let Some(k) = parts.key {
        rec = rec.key(k);
    }
    if let Some(v) = parts.value {
        rec = rec.payload(v);
    }
    if let Some(h) = parts.headers {
        rec = rec.headers(h);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match send(rec) {
            Ok(()) => return Ok(()),
            Err((RdError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                if Instant::now() < deadline =>
            {
                rec = back;
                wait();
            }
            Err((e, _)) if refuses_for_good(e.rdkafka_error_code()) => {
                return Err(TransportError::Refused(format!(
                    "producing to {topic}/{partition}: {e}"
                )));
            }
            Err((e, _)) => return Err(kerr(&format!("producing to {topic}/{partition}"), e)),
        }
    }
}

/// Kafka as the host's [`Transport`]: admin, an idempotent producer for durable appends, and a
/// read_committed reader.
pub struct KafkaTransport {
    config: KafkaConfig,
    admin: KafkaAdmin,
    /// Replication factor of created topics (the broker's default unless configured).
    replication: u16,
    producer: BaseProducer<AppendContext>,
    reader: Mutex<BaseConsumer>,
}

/// How a partition's consumer fetches. The benchmarks' bare consumers use these too.
/// - Up to 4 MiB per topic partition per request: librdkafka's default of 1 MiB capped the rate
///   of small records at about half of what one broker serves.
/// - A prefetch queue of at most 20,000 records or 4 MiB per consumer (one per baton partition),
///   whichever comes first, and at most 2 MiB per fetch over all its topic partitions, which is
///   what the queue may overshoot by. librdkafka holds each queued record in an op of a few
///   hundred bytes and keeps a fetch's response until its last record is consumed: its default of
///   100,000 records with a 32 MiB queue and fetches as large made about 80 MiB per partition
///   outside `--state-memory` at 100-byte records (jemalloc's heap profile), 320 MiB for a host
///   of four. 20,000 records still last 27 ms of a partition at 750k records/s, many fetch round
///   trips here.
/// - A full queue postpones the next fetch by 10 ms, not librdkafka's default of 1 s: a partition
///   that processes a little slower than it fetches otherwise drains its queue, then idles
///   until the second is over.
/// - A fetch with nothing to return waits at the broker for 20 ms at most, not librdkafka's
///   500: a broker answers one request of a connection at a time, so a question a handoff asks
///   of a consumer with a fetch in flight (the ends of its inputs, as a merged partition starts
///   on its warm replica's clients) waits behind it, and so does a read of records committed
///   while the fetch waited. At 50 ms those waits were steps of 46-51 ms in merges of 60 ms;
///   at 20 ms the slowest merges were those of a side that saw its drain only when its fetch's
///   wait ended, which a command now cuts short ([`InputConsumer::waker`]). An idle consumer
///   asks 50 times a second.
/// - A fetch that failed (a leader that moved, a fetch session the broker dropped) is retried
///   after 20 ms, not 500: a move's new owner and its changelog reader are new consumers, and a
///   hiccup of their first fetches was the tail of the handoff pause.
pub const FETCH_SETTINGS: &[(&str, &str)] = &[
    ("fetch.message.max.bytes", "4194304"),
    ("queued.min.messages", "20000"),
    ("queued.max.messages.kbytes", "4096"),
    ("fetch.max.bytes", "2097152"),
    ("fetch.queue.backoff.ms", "10"),
    ("fetch.wait.max.ms", "20"),
    ("fetch.error.backoff.ms", "20"),
];

/// Consumer defaults: manual offsets, committed reads only; with [`FETCH_SETTINGS`].
const CONSUMER_DEFAULTS: &[(&str, &str)] = &[
    ("enable.auto.commit", "false"),
    ("enable.auto.offset.store", "false"),
    ("isolation.level", "read_committed"),
    ("auto.offset.reset", "earliest"),
    ("enable.partition.eof", "false"),
];

impl KafkaTransport {
    /// Connects to the cluster; fails when no broker answers within 30 s.
    pub fn connect(config: KafkaConfig) -> Result<Self, TransportError> {
        config.check_settings()?;
        probe(&config, CONNECT_WITHIN)?;
        let admin = KafkaAdmin::new(&config.bootstrap, &config.settings)
            .map_err(|e| kerr("admin client", e))?;
        let producer: BaseProducer<AppendContext> = config
            .client(&[
                ("enable.idempotence", "true"),
                ("acks", "all"),
                // An append waits for its acknowledgement (a control event on a move's pause
                // path, say): records handed over together still go together.
                ("linger.ms", "0"),
            ])
            .create_with_context(AppendContext)
            .map_err(|e| kerr("producer", e))?;
        let reader = reader_consumer(&config)?;
        admin
            .topics()
            .map_err(|e| kerr(&format!("no broker answered at {}", config.bootstrap), e))?;
        let replication = match config.replication_factor {
            Some(rf) => rf,
            None => {
                let broker = admin.any_broker().map_err(|e| kerr("metadata", e))?;
                let configs = admin
                    .broker_configs(broker)
                    .map_err(|e| kerr("broker configs", e))?;
                configs
                    .get("default.replication.factor")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(1)
            }
        };
        if replication == 0 {
            return Err(TransportError::Misconfigured(
                "--replication-factor must be at least 1".into(),
            ));
        }
        if let Some(m) = config.min_insync_replicas
            && (m == 0 || m > replication)
        {
            return Err(TransportError::Misconfigured(format!(
                "--min-insync-replicas {m} must be between 1 and the replication factor ({replication})"
            )));
        }
        tracing::info!(
            replication,
            min_insync = config.min_insync_replicas.unwrap_or(replication.min(2)),
            "topics baton creates are replicated"
        );
        Ok(KafkaTransport {
            config,
            admin,
            replication,
            producer,
            reader: Mutex::new(reader),
        })
    }

    /// The connection settings.
    pub fn config(&self) -> &KafkaConfig {
        &self.config
    }

    /// The admin client.
    pub fn admin(&self) -> &KafkaAdmin {
        &self.admin
    }

    /// The replication factor of the topics baton creates.
    pub fn replication(&self) -> u16 {
        self.replication
    }

    /// Refuses a changelog whose `cleanup.policy` is not `compact`: restore would miss keys
    /// whose last write was deleted by retention.
    pub fn check_compacted(&self, topic: &str) -> Result<(), TransportError> {
        let configs = self
            .admin
            .topic_configs(topic)
            .map_err(|e| kerr(&format!("configs of `{topic}`"), e))?;
        let policy = configs.get("cleanup.policy").cloned().unwrap_or_default();
        let policies: Vec<&str> = policy.split(',').map(str::trim).collect();
        if policies.contains(&"compact") && !policies.contains(&"delete") {
            Ok(())
        } else {
            Err(TransportError::Misconfigured(format!(
                "changelog topic `{topic}` has cleanup.policy={policy}, but a changelog must be \
                 compacted (cleanup.policy=compact), or restore loses keys; fix it with \
                 kafka-configs --alter --entity-type topics --entity-name {topic} \
                 --add-config cleanup.policy=compact"
            )))
        }
    }

    /// A consumer with baton's defaults and `group.id`, for a partition's input.
    pub fn input_consumer(&self, group: &str) -> Result<InputConsumer, TransportError> {
        let consumer: BaseConsumer = self
            .config
            .client(&[CONSUMER_DEFAULTS, FETCH_SETTINGS, &[("group.id", group)]].concat())
            .create()
            .map_err(|e| kerr("consumer", e))?;
        let records = RecordQueue::new(&consumer);
        Ok(InputConsumer {
            records,
            consumer,
            assigned: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// A producer for a partition: transactional with `transactional_id`, else idempotent.
    pub fn batch_producer(&self, transactional_id: &str) -> Result<BatchProducer, TransportError> {
        let defaults = vec![
            ("enable.idempotence", "true"),
            ("acks", "all"),
            ("linger.ms", "1"),
            // A new transaction right after a commit meets CONCURRENT_TRANSACTIONS while the
            // markers are written; retry quickly instead of librdkafka's 100 ms default.
            ("retry.backoff.ms", "1"),
            ("retry.backoff.max.ms", "10"),
            ("transactional.id", transactional_id),
            ("transaction.timeout.ms", "60000"),
        ];
        let ctx = OffsetContext::default();
        // Threaded: a background thread serves delivery reports as they arrive, so a flush
        // wakes on the last acknowledgement instead of polling.
        let producer: ThreadedProducer<OffsetContext> = self
            .config
            .client(&defaults)
            .create_with_context(ctx)
            .map_err(|e| kerr("producer", e))?;
        Ok(BatchProducer { producer })
    }
}

impl Transport for KafkaTransport {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    fn ensure_topic(
        &self,
        topic: &str,
        partitions: u32,
        kind: TopicKind,
    ) -> Result<bool, TransportError> {
        let mut configs: Vec<(&str, &str)> = match kind {
            TopicKind::Data | TopicKind::DeadLetters => vec![],
            TopicKind::Compacted => vec![("cleanup.policy", "compact")],
            TopicKind::Forever => vec![("retention.ms", "-1"), ("retention.bytes", "-1")],
        };
        let min_insync = self
            .config
            .min_insync_replicas
            .unwrap_or(self.replication.min(2))
            .to_string();
        if kind.is_internal() {
            configs.push(("min.insync.replicas", &min_insync));
        }
        let created = match settle(
            || format!("creating topic `{topic}`"),
            SETTLE_FOR,
            || {
                block_on(self.admin.ensure_topic(
                    topic,
                    partitions,
                    i32::from(self.replication),
                    &configs,
                ))
            },
        ) {
            Ok(created) => created,
            Err(KafkaError::Topic(e)) => return Err(e),
            Err(e) => return Err(kerr(&format!("creating topic `{topic}`"), e)),
        };
        if !created && kind == TopicKind::Compacted {
            self.check_compacted(topic)?;
        }
        // Creation is asynchronous in the cluster: wait until the metadata shows every partition.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.admin.topic(topic) {
                Ok(Some(t)) if t.partitions == partitions => return Ok(created),
                _ if Instant::now() > deadline => {
                    return Err(kerr(
                        &format!("topic `{topic}`"),
                        "not in the cluster metadata 30 s after creation",
                    ));
                }
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn partitions(&self, topic: &str) -> Result<Option<u32>, TransportError> {
        Ok(self
            .admin
            .topic(topic)
            .map_err(|e| kerr("metadata", e))?
            .map(|t| t.partitions))
    }

    fn topics(&self) -> Result<Vec<(String, u32)>, TransportError> {
        let all = self.admin.topics().map_err(|e| kerr("metadata", e))?;
        Ok(all
            .into_iter()
            .filter(|t| !t.name.starts_with("__"))
            .map(|t| (t.name, t.partitions))
            .collect())
    }

    /// The topic's `max.message.bytes` (a record batch's limit) and the producer's own
    /// `message.max.bytes`, whichever is smaller, less 1 KiB for the batch and record framing.
    fn max_record_bytes(&self, topic: &str) -> Result<Option<usize>, TransportError> {
        let configs = self
            .admin
            .topic_configs(topic)
            .map_err(|e| kerr(&format!("configs of `{topic}`"), e))?;
        let topic_max: usize = configs
            .get("max.message.bytes")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1_048_588);
        let client_max: usize = self
            .config
            .settings
            .iter()
            .find(|(k, _)| k == "message.max.bytes")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(1_000_000);
        Ok(Some(topic_max.min(client_max).saturating_sub(1024)))
    }

    fn delete_topics(&self, topics: &[String]) -> Result<(), TransportError> {
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        settle(
            || format!("deleting topics {names:?}"),
            SETTLE_FOR,
            || block_on(self.admin.delete_topics(&names)),
        )
        .map_err(|e| kerr("deleting topics", e))?;
        // Deletion completes in the background: wait until the metadata no longer shows them,
        // so that the names can be used again at once.
        let deadline = Instant::now() + Duration::from_secs(60);
        for t in topics {
            while self
                .admin
                .topic(t)
                .map_err(|e| kerr("metadata", e))?
                .is_some()
            {
                if Instant::now() > deadline {
                    return Err(kerr(&format!("deleting `{t}`"), "still there after 60 s"));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    fn delete_group(&self, group: &str) -> Result<(), TransportError> {
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let what = || format!("deleting group `{group}`");
        settle(what, SETTLE_FOR, || {
            all_done(
                &what,
                block_on(self.admin.admin.delete_groups(&[group], &opts)),
                &[RDKafkaErrorCode::GroupIdNotFound],
            )
        })
        .map_err(|e| kerr(&what(), e))
    }

    fn end_offset(&self, topic: &str, partition: u32) -> Result<u64, TransportError> {
        let reader = self.reader.lock();
        let (_, hi) = watermarks(&reader, topic, partition)?;
        Ok(hi.max(0) as u64)
    }

    fn append(
        &self,
        topic: &str,
        partition: u32,
        records: &[Record],
    ) -> Result<u64, TransportError> {
        if records.is_empty() {
            return self.end_offset(topic, partition);
        }
        let pending = Arc::new(Pending {
            results: Mutex::new(vec![None; records.len()]),
            left: AtomicUsize::new(records.len()),
        });
        for (i, r) in records.iter().enumerate() {
            send_record(
                &self.producer,
                topic,
                partition,
                r,
                Box::new((pending.clone(), i)),
            )?;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while pending.left.load(Ordering::Acquire) > 0 {
            if Instant::now() > deadline {
                return Err(kerr(
                    &format!("appending to {topic}/{partition}"),
                    "no acknowledgement in 60 s",
                ));
            }
            self.producer.poll(Duration::from_millis(1));
        }
        let results = pending.results.lock();
        let mut first = None;
        for r in results.iter() {
            match r {
                Some(Ok(o)) => first = Some(first.map_or(*o, |f: i64| f.min(*o))),
                Some(Err(e)) => return Err(kerr(&format!("appending to {topic}/{partition}"), e)),
                None => {
                    return Err(kerr(
                        &format!("appending to {topic}/{partition}"),
                        "no delivery report",
                    ));
                }
            }
        }
        Ok(first.unwrap_or(0).max(0) as u64)
    }

    fn read(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<LogRecord>, TransportError> {
        Ok(self.read_from(topic, partition, offset, max)?.0)
    }

    fn read_from(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<(Vec<LogRecord>, u64), TransportError> {
        let reader = self.reader.lock();
        let (lo, hi) = watermarks(&reader, topic, partition)?;
        let start = (offset as i64).max(lo);
        if start >= hi || max == 0 {
            return Ok((Vec::new(), offset.max(start as u64)));
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition as i32, Offset::Offset(start))
            .map_err(|e| kerr("assign", e))?;
        reader.assign(&tpl).map_err(|e| kerr("assign", e))?;
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while out.len() < max && Instant::now() < deadline {
            match reader.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    let o = m.offset() as u64;
                    out.push(LogRecord {
                        offset: o,
                        record: to_record(&m),
                    });
                    if o + 1 >= hi as u64 {
                        break;
                    }
                }
                Some(Err(e)) => tracing::debug!("reading {topic}/{partition}: {e}"),
                None => {
                    // Nothing more to read: past the last committed record (aborted records and
                    // transaction markers take offsets too).
                    let pos = position(&reader, topic, partition);
                    if pos.is_some_and(|p| p >= hi) || (pos.is_none() && !out.is_empty()) {
                        break;
                    }
                }
            }
        }
        let last = out.last().map(|r| r.offset + 1);
        // With records read, what comes after the last one; without, how far the consumer got
        // past markers and aborted records.
        let next = match last {
            Some(next) => next,
            None => {
                position(&reader, topic, partition).map_or(start as u64, |p| (p.max(start)) as u64)
            }
        };
        let _ = reader.unassign();
        Ok((out, next))
    }

    fn tail(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
    ) -> Result<Option<Box<dyn super::LogTail>>, TransportError> {
        let consumer = reader_consumer(&self.config)?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition as i32, Offset::Offset(from as i64))
            .map_err(|e| kerr("assign", e))?;
        consumer.assign(&tpl).map_err(|e| kerr("assign", e))?;
        Ok(Some(Box::new(KafkaTail {
            consumer,
            topic: topic.to_string(),
            partition,
            next: from,
        })))
    }
}

/// A consumer for reading baton's own topics: committed reads, no group offsets.
fn reader_consumer(config: &KafkaConfig) -> Result<BaseConsumer, TransportError> {
    config
        .client(
            &[
                CONSUMER_DEFAULTS,
                FETCH_SETTINGS,
                &[("group.id", "baton.reader")],
            ]
            .concat(),
        )
        .create()
        .map_err(|e| kerr("consumer", e))
}

/// A consumer assigned once to one topic partition: each fetch waits at the broker until records
/// land, so a record is read about one round trip after its append is acknowledged, where a read
/// that asks for the watermarks and assigns anew takes three.
struct KafkaTail {
    consumer: BaseConsumer,
    topic: String,
    partition: u32,
    next: u64,
}

impl super::LogTail for KafkaTail {
    fn next(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<(Vec<LogRecord>, u64), TransportError> {
        let mut out = Vec::new();
        let mut timeout = wait;
        while out.len() < max {
            match self.consumer.poll(timeout) {
                Some(Ok(m)) => {
                    let o = m.offset() as u64;
                    // Before the position (a reset to the earliest offset never goes back).
                    if o < self.next {
                        continue;
                    }
                    out.push(LogRecord {
                        offset: o,
                        record: to_record(&m),
                    });
                    self.next = o + 1;
                    // The rest of what was fetched, without waiting for more.
                    timeout = Duration::ZERO;
                }
                Some(Err(e)) if out.is_empty() => {
                    return Err(kerr(
                        &format!("reading {}/{}", self.topic, self.partition),
                        e,
                    ));
                }
                Some(Err(e)) => {
                    tracing::debug!("reading {}/{}: {e}", self.topic, self.partition);
                    break;
                }
                None => break,
            }
        }
        // Past markers and aborted records, which take offsets and are never handed over.
        if out.is_empty()
            && let Some(p) = position(&self.consumer, &self.topic, self.partition)
        {
            self.next = self.next.max(p.max(0) as u64);
        }
        Ok((out, self.next))
    }
}

/// The low and high watermarks of a topic partition, waiting out a settling broker (a topic
/// just created has no leader for a moment).
fn watermarks(c: &BaseConsumer, topic: &str, partition: u32) -> Result<(i64, i64), TransportError> {
    let what = || format!("watermarks of {topic}/{partition}");
    settle(what, SETTLE_FOR, || {
        c.fetch_watermarks(topic, partition as i32, Duration::from_secs(10))
    })
    .map_err(|e| kerr(&what(), e))
}

fn position(c: &BaseConsumer, topic: &str, partition: u32) -> Option<i64> {
    let pos = c.position().ok()?;
    match pos.find_partition(topic, partition as i32)?.offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

/// A partition's input consumer: manual assignment of its slots, committed reads only.
///
/// Records are read in batches: every assigned topic partition's fetch queue is forwarded to
/// one queue of the consumer's own, which `rd_kafka_consume_batch_queue` drains in one call per
/// batch. rust-rdkafka's `poll` returns one record per call, and each call takes clock readings
/// and allocates an event handle; at hundreds of thousands of records a second that was a tenth
/// of the partition thread's time. Everything else (commit replies, errors) still arrives on the
/// consumer's own queue, which each fetch serves without waiting.
pub struct InputConsumer {
    records: RecordQueue,
    consumer: BaseConsumer,
    /// Assigned once: librdkafka clears a forwarding when it stops a topic partition, so a
    /// second assignment could leave records on a queue nothing reads.
    assigned: std::sync::atomic::AtomicBool,
}

/// An input consumer's group, as a transaction names it when it commits offsets.
pub struct GroupMetadata(rdkafka::consumer::ConsumerGroupMetadata);

/// Records fetched from one topic partition, in offset order.
pub struct Fetched {
    /// Topic.
    pub topic: String,
    /// Partition (slot).
    pub partition: u32,
    /// Records.
    pub records: Vec<LogRecord>,
}

/// A record of [`InputConsumer::fetch_raw`], borrowed.
pub struct RawRecord<'a> {
    /// Topic.
    pub topic: &'a str,
    /// Partition (slot).
    pub partition: u32,
    /// Offset.
    pub offset: u64,
    /// `None` for a record without a key.
    pub key: Option<&'a [u8]>,
    /// `None` for a tombstone.
    pub value: Option<&'a [u8]>,
}

impl InputConsumer {
    /// The group's committed offsets of these topic partitions (`None` where nothing is committed).
    pub fn committed(&self, tps: &[(String, u32)]) -> Result<Vec<Option<u64>>, TransportError> {
        let mut tpl = TopicPartitionList::new();
        for (t, p) in tps {
            tpl.add_partition(t, *p as i32);
        }
        let what = || format!("the group's committed offsets of {tps:?}");
        let started = Instant::now();
        let got = loop {
            let got = settle(
                what,
                SETTLE_FOR,
                || -> Result<Option<TopicPartitionList>, RdError> {
                    let got = self
                        .consumer
                        .committed_offsets(tpl.clone(), Duration::from_secs(30))?;
                    // An error of one partition is not "no offset": it is asked again like
                    // the call's own.
                    for e in got.elements() {
                        match e.error() {
                            Ok(()) => {}
                            Err(err)
                                if err.rdkafka_error_code()
                                    == Some(RDKafkaErrorCode::UnstableOffsetCommit) =>
                            {
                                return Ok(None);
                            }
                            Err(err) => return Err(err),
                        }
                    }
                    Ok(Some(got))
                },
            )
            .map_err(|e| kerr("committed offsets", e))?;
            match got {
                Some(got) => break got,
                // An offset of a transaction whose markers are being written: stable in
                // milliseconds. Asked again every 5 ms, not with a settling broker's doubling
                // back-off (20, 40 ... 320 ms, 620 ms by the sixth try), which could overshoot
                // the moment it is stable by hundreds of ms: a move's take-over waits for it
                // within its pause.
                // One that stays unstable (a dead owner's transaction until it times out or is
                // fenced) is asked every 100 ms after the first second.
                None if started.elapsed() < SETTLE_FOR => {
                    std::thread::sleep(if started.elapsed() < Duration::from_secs(1) {
                        UNSTABLE_AGAIN
                    } else {
                        Duration::from_millis(100)
                    });
                }
                None => {
                    return Err(kerr(
                        "committed offsets",
                        format!("{} still unstable after {SETTLE_FOR:?}", what()),
                    ));
                }
            }
        };
        Ok(tps
            .iter()
            .map(
                |(t, p)| match got.find_partition(t, *p as i32).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) if o >= 0 => Some(o as u64),
                    _ => None,
                },
            )
            .collect())
    }

    /// [`InputConsumer::ends`] asked once, within `timeout`, without retries: for a caller
    /// with a deadline of its own.
    pub fn ends_within(
        &self,
        tps: &[(String, u32)],
        timeout: Duration,
    ) -> Result<Vec<u64>, TransportError> {
        let mut tpl = TopicPartitionList::new();
        for (t, p) in tps {
            tpl.add_partition_offset(t, *p as i32, Offset::End)
                .map_err(|e| kerr("end offsets", e))?;
        }
        let got = self
            .consumer
            .offsets_for_times(tpl, timeout)
            .map_err(|e| kerr("end offsets", e))?;
        tps.iter()
            .map(|(t, p)| {
                let e = got
                    .find_partition(t, *p as i32)
                    .ok_or_else(|| kerr("end offsets", format!("no answer for {t}/{p}")))?;
                e.error().map_err(|e| kerr("end offsets", e))?;
                match e.offset() {
                    Offset::Offset(o) if o >= 0 => Ok(o as u64),
                    other => Err(kerr(
                        "end offsets",
                        format!("{t}/{p} answered {other:?}, not an offset"),
                    )),
                }
            })
            .collect()
    }

    /// The ends of these topic partitions (for committed reads, the last stable offsets), asked
    /// in one request per broker instead of one per partition.
    pub fn ends(&self, tps: &[(String, u32)]) -> Result<Vec<u64>, TransportError> {
        let mut tpl = TopicPartitionList::new();
        for (t, p) in tps {
            // A "timestamp" of -1 asks for the latest offset.
            tpl.add_partition_offset(t, *p as i32, Offset::End)
                .map_err(|e| kerr("end offsets", e))?;
        }
        let got = settle(
            || format!("the ends of {tps:?}"),
            SETTLE_FOR,
            || -> Result<TopicPartitionList, RdError> {
                let got = self
                    .consumer
                    .offsets_for_times(tpl.clone(), Duration::from_secs(10))?;
                for e in got.elements() {
                    e.error()?;
                }
                Ok(got)
            },
        )
        .map_err(|e| kerr("end offsets", e))?;
        tps.iter()
            .map(
                |(t, p)| match got.find_partition(t, *p as i32).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) if o >= 0 => Ok(o as u64),
                    // Not answered as an offset: asked on its own.
                    _ => self.watermarks(t, *p).map(|(_, hi)| hi),
                },
            )
            .collect()
    }

    /// What wakes [`InputConsumer::fetch`] waiting for records from another thread.
    pub fn waker(&self) -> super::FetchWaker {
        self.records.waker()
    }

    /// Assigns these topic partitions at these offsets: once per consumer (a session makes a
    /// new one).
    ///
    /// The first `first` entries are assigned on their own, then the rest: librdkafka sends one
    /// fetch at a time per broker, and a topic partition that joins while a fetch is in flight
    /// waits for it. A fetch of partitions with nothing to read waits out `fetch.wait.max.ms`
    /// at the broker, so the caller puts those with records waiting first: the first fetch
    /// returns at once with records.
    pub fn assign(&self, at: &[(String, u32, u64)], first: usize) -> Result<(), TransportError> {
        if self.assigned.swap(true, Ordering::AcqRel) {
            return Err(kerr(
                "assign",
                "an input consumer is assigned once; make a new one",
            ));
        }
        for (t, p, _) in at {
            self.records
                .forward(&self.consumer, t, *p)
                .map_err(|e| kerr("assign", e))?;
        }
        let (head, tail) = at.split_at(first.min(at.len()));
        for part in [head, tail] {
            if part.is_empty() {
                continue;
            }
            let mut tpl = TopicPartitionList::new();
            for (t, p, o) in part {
                tpl.add_partition_offset(t, *p as i32, Offset::Offset(*o as i64))
                    .map_err(|e| kerr("assign", e))?;
            }
            self.consumer
                .incremental_assign(&tpl)
                .map_err(|e| kerr("assign", e))?;
        }
        Ok(())
    }

    /// Up to `max` records, grouped by topic partition: those already fetched, at once; when
    /// there are none, waits up to `wait` for the first. One call to librdkafka per batch, with
    /// no deadline computed per record.
    pub fn fetch(&self, max: usize, wait: Duration) -> Vec<Fetched> {
        let mut groups: Vec<Fetched> = Vec::new();
        // Commit replies and client errors come on the consumer's queue; a record there (from a
        // topic partition assigned some other way) is kept, never dropped.
        while let Some(m) = self.consumer.poll(Duration::ZERO) {
            match m {
                Ok(m) => {
                    push_record(
                        &mut groups,
                        m.topic(),
                        m.partition() as u32,
                        LogRecord {
                            offset: m.offset() as u64,
                            record: to_record(&m),
                        },
                    );
                }
                Err(e) => tracing::warn!("input consumer: {e}"),
            }
        }
        let wait = if groups.is_empty() {
            wait
        } else {
            Duration::ZERO
        };
        let batch = self.records.consume(max.max(1), wait);
        // Records come in runs of one topic partition: the group of the last run, by topic
        // handle and partition, takes most of them without a name compared.
        let mut last: Option<(usize, u32, usize)> = None;
        for msg in &batch {
            if let Some(e) = msg.error() {
                tracing::warn!("input consumer: {e}");
                continue;
            }
            let (topic, partition) = (msg.topic_id(), msg.partition());
            let rec = LogRecord {
                offset: msg.offset(),
                record: msg.record(),
            };
            match last {
                Some((t, p, i)) if t == topic && p == partition => groups[i].records.push(rec),
                _ => {
                    let i = push_record(&mut groups, &msg.topic(), partition, rec);
                    last = Some((topic, partition, i));
                }
            }
        }
        groups
    }

    /// [`InputConsumer::fetch`] without copies: `each` sees each record's key and value in
    /// librdkafka's buffers (no headers, no timestamp); answers how many records it saw. For
    /// readers that copy what they keep anyway, such as a restore.
    pub fn fetch_raw(
        &self,
        max: usize,
        wait: Duration,
        each: &mut dyn FnMut(RawRecord<'_>),
    ) -> usize {
        let mut n = 0;
        while let Some(m) = self.consumer.poll(Duration::ZERO) {
            match m {
                Ok(m) => {
                    each(RawRecord {
                        topic: m.topic(),
                        partition: m.partition() as u32,
                        offset: m.offset() as u64,
                        key: m.key(),
                        value: m.payload(),
                    });
                    n += 1;
                }
                Err(e) => tracing::warn!("input consumer: {e}"),
            }
        }
        let wait = if n == 0 { wait } else { Duration::ZERO };
        let batch = self.records.consume(max.max(1), wait);
        // The name of the last topic seen, by its handle: records come in runs of one.
        let mut topic: Option<(usize, String)> = None;
        for msg in &batch {
            if let Some(e) = msg.error() {
                tracing::warn!("input consumer: {e}");
                continue;
            }
            let id = msg.topic_id();
            let name = match &topic {
                Some((i, name)) if *i == id => name,
                _ => &topic.insert((id, msg.topic())).1,
            };
            let (key, value) = msg.key_value();
            each(RawRecord {
                topic: name,
                partition: msg.partition(),
                offset: msg.offset(),
                key,
                value,
            });
            n += 1;
        }
        n
    }

    /// The group's metadata, for offsets committed in a transaction.
    pub fn group_metadata(&self) -> Result<GroupMetadata, TransportError> {
        self.consumer
            .group_metadata()
            .map(GroupMetadata)
            .ok_or_else(|| kerr("offsets", "the consumer has no group metadata"))
    }

    /// Stops fetching every topic partition assigned, without an error: the fault
    /// [`crate::steps::INPUT_STALL`].
    pub fn pause_all(&self) -> Result<(), TransportError> {
        let assigned = self
            .consumer
            .assignment()
            .map_err(|e| kerr("assignment", e))?;
        self.consumer.pause(&assigned).map_err(|e| kerr("pause", e))
    }

    /// The position (next offset) of a topic partition, when known.
    pub fn position(&self, topic: &str, partition: u32) -> Option<u64> {
        position(&self.consumer, topic, partition).map(|o| o.max(0) as u64)
    }

    /// The high watermark of a topic partition.
    pub fn high_watermark(&self, topic: &str, partition: u32) -> Result<u64, TransportError> {
        Ok(self.watermarks(topic, partition)?.1)
    }

    /// The low watermark of a topic partition.
    pub fn low_watermark(&self, topic: &str, partition: u32) -> Result<u64, TransportError> {
        Ok(self.watermarks(topic, partition)?.0)
    }

    /// The low and high watermarks of a topic partition, in one round trip. On a consumer
    /// that is fetching, the broker answers after the fetch in flight: ask one that is not.
    pub fn watermarks(&self, topic: &str, partition: u32) -> Result<(u64, u64), TransportError> {
        let (lo, hi) = watermarks(&self.consumer, topic, partition)?;
        Ok((lo.max(0) as u64, hi.max(0) as u64))
    }

    /// The high watermark of a topic partition, asked once with `timeout`: a broker that
    /// does not answer fails the call instead of holding the caller while it settles.
    pub fn end_once(
        &self,
        topic: &str,
        partition: u32,
        timeout: Duration,
    ) -> Result<u64, TransportError> {
        let (_, hi) = self
            .consumer
            .fetch_watermarks(topic, partition as i32, timeout)
            .map_err(|e| kerr(&format!("the end of {topic}/{partition}"), e))?;
        Ok(hi.max(0) as u64)
    }
}

fn offsets_tpl(offsets: &[(String, u32, u64)]) -> Result<TopicPartitionList, TransportError> {
    let mut tpl = TopicPartitionList::new();
    for (t, p, o) in offsets {
        tpl.add_partition_offset(t, *p as i32, Offset::Offset(*o as i64))
            .map_err(|e| kerr("offsets", e))?;
    }
    Ok(tpl)
}

/// Producer context of [`BatchProducer`]: the highest offset written per topic partition and
/// the first delivery error, since the last [`BatchProducer::flush`].
#[derive(Default)]
struct OffsetContext {
    state: Mutex<Delivered>,
    /// Records sent and not yet reported: an atomic, so that sending takes no lock.
    pending: AtomicUsize,
    /// Signalled (under `state`) when the last record in flight is delivered or fails.
    idle: parking_lot::Condvar,
}

/// What deliveries told since the last flush.
#[derive(Default)]
struct Delivered {
    /// Highest offset per topic partition: a short list (a partition's changelog and output
    /// partitions), searched without making a key per delivered record.
    offsets: Vec<((String, u32), u64)>,
    /// The first delivery error, and whether Kafka refused that record for good.
    error: Option<(String, bool)>,
}

impl ClientContext for OffsetContext {}

impl ProducerContext for OffsetContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let mut st = self.state.lock();
        // Decremented and notified under the lock a flush waits with: no lost wake-up.
        if self.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_all();
        }
        match result {
            Ok(m) => {
                let (topic, partition) = (m.topic(), m.partition() as u32);
                let offset = m.offset().max(0) as u64;
                match st
                    .offsets
                    .iter_mut()
                    .find(|((t, p), _)| *p == partition && t == topic)
                {
                    Some((_, e)) => *e = (*e).max(offset),
                    None => st.offsets.push(((topic.to_string(), partition), offset)),
                }
            }
            Err((err, m)) => {
                let refused = refuses_for_good(err.rdkafka_error_code());
                match &mut st.error {
                    None => {
                        st.error = Some((
                            format!("delivery to {}/{} failed: {err}", m.topic(), m.partition()),
                            refused,
                        ));
                    }
                    // A refusal for good decides, whatever failed first in the same flush.
                    Some((_, any_refused)) => *any_refused |= refused,
                }
            }
        }
    }
}

/// Input offsets to commit: (topic, partition, the next offset to read).
pub type NextOffsets = [(String, u32, u64)];

/// The producer of a partition: sends a batch's records in a transaction and reports the
/// offsets they got. It is transactional under every guarantee: its registration fences the
/// producers of older owners of the partition.
pub struct BatchProducer {
    producer: ThreadedProducer<OffsetContext>,
}

const TXN_TIMEOUT: Duration = Duration::from_secs(60);

impl BatchProducer {
    /// Registers the transactional id with the coordinator, fencing any older producer with
    /// the same id and aborting its open transaction.
    pub fn init_transactions(&self) -> Result<(), TransportError> {
        self.producer
            .init_transactions(TXN_TIMEOUT)
            .map_err(|e| kerr("init transactions", e))
    }

    /// Connects to a broker now (librdkafka connects only when it needs to). A transactional
    /// producer that is not connected when `init_transactions` starts finds no broker to ask
    /// for its coordinator, and librdkafka asks again only 500 ms later.
    pub fn connect(&self, timeout: Duration) -> Result<(), TransportError> {
        use rdkafka::producer::Producer as _;
        self.producer
            .client()
            .fetch_metadata(None, timeout)
            .map(|_| ())
            .map_err(|e| kerr("producer metadata", e))
    }

    /// Starts a transaction.
    pub fn begin(&self) -> Result<(), TransportError> {
        self.producer
            .begin_transaction()
            .map_err(|e| kerr("begin transaction", e))
    }

    /// Sends one record.
    pub fn send(&self, topic: &str, partition: u32, r: &Record) -> Result<(), TransportError> {
        self.send_made_of(topic, partition, Parts::of(r))
    }

    /// Sends a record made of borrowed parts (no headers): a changelog record.
    pub fn send_parts(
        &self,
        topic: &str,
        partition: u32,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        timestamp: i64,
    ) -> Result<(), TransportError> {
        self.send_made_of(
            topic,
            partition,
            Parts {
                key,
                value,
                headers: None,
                timestamp,
            },
        )
    }

    /// Sends records without headers, `(key, value)` each, to `topic`/`partition`, in one call
    /// into librdkafka ([`super::rdbatch::produce_many`]): a commit's changelog records. Their
    /// timestamp is the time of the call. Waits for room in the queue when it is full, as
    /// [`BatchProducer::send`] does.
    pub fn send_many<'a>(
        &self,
        topic: &str,
        partition: u32,
        records: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    ) -> Result<(), TransportError> {
        let ctx = self.producer.context();
        super::rdbatch::produce_many(
            self.producer.client(),
            &ctx.pending,
            topic,
            partition,
            records,
            Duration::from_secs(60),
        )
        .map_err(|e| match e {
            super::rdbatch::ProduceError::Topic => kerr(
                &format!("producing to {topic}"),
                "the topic's name has a NUL, or librdkafka gave no handle for it",
            ),
            super::rdbatch::ProduceError::Record { code } => {
                if refuses_for_good(Some(code)) {
                    TransportError::Refused(format!("producing to {topic}/{partition}: {code}"))
                } else {
                    kerr(&format!("producing to {topic}/{partition}"), code)
                }
            }
        })
    }

    #[allow(clippy::result_large_err)] // rdkafka's own error type: the record comes back in it
    fn send_made_of(
        &self,
        topic: &str,
        partition: u32,
        parts: Parts<'_>,
    ) -> Result<(), TransportError> {
        let ctx = self.producer.context();
        ctx.pending.fetch_add(1, Ordering::AcqRel);
        let sent = send_parts_with(
            |rec| self.producer.send(rec),
            || std::thread::sleep(Duration::from_millis(1)),
            topic,
            partition,
            parts,
            (),
        );
        if sent.is_err() {
            ctx.pending.fetch_sub(1, Ordering::AcqRel);
        }
        sent
    }

    /// Waits until every record sent is acknowledged; returns the highest offset written per
    /// topic partition since the last flush, or the first delivery error.
    pub fn flush(&self) -> Result<HashMap<(String, u32), u64>, TransportError> {
        let ctx = self.producer.context();
        let deadline = Instant::now() + TXN_TIMEOUT;
        let mut st = ctx.state.lock();
        while ctx.pending.load(Ordering::Acquire) > 0 {
            if ctx.idle.wait_until(&mut st, deadline).timed_out() {
                return Err(kerr(
                    "flush",
                    format!(
                        "{} records not acknowledged within {TXN_TIMEOUT:?}",
                        ctx.pending.load(Ordering::Acquire)
                    ),
                ));
            }
        }
        let offsets = std::mem::take(&mut st.offsets).into_iter().collect();
        match st.error.take() {
            Some((e, true)) => return Err(TransportError::Refused(e)),
            Some((e, false)) => return Err(TransportError::Kafka(e)),
            None => {}
        }
        Ok(offsets)
    }

    /// Commits the transaction, with the input `offsets` of `group` in it.
    pub fn commit(
        &self,
        offsets: &NextOffsets,
        group: &GroupMetadata,
    ) -> Result<(), TransportError> {
        let tpl = offsets_tpl(offsets)?;
        let t0 = Instant::now();
        self.producer
            .send_offsets_to_transaction(&tpl, &group.0, TXN_TIMEOUT)
            .map_err(|e| kerr("send offsets to transaction", e))?;
        tracing::trace!(
            us = t0.elapsed().as_micros() as u64,
            "offsets sent to the transaction"
        );
        self.producer
            .commit_transaction(TXN_TIMEOUT)
            .map_err(|e| kerr("commit transaction", e))
    }

    /// Aborts the open transaction, if any; errors are logged (the next session fences anyway).
    pub fn abort(&self) {
        if let Err(e) = self.producer.abort_transaction(TXN_TIMEOUT) {
            tracing::warn!("abort transaction: {e}");
        }
        let mut st = self.producer.context().state.lock();
        st.offsets.clear();
        st.error = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_login_or_handshake_names_what_to_check_and_no_secret() {
        let mut c = KafkaConfig::new("b1:9094");
        c.settings = vec![
            ("security.protocol".into(), "SASL_SSL".into()),
            ("sasl.mechanisms".into(), "SCRAM-SHA-512".into()),
            ("sasl.username".into(), "svc".into()),
            ("sasl.password".into(), "hunter2".into()),
        ];
        let login = refusal(&c, RDKafkaErrorCode::Authentication, "invalid credentials");
        for said in [
            "b1:9094",
            "refused the login",
            "SCRAM-SHA-512",
            "`svc`",
            "SASL_SSL",
            "invalid credentials",
            "sasl.password",
        ] {
            assert!(login.contains(said), "{said:?} missing from {login}");
        }
        assert!(!login.contains("hunter2"));
        let tls = refusal(&c, RDKafkaErrorCode::SSL, "certificate verify failed");
        assert!(
            tls.contains("TLS handshake") && tls.contains("ssl.ca.location"),
            "{tls}"
        );
        assert!(!tls.contains("hunter2"));
    }

    #[test]
    fn a_broker_that_does_not_answer_fails_the_probe_in_time() {
        // A port nobody listens on: no refusal, only silence.
        let c = KafkaConfig::new("127.0.0.1:1");
        let started = Instant::now();
        let err = probe(&c, Duration::from_secs(2)).unwrap_err().to_string();
        assert!(err.contains("no broker answered at 127.0.0.1:1"), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn settings_baton_relies_on_are_refused_and_secrets_never_printed() {
        let mut c = KafkaConfig::new("127.0.0.1:9092");
        c.settings = vec![
            ("compression.type".into(), "lz4".into()),
            ("sasl.password".into(), "hunter2".into()),
            ("ssl.key.password".into(), "swordfish".into()),
        ];
        c.check_settings().unwrap();
        let shown = format!("{c:?}");
        assert!(shown.contains("lz4"), "{shown}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("swordfish"),
            "{shown}"
        );
        for key in [
            "transactional.id",
            "Isolation.Level",
            "group.id",
            "enable.idempotence",
        ] {
            c.settings = vec![(key.into(), "x".into())];
            let e = c.check_settings().unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("cannot be overridden"), "{e}");
        }
        // And no client is made with one.
        c.settings = vec![("isolation.level".into(), "read_uncommitted".into())];
        let e = KafkaTransport::connect(c)
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("isolation.level"), "{e}");
    }

    /// Fails with `errors` in turn, then succeeds; counts the calls.
    fn flaky(errors: Vec<RDKafkaErrorCode>) -> impl FnMut() -> Result<u32, RdError> {
        let mut left = errors.into_iter();
        let mut calls = 0;
        move || {
            calls += 1;
            match left.next() {
                Some(code) => Err(RdError::MetadataFetch(code)),
                None => Ok(calls),
            }
        }
    }

    #[test]
    fn the_errors_of_a_settling_broker_are_waited_out() {
        use RDKafkaErrorCode as C;
        let f = flaky(vec![
            C::NotLeaderForPartition,
            C::LeaderNotAvailable,
            C::CoordinatorLoadInProgress,
            C::UnknownLeaderEpoch,
        ]);
        let got = settle(|| "watermarks of t/0".into(), Duration::from_secs(10), f);
        assert_eq!(got.unwrap(), 5, "four refusals, then the answer");
    }

    #[test]
    fn a_permanent_error_fails_at_once() {
        use RDKafkaErrorCode as C;
        for code in [
            C::TopicAuthorizationFailed,
            C::InvalidReplicationFactor,
            C::UnknownTopicOrPartition,
        ] {
            let mut calls = 0;
            let started = Instant::now();
            let got: Result<(), _> = settle(
                || "x".into(),
                Duration::from_secs(10),
                || {
                    calls += 1;
                    Err(RdError::MetadataFetch(code))
                },
            );
            assert_eq!(got.unwrap_err().code(), Some(code));
            assert_eq!(calls, 1, "{code:?} is not retried");
            assert!(started.elapsed() < Duration::from_secs(1));
        }
    }

    #[test]
    fn a_broker_that_does_not_settle_fails_at_the_deadline_with_its_last_error() {
        let started = Instant::now();
        let mut calls = 0;
        let got: Result<(), _> = settle(
            || "x".into(),
            Duration::from_millis(300),
            || {
                calls += 1;
                Err(KafkaError::Refused {
                    what: "creating topic `t`".into(),
                    code: RDKafkaErrorCode::NotController,
                })
            },
        );
        let err = got.unwrap_err();
        assert!(err.to_string().contains("creating topic `t`"), "{err}");
        assert!(calls >= 3, "backed off and retried: {calls} calls");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "gave up at the deadline"
        );
    }
}
