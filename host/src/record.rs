//! A record, as producers write it, processors read it and the logs keep it.

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

/// A record a guest sent to an output topic during the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Destination topic.
    pub topic: String,
    /// Destination partition.
    pub partition: u32,
    /// The record.
    pub record: Record,
}
