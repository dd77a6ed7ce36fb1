//! A pipeline's recent events for `GET /api/v1/pipelines/{p}/events`: guest log lines, records
//! that failed (guest errors and traps, with the topic, slot and offset of the record), and
//! module swaps. A bounded ring: the newest 1,000 are kept.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::Serialize;

use crate::runtime::Cursor;

/// How many events a pipeline keeps.
pub const EVENTS_KEPT: usize = 1000;

/// What an event is about.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    /// A guest log line.
    Log,
    /// A record the guest failed on (an error it returned), sent to the dead-letter topic.
    Error,
    /// A record the guest trapped on, sent to the dead-letter topic.
    Trap,
    /// A module swap.
    Swap,
    /// A rollback of a swap.
    Rollback,
}

/// One event.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Event {
    /// Increasing number: pass the last one seen as `after` to get only newer events.
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub at: i64,
    /// What it is about.
    pub kind: EventKind,
    /// For `log`: the guest's level.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level: Option<&'static str>,
    /// What happened.
    pub message: String,
    /// The partition it happened on.
    pub partition: String,
    /// The record that caused it: topic, slot and offset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// Slot of that record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    /// Offset of that record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
}

/// The events of one pipeline.
#[derive(Default)]
pub struct EventLog {
    next: AtomicU64,
    ring: Mutex<VecDeque<Event>>,
}

impl EventLog {
    /// Records an event about the record at `cursor` (if any).
    pub fn push(
        &self,
        kind: EventKind,
        level: Option<&'static str>,
        message: String,
        partition: &str,
        cursor: Option<&Cursor>,
    ) {
        let seq = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let event = Event {
            seq,
            at: crate::control::now_ms(),
            kind,
            level,
            message,
            partition: partition.to_string(),
            topic: cursor.map(|c| c.topic.clone()),
            slot: cursor.map(|c| c.slot),
            offset: cursor.map(|c| c.offset),
        };
        let mut ring = self.ring.lock();
        if ring.len() == EVENTS_KEPT {
            ring.pop_front();
        }
        ring.push_back(event);
    }

    /// Events with `seq > after`, oldest first, at most `limit`.
    pub fn since(&self, after: u64, limit: usize) -> Vec<Event> {
        self.ring
            .lock()
            .iter()
            .filter(|e| e.seq > after)
            .take(limit)
            .cloned()
            .collect()
    }
}
