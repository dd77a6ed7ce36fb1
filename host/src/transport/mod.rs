//! Where records live: the embedded log and Kafka. This layer moves bytes; it knows nothing of
//! WebAssembly, state or pipelines.

pub mod embedded;
pub mod kafka;
mod rdbatch;

pub use rdbatch::FetchWaker;

pub use crate::partitioner;
pub use crate::record::Record;

use std::sync::Arc;

/// The log a host runs on, as one handle: the [`Transport`] every layer uses (through
/// `Deref`), and the embedded log or the Kafka client behind it for what only one of them does
/// (a partition's Kafka session, a move's warm replica, cluster membership).
#[derive(Clone)]
pub struct Log {
    transport: Arc<dyn Transport>,
    kafka: Option<Arc<kafka::KafkaTransport>>,
    embedded: Option<Arc<embedded::EmbeddedLog>>,
}

impl Log {
    /// The embedded log.
    pub fn embedded(log: Arc<embedded::EmbeddedLog>) -> Self {
        Log {
            transport: log.clone(),
            kafka: None,
            embedded: Some(log),
        }
    }

    /// A Kafka cluster.
    pub fn kafka(k: Arc<kafka::KafkaTransport>) -> Self {
        Log {
            transport: k.clone(),
            kafka: Some(k),
            embedded: None,
        }
    }

    /// The transport, shared.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    /// The Kafka client, on Kafka.
    pub fn as_kafka(&self) -> Option<&Arc<kafka::KafkaTransport>> {
        self.kafka.as_ref()
    }

    /// The embedded log, alone on it.
    pub fn as_embedded(&self) -> Option<&Arc<embedded::EmbeddedLog>> {
        self.embedded.as_ref()
    }

    /// Whether the host runs on Kafka (a cluster), not the embedded log.
    pub fn is_kafka(&self) -> bool {
        self.kafka.is_some()
    }
}

impl std::ops::Deref for Log {
    type Target = dyn Transport;

    fn deref(&self) -> &Self::Target {
        self.transport.as_ref()
    }
}

/// A record with its position in a topic partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecord {
    /// Position of the record in its partition, from 0.
    pub offset: u64,
    /// The record.
    pub record: Record,
}

/// Errors of the transport layer.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The topic does not exist.
    #[error("topic `{0}` does not exist")]
    UnknownTopic(String),
    /// The partition is outside the topic.
    #[error("topic `{topic}` has {partitions} partitions; partition {partition} does not exist")]
    NoSuchPartition {
        /// Topic name.
        topic: String,
        /// Partition asked for.
        partition: u32,
        /// Partitions the topic has.
        partitions: u32,
    },
    /// The topic exists with another partition count than needed.
    #[error(
        "topic `{topic}` exists with {actual} partitions but {wanted} are needed (one per slot)"
    )]
    PartitionCountMismatch {
        /// Topic name.
        topic: String,
        /// Partitions it has.
        actual: u32,
        /// Partitions wanted.
        wanted: u32,
    },
    /// The topic exists with a setting baton cannot work with (e.g. a changelog that is not
    /// compacted); the message names the setting and how to fix it.
    #[error("{0}")]
    Misconfigured(String),
    /// The name is not a valid topic name.
    #[error(
        "invalid topic name `{0}`: use 1 to 249 characters of ASCII letters, digits, '.', '_' and '-'"
    )]
    InvalidTopicName(String),
    /// A file of the log could not be read or written.
    #[error("log I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A file of the log holds bytes that do not parse.
    #[error("log corrupt: {0}")]
    Corrupt(String),
    /// Kafka refused or did not answer.
    #[error("kafka: {0}")]
    Kafka(String),
    /// Kafka refused a record for good (too large, an invalid timestamp, a corrupt record): no
    /// retry of the same record can succeed.
    #[error("kafka refused a record: {0}")]
    Refused(String),
}

/// What a topic is for, which decides its retention on Kafka.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicKind {
    /// Input and output topics: the broker's defaults.
    Data,
    /// Dead letters: the broker's default retention, baton's own durability settings.
    DeadLetters,
    /// Changelogs: compacted, so the latest value of every key is kept.
    Compacted,
    /// The control log and module chunks: kept forever.
    Forever,
}

impl TopicKind {
    /// True for baton's own topics (all but inputs and outputs), which get
    /// `min.insync.replicas` on Kafka.
    pub fn is_internal(self) -> bool {
        self != TopicKind::Data
    }
}

/// What the host needs from a log, served by the embedded log and by Kafka alike: topics,
/// durable appends and reads. The partition loop's own data path is in `task::io`.
pub trait Transport: Send + Sync {
    /// `"embedded"` or `"kafka"`.
    fn kind(&self) -> &'static str;
    /// Creates `topic` if missing. `Ok(true)` if created, `Ok(false)` if it existed with that
    /// count, [`TransportError::PartitionCountMismatch`] if it exists with another.
    fn ensure_topic(
        &self,
        topic: &str,
        partitions: u32,
        kind: TopicKind,
    ) -> Result<bool, TransportError>;
    /// The partition count of `topic`, `None` when it does not exist.
    fn partitions(&self, topic: &str) -> Result<Option<u32>, TransportError>;
    /// Every topic with its partition count, sorted by name.
    fn topics(&self) -> Result<Vec<(String, u32)>, TransportError>;
    /// The offset the next record appended to the partition gets.
    fn end_offset(&self, topic: &str, partition: u32) -> Result<u64, TransportError>;
    /// Appends records to one partition, durably; returns the offset of the first.
    fn append(
        &self,
        topic: &str,
        partition: u32,
        records: &[Record],
    ) -> Result<u64, TransportError>;
    /// Most bytes of key, value and headers one record of `topic` may have, framing left out;
    /// `None` when the transport sets no limit (the embedded log).
    fn max_record_bytes(&self, _topic: &str) -> Result<Option<usize>, TransportError> {
        Ok(None)
    }
    /// Deletes topics (missing ones are ignored) and returns once they are gone.
    fn delete_topics(&self, topics: &[String]) -> Result<(), TransportError>;
    /// Deletes a consumer group's committed offsets (nothing on the embedded log, which keeps
    /// input offsets in the partitions' state).
    fn delete_group(&self, _group: &str) -> Result<(), TransportError> {
        Ok(())
    }
    /// Reads up to `max` committed records from `offset` on.
    fn read(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<LogRecord>, TransportError>;

    /// Like [`Transport::read`], with the offset to read from next: past the records read, and
    /// past transaction markers and aborted records (which take offsets and are never read).
    fn read_from(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<(Vec<LogRecord>, u64), TransportError> {
        let records = self.read(topic, partition, offset, max)?;
        let next = records.last().map_or(offset, |r| r.offset + 1);
        Ok((records, next))
    }

    /// A reader of one partition from `from` on that stays at its position and is handed
    /// records as they land, for a log read without end (the control log); `None` when the
    /// transport has none and [`Transport::read_from`] serves.
    fn tail(
        &self,
        _topic: &str,
        _partition: u32,
        _from: u64,
    ) -> Result<Option<Box<dyn LogTail>>, TransportError> {
        Ok(None)
    }
}

/// One partition read from a position on, as its records land (see [`Transport::tail`]).
pub trait LogTail: Send {
    /// The committed records after the last ones returned, at most `max`, waiting up to `wait`
    /// for the first; with the offset to read from next, which is past transaction markers and
    /// aborted records too.
    fn next(
        &mut self,
        max: usize,
        wait: std::time::Duration,
    ) -> Result<(Vec<LogRecord>, u64), TransportError>;
}

/// Checks a topic name with Kafka's rules, so that names work on both transports.
pub fn validate_topic_name(name: &str) -> Result<(), TransportError> {
    let ok = !name.is_empty()
        && name.len() <= 249
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(TransportError::InvalidTopicName(name.to_string()))
    }
}
