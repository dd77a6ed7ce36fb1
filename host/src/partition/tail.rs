//! Reading a partition's changelogs into its RocksDB: once to their end (a session's restore),
//! or on and on (a warming replica of a move, which keeps up with the owner until it takes
//! over). RocksDB keeps, per store and slot, the changelog offset it has applied up to, so that
//! a later restore goes on from there.

use std::ops::Range;
use std::time::{Duration, Instant};

use super::changelog_offset_key;
use crate::control::PipelineRecord;
use crate::state::{PartitionDb, WriteRef};
use crate::transport::kafka::{InputConsumer, KafkaTransport};

/// Most records one poll applies in one RocksDB write.
const POLL_RECORDS: usize = 20_000;

/// Records [`Tail::read_to_end`] gathers into one run, written as SST files and ingested (or
/// [`RUN_BYTES`] of keys and values, whichever comes first): a run holds an entry of 24 bytes
/// per record beside its key and value, 13 MiB at word-count's records, about the data of a
/// memtable.
const RUN_RECORDS: usize = 250_000;

/// Bytes of keys and values that end a run of [`Tail::read_to_end`].
const RUN_BYTES: usize = 16 << 20;

/// A run of fewer records than this (the last one, or a short restore) is written as a batch:
/// a tiny SST file would be one more level-0 file for every lookup until it is compacted.
const INGEST_MIN: usize = 20_000;

/// How long one fetch of [`Tail::read_to_end`] waits for records.
const IDLE_WAIT: Duration = Duration::from_millis(20);

/// Changelog records on their way to RocksDB: their keys (slot-prefixed) and values in one
/// buffer, with an entry per record that says where, and the changelog offsets reached.
#[derive(Default)]
struct Run {
    bytes: Vec<u8>,
    /// In log order until [`Run::sort`]; then by store and key, the last write of each key.
    entries: Vec<Entry>,
    /// Per changelog partition read (store, slot): the next offset.
    ends: Vec<(usize, u32, u64)>,
    /// Records read.
    n: u64,
}

/// Where a record of a [`Run`] is.
#[derive(Clone, Copy)]
struct Entry {
    at: usize,
    key_len: u32,
    /// [`Entry::DELETE`] for a tombstone.
    value_len: u32,
    store: u32,
}

impl Entry {
    const DELETE: u32 = u32::MAX;

    fn key<'a>(&self, bytes: &'a [u8]) -> &'a [u8] {
        &bytes[self.at..self.at + self.key_len as usize]
    }

    fn value<'a>(&self, bytes: &'a [u8]) -> Option<&'a [u8]> {
        let from = self.at + self.key_len as usize;
        (self.value_len != Self::DELETE).then(|| &bytes[from..from + self.value_len as usize])
    }
}

impl Run {
    /// Appends a record of changelog partition `slot` of store `store`, at `offset`.
    fn push(&mut self, store: usize, slot: u32, offset: u64, key: &[u8], value: Option<&[u8]>) {
        let at = self.bytes.len();
        self.bytes.extend_from_slice(&slot.to_be_bytes());
        self.bytes.extend_from_slice(key);
        let value_len = match value {
            Some(v) => {
                self.bytes.extend_from_slice(v);
                // Kafka's records are far below 4 GiB.
                u32::try_from(v.len()).unwrap_or(Entry::DELETE - 1)
            }
            None => Entry::DELETE,
        };
        self.entries.push(Entry {
            at,
            key_len: (4 + key.len()) as u32,
            value_len,
            store: store as u32,
        });
        self.n += 1;
        match self.ends.last_mut() {
            Some(e) if e.0 == store && e.1 == slot => e.2 = offset + 1,
            _ => match self.ends.iter_mut().find(|e| e.0 == store && e.1 == slot) {
                Some(e) => e.2 = offset + 1,
                None => self.ends.push((store, slot, offset + 1)),
            },
        }
    }

    /// Whether the run is as large as one run of [`Tail::read_to_end`] gets.
    fn full(&self) -> bool {
        self.entries.len() >= RUN_RECORDS || self.bytes.len() >= RUN_BYTES
    }

    /// Sorts the entries by store and key and keeps the last of each key (they came in log
    /// order): RocksDB takes them in key order, as an SST file must hold them, and a memtable
    /// insert starts its search where the one before ended, so keys in order cost a fraction
    /// of keys at random, which is how a changelog holds them.
    fn sort(&mut self) {
        let bytes = &self.bytes;
        // Stable: a key's writes stay in log order, and the last of each is kept.
        self.entries
            .sort_by(|a, b| (a.store, a.key(bytes)).cmp(&(b.store, b.key(bytes))));
        let same = |a: &Entry, b: &Entry| a.store == b.store && a.key(bytes) == b.key(bytes);
        let mut kept = 0;
        for i in 0..self.entries.len() {
            if i + 1 < self.entries.len() && same(&self.entries[i], &self.entries[i + 1]) {
                continue;
            }
            self.entries[kept] = self.entries[i];
            kept += 1;
        }
        self.entries.truncate(kept);
    }

    /// The writes, in the entries' order.
    fn writes(&self) -> impl Iterator<Item = WriteRef<'_>> {
        self.entries.iter().map(|e| WriteRef {
            store: e.store as usize,
            key: e.key(&self.bytes),
            value: e.value(&self.bytes),
        })
    }

    /// The changelog offsets reached, as the metadata keys RocksDB keeps them under.
    fn meta(&self, stores: &[String]) -> Vec<(String, Option<Vec<u8>>)> {
        self.ends
            .iter()
            .map(|&(si, slot, next)| {
                (
                    changelog_offset_key(&stores[si], slot),
                    Some(next.to_be_bytes().to_vec()),
                )
            })
            .collect()
    }

    /// Writes the sorted run and its offsets in one RocksDB write; answers the records it
    /// holds.
    fn apply(&self, db: &PartitionDb, stores: &[String]) -> anyhow::Result<u64> {
        if !self.entries.is_empty() || !self.ends.is_empty() {
            db.commit(self.writes(), &self.meta(stores))?;
        }
        Ok(self.n)
    }

    /// Writes the sorted run as SST files ingested into `db` (as a batch if it is short), then
    /// its offsets; answers the records it holds.
    fn ingest(&self, db: &PartitionDb, stores: &[String]) -> anyhow::Result<u64> {
        if self.entries.len() < INGEST_MIN {
            return self.apply(db, stores);
        }
        db.ingest_sorted(self.writes(), &self.meta(stores))?;
        Ok(self.n)
    }
}

/// A reader of a partition's changelogs, from where its RocksDB is.
pub struct Tail {
    reader: InputConsumer,
    /// Asked for the changelogs' ends: a client of its own, which never fetches, so that the
    /// broker does not hold its questions behind the reader's long-polling fetches.
    ends: InputConsumer,
    changelogs: Vec<String>,
    stores: Vec<String>,
    /// Per changelog partition read: (store index, slot, offset read from, end last seen).
    parts: Vec<(usize, u32, u64, u64)>,
    /// The changelog partitions of `parts`, in their order, as [`Tail::refresh`] asks for them.
    tps: Vec<(String, u32)>,
}

impl Tail {
    /// Opens a reader of the changelogs of `slots` of `pipeline`, positioned where `db` is.
    ///
    /// State ahead of its changelog (the topic was deleted, recreated or truncated) or behind
    /// what the changelog still holds is wiped and read again from the changelog, which is the
    /// truth, as Kafka Streams does.
    pub fn open(
        transport: &KafkaTransport,
        pipeline: &PipelineRecord,
        slots: Range<u32>,
        db: &PartitionDb,
    ) -> anyhow::Result<Tail> {
        let reader = transport.input_consumer(&format!("{}.restore", pipeline.group_id()))?;
        let ends = transport.input_consumer(&format!("{}.restore", pipeline.group_id()))?;
        let stores = pipeline.spec.state_stores();
        let changelogs: Vec<String> = stores.iter().map(|s| pipeline.changelog_topic(s)).collect();
        let mut parts = Vec::new();
        let mut assign = Vec::new();
        for (si, topic) in changelogs.iter().enumerate() {
            for slot in slots.clone() {
                let key = changelog_offset_key(&stores[si], slot);
                let mut local = db.get_meta_u64(&key)?.unwrap_or(0);
                let (lo, hi) = ends.watermarks(topic, slot)?;
                if local > hi || (local > 0 && local < lo) {
                    tracing::warn!(
                        changelog = %topic,
                        slot,
                        local,
                        low = lo,
                        high = hi,
                        "the state of this slot does not match its changelog (the changelog was \
                         deleted, recreated or truncated); wiping it and restoring from the changelog"
                    );
                    db.wipe_slot(si, slot, &[key])?;
                    local = 0;
                }
                let start = local.max(lo);
                parts.push((si, slot, start, hi));
                assign.push((topic.clone(), slot, start));
            }
        }
        reader.assign(&assign, assign.len())?;
        let tps = parts
            .iter()
            .map(|&(si, slot, _, _)| (changelogs[si].clone(), slot))
            .collect();
        Ok(Tail {
            reader,
            ends,
            changelogs,
            stores,
            parts,
            tps,
        })
    }

    /// Takes the changelog positions `db` holds as the changelogs' ends, where none is ahead
    /// of what was seen: the database of a partition stopped after its final commit, whose
    /// changelogs nobody writes after it (the other half of a split reads a copy of it).
    pub fn expect_ends(&mut self, db: &PartitionDb) -> anyhow::Result<()> {
        for part in &mut self.parts {
            let (si, slot) = (part.0, part.1);
            if let Some(end) = db.get_meta_u64(&changelog_offset_key(&self.stores[si], slot))? {
                part.3 = part.3.max(end);
            }
        }
        Ok(())
    }

    /// Waits, asking the broker every millisecond until `deadline`, for every changelog
    /// partition's end for committed reads to reach its end last seen (set by
    /// [`Tail::expect_ends`]): the final transaction of a stopped partition is complete, and a
    /// fetch from here on returns its records. Fails naming the partition still short.
    pub fn wait_stable(&mut self, deadline: Instant) -> anyhow::Result<()> {
        loop {
            // Each question within what is left of the deadline, so that a broker that does
            // not answer holds a pause no longer than that.
            let left = deadline.saturating_duration_since(Instant::now());
            let ends = match self
                .ends
                .ends_within(&self.tps, left.max(Duration::from_millis(1)))
            {
                Ok(ends) => ends,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!("asking the changelogs' ends: {e}");
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let short = self
                .parts
                .iter()
                .zip(&ends)
                .find(|((_, _, _, hi), end)| *end < hi);
            let Some((&(si, slot, _, hi), &end)) = short else {
                return Ok(());
            };
            anyhow::ensure!(
                Instant::now() < deadline,
                "changelog {}/{slot} ends at {end} for committed reads, before the final \
                 position {hi}: the last transaction did not complete in time",
                self.changelogs[si]
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Records between where each changelog partition is read to and its end last seen.
    pub fn behind(&self) -> u64 {
        self.parts
            .iter()
            .map(|&(si, slot, start, hi)| hi.saturating_sub(self.at(si, slot, start)))
            .sum()
    }

    /// Where changelog partition `slot` of store `si` is read to.
    fn at(&self, si: usize, slot: u32, start: u64) -> u64 {
        self.reader
            .position(&self.changelogs[si], slot)
            .map_or(start, |p| p.max(start))
    }

    /// Whether every changelog partition is read to its end last seen (transaction markers and
    /// aborted records take offsets too, so the position is what says so).
    pub fn caught_up(&self) -> bool {
        self.parts
            .iter()
            .all(|&(si, slot, start, hi)| self.at(si, slot, start) >= hi)
    }

    /// The end last seen of changelog partition `slot` of `topic` (for committed reads: the
    /// last stable offset); `None` when this reader does not read it.
    pub fn end(&self, topic: &str, slot: u32) -> Option<u64> {
        self.part(topic, slot).map(|&(_, _, _, hi)| hi)
    }

    /// Where reading changelog partition `slot` of `topic` began.
    pub fn start(&self, topic: &str, slot: u32) -> Option<u64> {
        self.part(topic, slot).map(|&(_, _, start, _)| start)
    }

    fn part(&self, topic: &str, slot: u32) -> Option<&(usize, u32, u64, u64)> {
        let si = self.changelogs.iter().position(|t| t == topic)?;
        self.parts.iter().find(|p| p.0 == si && p.1 == slot)
    }

    /// Asks the broker for the changelogs' ends again; answers how far behind them this is.
    pub fn refresh(&mut self) -> anyhow::Result<u64> {
        let ends = self.ends.ends(&self.tps)?;
        for ((_, _, _, hi), end) in self.parts.iter_mut().zip(ends) {
            *hi = end;
        }
        Ok(self.behind())
    }

    /// Reads what is there (waiting up to `wait` for it) and applies it to `db` with the
    /// offsets reached, in one write, in key order; answers how many records were applied.
    pub fn poll(&mut self, db: &PartitionDb, wait: Duration) -> anyhow::Result<u64> {
        let mut run = Run::default();
        self.gather(&mut run, wait);
        run.sort();
        run.apply(db, &self.stores)
    }

    /// Fetches (waiting up to `wait` for records) into `run`; answers how many records came.
    fn gather(&self, run: &mut Run, wait: Duration) -> usize {
        // The store of the last topic seen: records come in runs of one topic partition.
        let mut last: Option<(String, Option<usize>)> = None;
        self.reader.fetch_raw(POLL_RECORDS, wait, &mut |r| {
            let si = match &last {
                Some((topic, si)) if topic == r.topic => *si,
                _ => {
                    let si = self.changelogs.iter().position(|t| t == r.topic);
                    last = Some((r.topic.to_string(), si));
                    si
                }
            };
            if let Some(si) = si {
                run.push(
                    si,
                    r.partition,
                    r.offset,
                    r.key.unwrap_or_default(),
                    r.value,
                );
            }
        })
    }

    /// Reads to the changelogs' ends last seen and applies what it reads to `db`, with
    /// `progress` told the records applied so far after each write; answers how many records
    /// were applied. Fails if nothing arrives for `idle_limit` while records are still to be
    /// read.
    ///
    /// What it reads goes to RocksDB in runs of up to [`RUN_RECORDS`], sorted, the last write
    /// of each key only. When it starts at least a run behind, each run becomes SST files that
    /// it ingests ([`PartitionDb::ingest_sorted`]) with the stores in bulk-load mode
    /// ([`PartitionDb::bulk_load`]): a restore is CPU-bound, and memtable inserts were a quarter
    /// of its CPU, their flushes another sixth. A shorter catch-up (a move's take-over, within
    /// its pause) goes in plain writes. A thread of its own fetches the next run and sorts it
    /// while this one writes the last.
    pub fn read_to_end(
        &mut self,
        db: &PartitionDb,
        idle_limit: Duration,
        progress: &mut dyn FnMut(u64),
    ) -> anyhow::Result<u64> {
        // Bulk-load mode while this writes, normal again however it ends.
        struct Bulk<'a>(&'a PartitionDb);
        impl Drop for Bulk<'_> {
            fn drop(&mut self) {
                if let Err(e) = self.0.bulk_load(false) {
                    tracing::warn!(path = %self.0.path().display(), "ending a bulk load: {e}");
                }
            }
        }
        // Not for a short catch-up (a move's take-over, in its pause): a change of options writes
        // an options file, and there is no compaction debt to spare.
        let bulk = self.behind() >= RUN_RECORDS as u64;
        let _bulk = bulk.then(|| {
            if let Err(e) = db.bulk_load(true) {
                tracing::warn!(path = %db.path().display(), "starting a bulk load: {e}");
            }
            db.clear_ingest_dir();
            Bulk(db)
        });
        // Unbuffered: one run being written, one ready, one being gathered at most.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Run>(0);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let this = &*self;
        std::thread::scope(|scope| {
            let fetcher = std::thread::Builder::new()
                .name("baton-restore".into())
                .spawn_scoped(scope, || -> anyhow::Result<()> {
                    let tx = tx;
                    let mut last = Instant::now();
                    let mut run = Run::default();
                    while !this.caught_up() {
                        if stop.load(std::sync::atomic::Ordering::Relaxed) {
                            return Ok(());
                        }
                        if this.gather(&mut run, IDLE_WAIT) == 0 {
                            anyhow::ensure!(
                                last.elapsed() < idle_limit,
                                "restore made no progress for {} s",
                                idle_limit.as_secs()
                            );
                            continue;
                        }
                        last = Instant::now();
                        if run.full() {
                            run.sort();
                            if tx.send(std::mem::take(&mut run)).is_err() {
                                return Ok(());
                            }
                        }
                    }
                    if run.n > 0 {
                        run.sort();
                        let _ = tx.send(run);
                    }
                    Ok(())
                })?;
            let mut done = 0u64;
            let mut applied = Ok(());
            while let Ok(run) = rx.recv() {
                let written = if bulk {
                    run.ingest(db, &self.stores)
                } else {
                    run.apply(db, &self.stores)
                };
                match written {
                    Ok(n) => {
                        done += n;
                        progress(done);
                    }
                    Err(e) => {
                        applied = Err(e);
                        break;
                    }
                }
            }
            // A failed write stops the fetcher: it sees the flag, or a closed channel.
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            drop(rx);
            let fetched = fetcher
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the restore's fetching thread panicked")));
            applied.and(fetched).map(|()| done)
        })
    }

    /// Closes the clients on a thread of their own: closing a consumer waits for its fetches
    /// in flight, which nobody needs to wait for.
    pub fn close_in_background(self) {
        let spawned = std::thread::Builder::new()
            .name("baton-close".into())
            .spawn(move || drop(self));
        if let Err(e) = spawned {
            tracing::debug!("closing a changelog reader in the background: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w<'a>(
        store: usize,
        slot: u32,
        key: &str,
        value: Option<&'a str>,
    ) -> (usize, Vec<u8>, Option<&'a [u8]>) {
        let mut k = slot.to_be_bytes().to_vec();
        k.extend_from_slice(key.as_bytes());
        (store, k, value.map(str::as_bytes))
    }

    #[test]
    fn a_run_goes_in_key_order_with_the_last_of_each_key_and_the_offsets_reached() {
        let mut run = Run::default();
        let records = [
            (0, 1, 10, "b", Some("1")),
            (1, 1, 3, "a", Some("x")),
            (0, 1, 11, "a", Some("1")),
            (0, 2, 7, "a", Some("other slot")),
            (0, 1, 12, "b", Some("2")),
            (0, 1, 13, "a", None),
            (0, 1, 14, "c", Some("1")),
            (0, 1, 15, "b", Some("3")),
        ];
        for (store, slot, offset, key, value) in records {
            run.push(
                store,
                slot,
                offset,
                key.as_bytes(),
                value.map(str::as_bytes),
            );
        }
        assert!(!run.full());
        run.sort();
        let got: Vec<_> = run
            .writes()
            .map(|w| (w.store, w.key.to_vec(), w.value))
            .collect();
        assert_eq!(
            got,
            vec![
                w(0, 1, "a", None),
                w(0, 1, "b", Some("3")),
                w(0, 1, "c", Some("1")),
                w(0, 2, "a", Some("other slot")),
                w(1, 1, "a", Some("x")),
            ]
        );
        assert_eq!(run.n, 8);
        let stores = ["counts".to_string(), "totals".to_string()];
        let mut meta = run.meta(&stores);
        meta.sort();
        let mut want = vec![
            (
                changelog_offset_key("counts", 1),
                Some(16u64.to_be_bytes().to_vec()),
            ),
            (
                changelog_offset_key("counts", 2),
                Some(8u64.to_be_bytes().to_vec()),
            ),
            (
                changelog_offset_key("totals", 1),
                Some(4u64.to_be_bytes().to_vec()),
            ),
        ];
        want.sort();
        assert_eq!(meta, want);
    }

    #[test]
    fn a_run_is_full_at_its_record_or_byte_limit() {
        let mut run = Run::default();
        let big = vec![7u8; RUN_BYTES / 2];
        run.push(0, 0, 0, b"k1", Some(&big));
        assert!(!run.full());
        run.push(0, 0, 1, b"k2", Some(&big));
        assert!(run.full());
        let mut run = Run::default();
        for i in 0..RUN_RECORDS as u64 {
            assert!(!run.full());
            run.push(0, 0, i, &i.to_be_bytes(), Some(b"1"));
        }
        assert!(run.full());
    }
}
