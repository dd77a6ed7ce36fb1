//! Reading a partition's changelogs into its RocksDB: once to their end (a session's restore),
//! or on and on (a warming replica of a move, which keeps up with the owner until it takes
//! over). RocksDB keeps, per store and slot, the changelog offset it has applied up to, so that
//! a later restore goes on from there.

use std::ops::Range;
use std::time::{Duration, Instant};

use super::changelog_offset_key;
use crate::control::PipelineRecord;
use crate::state::{PartitionDb, WriteOp, slot_key};
use crate::transport::kafka::{Fetched, InputConsumer, KafkaTransport};

/// Most records one poll applies in one RocksDB write.
const POLL_RECORDS: usize = 20_000;

/// Sorts `writes` by store and key and keeps the last of each key (they came in log order).
fn last_of_each_key_in_order(writes: &mut Vec<WriteOp>) {
    // Reversed, a stable sort puts the latest write of a key first among its equals.
    writes.reverse();
    writes.sort_by(|a, b| (a.store, &a.key).cmp(&(b.store, &b.key)));
    writes.dedup_by(|later, first| later.store == first.store && later.key == first.key);
}

/// How long one fetch of [`Tail::read_to_end`] waits for records.
const IDLE_WAIT: Duration = Duration::from_millis(20);

/// A batch read from the changelogs, ready for RocksDB.
struct Prepared {
    /// Sorted by store and key, the last write of each key.
    writes: Vec<WriteOp>,
    /// The changelog offsets reached.
    meta: Vec<(String, Option<Vec<u8>>)>,
    /// Records read.
    n: u64,
}

impl Prepared {
    /// Writes the batch and its offsets in one RocksDB write; answers the records it holds.
    fn apply(self, db: &PartitionDb) -> anyhow::Result<u64> {
        if !self.writes.is_empty() || !self.meta.is_empty() {
            db.commit(self.writes.iter().map(WriteOp::as_ref), &self.meta)?;
        }
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
    /// offsets reached; answers how many records were applied.
    ///
    /// The writes go to RocksDB in key order, the last one of each key only: a memtable insert
    /// starts its search where the one before ended, so keys in order cost a fraction of keys
    /// at random, which is how a changelog holds them.
    pub fn poll(&mut self, db: &PartitionDb, wait: Duration) -> anyhow::Result<u64> {
        let batch = self.prepare(self.reader.fetch(POLL_RECORDS, wait));
        batch.apply(db)
    }

    /// The writes and offsets of what was fetched, sorted for RocksDB.
    fn prepare(&self, fetched: Vec<Fetched>) -> Prepared {
        let mut writes = Vec::with_capacity(fetched.iter().map(|f| f.records.len()).sum());
        let mut meta = Vec::new();
        let mut n = 0u64;
        for f in fetched {
            let Some(si) = self.changelogs.iter().position(|t| *t == f.topic) else {
                continue;
            };
            if let Some(last) = f.records.last() {
                meta.push((
                    changelog_offset_key(&self.stores[si], f.partition),
                    Some((last.offset + 1).to_be_bytes().to_vec()),
                ));
            }
            n += f.records.len() as u64;
            for r in f.records {
                writes.push(WriteOp {
                    store: si,
                    key: slot_key(f.partition, r.record.key.as_deref().unwrap_or_default()),
                    value: r.record.value,
                });
            }
        }
        last_of_each_key_in_order(&mut writes);
        Prepared { writes, meta, n }
    }

    /// Reads to the changelogs' ends last seen and applies what it reads to `db`, as
    /// [`Tail::poll`] does, with `progress` told the records applied so far after each write;
    /// answers how many records were applied. Fails if nothing arrives for `idle_limit` while
    /// records are still to be read.
    ///
    /// A thread of its own fetches, decodes and sorts the next batch while this one writes the
    /// last into RocksDB: a restore is CPU-bound, and on one thread the RocksDB write (memtable
    /// inserts) and the fetching each took a third of it.
    pub fn read_to_end(
        &mut self,
        db: &PartitionDb,
        idle_limit: Duration,
        progress: &mut dyn FnMut(u64),
    ) -> anyhow::Result<u64> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Prepared>(2);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let this = &*self;
        std::thread::scope(|scope| {
            let fetcher = std::thread::Builder::new()
                .name("baton-restore".into())
                .spawn_scoped(scope, || -> anyhow::Result<()> {
                    let tx = tx;
                    let mut last = Instant::now();
                    while !this.caught_up() {
                        if stop.load(std::sync::atomic::Ordering::Relaxed) {
                            return Ok(());
                        }
                        let batch = this.prepare(this.reader.fetch(POLL_RECORDS, IDLE_WAIT));
                        if batch.n == 0 {
                            anyhow::ensure!(
                                last.elapsed() < idle_limit,
                                "restore made no progress for {} s",
                                idle_limit.as_secs()
                            );
                            continue;
                        }
                        last = Instant::now();
                        if tx.send(batch).is_err() {
                            return Ok(());
                        }
                    }
                    Ok(())
                })?;
            let mut done = 0u64;
            let mut applied = Ok(());
            while let Ok(batch) = rx.recv() {
                match batch.apply(db) {
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

    fn w(store: usize, key: &str, value: Option<&str>) -> WriteOp {
        WriteOp {
            store,
            key: key.as_bytes().to_vec(),
            value: value.map(|v| v.as_bytes().to_vec()),
        }
    }

    #[test]
    fn writes_go_in_key_order_with_the_last_of_each_key() {
        let mut writes = vec![
            w(0, "b", Some("1")),
            w(1, "a", Some("x")),
            w(0, "a", Some("1")),
            w(0, "b", Some("2")),
            w(0, "a", None),
            w(0, "c", Some("1")),
            w(0, "b", Some("3")),
        ];
        last_of_each_key_in_order(&mut writes);
        assert_eq!(
            writes,
            vec![
                w(0, "a", None),
                w(0, "b", Some("3")),
                w(0, "c", Some("1")),
                w(1, "a", Some("x")),
            ]
        );
    }
}
