//! Dead letters a pipeline replays: the plan its partitions share, and each record read back
//! from the dead-letter topic as the message it was.

use super::*;

/// The dead letters a pipeline replays (`POST /api/v1/pipelines/{p}/dead-letters/replay`),
/// shared by its partitions: a request bumps the generation, and each partition starts a new
/// session at its next batch boundary to read them. Replayed dead letters go through the
/// current version; the replay's progress is committed with each batch, as input offsets are,
/// so each dead letter is processed exactly once.
#[derive(Default)]
pub struct ReplayPlan {
    generation: AtomicU64,
    ranges: Mutex<ReplayRanges>,
}

impl ReplayPlan {
    /// A plan with the ranges requested so far.
    pub fn new(ranges: ReplayRanges) -> Arc<Self> {
        Arc::new(ReplayPlan {
            generation: AtomicU64::new(0),
            ranges: Mutex::new(ranges),
        })
    }

    /// Bumped by each request.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Every range requested, per slot.
    pub fn ranges(&self) -> ReplayRanges {
        self.ranges.lock().clone()
    }

    /// Adds a range of a slot's dead letters.
    pub fn add(&self, slot: u32, from: u64, to: u64) {
        self.ranges.lock().entry(slot).or_default().push((from, to));
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}

/// How far the replay of one slot's dead letters is.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct ReplayProgress {
    /// The slot (and partition of the dead-letter topic).
    pub slot: u32,
    /// The next dead letter to replay.
    pub offset: u64,
    /// Where the range being replayed ends (exclusive).
    pub to: u64,
}

/// A dead letter as the record it was: its topic and offset from the `baton.*` headers, which
/// are dropped.
pub(super) fn replayed_message(first_input: &str, slot: u32, r: LogRecord) -> Message {
    let header = |name: &str| {
        r.record
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    };
    let topic = header("baton.topic").unwrap_or_else(|| first_input.to_string());
    let offset = header("baton.offset")
        .and_then(|o| o.parse().ok())
        .unwrap_or(r.offset);
    let mut m = to_message(&topic, slot, r);
    m.offset = offset;
    m.headers.retain(|h| !h.key.starts_with("baton."));
    m
}
