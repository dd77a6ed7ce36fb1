//! The embedded log: a durable, single-host log in the data directory with Kafka's data model
//! (topics of numbered partitions, records at dense offsets) so that baton runs with no broker.
//!
//! On disk: `<dir>/<topic>/partitions` holds the partition count, `<dir>/<topic>/<n>.log` the
//! records of partition `n` as frames `[len u32][crc32 u32][body]`. A torn frame at the end of a
//! file (a crash mid-write) is cut off when the log opens; nothing before it is touched.
//!
//! Idempotent appends: an append may carry a producer id and a sequence number. Every frame of
//! such an append carries the id, the sequence, its index in the append and the append's frame
//! count. The log keeps, per producer and partition, the highest sequence and how many of its
//! frames are on disk (rebuilt from the frames on open). An append whose sequence is older is
//! skipped; one whose sequence is the last one seen writes only the frames that are missing. So
//! a partition task re-sends its outbox after a crash without writing anything twice, and an
//! append torn by a crash (some frames on disk, the tail lost) is completed, not judged a
//! duplicate.
//!
//! Durability: appends made through [`Transport::append`] (produced records, the control log,
//! module chunks) are on disk (`fdatasync`) before they return, and so are a partition's output
//! appends, which the partition makes with `sync`. What the log promises on power loss is
//! therefore what it promises on `kill -9`: nothing acknowledged is lost, and nothing is written
//! twice.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock};

use super::{LogRecord, Record, TopicKind, Transport, TransportError, validate_topic_name};

type Result<T> = std::result::Result<T, TransportError>;

/// Most bytes one `read` returns (it always returns at least one record when there is one).
const MAX_READ_BYTES: u64 = 4 << 20;

/// The log of one host. Cheap to share behind an `Arc`.
pub struct EmbeddedLog {
    dir: PathBuf,
    topics: RwLock<HashMap<String, Arc<Topic>>>,
    generation: Mutex<u64>,
    appended: Condvar,
}

struct Topic {
    partitions: Vec<PartitionLog>,
}

struct PartitionLog {
    file: File,
    inner: Mutex<Inner>,
}

struct Inner {
    /// File position of each record's frame; the offset is the index.
    positions: Vec<u64>,
    end: u64,
    producers: HashMap<String, ProducerState>,
}

/// The last append of a producer to a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProducerState {
    seq: u64,
    /// Frames of append `seq` on disk.
    frames: u32,
    /// Frames append `seq` has in all (`u32::MAX` for frames written before frames carried it).
    count: u32,
}

impl ProducerState {
    fn complete(&self) -> bool {
        self.frames >= self.count
    }
}

/// The producer fields of one frame.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FrameProducer {
    id: String,
    seq: u64,
    /// Index of the frame in its append, and the append's frame count (absent in old frames).
    part: Option<(u32, u32)>,
}

/// What an idempotent append did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// The records were written; the first got this offset.
    At(u64),
    /// The producer's sequence was already in the log; nothing was written.
    Duplicate,
}

impl EmbeddedLog {
    /// Opens (or creates) the log in `dir`, loading every topic found there.
    pub fn open(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir)?;
        let mut topics = HashMap::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().to_string();
            let count_file = entry.path().join("partitions");
            if !count_file.exists() {
                continue;
            }
            let count: u32 = fs::read_to_string(&count_file)?
                .trim()
                .parse()
                .map_err(|_| {
                    TransportError::Corrupt(format!("{} is not a number", count_file.display()))
                })?;
            let mut partitions = Vec::with_capacity(count as usize);
            for p in 0..count {
                partitions.push(PartitionLog::open(&entry.path().join(format!("{p}.log")))?);
            }
            topics.insert(name, Arc::new(Topic { partitions }));
        }
        Ok(EmbeddedLog {
            dir: dir.to_path_buf(),
            topics: RwLock::new(topics),
            generation: Mutex::new(0),
            appended: Condvar::new(),
        })
    }

    /// Creates `topic` with `partitions` partitions if it is missing. Returns `true` if it was
    /// created, `false` if it existed with that count, and an error naming both counts if it
    /// exists with another.
    pub fn ensure_topic(&self, topic: &str, partitions: u32) -> Result<bool> {
        validate_topic_name(topic)?;
        if partitions == 0 {
            return Err(TransportError::Corrupt(format!(
                "topic `{topic}` needs at least one partition"
            )));
        }
        let mut topics = self.topics.write();
        if let Some(t) = topics.get(topic) {
            let actual = t.partitions.len() as u32;
            return if actual == partitions {
                Ok(false)
            } else {
                Err(TransportError::PartitionCountMismatch {
                    topic: topic.to_string(),
                    actual,
                    wanted: partitions,
                })
            };
        }
        let tdir = self.dir.join(topic);
        fs::create_dir_all(&tdir)?;
        let mut parts = Vec::with_capacity(partitions as usize);
        for p in 0..partitions {
            parts.push(PartitionLog::open(&tdir.join(format!("{p}.log")))?);
        }
        // The count file is written last and atomically: a topic without it is not a topic.
        let tmp = tdir.join("partitions.tmp");
        fs::write(&tmp, partitions.to_string())?;
        File::open(&tmp)?.sync_all()?;
        fs::rename(&tmp, tdir.join("partitions"))?;
        File::open(&tdir)?.sync_all()?;
        topics.insert(topic.to_string(), Arc::new(Topic { partitions: parts }));
        Ok(true)
    }

    /// Deletes a topic and its files; a missing topic is ignored.
    pub fn delete_topic(&self, topic: &str) -> Result<()> {
        validate_topic_name(topic)?;
        if self.topics.write().remove(topic).is_some() {
            fs::remove_dir_all(self.dir.join(topic))?;
            File::open(&self.dir)?.sync_all()?;
        }
        Ok(())
    }

    /// The partition count of `topic`, or `None` if it does not exist.
    pub fn partitions(&self, topic: &str) -> Option<u32> {
        self.topics
            .read()
            .get(topic)
            .map(|t| t.partitions.len() as u32)
    }

    /// Names and partition counts of every topic, sorted by name.
    pub fn topics(&self) -> Vec<(String, u32)> {
        let mut v: Vec<_> = self
            .topics
            .read()
            .iter()
            .map(|(n, t)| (n.clone(), t.partitions.len() as u32))
            .collect();
        v.sort();
        v
    }

    fn topic(&self, topic: &str) -> Result<Arc<Topic>> {
        self.topics
            .read()
            .get(topic)
            .cloned()
            .ok_or_else(|| TransportError::UnknownTopic(topic.to_string()))
    }

    fn partition<'a>(t: &'a Topic, topic: &str, partition: u32) -> Result<&'a PartitionLog> {
        t.partitions
            .get(partition as usize)
            .ok_or_else(|| TransportError::NoSuchPartition {
                topic: topic.to_string(),
                partition,
                partitions: t.partitions.len() as u32,
            })
    }

    /// Appends `records` to one partition as one write. With `producer = Some((id, seq))` the
    /// append is idempotent: it is skipped when `seq` is not above the highest sequence this
    /// producer has written to the partition. With `sync` the data is on disk before returning.
    pub fn append(
        &self,
        topic: &str,
        partition: u32,
        records: &[Record],
        producer: Option<(&str, u64)>,
        sync: bool,
    ) -> Result<Appended> {
        let t = self.topic(topic)?;
        let p = Self::partition(&t, topic, partition)?;
        let first = {
            let mut inner = p.inner.lock();
            // With a producer: skip what it already wrote, complete a torn append.
            let mut skip = 0usize;
            if let Some((id, seq)) = producer
                && let Some(last) = inner.producers.get(id)
            {
                if last.seq > seq || (last.seq == seq && last.complete()) {
                    return Ok(Appended::Duplicate);
                }
                if last.seq == seq {
                    skip = last.frames as usize;
                    tracing::warn!(
                        topic,
                        partition,
                        producer = id,
                        seq,
                        written = skip,
                        of = records.len(),
                        "completing an append torn by a crash"
                    );
                }
            }
            let count = u32::try_from(records.len()).map_err(|_| {
                TransportError::Corrupt(format!("{} records in one append", records.len()))
            })?;
            let mut buf = Vec::with_capacity(records.len() * 64);
            let mut rel = Vec::with_capacity(records.len());
            for (i, r) in records.iter().enumerate().skip(skip) {
                rel.push(buf.len() as u64);
                encode_frame(
                    &mut buf,
                    r,
                    producer.map(|(id, seq)| (id, seq, i as u32, count)),
                );
            }
            let start = inner.end;
            if let Err(e) = p.file.write_all_at(&buf, start) {
                // Leave no partial frame behind for the next append to follow.
                let _ = p.file.set_len(start);
                return Err(e.into());
            }
            if sync {
                p.file.sync_data()?;
            }
            let first = inner.positions.len() as u64;
            inner.positions.extend(rel.into_iter().map(|r| start + r));
            inner.end = start + buf.len() as u64;
            if let Some((id, seq)) = producer {
                inner.producers.insert(
                    id.to_string(),
                    ProducerState {
                        seq,
                        frames: count,
                        count,
                    },
                );
            }
            first
        };
        *self.generation.lock() += 1;
        self.appended.notify_all();
        Ok(Appended::At(first))
    }

    /// Reads up to `max` records from `offset` on (fewer near the end or past a few MiB).
    pub fn read(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<LogRecord>> {
        let t = self.topic(topic)?;
        let p = Self::partition(&t, topic, partition)?;
        let (start, end, count) = {
            let inner = p.inner.lock();
            let n = inner.positions.len() as u64;
            if offset >= n || max == 0 {
                return Ok(Vec::new());
            }
            let last = (offset + max as u64).min(n);
            let start = inner.positions[offset as usize];
            // Cut the read at a frame boundary near MAX_READ_BYTES, keeping at least one record.
            let mut last_idx = last;
            while last_idx > offset + 1
                && inner.positions[(last_idx - 1) as usize] - start > MAX_READ_BYTES
            {
                last_idx = offset + 1 + (last_idx - offset - 1) / 2;
            }
            let end = if last_idx < n {
                inner.positions[last_idx as usize]
            } else {
                inner.end
            };
            (start, end, (last_idx - offset) as usize)
        };
        let mut buf = vec![0u8; (end - start) as usize];
        p.file.read_exact_at(&mut buf, start)?;
        let mut out = Vec::with_capacity(count);
        let mut pos = 0usize;
        for i in 0..count {
            let (record, used) = decode_frame(&buf[pos..]).ok_or_else(|| {
                TransportError::Corrupt(format!(
                    "{topic}/{partition} at offset {}",
                    offset + i as u64
                ))
            })?;
            pos += used;
            out.push(LogRecord {
                offset: offset + i as u64,
                record: record.0,
            });
        }
        Ok(out)
    }

    #[cfg(test)]
    fn p_position(&self, topic: &str, partition: u32, offset: usize) -> u64 {
        let t = self.topic(topic).unwrap();
        let p = Self::partition(&t, topic, partition).unwrap();
        p.inner.lock().positions[offset]
    }

    /// The offset the next record appended to the partition will get.
    pub fn end_offset(&self, topic: &str, partition: u32) -> Result<u64> {
        let t = self.topic(topic)?;
        let p = Self::partition(&t, topic, partition)?;
        Ok(p.inner.lock().positions.len() as u64)
    }

    /// A counter bumped by every append; pass it to [`EmbeddedLog::wait_for_append`].
    pub fn generation(&self) -> u64 {
        *self.generation.lock()
    }

    /// Blocks until an append happened after `seen` was read, or `timeout` passed.
    pub fn wait_for_append(&self, seen: u64, timeout: Duration) {
        let mut g = self.generation.lock();
        if *g == seen {
            self.appended.wait_for(&mut g, timeout);
        }
    }
}

impl Transport for EmbeddedLog {
    fn kind(&self) -> &'static str {
        "embedded"
    }

    fn ensure_topic(&self, topic: &str, partitions: u32, _kind: TopicKind) -> Result<bool> {
        EmbeddedLog::ensure_topic(self, topic, partitions)
    }

    fn partitions(&self, topic: &str) -> Result<Option<u32>> {
        Ok(EmbeddedLog::partitions(self, topic))
    }

    fn topics(&self) -> Result<Vec<(String, u32)>> {
        Ok(EmbeddedLog::topics(self))
    }

    fn end_offset(&self, topic: &str, partition: u32) -> Result<u64> {
        EmbeddedLog::end_offset(self, topic, partition)
    }

    fn append(&self, topic: &str, partition: u32, records: &[Record]) -> Result<u64> {
        match EmbeddedLog::append(self, topic, partition, records, None, true)? {
            Appended::At(o) => Ok(o),
            Appended::Duplicate => Err(TransportError::Corrupt(
                "an append without a producer was skipped".into(),
            )),
        }
    }

    fn read(&self, topic: &str, partition: u32, offset: u64, max: usize) -> Result<Vec<LogRecord>> {
        EmbeddedLog::read(self, topic, partition, offset, max)
    }

    fn delete_topics(&self, topics: &[String]) -> Result<()> {
        for t in topics {
            self.delete_topic(t)?;
        }
        Ok(())
    }
}

impl PartitionLog {
    fn open(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let len = file.metadata()?.len();
        let mut positions = Vec::new();
        let mut producers: HashMap<String, ProducerState> = HashMap::new();
        let mut reader = BufReader::with_capacity(1 << 20, &file);
        let mut pos = 0u64;
        let mut frame = Vec::new();
        loop {
            let mut head = [0u8; 8];
            if pos + 8 > len || reader.read_exact(&mut head).is_err() {
                break;
            }
            let body_len = u32::from_le_bytes(head[0..4].try_into().unwrap_or_default()) as u64;
            let crc = u32::from_le_bytes(head[4..8].try_into().unwrap_or_default());
            if pos + 8 + body_len > len {
                break;
            }
            frame.resize(body_len as usize, 0);
            if reader.read_exact(&mut frame).is_err() || crc32fast::hash(&frame) != crc {
                break;
            }
            let mut whole = Vec::with_capacity(8 + frame.len());
            whole.extend_from_slice(&head);
            whole.extend_from_slice(&frame);
            let Some(((_, producer), _)) = decode_frame(&whole) else {
                break;
            };
            if let Some(fp) = producer {
                let (index, count) = fp.part.unwrap_or((0, u32::MAX));
                let e = producers.entry(fp.id).or_insert(ProducerState {
                    seq: fp.seq,
                    frames: 0,
                    count,
                });
                if fp.seq > e.seq {
                    *e = ProducerState {
                        seq: fp.seq,
                        frames: 0,
                        count,
                    };
                }
                if fp.seq == e.seq {
                    e.frames = e.frames.max(index + 1);
                    if count == u32::MAX {
                        e.frames = u32::MAX;
                    }
                }
            }
            positions.push(pos);
            pos += 8 + body_len;
        }
        drop(reader);
        if pos < len {
            tracing::warn!(path = %path.display(), kept = pos, dropped = len - pos, "cutting a torn frame off the end of the log");
            file.set_len(pos)?;
            file.sync_data()?;
        }
        Ok(PartitionLog {
            file,
            inner: Mutex::new(Inner {
                positions,
                end: pos,
                producers,
            }),
        })
    }
}

fn put_bytes(buf: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => buf.extend_from_slice(&(-1i32).to_le_bytes()),
        Some(b) => {
            buf.extend_from_slice(&(b.len() as i32).to_le_bytes());
            buf.extend_from_slice(b);
        }
    }
}

fn encode_frame(buf: &mut Vec<u8>, r: &Record, producer: Option<(&str, u64, u32, u32)>) {
    let head = buf.len();
    buf.extend_from_slice(&[0u8; 8]);
    let body = buf.len();
    buf.extend_from_slice(&r.timestamp.to_le_bytes());
    put_bytes(buf, r.key.as_deref());
    put_bytes(buf, r.value.as_deref());
    buf.extend_from_slice(&(r.headers.len() as u32).to_le_bytes());
    for (k, v) in &r.headers {
        put_bytes(buf, Some(k.as_bytes()));
        put_bytes(buf, Some(v));
    }
    match producer {
        None => put_bytes(buf, None),
        Some((id, seq, index, count)) => {
            put_bytes(buf, Some(id.as_bytes()));
            buf.extend_from_slice(&seq.to_le_bytes());
            buf.extend_from_slice(&index.to_le_bytes());
            buf.extend_from_slice(&count.to_le_bytes());
        }
    }
    let len = (buf.len() - body) as u32;
    let crc = crc32fast::hash(&buf[body..]);
    buf[head..head + 4].copy_from_slice(&len.to_le_bytes());
    buf[head + 4..head + 8].copy_from_slice(&crc.to_le_bytes());
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<Option<&'a [u8]>> {
        let len = i32::from_le_bytes(self.take(4)?.try_into().ok()?);
        if len < 0 {
            Some(None)
        } else {
            Some(Some(self.take(len as usize)?))
        }
    }
}

type Decoded = (Record, Option<FrameProducer>);

/// Appends `r` to `buf` in the log's frame format (used for the task outbox too).
pub(crate) fn encode_record(buf: &mut Vec<u8>, r: &Record) {
    encode_frame(buf, r, None)
}

/// Decodes a record written by [`encode_record`]; returns it and the bytes used.
pub(crate) fn decode_record(b: &[u8]) -> Option<(Record, usize)> {
    decode_frame(b).map(|((r, _), used)| (r, used))
}

/// Decodes one frame from the start of `b`; returns the record and the bytes used.
fn decode_frame(b: &[u8]) -> Option<(Decoded, usize)> {
    let mut c = Cursor { b, pos: 0 };
    let len = c.u32()? as usize;
    let crc = c.u32()?;
    let body = c.take(len)?;
    if crc32fast::hash(body) != crc {
        return None;
    }
    let mut c = Cursor { b: body, pos: 0 };
    let timestamp = c.u64()? as i64;
    let key = c.bytes()?.map(<[u8]>::to_vec);
    let value = c.bytes()?.map(<[u8]>::to_vec);
    let n = c.u32()? as usize;
    let mut headers = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        let k = c.bytes()??;
        let v = c.bytes()??;
        headers.push((String::from_utf8_lossy(k).into_owned(), v.to_vec()));
    }
    let producer = match c.bytes()? {
        None => None,
        Some(id) => {
            let id = String::from_utf8_lossy(id).into_owned();
            let seq = c.u64()?;
            // Frames written before frames carried their place in the append end here.
            let part = if c.pos < body.len() {
                Some((c.u32()?, c.u32()?))
            } else {
                None
            };
            Some(FrameProducer { id, seq, part })
        }
    };
    Some((
        (
            Record {
                key,
                value,
                headers,
                timestamp,
            },
            producer,
        ),
        8 + len,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(k: &str, v: Option<&str>) -> Record {
        Record {
            key: Some(k.as_bytes().to_vec()),
            value: v.map(|v| v.as_bytes().to_vec()),
            headers: vec![("h".into(), b"x".to_vec())],
            timestamp: 42,
        }
    }

    #[test]
    fn append_read_reopen_and_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let log = EmbeddedLog::open(dir.path()).unwrap();
        assert!(log.ensure_topic("t", 2).unwrap());
        assert!(!log.ensure_topic("t", 2).unwrap());
        assert!(matches!(
            log.ensure_topic("t", 3),
            Err(TransportError::PartitionCountMismatch { .. })
        ));
        assert_eq!(
            log.append("t", 1, &[rec("a", Some("1")), rec("b", None)], None, true)
                .unwrap(),
            Appended::At(0)
        );
        assert_eq!(
            log.append("t", 1, &[rec("c", Some("3"))], Some(("p", 7)), false)
                .unwrap(),
            Appended::At(2)
        );
        assert_eq!(
            log.append("t", 1, &[rec("c", Some("3"))], Some(("p", 7)), false)
                .unwrap(),
            Appended::Duplicate
        );
        let got = log.read("t", 1, 1, 10).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].offset, 1);
        assert_eq!(got[0].record, rec("b", None));
        drop(log);
        // A torn frame at the end is cut off on open; the producer's sequence survives.
        let f = OpenOptions::new()
            .append(true)
            .open(dir.path().join("t/1.log"))
            .unwrap();
        f.write_all_at(&[9, 9, 9], f.metadata().unwrap().len())
            .unwrap();
        let log = EmbeddedLog::open(dir.path()).unwrap();
        assert_eq!(log.end_offset("t", 1).unwrap(), 3);
        assert_eq!(
            log.append("t", 1, &[rec("c", Some("3"))], Some(("p", 7)), false)
                .unwrap(),
            Appended::Duplicate
        );
        assert_eq!(
            log.append("t", 1, &[rec("d", Some("4"))], Some(("p", 8)), false)
                .unwrap(),
            Appended::At(3)
        );
        assert_eq!(
            log.read("t", 1, 3, 1).unwrap()[0].record,
            rec("d", Some("4"))
        );
        assert!(matches!(
            log.read("nope", 0, 0, 1),
            Err(TransportError::UnknownTopic(_))
        ));
        assert!(matches!(
            log.read("t", 5, 0, 1),
            Err(TransportError::NoSuchPartition { .. })
        ));
        assert!(log.ensure_topic("bad/name", 1).is_err());
    }

    /// A crash that leaves only the first frames of an idempotent append on disk (whole frames,
    /// or a torn one after them): the re-sent append writes exactly the missing tail.
    #[test]
    fn a_torn_append_is_completed_by_its_resend() {
        for cut_inside_a_frame in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let log = EmbeddedLog::open(dir.path()).unwrap();
            log.ensure_topic("t", 1).unwrap();
            let batch: Vec<_> = (0..5)
                .map(|i| rec(&format!("k{i}"), Some(&format!("v{i}"))))
                .collect();
            assert_eq!(
                log.append("t", 0, &batch, Some(("p", 1)), true).unwrap(),
                Appended::At(0)
            );
            let third = log.p_position("t", 0, 3);
            drop(log);
            // Only the first three frames reached the disk (and maybe part of the fourth).
            let f = OpenOptions::new()
                .write(true)
                .open(dir.path().join("t/0.log"))
                .unwrap();
            f.set_len(third + if cut_inside_a_frame { 5 } else { 0 })
                .unwrap();
            let log = EmbeddedLog::open(dir.path()).unwrap();
            assert_eq!(log.end_offset("t", 0).unwrap(), 3);
            assert_eq!(
                log.append("t", 0, &batch, Some(("p", 1)), true).unwrap(),
                Appended::At(3)
            );
            assert_eq!(
                log.append("t", 0, &batch, Some(("p", 1)), true).unwrap(),
                Appended::Duplicate
            );
            let all: Vec<_> = log
                .read("t", 0, 0, 100)
                .unwrap()
                .into_iter()
                .map(|r| r.record)
                .collect();
            assert_eq!(all, batch);
            drop(log);
            // Reopened, the completed append is known as complete.
            let log = EmbeddedLog::open(dir.path()).unwrap();
            assert_eq!(
                log.append("t", 0, &batch, Some(("p", 1)), true).unwrap(),
                Appended::Duplicate
            );
            assert_eq!(log.end_offset("t", 0).unwrap(), 5);
        }
    }
}
