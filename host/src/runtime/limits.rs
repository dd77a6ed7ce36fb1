//! What a pipeline's guests may write, and how much: checked by the host before the log sees
//! a record.

use std::collections::HashMap;

/// An output topic a pipeline's guests may send to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputTopic {
    /// Its partition count.
    pub partitions: u32,
    /// Most bytes of key, value and headers one record may have (the topic's
    /// `max.message.bytes` less 1 KiB of framing on Kafka); `None` for no limit.
    pub max_record_bytes: Option<usize>,
}

/// Where a pipeline's guests may write, and how much: checked by the host before Kafka sees a
/// record, so that no record the broker would refuse enters a batch.
#[derive(Debug, Clone)]
pub struct WriteLimits {
    /// Declared output topics and the dead-letter topic.
    pub outputs: HashMap<String, OutputTopic>,
    /// Most bytes of a state key (`limits.max_key_bytes`).
    pub max_key_bytes: usize,
    /// Most bytes of a state value (`limits.max_value_bytes`).
    pub max_value_bytes: usize,
    /// Most timers pending per slot (`limits.max_timers`).
    pub max_timers: u64,
    /// Per store: most bytes of key and value its changelog takes in one record (`None`: no
    /// changelog limit).
    pub changelog_record_bytes: Vec<Option<usize>>,
    /// Any topic is an output, of one partition (local runs, which have no topics).
    pub any_output: bool,
}

impl Default for WriteLimits {
    /// No outputs and no size limits.
    fn default() -> Self {
        WriteLimits {
            outputs: HashMap::new(),
            max_key_bytes: usize::MAX,
            max_value_bytes: usize::MAX,
            max_timers: u64::MAX,
            changelog_record_bytes: Vec::new(),
            any_output: false,
        }
    }
}
