//! The control log: appending events (one at a time, under the control lock) and replaying
//! it into the catalog at start.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::control::{Catalog, ControlEvent, now_ms};

/// The header naming the host that appended a control event.
pub const ORIGIN: &str = "baton.origin";

/// How long an appender waits for its event to be read back before it answers `Unavailable`.
pub(crate) const READ_BACK_WAIT: Duration = Duration::from_secs(30);
use crate::error::{Error, Result};
use crate::steps::Steps;
use crate::transport::{Log, Record, Transport};

/// The control log as a host uses it: appends (under the control lock, which serialises this
/// host's control-plane changes), how far the follower has applied it, and read-backs. A narrow
/// handle: what takes it needs nothing else of the host.
pub struct ControlLog {
    log: Log,
    topic: String,
    host_id: String,
    steps: Arc<Steps>,
    /// Serialises control-plane changes on this host: held around a change's check and its
    /// append (and, for admin calls, its read-back), never by the follower.
    lock: Mutex<()>,
    /// The next offset the follower reads (everything before it is applied).
    offset: Mutex<u64>,
    /// Notified when `offset` moves.
    read: Condvar,
    /// The offset after this host's last append.
    appended_to: AtomicU64,
    /// Wakes the follower from its idle wait when an append is to be read back.
    wake: Arc<ControlWake>,
    /// The catalog as the log makes it: every record applied in log order (this host's own
    /// too, once read back). What decides between two hosts' appends, and what snapshots hold.
    ordered: Arc<Mutex<Catalog>>,
    /// The host's one apply path, which every event takes effect through ([`Self::set_apply`]).
    apply: std::sync::OnceLock<Apply>,
}

/// Has a control event take effect on this host at its offset: the one apply path, which the
/// host wires in. Answers false once the host is gone (its follower then ends).
pub type Apply = Box<dyn Fn(ControlEvent, u64) -> bool + Send + Sync>;

/// When the follower writes a snapshot of the log-ordered catalog: every `every` records, on
/// the host for which `due` answers true (the controller).
pub struct Snapshots {
    /// Records between snapshots.
    pub every: u64,
    /// Whether this host writes them now.
    pub due: Box<dyn Fn() -> bool + Send>,
}

impl ControlLog {
    /// The control log `topic` on `log`, applied up to `end` (the replay's end) at start.
    pub fn new(log: Log, topic: String, host_id: String, steps: Arc<Steps>, end: u64) -> Self {
        ControlLog {
            log,
            topic,
            host_id,
            steps,
            lock: Mutex::new(()),
            offset: Mutex::new(end),
            read: Condvar::new(),
            appended_to: AtomicU64::new(end),
            wake: Default::default(),
            ordered: Arc::new(Mutex::new(Catalog::default())),
            apply: std::sync::OnceLock::new(),
        }
    }

    /// Wires in the host's apply path; set once, before the first commit or follow.
    pub fn set_apply(&self, apply: Apply) {
        if self.apply.set(apply).is_err() {
            tracing::error!("the control log's apply path was set twice; the first one stays");
        }
    }

    /// The catalog the log's records make, applied strictly in log order.
    pub fn ordered(&self) -> MutexGuard<'_, Catalog> {
        self.ordered.lock()
    }

    /// Applies the record at `at`: to the log-ordered catalog, then through the apply path.
    fn apply_at(&self, event: ControlEvent, at: u64) -> bool {
        self.ordered.lock().apply(event.clone());
        match self.apply.get() {
            Some(apply) => apply(event, at),
            None => {
                tracing::error!(
                    at,
                    "a control event read before the apply path was wired in"
                );
                true
            }
        }
    }

    /// Appends `event` and has it take effect here: on Kafka once the follower has read it back
    /// and applied it (with every event before it), on the embedded log, which this host alone
    /// writes, at once, so the append's order is the log's. Answers the event's offset; whether
    /// it counted at its place in the log the caller reads from the catalog. An event not read
    /// back within [`READ_BACK_WAIT`] is `Unavailable`: it is in the log and takes effect when
    /// the follower gets to it.
    pub fn commit(&self, event: ControlEvent) -> Result<u64> {
        let at = self.append(&event)?;
        if self.log.as_embedded().is_some() {
            self.apply_at(event, at);
            self.set_applied(at + 1);
            return Ok(at);
        }
        self.wake_follower();
        if !self.read_back(at, READ_BACK_WAIT) {
            return Err(Error::Unavailable(format!(
                "the control-log event at offset {at} is recorded but not read back after {} s; \
                 it takes effect when this host's follower reaches it",
                READ_BACK_WAIT.as_secs()
            )));
        }
        Ok(at)
    }

    /// Tails the log from `from` on a thread of its own until `stop` is set (or the host is
    /// gone), applying every record in log order, this host's own too. The log-ordered catalog
    /// starts as the records before `from` make it.
    pub fn follow(
        self: &Arc<Self>,
        from: u64,
        stop: Arc<AtomicBool>,
        snapshots: Snapshots,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let control = self.clone();
        // A reader that stays assigned where the transport has one (Kafka): records arrive as
        // they land, with no idle wait.
        let mut tail = self.log.tail(&self.topic, 0, from).unwrap_or_else(|e| {
            tracing::warn!("a reader of the control log: {e}; reading it a batch at a time");
            None
        });
        std::thread::Builder::new()
            .name("baton-control".into())
            .spawn(move || {
                let topic = control.topic.clone();
                let mut offset = from;
                let mut since_snapshot = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let read = match tail.as_mut() {
                        Some(t) => t.next(256, Duration::from_millis(50)),
                        None => control.log.read_from(&topic, 0, offset, 256),
                    };
                    let (records, next) = match read {
                        Ok(r) => r,
                        Err(e) => {
                            tracing::warn!("following the control log at {offset}: {e}");
                            std::thread::sleep(Duration::from_millis(500));
                            continue;
                        }
                    };
                    if records.is_empty() {
                        // Past markers and aborted records, if that is all there was.
                        if next > offset {
                            offset = next;
                            control.set_applied(offset);
                        }
                        // A tail waited for records already.
                        if tail.is_none() {
                            control.wake.wait(Duration::from_millis(50));
                        }
                        continue;
                    }
                    for r in records {
                        offset = r.offset + 1;
                        let bytes = r.record.value.unwrap_or_default();
                        match crate::control::parse_event(&bytes) {
                            Ok(e) => {
                                since_snapshot += 1;
                                if !control.apply_at(e, r.offset) {
                                    return;
                                }
                            }
                            Err(e) => tracing::error!(
                                "control log record {} cannot be read, skipped: {e}",
                                r.offset
                            ),
                        }
                    }
                    offset = offset.max(next);
                    control.set_applied(offset);
                    if since_snapshot >= snapshots.every.max(1) && (snapshots.due)() {
                        let ordered = control.ordered.lock().clone();
                        if let Err(e) = write_snapshot(&*control.log, &topic, &ordered, offset) {
                            tracing::warn!("control-log snapshot: {e:#}");
                        }
                        since_snapshot = 0;
                    }
                }
            })
    }

    /// The topic (`<cluster>.control`).
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Takes the control lock.
    pub fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock()
    }

    /// Appends `event` (headed with this host's id); answers its offset. It takes effect when
    /// it is applied from the log, like every other event.
    pub fn append(&self, event: &ControlEvent) -> Result<u64> {
        if self
            .steps
            .injected(crate::steps::CONTROL_APPEND_FAILS, &self.topic)
        {
            return Err(Error::Unavailable(
                "control log append failed (injected)".into(),
            ));
        }
        let value = serde_json::to_vec(event).map_err(|e| Error::Internal(e.to_string()))?;
        let record = Record {
            key: None,
            value: Some(value),
            headers: vec![(ORIGIN.to_string(), self.host_id.as_bytes().to_vec())],
            timestamp: now_ms(),
        };
        let at = self.log.append(&self.topic, 0, &[record])?;
        self.appended_to.fetch_max(at + 1, Ordering::SeqCst);
        Ok(at)
    }

    /// Has the follower read the log now instead of after its idle wait: an append is about
    /// to be read back.
    pub fn wake_follower(&self) {
        self.wake.wake();
    }

    /// Waits until the follower has applied the record at `offset`, for at most `timeout`;
    /// true when it has.
    pub fn read_back(&self, offset: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut at = self.offset.lock();
        while *at <= offset {
            if self.read.wait_until(&mut at, deadline).timed_out() {
                return *at > offset;
            }
        }
        true
    }

    /// Records that the follower applied the log up to `offset` (exclusive), and wakes whoever
    /// waits for a read-back.
    pub fn set_applied(&self, offset: u64) {
        *self.offset.lock() = offset;
        self.read.notify_all();
    }

    /// The next offset the follower reads (how far it has applied the log).
    pub fn applied(&self) -> u64 {
        *self.offset.lock()
    }

    /// How far this host has seen the log: what it applied, and what it appended itself.
    pub fn seen(&self) -> u64 {
        self.applied().max(self.appended_to.load(Ordering::SeqCst))
    }

    /// Waits until the follower has applied every record readable now, for at most `timeout`.
    pub fn catch_up(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let at = self.applied();
            let next = match self.log.read_from(&self.topic, 0, at, 1) {
                Ok((r, next)) if r.is_empty() && next <= at => return,
                Ok((r, next)) => r.first().map_or(next, |r| r.offset + 1),
                Err(e) => {
                    tracing::warn!("reading the control log: {e}");
                    return;
                }
            };
            while self.applied() < next {
                if Instant::now() > deadline {
                    tracing::warn!(next, "the control log is not followed to its end in time");
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// How long control-log replay waits for a record it knows exists before it gives up.
pub(crate) const CONTROL_REPLAY_STALL: Duration = Duration::from_secs(60);

/// What a replay read: where it began (a snapshot's offset, or 0) and how many records it
/// applied after that.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReplayStats {
    /// The control-log offset the replay began at: the newest snapshot's, or 0.
    pub from: u64,
    /// The control-log end the replay read to.
    pub to: u64,
    /// Records applied after the snapshot.
    pub replayed: u64,
}

/// The topic holding catalog snapshots of the control log `control` (compacted, one key):
/// `<cluster>.control.snapshots`, a name no pipeline can take since `control` is reserved.
pub(crate) fn snapshot_topic(control: &str) -> String {
    format!("{control}.snapshots")
}

/// The key every snapshot is written under, so that compaction keeps only the newest.
const SNAPSHOT_KEY: &[u8] = b"catalog";

/// The newest snapshot of `topic`, if there is one this host can read. A snapshot that does not
/// parse (from a newer host, say) is skipped with a warning: replay then reads the whole log.
fn newest_snapshot(
    transport: &dyn Transport,
    topic: &str,
    stall: Duration,
) -> anyhow::Result<Option<crate::control::Snapshot>> {
    if transport.partitions(topic)?.is_none() {
        return Ok(None);
    }
    let end = transport.end_offset(topic, 0)?;
    if end == 0 {
        return Ok(None);
    }
    // The newest record is at or a little before the end (a compacted topic keeps it; a few
    // offsets at the end may be markers on Kafka).
    let deadline = Instant::now() + stall;
    let mut from = end.saturating_sub(8);
    let mut last = None;
    while from < end {
        let (records, next) = transport.read_from(topic, 0, from, 64)?;
        if records.is_empty() && next <= from {
            anyhow::ensure!(
                Instant::now() < deadline,
                "snapshot topic `{topic}`: no record read at offset {from} of {end} for {stall:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        if let Some(r) = records.into_iter().last() {
            last = Some(r);
        }
        from = next;
    }
    let Some(r) = last else { return Ok(None) };
    match serde_json::from_slice::<crate::control::Snapshot>(
        r.record.value.as_deref().unwrap_or(b""),
    ) {
        Ok(s) if s.format == 1 => Ok(Some(s)),
        Ok(s) => {
            tracing::warn!(
                "snapshot at offset {} of `{topic}` has format {}, unknown here: replaying the whole control log",
                r.offset,
                s.format
            );
            Ok(None)
        }
        Err(e) => {
            tracing::warn!(
                "snapshot at offset {} of `{topic}` cannot be read ({e}): replaying the whole control log",
                r.offset
            );
            Ok(None)
        }
    }
}

/// Writes a snapshot of `catalog` (the log's records before `offset`, applied in log order).
/// A catalog too large for one record is not snapshotted: replay then reads on from the last one.
pub(crate) fn write_snapshot(
    transport: &dyn Transport,
    control: &str,
    catalog: &Catalog,
    offset: u64,
) -> anyhow::Result<()> {
    let topic = snapshot_topic(control);
    let value = serde_json::to_vec(&catalog.snapshot(offset))?;
    if let Some(max) = transport.max_record_bytes(&topic)?
        && value.len() + 1024 > max
    {
        anyhow::bail!(
            "the catalog is {} bytes, more than `{topic}` takes in one record ({max}): not snapshotted",
            value.len()
        );
    }
    let record = Record {
        key: Some(SNAPSHOT_KEY.to_vec()),
        value: Some(value),
        headers: Vec::new(),
        timestamp: now_ms(),
    };
    transport.append(&topic, 0, &[record])?;
    tracing::info!(offset, "control-log snapshot written");
    Ok(())
}

/// Replays the control log up to its end offset taken now, from its newest snapshot on. A host
/// must never start on a partial catalog: a read that stays empty for `stall` before that end,
/// or a log whose first records (or the first after the snapshot) are gone, fails loudly with
/// the offsets.
pub(crate) fn replay_control(
    transport: &dyn Transport,
    topic: &str,
    stall: Duration,
) -> anyhow::Result<(Catalog, ReplayStats)> {
    let end = transport.end_offset(topic, 0)?;
    let snapshot = match newest_snapshot(transport, &snapshot_topic(topic), stall)? {
        Some(s) if s.offset <= end => Some(s),
        Some(s) => {
            tracing::warn!(
                "the newest snapshot reaches offset {} but `{topic}` ends at {end} (the log was \
                 made again?): replaying the whole control log",
                s.offset
            );
            None
        }
        None => None,
    };
    let start = snapshot.as_ref().map_or(0, |s| s.offset);
    let mut catalog = snapshot.map(Catalog::from_snapshot).unwrap_or_default();
    let mut offset = start;
    let mut replayed = 0;
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
                "control log `{topic}`: replay stalled at offset {offset} of {end} (no record \
                 for {stall:?}); refusing to start on a partial catalog"
            );
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        progress_at = Instant::now();
        for r in records {
            anyhow::ensure!(
                offset > 0 || r.offset == 0,
                "control log `{topic}`: its first {} records are gone (deleted or expired); \
                 refusing to start on a partial catalog. The control log must keep every record \
                 (retention.ms=-1)",
                r.offset
            );
            offset = r.offset + 1;
            let bytes = r.record.value.unwrap_or_default();
            let event = crate::control::parse_event(&bytes)
                .map_err(|e| anyhow::anyhow!("control log `{topic}` record {}: {e}", r.offset))?;
            catalog.apply(event);
            replayed += 1;
        }
        offset = offset.max(next);
    }
    let stats = ReplayStats {
        from: start,
        to: end,
        replayed,
    };
    tracing::info!(from = start, to = end, replayed, "control log replayed");
    Ok((catalog, stats))
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
        let (catalog, stats) = replay_control(&t, "c", Duration::from_millis(300)).unwrap();
        assert_eq!(stats.to, 3000);
        assert_eq!(catalog.modules.len(), 3000);
        let t = Stalling { hole: 2000, ..t };
        let e = replay_control(&t, "c", Duration::from_millis(300))
            .unwrap_err()
            .to_string();
        assert!(e.contains("stalled at offset 2000 of 3000"), "{e}");
    }

    #[test]
    fn replay_starts_from_the_newest_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let t = EmbeddedLog::open(dir.path()).unwrap();
        Transport::ensure_topic(&t, "c", 1, TopicKind::Forever).unwrap();
        Transport::ensure_topic(&t, "c.snapshots", 1, TopicKind::Compacted).unwrap();
        let records: Vec<_> = (0..1500).map(module_event).collect();
        Transport::append(&t, "c", 0, &records).unwrap();
        let stall = Duration::from_millis(300);
        let (first, stats) = replay_control(&t, "c", stall).unwrap();
        assert_eq!((stats.from, stats.replayed), (0, 1500));
        write_snapshot(&t, "c", &first, stats.to).unwrap();
        let more: Vec<_> = (1500..1507).map(module_event).collect();
        Transport::append(&t, "c", 0, &more).unwrap();
        let (from_snapshot, stats) = replay_control(&t, "c", stall).unwrap();
        assert_eq!((stats.from, stats.to, stats.replayed), (1500, 1507, 7));
        assert_eq!(from_snapshot.modules.len(), 1507);
        // The same catalog as a replay of the whole log.
        Transport::delete_topics(&t, &["c.snapshots".to_string()]).unwrap();
        let (whole, stats) = replay_control(&t, "c", stall).unwrap();
        assert_eq!(stats.replayed, 1507);
        assert_eq!(whole, from_snapshot);
        // A snapshot this host cannot read is skipped, not trusted.
        Transport::ensure_topic(&t, "c.snapshots", 1, TopicKind::Compacted).unwrap();
        let junk = Record {
            key: Some(b"catalog".to_vec()),
            value: Some(b"{\"format\": 9}".to_vec()),
            headers: vec![],
            timestamp: 0,
        };
        Transport::append(&t, "c.snapshots", 0, &[junk]).unwrap();
        let (_, stats) = replay_control(&t, "c", stall).unwrap();
        assert_eq!((stats.from, stats.replayed), (0, 1507));
    }
}

/// Wakes the control-log follower from its idle wait.
#[derive(Default)]
pub(crate) struct ControlWake {
    woken: parking_lot::Mutex<bool>,
    changed: parking_lot::Condvar,
}

impl ControlWake {
    pub(crate) fn wake(&self) {
        *self.woken.lock() = true;
        self.changed.notify_all();
    }

    /// Waits until woken or `timeout` passed.
    pub(crate) fn wait(&self, timeout: Duration) {
        let mut woken = self.woken.lock();
        if !*woken {
            let _ = self.changed.wait_for(&mut woken, timeout);
        }
        *woken = false;
    }
}
