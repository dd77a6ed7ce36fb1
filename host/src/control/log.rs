//! The control log: appending events (one at a time, under the control lock) and replaying
//! it into the catalog at start.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::control::{Catalog, ControlEvent, now_ms};
use crate::error::{Error, Result};
use crate::transport::{Record, Transport};

use crate::app::Baton;

impl Baton {
    /// Holds the control lock, as a long admin call does (tests only: no partition may stall
    /// behind it).
    #[doc(hidden)]
    pub fn hold_control_for_test(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.control.lock()
    }

    /// Makes the next `n` control-log appends fail (tests only).
    #[doc(hidden)]
    pub fn fail_control_appends_for_test(&self, n: u32) {
        self.control_faults.store(n, Ordering::SeqCst);
    }

    pub(crate) fn append_control(&self, event: &ControlEvent) -> Result<()> {
        if self
            .control_faults
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Error::Unavailable(
                "control log append failed (injected)".into(),
            ));
        }
        let value = serde_json::to_vec(event).map_err(|e| Error::Internal(e.to_string()))?;
        let record = Record {
            key: None,
            value: Some(value),
            headers: vec![(
                crate::control::follow::ORIGIN.to_string(),
                self.host_id.as_bytes().to_vec(),
            )],
            timestamp: now_ms(),
        };
        self.transport.append(&self.control_topic, 0, &[record])?;
        Ok(())
    }
}

/// How long control-log replay waits for a record it knows exists before it gives up.
pub(crate) const CONTROL_REPLAY_STALL: Duration = Duration::from_secs(60);

/// Replays the control log up to its end offset taken now. A host must never start on a
/// partial catalog: a read that stays empty for `stall` before that end, or a log whose first
/// records are gone, fails loudly with the offsets.
pub(crate) fn replay_control(
    transport: &dyn Transport,
    topic: &str,
    stall: Duration,
) -> anyhow::Result<(Catalog, u64)> {
    let mut catalog = Catalog::default();
    let end = transport.end_offset(topic, 0)?;
    let mut offset = 0;
    let mut progress_at = Instant::now();
    while offset < end {
        let (records, next) = transport.read_from(topic, 0, offset, 1024)?;
        if records.is_empty() && next > offset {
            // Transaction markers (the controller's) or aborted records: nothing to apply.
            offset = next;
            progress_at = Instant::now();
            continue;
        }
        if records.is_empty() {
            anyhow::ensure!(
                progress_at.elapsed() < stall,
                "control log `{topic}`: replay stalled at offset {offset} of {end} (no record                  for {stall:?}); refusing to start on a partial catalog"
            );
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        progress_at = Instant::now();
        for r in records {
            anyhow::ensure!(
                offset > 0 || r.offset == 0,
                "control log `{topic}`: its first {} records are gone (deleted or expired);                  refusing to start on a partial catalog. The control log must keep every record                  (retention.ms=-1)",
                r.offset
            );
            offset = r.offset + 1;
            let bytes = r.record.value.unwrap_or_default();
            let event = crate::control::parse_event(&bytes)
                .map_err(|e| anyhow::anyhow!("control log `{topic}` record {}: {e}", r.offset))?;
            catalog.apply(event);
        }
        offset = offset.max(next);
    }
    Ok((catalog, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::ModuleRecord;
    use crate::transport::TransportError;
    use crate::transport::embedded::EmbeddedLog;
    use crate::transport::{LogRecord, Record, TopicKind, Transport};

    /// The embedded log, except that reads from `hole` on return nothing (a broker that stops
    /// answering fetches).
    struct Stalling {
        log: EmbeddedLog,
        hole: u64,
    }

    impl Transport for Stalling {
        fn kind(&self) -> &'static str {
            "embedded"
        }
        fn ensure_topic(&self, t: &str, n: u32, _: TopicKind) -> Result<bool, TransportError> {
            self.log.ensure_topic(t, n)
        }
        fn partitions(&self, t: &str) -> Result<Option<u32>, TransportError> {
            Ok(self.log.partitions(t))
        }
        fn topics(&self) -> Result<Vec<(String, u32)>, TransportError> {
            Ok(self.log.topics())
        }
        fn end_offset(&self, t: &str, p: u32) -> Result<u64, TransportError> {
            self.log.end_offset(t, p)
        }
        fn append(&self, t: &str, p: u32, r: &[Record]) -> Result<u64, TransportError> {
            Transport::append(&self.log, t, p, r)
        }
        fn delete_topics(&self, t: &[String]) -> Result<(), TransportError> {
            Transport::delete_topics(&self.log, t)
        }
        fn read(
            &self,
            t: &str,
            p: u32,
            o: u64,
            max: usize,
        ) -> Result<Vec<LogRecord>, TransportError> {
            let mut v = self.log.read(t, p, o, max)?;
            v.retain(|r| r.offset < self.hole);
            Ok(v)
        }
    }

    fn module_event(i: usize) -> Record {
        let e = ControlEvent::Module(ModuleRecord {
            name: format!("m{i}"),
            version: "1".into(),
            sha256: "00".into(),
            size: 1,
            wit: "baton:processor@0.1.0".into(),
            uploaded_at: 0,
        });
        Record {
            key: None,
            value: Some(serde_json::to_vec(&e).unwrap()),
            headers: vec![],
            timestamp: 0,
        }
    }

    #[test]
    fn control_replay_reads_to_the_end_or_fails_loudly() {
        let dir = tempfile::tempdir().unwrap();
        let t = Stalling {
            log: EmbeddedLog::open(dir.path()).unwrap(),
            hole: u64::MAX,
        };
        t.ensure_topic("c", 1, TopicKind::Forever).unwrap();
        let records: Vec<_> = (0..3000).map(module_event).collect();
        Transport::append(&t, "c", 0, &records).unwrap();
        let (catalog, end) = replay_control(&t, "c", Duration::from_millis(300)).unwrap();
        assert_eq!(end, 3000);
        assert_eq!(catalog.modules.len(), 3000);
        let t = Stalling { hole: 2000, ..t };
        let e = replay_control(&t, "c", Duration::from_millis(300))
            .unwrap_err()
            .to_string();
        assert!(e.contains("stalled at offset 2000 of 3000"), "{e}");
    }
}
