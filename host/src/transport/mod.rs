//! Where records live: the embedded log and Kafka. This layer moves bytes; it knows nothing of
//! WebAssembly, state or pipelines.

pub mod embedded;
pub mod kafka;
pub mod partitioner;

/// One record as producers write it and processors read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// `None` for a record without a key.
    pub key: Option<Vec<u8>>,
    /// `None` for a tombstone.
    pub value: Option<Vec<u8>>,
    /// Headers in order; names may repeat.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Milliseconds since the Unix epoch.
    pub timestamp: i64,
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
