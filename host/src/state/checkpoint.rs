//! Incremental checkpoints of a partition's database in a checkpoint store, and restores from
//! them.
//!
//! A checkpoint is a RocksDB checkpoint (hard links, memtables flushed first) of the partition's
//! database. Each commit writes the batch's state and the slots' input and changelog offsets in
//! one atomic RocksDB write, so a checkpoint taken at any moment holds the state and offsets of
//! one commit. Its files go to the store:
//!
//! - `<pipeline>/<created_at>/<partition>/files/<object>`: every file, each uploaded once. An
//!   SST file is immutable and its name (its RocksDB file number) is never reused in one
//!   database directory, so it is named `<dir id>-<name>`, the directory's id being a random
//!   number kept in the directory (`BATON-DIR-ID`): later checkpoints of the same directory
//!   find it uploaded and share it. The other files (`MANIFEST-*`, `CURRENT`, `OPTIONS-*`, WAL)
//!   belong to one checkpoint. A database restored from a checkpoint keeps the objects of the
//!   files it was restored from (`BATON-RESTORED.json`) and gets a new id.
//! - `<pipeline>/<created_at>/<partition>/manifests/<seq>.json`: the manifest, written last,
//!   with every file's object, size and CRC-32, and the per-slot input and changelog offsets.
//!
//! `created_at` tells a pipeline from an earlier one of the same name. Retention keeps the
//! newest `retain` manifests of a partition; garbage collection then deletes the files no
//! retained manifest names, except those written since the oldest retained manifest (a
//! checkpoint still being written).
//!
//! Restore takes the newest manifest whose files are all there with their size and CRC-32,
//! into a new directory; a checkpoint that fails is skipped with its reason, and an older one
//! tried. The partition then reads its changelogs from the checkpoint's offsets on.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use serde::{Deserialize, Serialize};

use super::{META_CF, PartitionDb, StateError, store_cf};

/// The file in a database directory with its id, which names its SST files in the store.
const DIR_ID_FILE: &str = "BATON-DIR-ID";
/// The file in a database directory restored from a checkpoint: the objects of its files.
const RESTORED_FILE: &str = "BATON-RESTORED.json";
/// Files of a database directory that are baton's, not RocksDB's: never in a checkpoint.
const OWN_FILES: [&str; 2] = [DIR_ID_FILE, RESTORED_FILE];
/// Files uploaded or read at once.
const CONCURRENCY: usize = 4;
/// Files are uploaded and read in parts of this size.
const PART: usize = 8 << 20;
/// A checkpoint older than this is not restored: the changelog's tombstones are kept for
/// `delete.retention.ms` (a day by default), and replaying the changelog from an older
/// checkpoint could miss a deletion whose tombstone compaction has removed since.
pub const MAX_RESTORE_AGE: Duration = Duration::from_secs(20 * 3600);
/// The version of the manifest's format.
const FORMAT: u32 = 1;

/// One file of a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct CheckpointFile {
    /// Its name in the database directory.
    pub name: String,
    /// Its object under the partition's `files/`.
    pub object: String,
    /// Bytes.
    pub size: u64,
    /// CRC-32 of its bytes.
    pub crc32: u32,
}

/// What a checkpoint holds: the manifest, written after every file.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Manifest {
    /// Version of this format.
    pub format: u32,
    /// The pipeline.
    pub pipeline: String,
    /// The pipeline's creation time (ms since the epoch): tells it from an earlier pipeline of
    /// the same name.
    pub pipeline_created_at: i64,
    /// The partition.
    pub partition: String,
    /// Its slots `[start, end)`.
    pub slots: [u32; 2],
    /// Its stores.
    pub stores: Vec<String>,
    /// Number of this checkpoint among the partition's, from 1.
    pub seq: u64,
    /// The host that took it.
    pub host: String,
    /// When it was taken (ms since the epoch).
    pub taken_at: i64,
    /// How long it took (ms): the RocksDB checkpoint, the uploads and the manifest.
    pub duration_ms: f64,
    /// Of that, the RocksDB checkpoint (ms): memtables flushed, files linked.
    #[serde(default)]
    pub rocksdb_ms: f64,
    /// Per slot of each input topic (`<topic>/<slot>`): the next input offset.
    pub input_offsets: BTreeMap<String, u64>,
    /// Per slot of each store (`<store>/<slot>`): the next changelog offset.
    pub changelog_offsets: BTreeMap<String, u64>,
    /// Bytes uploaded for it (files no earlier checkpoint had).
    pub uploaded_bytes: u64,
    /// Files uploaded for it.
    pub files_uploaded: usize,
    /// Files it shares with an earlier checkpoint.
    pub files_reused: usize,
    /// Its files.
    pub files: Vec<CheckpointFile>,
}

impl Manifest {
    /// Bytes of all its files.
    pub fn size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// Bytes of its write-ahead log files.
    pub fn wal_bytes(&self) -> u64 {
        self.files
            .iter()
            .filter(|f| f.name.ends_with(".log"))
            .map(|f| f.size)
            .sum()
    }

    /// What the partition table shows of it, with `retained` checkpoints kept.
    pub fn info(&self, retained: usize) -> CheckpointInfo {
        CheckpointInfo {
            seq: self.seq,
            taken_at: self.taken_at,
            duration_ms: self.duration_ms,
            rocksdb_ms: self.rocksdb_ms,
            uploaded_bytes: self.uploaded_bytes,
            files_uploaded: self.files_uploaded,
            files_reused: self.files_reused,
            size_bytes: self.size(),
            wal_bytes: self.wal_bytes(),
            retained,
            files_deleted: 0,
        }
    }
}

/// A partition's last checkpoint, as `GET /api/v1/partitions` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct CheckpointInfo {
    /// Its number among the partition's checkpoints.
    pub seq: u64,
    /// When it was taken (ms since the epoch).
    pub taken_at: i64,
    /// How long it took (ms).
    pub duration_ms: f64,
    /// Of that, the RocksDB checkpoint (ms): memtables flushed, files linked.
    pub rocksdb_ms: f64,
    /// Bytes uploaded for it.
    pub uploaded_bytes: u64,
    /// Files uploaded for it.
    pub files_uploaded: usize,
    /// Files it shares with an earlier checkpoint.
    pub files_reused: usize,
    /// Bytes of all its files: the state's size on disk.
    pub size_bytes: u64,
    /// Bytes of write-ahead log it holds in place of SST files of its memtables: 0, unless a
    /// flush would have waited for a compaction when it was taken.
    #[serde(default)]
    pub wal_bytes: u64,
    /// Checkpoints of the partition the store keeps after this one's garbage collection.
    pub retained: usize,
    /// Files garbage collection deleted after it.
    pub files_deleted: usize,
}

/// What a restore from a checkpoint did.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Restored {
    /// The checkpoint restored.
    pub seq: u64,
    /// When it was taken (ms since the epoch).
    pub taken_at: i64,
    /// Bytes read from the store.
    pub bytes: u64,
    /// Files read.
    pub files: usize,
    /// How long it took (ms).
    pub duration_ms: f64,
    /// Newer checkpoints skipped, each with the reason.
    pub skipped: Vec<String>,
}

/// Which partition of which pipeline a checkpoint is of.
#[derive(Debug, Clone)]
pub struct PartitionRef {
    /// The pipeline.
    pub pipeline: String,
    /// Its creation time (ms since the epoch).
    pub created_at: i64,
    /// The partition.
    pub partition: String,
    /// Its slots.
    pub slots: [u32; 2],
}

impl PartitionRef {
    /// Partition `partition`, with `slots`, of pipeline `pipeline` created at `created_at`.
    pub fn new(pipeline: &str, created_at: i64, partition: &str, slots: [u32; 2]) -> Self {
        PartitionRef {
            pipeline: pipeline.to_string(),
            created_at,
            partition: partition.to_string(),
            slots,
        }
    }

    fn prefix(&self) -> String {
        format!("{}/{}/{}", self.pipeline, self.created_at, self.partition)
    }
}

/// Errors of the checkpoint store.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The store failed.
    #[error("checkpoint store {url}: {source}")]
    Store {
        /// The store.
        url: String,
        /// What it said.
        source: object_store::Error,
    },
    /// A local file or directory could not be read or written.
    #[error("{0}")]
    Io(String),
    /// RocksDB failed.
    #[error(transparent)]
    State(#[from] StateError),
}

/// A result of the checkpoint store.
pub type Result<T> = std::result::Result<T, CheckpointError>;

fn io(what: impl std::fmt::Display, e: std::io::Error) -> CheckpointError {
    CheckpointError::Io(format!("{what}: {e}"))
}

/// What the store knows of one partition's checkpoints, kept between its checkpoints.
#[derive(Default)]
struct Known {
    /// Whether the store was listed since the host started.
    listed: bool,
    /// The newest checkpoint's number.
    last_seq: u64,
    /// Files in retained checkpoints, by object: what a later checkpoint need not upload.
    files: HashMap<String, CheckpointFile>,
    /// Files uploaded ahead of the next checkpoint ([`CheckpointStore::upload_ahead`]), by
    /// object, and their bytes: the next checkpoint counts them as its own uploads.
    ahead: HashMap<String, CheckpointFile>,
    ahead_bytes: u64,
}

/// A checkpoint store: a directory or an object store, with the retention of checkpoints.
pub struct CheckpointStore {
    store: Arc<dyn ObjectStore>,
    /// The directory of a local store: files are hard-linked into it where they can be.
    local_root: Option<PathBuf>,
    url: String,
    retain: usize,
    /// The store's client runs here; callers block on it from their own threads.
    rt: tokio::runtime::Runtime,
    /// Per partition (store prefix): what its checkpoints hold. A partition's checkpoints are
    /// taken one at a time (its lock held), and two partitions share nothing.
    known: parking_lot::Mutex<HashMap<String, Arc<parking_lot::Mutex<Known>>>>,
}

impl CheckpointStore {
    /// The store at `url`: a path (or `file://` URL) for a directory, `s3://bucket/prefix`
    /// for S3 and S3-compatible stores, configured as the `object_store` crate's users expect
    /// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT`,
    /// `AWS_ALLOW_HTTP`, ...). Keeps `retain` checkpoints per partition.
    pub fn open(url: &str, retain: usize) -> std::result::Result<Self, String> {
        Self::open_with(url, retain, &[])
    }

    /// [`CheckpointStore::open`], with `options` for an object store beside what the
    /// environment says (`object_store`'s keys, as `aws_endpoint`).
    pub fn open_with(
        url: &str,
        retain: usize,
        options: &[(String, String)],
    ) -> std::result::Result<Self, String> {
        if retain == 0 {
            return Err("--checkpoint-retain must be at least 1".into());
        }
        let mut local_root = None;
        let store: Arc<dyn ObjectStore> = if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(format!(
                    "checkpoint store {url}: no bucket; use s3://BUCKET/PREFIX"
                ));
            }
            let mut builder = object_store::aws::AmazonS3Builder::from_env();
            for (k, v) in options {
                let key: object_store::aws::AmazonS3ConfigKey = k
                    .parse()
                    .map_err(|e| format!("checkpoint store {url}: option {k}: {e}"))?;
                builder = builder.with_config(key, v);
            }
            let s3 = builder
                .with_bucket_name(bucket)
                .build()
                .map_err(|e| format!("checkpoint store {url}: {e}"))?;
            let prefix = prefix.trim_matches('/');
            if prefix.is_empty() {
                Arc::new(s3)
            } else {
                Arc::new(object_store::prefix::PrefixStore::new(s3, prefix))
            }
        } else if url.contains("://") && !url.starts_with("file://") {
            return Err(format!(
                "checkpoint store {url}: use a directory, file://DIR or s3://BUCKET/PREFIX"
            ));
        } else {
            let dir = PathBuf::from(url.strip_prefix("file://").unwrap_or(url));
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("checkpoint store {}: {e}", dir.display()))?;
            let dir = dir
                .canonicalize()
                .map_err(|e| format!("checkpoint store {}: {e}", dir.display()))?;
            local_root = Some(dir.clone());
            Arc::new(
                object_store::local::LocalFileSystem::new_with_prefix(&dir)
                    .map_err(|e| format!("checkpoint store {}: {e}", dir.display()))?,
            )
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("baton-checkpoints")
            .enable_all()
            .build()
            .map_err(|e| format!("checkpoint store: {e}"))?;
        Ok(CheckpointStore {
            store,
            local_root,
            url: url.to_string(),
            retain,
            rt,
            known: Default::default(),
        })
    }

    /// The store's URL as given.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Checkpoints kept per partition.
    pub fn retain(&self) -> usize {
        self.retain
    }

    /// This store, copying files as to an object store instead of linking them (for tests of
    /// what an object store does).
    #[cfg(test)]
    fn copying(mut self) -> Self {
        self.local_root = None;
        self
    }

    /// Runs `f` on the store's runtime, from a thread of its own: callers may be on a runtime.
    fn block<T: Send>(&self, f: impl std::future::Future<Output = T> + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| self.rt.block_on(f))
                .join()
                .expect("a checkpoint store call panicked")
        })
    }

    fn err(&self, source: object_store::Error) -> CheckpointError {
        CheckpointError::Store {
            url: self.url.clone(),
            source,
        }
    }

    fn known(&self, p: &PartitionRef) -> Arc<parking_lot::Mutex<Known>> {
        self.known.lock().entry(p.prefix()).or_default().clone()
    }

    /// The partition's manifests in the store, oldest first: (seq, object, last modified ms).
    async fn list_manifests(&self, p: &PartitionRef) -> Result<Vec<(u64, ObjectPath, i64)>> {
        let prefix = ObjectPath::from(format!("{}/manifests", p.prefix()));
        let mut out = Vec::new();
        let mut list = self.store.list(Some(&prefix));
        while let Some(meta) = list.next().await {
            let meta = meta.map_err(|e| self.err(e))?;
            let seq = meta
                .location
                .filename()
                .and_then(|f| f.strip_suffix(".json"))
                .and_then(|s| s.parse::<u64>().ok());
            if let Some(seq) = seq {
                out.push((seq, meta.location, meta.last_modified.timestamp_millis()));
            }
        }
        out.sort_by_key(|(seq, _, _)| *seq);
        Ok(out)
    }

    async fn read_manifest(&self, location: &ObjectPath) -> Result<Manifest> {
        let bytes = self
            .store
            .get(location)
            .await
            .map_err(|e| self.err(e))?
            .bytes()
            .await
            .map_err(|e| self.err(e))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| CheckpointError::Io(format!("manifest {location}: {e}")))
    }

    /// The partition's retained checkpoints, oldest first.
    pub fn manifests(&self, p: &PartitionRef) -> Result<Vec<Manifest>> {
        self.block(async {
            let mut out = Vec::new();
            for (_, location, _) in self.list_manifests(p).await? {
                out.push(self.read_manifest(&location).await?);
            }
            Ok(out)
        })
    }

    /// Takes a checkpoint of `db`, the database of partition `p`, by host `host`: a RocksDB
    /// checkpoint next to the database, its new files uploaded, its manifest written; then
    /// the partition's checkpoints beyond the retention are deleted with the files only they
    /// named.
    pub fn take(&self, db: &PartitionDb, p: &PartitionRef, host: &str) -> Result<CheckpointInfo> {
        self.take_with(db, p, host, &|_| {})
    }

    /// [`CheckpointStore::take`], calling `before_manifest(seq)` once the checkpoint's files
    /// are in the store and before its manifest is written (where a test holds it).
    pub fn take_with(
        &self,
        db: &PartitionDb,
        p: &PartitionRef,
        host: &str,
        before_manifest: &(dyn Fn(u64) + Sync),
    ) -> Result<CheckpointInfo> {
        let started = Instant::now();
        let known = self.known(p);
        // One checkpoint of a partition at a time.
        let mut known = known.lock();
        let local = db.path().with_extension("checkpoint");
        if local.exists() {
            std::fs::remove_dir_all(&local).map_err(|e| io(local.display(), e))?;
        }
        if db.create_checkpoint_without_waiting(&local)? {
            tracing::debug!(partition = %p.partition, "checkpoint with the write-ahead log: a flush would have waited");
        }
        let rocksdb_ms = started.elapsed().as_secs_f64() * 1e3;
        let result = self.upload(
            db,
            p,
            host,
            (&local, started, rocksdb_ms),
            &mut known,
            before_manifest,
        );
        let _ = std::fs::remove_dir_all(&local);
        result
    }

    /// Forgets what this host knew of partition `p`'s checkpoints, for a partition that starts
    /// here (again): while it ran elsewhere, another host took checkpoints of it and its
    /// garbage collection deleted files this host had uploaded, so the next checkpoint here
    /// lists the store again and uploads what it does not hold.
    pub fn forget(&self, p: &PartitionRef) {
        *self.known(p).lock() = Known::default();
    }

    /// Uploads, ahead of partition `p`'s next checkpoint, the SST files of `db` below level 0
    /// that no checkpoint of it holds: what compactions wrote since the last one. A checkpoint
    /// that follows a compaction then uploads little more than its flush, not the hundreds of
    /// MiB a compaction rewrote (uniform updates rewrite whole levels). What is uploaded ahead
    /// counts in the next checkpoint's `uploaded_bytes`, files compacted away before it
    /// included. Nothing for a local store, whose checkpoints link files instead of copying
    /// them, or before the store was listed (by a first checkpoint here). Returns the bytes.
    pub fn upload_ahead(&self, db: &PartitionDb, p: &PartitionRef) -> Result<u64> {
        if self.local_root.is_some() {
            return Ok(0);
        }
        let known = self.known(p);
        let mut known = known.lock();
        if !known.listed {
            return Ok(0);
        }
        let dir_id = dir_id(db.path())?;
        let restored = restored_objects(db.path());
        let mut wanted: Vec<(String, String)> = db
            .sst_levels()
            .into_iter()
            .filter(|(_, level)| *level > 0)
            .map(|(name, _)| {
                let object = sst_object(&restored, &dir_id, &name);
                (name, object)
            })
            .filter(|(_, object)| {
                !known.files.contains_key(object) && !known.ahead.contains_key(object)
            })
            .collect();
        if wanted.is_empty() {
            return Ok(0);
        }
        wanted.sort();
        let uploaded = self.block(self.put_files(p, db.path(), wanted));
        let mut bytes = 0;
        for u in uploaded {
            match u {
                Ok(f) => {
                    bytes += f.size;
                    known.ahead.insert(f.object.clone(), f);
                }
                // A file compacted away before it could be opened is nothing a checkpoint will
                // need; any other failure is the store's, and the file goes again next time.
                Err(e @ CheckpointError::Io(_)) => {
                    tracing::debug!(partition = %p.partition, "upload ahead: {e}")
                }
                Err(e) => tracing::warn!(partition = %p.partition, "upload ahead: {e}"),
            }
        }
        known.ahead_bytes += bytes;
        Ok(bytes)
    }

    /// Puts the files `(name, object)` of directory `dir` into partition `p`'s files, several
    /// at once (an object store's round trips overlap).
    async fn put_files(
        &self,
        p: &PartitionRef,
        dir: &Path,
        files: Vec<(String, String)>,
    ) -> Vec<Result<CheckpointFile>> {
        futures_util::stream::iter(files)
            .map(|(name, object)| async move {
                let path = dir.join(&name);
                let location = ObjectPath::from(format!("{}/files/{object}", p.prefix()));
                let (size, crc32) = self.put_file(&path, &location).await?;
                Ok(CheckpointFile {
                    name,
                    object,
                    size,
                    crc32,
                })
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await
    }

    fn upload(
        &self,
        db: &PartitionDb,
        p: &PartitionRef,
        host: &str,
        (local, started, rocksdb_ms): (&Path, Instant, f64),
        known: &mut Known,
        before_manifest: &(dyn Fn(u64) + Sync),
    ) -> Result<CheckpointInfo> {
        let (input_offsets, changelog_offsets) = read_offsets(local, db.stores())?;
        let dir_id = dir_id(db.path())?;
        let restored = restored_objects(db.path());
        self.block(async {
            if !known.listed {
                if let Some((seq, location, _)) = self.list_manifests(p).await?.pop() {
                    known.last_seq = seq;
                    if let Ok(m) = self.read_manifest(&location).await {
                        known.files = m.files.into_iter().map(|f| (f.object.clone(), f)).collect();
                    }
                }
                known.listed = true;
            }
            let seq = known.last_seq + 1;
            let mut names: Vec<String> = std::fs::read_dir(local)
                .map_err(|e| io(local.display(), e))?
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !OWN_FILES.contains(&n.as_str()))
                .collect();
            names.sort();
            let mut files = Vec::with_capacity(names.len());
            let (mut uploaded_bytes, mut files_uploaded, mut files_reused) = (0u64, 0usize, 0);
            let mut uploads = Vec::new();
            for name in names {
                let object = if name.ends_with(".sst") {
                    sst_object(&restored, &dir_id, &name)
                } else {
                    format!("{dir_id}-{seq}-{name}")
                };
                if let Some(f) = known.files.get(&object) {
                    files.push(CheckpointFile { name, ..f.clone() });
                    files_reused += 1;
                } else if let Some(f) = known.ahead.get(&object) {
                    files.push(CheckpointFile { name, ..f.clone() });
                    files_uploaded += 1;
                } else {
                    uploads.push((name, object));
                }
            }
            for f in self.put_files(p, local, uploads).await {
                let f = f?;
                uploaded_bytes += f.size;
                files_uploaded += 1;
                files.push(f);
            }
            // Uploaded ahead of it: all of it counts, named here or compacted away since.
            uploaded_bytes += known.ahead_bytes;
            files.sort_by(|a, b| a.name.cmp(&b.name));
            let manifest = Manifest {
                format: FORMAT,
                pipeline: p.pipeline.clone(),
                pipeline_created_at: p.created_at,
                partition: p.partition.clone(),
                slots: p.slots,
                stores: db.stores().to_vec(),
                seq,
                host: host.to_string(),
                taken_at: crate::control::now_ms(),
                duration_ms: started.elapsed().as_secs_f64() * 1e3,
                rocksdb_ms,
                input_offsets,
                changelog_offsets,
                uploaded_bytes,
                files_uploaded,
                files_reused,
                files,
            };
            before_manifest(seq);
            let location = ObjectPath::from(format!("{}/manifests/{seq:020}.json", p.prefix()));
            let body = serde_json::to_vec_pretty(&manifest).expect("a manifest serializes");
            self.store
                .put(&location, body.into())
                .await
                .map_err(|e| self.err(e))?;
            known.last_seq = seq;
            // What was uploaded ahead and not named here was compacted away before it: garbage
            // collection deletes it once it is older than every retained checkpoint.
            known.ahead.clear();
            known.ahead_bytes = 0;
            known.files = manifest
                .files
                .iter()
                .map(|f| (f.object.clone(), f.clone()))
                .collect();
            let (retained, files_deleted) = self.collect_garbage(p).await?;
            Ok(CheckpointInfo {
                seq,
                taken_at: manifest.taken_at,
                duration_ms: started.elapsed().as_secs_f64() * 1e3,
                rocksdb_ms,
                uploaded_bytes,
                files_uploaded,
                files_reused,
                size_bytes: manifest.size(),
                wal_bytes: manifest.wal_bytes(),
                retained,
                files_deleted,
            })
        })
    }

    /// Reads every object of checkpoint `seq` of `p` and throws the bytes away, as a bare
    /// client of the store would: the seconds it took (the ceiling a restore is measured
    /// against).
    pub fn read_all(&self, p: &PartitionRef, seq: u64) -> Result<f64> {
        self.block(async {
            let location = ObjectPath::from(format!("{}/manifests/{seq:020}.json", p.prefix()));
            let m = self.read_manifest(&location).await?;
            let started = Instant::now();
            for f in &m.files {
                let location = ObjectPath::from(format!("{}/files/{}", p.prefix(), f.object));
                let mut stream = self
                    .store
                    .get(&location)
                    .await
                    .map_err(|e| self.err(e))?
                    .into_stream();
                while let Some(chunk) = stream.next().await {
                    chunk.map_err(|e| self.err(e))?;
                }
            }
            Ok(started.elapsed().as_secs_f64())
        })
    }

    /// Deletes every checkpoint of pipeline `pipeline` created at `created_at` (a purge).
    pub fn delete_pipeline(&self, pipeline: &str, created_at: i64) -> Result<()> {
        let prefix = ObjectPath::from(format!("{pipeline}/{created_at}"));
        let mine = format!("{pipeline}/{created_at}/");
        // A checkpoint under way of one of its partitions ends first: its partitions have
        // stopped, so none starts after it.
        let partitions: Vec<_> = self
            .known
            .lock()
            .iter()
            .filter(|(k, _)| k.starts_with(&mine))
            .map(|(_, v)| v.clone())
            .collect();
        let _held: Vec<_> = partitions.iter().map(|k| k.lock()).collect();
        self.known.lock().retain(|k, _| !k.starts_with(&mine));
        self.block(async {
            let mut list = self.store.list(Some(&prefix));
            let mut all = Vec::new();
            while let Some(meta) = list.next().await {
                all.push(meta.map_err(|e| self.err(e))?.location);
            }
            drop(list);
            let n = all.len();
            self.delete(all).await?;
            tracing::info!(pipeline, created_at, objects = n, "checkpoints deleted");
            Ok(())
        })
    }

    /// Uploads the file at `path` to `location`, in parts: its size and CRC-32.
    async fn put_file(&self, path: &Path, location: &ObjectPath) -> Result<(u64, u32)> {
        let mut file = std::fs::File::open(path).map_err(|e| io(path.display(), e))?;
        let len = file.metadata().map_err(|e| io(path.display(), e))?.len();
        let mut crc = crc32fast::Hasher::new();
        // Only SST files, which are never changed in place and linked once: the other files
        // of a RocksDB checkpoint may be links to one file (its `OPTIONS`), whose modification
        // time, which garbage collection goes by, would be that of the last link.
        let linkable = path.extension().is_some_and(|e| e == "sst");
        if let Some(root) = self.local_root.as_ref().filter(|_| linkable) {
            // A directory on the database's file system: the file is linked, not copied (an
            // SST file is never changed in place), and only read for its CRC-32.
            let target = root.join(location.as_ref());
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io(parent.display(), e))?;
            }
            let _ = std::fs::remove_file(&target);
            if std::fs::hard_link(path, &target).is_ok() {
                let size = read_crc(&mut file, path, &mut crc)?;
                // Its modification time is now that of the upload, which garbage collection
                // goes by.
                let _ = std::fs::File::options()
                    .write(true)
                    .open(&target)
                    .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                return Ok((size, crc.finalize()));
            }
        }
        if len as usize <= PART {
            let mut buf = Vec::with_capacity(len as usize);
            file.read_to_end(&mut buf)
                .map_err(|e| io(path.display(), e))?;
            crc.update(&buf);
            let size = buf.len() as u64;
            self.store
                .put(location, buf.into())
                .await
                .map_err(|e| self.err(e))?;
            return Ok((size, crc.finalize()));
        }
        let upload = self
            .store
            .put_multipart(location)
            .await
            .map_err(|e| self.err(e))?;
        let mut writer = object_store::WriteMultipart::new_with_chunk_size(upload, PART);
        let mut buf = vec![0u8; PART];
        let mut size = 0u64;
        loop {
            let n = file.read(&mut buf).map_err(|e| io(path.display(), e))?;
            if n == 0 {
                break;
            }
            crc.update(&buf[..n]);
            size += n as u64;
            writer.wait_for_capacity(2).await.map_err(|e| self.err(e))?;
            writer.write(&buf[..n]);
        }
        writer.finish().await.map_err(|e| self.err(e))?;
        Ok((size, crc.finalize()))
    }

    /// Deletes `locations`; one already gone is no error.
    async fn delete(&self, locations: impl IntoIterator<Item = ObjectPath>) -> Result<()> {
        for location in locations {
            match self.store.delete(&location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.err(e)),
            }
        }
        Ok(())
    }

    /// Deletes the partition's checkpoints beyond the retention, then the files no retained
    /// checkpoint names and written before the oldest retained one: (retained, files deleted).
    async fn collect_garbage(&self, p: &PartitionRef) -> Result<(usize, usize)> {
        let mut manifests = self.list_manifests(p).await?;
        let excess = manifests.len().saturating_sub(self.retain);
        self.delete(manifests.drain(..excess).map(|(_, location, _)| location))
            .await?;
        let Some(&(_, _, oldest)) = manifests.first() else {
            return Ok((0, 0));
        };
        let mut referenced = std::collections::HashSet::new();
        for (_, location, _) in &manifests {
            // A manifest that cannot be read names nothing: its checkpoint is not restorable.
            match self.read_manifest(location).await {
                Ok(m) => referenced.extend(m.files.into_iter().map(|f| f.object)),
                Err(e) => tracing::warn!("checkpoint garbage collection: {e}"),
            }
        }
        let prefix = ObjectPath::from(format!("{}/files", p.prefix()));
        let mut doomed = Vec::new();
        let mut list = self.store.list(Some(&prefix));
        while let Some(meta) = list.next().await {
            let meta = meta.map_err(|e| self.err(e))?;
            let name = meta.location.filename().unwrap_or_default().to_string();
            // Written since the oldest retained manifest: a checkpoint may be writing it.
            if !referenced.contains(&name) && meta.last_modified.timestamp_millis() < oldest {
                doomed.push(meta.location);
            }
        }
        drop(list);
        let deleted = doomed.len();
        self.delete(doomed).await?;
        Ok((manifests.len(), deleted))
    }

    /// Fills the directory `path`, where partition `p` has no database, from its newest valid
    /// checkpoint: `None` when it has no checkpoint that restores (each skipped one is logged
    /// with its reason, and returned in [`Restored::skipped`] of the one that restores).
    /// `stores` are the partition's stores now: a checkpoint of others does not restore.
    pub fn restore(
        &self,
        p: &PartitionRef,
        stores: &[String],
        path: &Path,
    ) -> Result<Option<Restored>> {
        self.restore_from(p, stores, path, None)
    }

    /// [`CheckpointStore::restore`] from checkpoint `only` (a number), or the newest valid
    /// one when `None`.
    pub fn restore_from(
        &self,
        p: &PartitionRef,
        stores: &[String],
        path: &Path,
        only: Option<u64>,
    ) -> Result<Option<Restored>> {
        let started = Instant::now();
        let known = self.known(p);
        let _one_at_a_time = known.lock();
        if path.join("CURRENT").exists() {
            // Another opener restored it meanwhile.
            return Ok(None);
        }
        self.block(async {
            let mut skipped = Vec::new();
            let mut manifests = self.list_manifests(p).await?;
            manifests.reverse();
            for (seq, location, _) in manifests {
                if only.is_some_and(|o| o != seq) {
                    continue;
                }
                let attempt = async {
                    let m = self.read_manifest(&location).await?;
                    self.check(&m, p, stores).map_err(CheckpointError::Io)?;
                    self.fetch(&m, p, path).await?;
                    Ok::<_, CheckpointError>(m)
                };
                match attempt.await {
                    Ok(m) => {
                        let restored = Restored {
                            seq,
                            taken_at: m.taken_at,
                            bytes: m.size(),
                            files: m.files.len(),
                            duration_ms: started.elapsed().as_secs_f64() * 1e3,
                            skipped,
                        };
                        tracing::info!(
                            partition = %p.partition,
                            seq,
                            bytes = restored.bytes,
                            ms = restored.duration_ms,
                            "restored from checkpoint"
                        );
                        return Ok(Some(restored));
                    }
                    Err(e) => {
                        let why = format!("checkpoint {seq} of {}: {e}", p.partition);
                        tracing::warn!("{why}; trying an older one");
                        skipped.push(why);
                    }
                }
            }
            Ok(None)
        })
    }

    /// Why manifest `m` cannot restore partition `p` now, if it cannot.
    fn check(
        &self,
        m: &Manifest,
        p: &PartitionRef,
        stores: &[String],
    ) -> std::result::Result<(), String> {
        if m.format != FORMAT {
            return Err(format!("format {} is not {FORMAT}", m.format));
        }
        if m.pipeline != p.pipeline
            || m.pipeline_created_at != p.created_at
            || m.partition != p.partition
        {
            return Err(format!(
                "it is of {}/{} (created {}), not this partition",
                m.pipeline, m.partition, m.pipeline_created_at
            ));
        }
        if m.slots != p.slots {
            return Err(format!("it holds slots {:?}, not {:?}", m.slots, p.slots));
        }
        if m.stores != stores {
            return Err(format!(
                "it has stores {:?}, the pipeline {:?}",
                m.stores, stores
            ));
        }
        let age = crate::control::now_ms().saturating_sub(m.taken_at);
        if age > MAX_RESTORE_AGE.as_millis() as i64 {
            return Err(format!(
                "it is {} h old, older than the changelog's tombstones are kept",
                age / 3_600_000
            ));
        }
        Ok(())
    }

    /// Reads file `f` of a checkpoint of `p` into the directory `dir`, and checks its size and
    /// CRC-32. From a local store an SST file is read for its CRC-32 and hard-linked.
    async fn fetch_file(&self, p: &PartitionRef, f: &CheckpointFile, dir: &Path) -> Result<()> {
        let location = ObjectPath::from(format!("{}/files/{}", p.prefix(), f.object));
        let target = dir.join(&f.name);
        let mut crc = crc32fast::Hasher::new();
        let mut size = 0u64;
        let linked = match self
            .local_root
            .as_ref()
            .filter(|_| f.name.ends_with(".sst"))
        {
            Some(root) => {
                let source = root.join(location.as_ref());
                match std::fs::File::open(&source) {
                    Ok(mut file) => {
                        size = read_crc(&mut file, &source, &mut crc)?;
                        std::fs::hard_link(&source, &target).is_ok()
                    }
                    Err(_) => false,
                }
            }
            None => false,
        };
        if !linked {
            crc = crc32fast::Hasher::new();
            size = 0;
            let mut out = std::fs::File::create(&target).map_err(|e| io(target.display(), e))?;
            let mut stream = self
                .store
                .get(&location)
                .await
                .map_err(|e| self.err(e))?
                .into_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| self.err(e))?;
                crc.update(&chunk);
                size += chunk.len() as u64;
                out.write_all(&chunk).map_err(|e| io(target.display(), e))?;
            }
        }
        let crc = crc.finalize();
        if size != f.size || crc != f.crc32 {
            return Err(CheckpointError::Io(format!(
                "file {} ({}) has {size} bytes with CRC-32 {crc:08x}, the manifest says {} bytes \
                 with {:08x}",
                f.name, f.object, f.size, f.crc32
            )));
        }
        Ok(())
    }

    /// Reads the files of `m` into a new directory, checks each one's size and CRC-32, and
    /// puts the directory at `path`.
    async fn fetch(&self, m: &Manifest, p: &PartitionRef, path: &Path) -> Result<()> {
        let tmp = path.with_extension("restoring");
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(|e| io(tmp.display(), e))?;
        }
        std::fs::create_dir_all(&tmp).map_err(|e| io(tmp.display(), e))?;
        let fetched = async {
            let dir: &Path = &tmp;
            let results: Vec<Result<()>> = futures_util::stream::iter(m.files.clone())
                .map(|f| async move { self.fetch_file(p, &f, dir).await })
                .buffer_unordered(CONCURRENCY)
                .collect()
                .await;
            results.into_iter().collect::<Result<Vec<()>>>()?;
            let objects: BTreeMap<&str, &str> = m
                .files
                .iter()
                .filter(|f| f.name.ends_with(".sst"))
                .map(|f| (f.name.as_str(), f.object.as_str()))
                .collect();
            let restored = serde_json::to_vec(&objects).expect("a map serializes");
            std::fs::write(tmp.join(RESTORED_FILE), restored).map_err(|e| io(tmp.display(), e))?;
            Ok(())
        };
        if let Err(e) = fetched.await {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        if path.exists() {
            std::fs::remove_dir_all(path).map_err(|e| io(path.display(), e))?;
        }
        std::fs::rename(&tmp, path).map_err(|e| io(path.display(), e))?;
        Ok(())
    }
}

/// Reads `file` (at `path`) to its end into `crc`: its size.
fn read_crc(file: &mut std::fs::File, path: &Path, crc: &mut crc32fast::Hasher) -> Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(|e| io(path.display(), e))?;
        if n == 0 {
            return Ok(size);
        }
        crc.update(&buf[..n]);
        size += n as u64;
    }
}

/// The id of the database directory `dir`, made on first use.
fn dir_id(dir: &Path) -> Result<String> {
    let file = dir.join(DIR_ID_FILE);
    if let Ok(id) = std::fs::read_to_string(&file)
        && !id.trim().is_empty()
    {
        return Ok(id.trim().to_string());
    }
    // Unique among directories: the time in nanoseconds, the process and the path, hashed.
    use sha2::Digest;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let seed = format!("{nanos}/{}/{}", std::process::id(), dir.display());
    let id = hex::encode(&sha2::Sha256::digest(seed.as_bytes())[..8]);
    std::fs::write(&file, &id).map_err(|e| io(file.display(), e))?;
    Ok(id)
}

/// The object of SST file `name` of a directory with id `dir_id`: the one it was restored
/// from, or a name of its own for good (a directory never reuses a file number).
fn sst_object(restored: &HashMap<String, String>, dir_id: &str, name: &str) -> String {
    restored
        .get(name)
        .cloned()
        .unwrap_or_else(|| format!("{dir_id}-{name}"))
}

/// The objects of the files a directory was restored from, by name.
fn restored_objects(dir: &Path) -> HashMap<String, String> {
    std::fs::read(dir.join(RESTORED_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// The input and changelog offsets in the metadata of the checkpoint at `dir`.
fn read_offsets(
    dir: &Path,
    stores: &[String],
) -> Result<(BTreeMap<String, u64>, BTreeMap<String, u64>)> {
    let mut cfs = vec![META_CF.to_string()];
    cfs.extend(stores.iter().map(|s| store_cf(s)));
    let db = rocksdb::DB::open_cf_for_read_only(&rocksdb::Options::default(), dir, cfs, false)
        .map_err(StateError::from)?;
    let meta = db
        .cf_handle(META_CF)
        .ok_or_else(|| StateError::Corrupt("no _meta column family".into()))?;
    let (mut input, mut changelog) = (BTreeMap::new(), BTreeMap::new());
    for item in db.iterator_cf(meta, rocksdb::IteratorMode::Start) {
        let (k, v) = item.map_err(StateError::from)?;
        let (Ok(k), Ok(v)) = (std::str::from_utf8(&k), <[u8; 8]>::try_from(&v[..])) else {
            continue;
        };
        let v = u64::from_be_bytes(v);
        if let Some(rest) = k.strip_prefix("in/") {
            input.insert(rest.to_string(), v);
        } else if let Some(rest) = k.strip_prefix("cl/") {
            changelog.insert(rest.to_string(), v);
        }
    }
    Ok((input, changelog))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{StateEnv, WriteRef};

    /// Waits for the clock garbage collection compares to move on: the millisecond of a file's
    /// modification time, which the file system takes from a clock coarser than the system's
    /// (a tick of 1 to 10 ms), so that what is written next is newer than what was written
    /// before.
    fn next_ms() {
        let probe = tempfile::NamedTempFile::new().expect("a probe file");
        let mtime_ms = || {
            std::fs::write(probe.path(), b"x").expect("writing the probe");
            std::fs::metadata(probe.path())
                .and_then(|m| m.modified())
                .expect("the probe's mtime")
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after the epoch")
                .as_millis()
        };
        let start = mtime_ms();
        while mtime_ms() <= start {
            std::thread::yield_now();
        }
    }

    fn put(db: &PartitionDb, key: &str, value: &str, offset: u64) {
        let w = WriteRef {
            store: 0,
            key: key.as_bytes(),
            value: Some(value.as_bytes()),
        };
        db.commit(
            [w],
            &[(
                "cl/counts/0".to_string(),
                Some(offset.to_be_bytes().to_vec()),
            )],
        )
        .unwrap();
    }

    /// A new directory with a store of `retain` checkpoints and the database of partition
    /// `wc-0` of pipeline `wc` (store `counts`) in it.
    type Fixture = (
        tempfile::TempDir,
        StateEnv,
        CheckpointStore,
        Vec<String>,
        PartitionRef,
        PartitionDb,
    );

    fn fixture(retain: usize) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let env = StateEnv::new(32 << 20);
        let root = dir.path().join("store");
        let store = CheckpointStore::open(root.to_str().unwrap(), retain).unwrap();
        let stores = vec!["counts".to_string()];
        let p = PartitionRef::new("wc", 7, "wc-0", [0, 2]);
        let db = env.open_partition(&dir.path().join("db"), &stores).unwrap();
        (dir, env, store, stores, p, db)
    }

    /// The newest checkpoint of `p` restored into `target`, and opened.
    fn restore_newest(
        store: &CheckpointStore,
        env: &StateEnv,
        p: &PartitionRef,
        stores: &[String],
        target: &Path,
    ) -> (Restored, PartitionDb) {
        let r = store.restore(p, stores, target).unwrap().unwrap();
        (r, env.open_partition(target, stores).unwrap())
    }

    #[test]
    fn a_checkpoint_restores_into_a_new_directory_and_a_purge_deletes_every_file() {
        let (dir, env, store, stores, p, db) = fixture(2);
        put(&db, "a", "1", 10);
        let first = store.take(&db, &p, "h").unwrap();
        assert_eq!((first.seq, first.files_reused), (1, 0));
        put(&db, "b", "2", 11);
        let second = store.take(&db, &p, "h").unwrap();
        assert_eq!(second.seq, 2);
        assert!(second.files_reused > 0, "{second:?}");
        let m = store.manifests(&p).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[1].changelog_offsets.get("counts/0"), Some(&11));

        let (r, copy) = restore_newest(&store, &env, &p, &stores, &dir.path().join("restored"));
        assert_eq!(r.seq, 2);
        assert_eq!(copy.get(0, b"a").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(copy.get(0, b"b").unwrap().as_deref(), Some(&b"2"[..]));
        assert_eq!(copy.get_meta_u64("cl/counts/0").unwrap(), Some(11));
        // Another pipeline's partition of the same name has none.
        let other = PartitionRef::new("wc", 8, "wc-0", [0, 2]);
        assert!(
            store
                .restore(&other, &stores, &dir.path().join("x"))
                .unwrap()
                .is_none()
        );

        store.delete_pipeline("wc", 7).unwrap();
        assert!(store.manifests(&p).unwrap().is_empty());
        let left: Vec<_> = walk(&dir.path().join("store"));
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_checkpoint_that_holds_the_write_ahead_log_restores_what_its_memtables_held() {
        let (dir, env, store, stores, p, db) = fixture(3);
        assert!(
            !db.flush_would_wait(),
            "an idle database has nothing to wait for"
        );
        put(&db, "a", "1", 10);
        let first = store.take(&db, &p, "h").unwrap();
        assert_eq!(first.wal_bytes, 0, "{first:?}");
        put(&db, "b", "2", 11);
        db.force_wal_checkpoints();
        let second = store.take(&db, &p, "h").unwrap();
        assert!(second.wal_bytes > 0, "{second:?}");
        assert!(
            second.files_reused > 0,
            "the first one's SST files: {second:?}"
        );
        // Written after it: not in it.
        put(&db, "c", "3", 12);

        let (r, copy) = restore_newest(&store, &env, &p, &stores, &dir.path().join("restored"));
        assert_eq!(r.seq, 2);
        assert_eq!(copy.get(0, b"a").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(copy.get(0, b"b").unwrap().as_deref(), Some(&b"2"[..]));
        assert_eq!(copy.get(0, b"c").unwrap(), None);
        assert_eq!(copy.get_meta_u64("cl/counts/0").unwrap(), Some(11));
        assert_eq!(
            store.manifests(&p).unwrap()[1].changelog_offsets["counts/0"],
            11
        );
        // The restored copy checkpoints on, its first checkpoint reusing what it restored.
        put(&copy, "d", "4", 13);
        let third = store.take(&copy, &p, "h").unwrap();
        assert!(third.files_reused > 0, "{third:?}");
        drop(copy);
        let (_, copy) = restore_newest(&store, &env, &p, &stores, &dir.path().join("again"));
        for (k, v) in [("a", "1"), ("b", "2"), ("d", "4")] {
            assert_eq!(
                copy.get(0, k.as_bytes()).unwrap().as_deref(),
                Some(v.as_bytes()),
                "{k}"
            );
        }
        assert_eq!(copy.get_meta_u64("cl/counts/0").unwrap(), Some(13));
    }

    #[test]
    fn what_compactions_wrote_is_uploaded_ahead_once_and_counted_in_the_next_checkpoint() {
        let (dir, env, store, stores, p, db) = fixture(2);
        let store = store.copying();
        let root = dir.path().join("store");
        let fill = |version: u64| {
            for i in 0..2000u64 {
                put(
                    &db,
                    &format!("key-{i:05}"),
                    &format!("v{version}-{i}"),
                    version * 10_000 + i,
                );
            }
        };
        fill(1);
        db.compact_all().unwrap();
        assert_eq!(
            store.upload_ahead(&db, &p).unwrap(),
            0,
            "not listed before a checkpoint"
        );
        let first = store.take(&db, &p, "h").unwrap();
        assert!(first.uploaded_bytes > 0);
        assert_eq!(
            store.upload_ahead(&db, &p).unwrap(),
            0,
            "all of it is in the checkpoint"
        );
        let objects = |m: &Manifest| -> HashMap<String, u64> {
            m.files.iter().map(|f| (f.object.clone(), f.size)).collect()
        };

        // A compaction rewrites every file; they go ahead, once.
        fill(2);
        db.compact_all().unwrap();
        let ahead = store.upload_ahead(&db, &p).unwrap();
        assert!(ahead > 0);
        assert_eq!(
            store.upload_ahead(&db, &p).unwrap(),
            0,
            "each file goes ahead once"
        );
        let second = store.take(&db, &p, "h").unwrap();
        let m = store.manifests(&p).unwrap();
        let (m1, m2) = (objects(&m[0]), objects(&m[1]));
        let new: u64 = m2
            .iter()
            .filter(|(o, _)| !m1.contains_key(*o))
            .map(|(_, s)| s)
            .sum();
        // What went ahead counts here, and nothing was uploaded twice.
        assert_eq!(second.uploaded_bytes, new, "{second:?}");
        assert!(second.uploaded_bytes >= ahead);

        // Files that go ahead and are compacted away before the next checkpoint count in it
        // too, and garbage collection deletes them once every retained checkpoint is newer.
        fill(3);
        db.compact_all().unwrap();
        let wasted = store.upload_ahead(&db, &p).unwrap();
        let went_ahead: std::collections::HashSet<String> = db
            .sst_levels()
            .into_iter()
            .filter(|(_, level)| *level > 0)
            .map(|(name, _)| name)
            .collect();
        fill(4);
        db.compact_all().unwrap();
        let third = store.take(&db, &p, "h").unwrap();
        let last = store.manifests(&p).unwrap().pop().unwrap();
        let fresh: u64 = last
            .files
            .iter()
            .filter(|f| !m2.contains_key(&f.object) && !went_ahead.contains(&f.name))
            .map(|f| f.size)
            .sum();
        assert_eq!(third.uploaded_bytes, wasted + fresh, "{third:?}");
        let orphans: Vec<String> = went_ahead
            .iter()
            .filter(|n| !last.files.iter().any(|f| &f.name == *n))
            .cloned()
            .collect();
        assert!(
            !orphans.is_empty(),
            "the compaction rewrote what went ahead"
        );
        let in_store = |name: &str| {
            walk(&root)
                .iter()
                .any(|f| f.to_string_lossy().ends_with(name))
        };
        assert!(
            orphans.iter().all(|n| in_store(n)),
            "kept while a checkpoint may name them"
        );
        for v in 5..8 {
            next_ms();
            put(&db, "extra", &format!("{v}"), v * 10_000);
            store.take(&db, &p, "h").unwrap();
        }
        let left: Vec<&String> = orphans.iter().filter(|n| in_store(n)).collect();
        assert!(left.is_empty(), "garbage collection left {left:?}");

        let (_, copy) = restore_newest(&store, &env, &p, &stores, &dir.path().join("restored"));
        for i in [0u64, 999, 1999] {
            let v = copy.get(0, format!("key-{i:05}").as_bytes()).unwrap();
            assert_eq!(v.as_deref(), Some(format!("v4-{i}").as_bytes()));
        }
    }

    #[test]
    fn a_partition_back_on_a_host_checkpoints_after_what_another_host_took_meanwhile() {
        let (dir, env, store, stores, p, db) = fixture(2);
        let store = store.copying();
        let root = dir.path().join("store");
        let pause = next_ms;
        // Host a checkpoints, then uploads a compaction's files ahead.
        put(&db, "a", "1", 10);
        store.take(&db, &p, "a").unwrap();
        put(&db, "a", "2", 11);
        db.compact_all().unwrap();
        assert!(store.upload_ahead(&db, &p).unwrap() > 0);
        // The partition runs on host b, which takes two checkpoints: with 2 retained, its
        // garbage collection deletes what host a uploaded.
        pause();
        let other = CheckpointStore::open(root.to_str().unwrap(), 2)
            .unwrap()
            .copying();
        let b = env
            .open_partition(&dir.path().join("db-b"), &stores)
            .unwrap();
        for (value, offset) in [("b1", 20), ("b2", 21)] {
            put(&b, "b", value, offset);
            other.take(&b, &p, "b").unwrap();
            pause();
        }
        // Back on host a (its directory kept): it checkpoints after b's, every file there.
        store.forget(&p);
        put(&db, "a", "3", 30);
        let back = store.take(&db, &p, "a").unwrap();
        assert_eq!(back.seq, 4, "{back:?}");
        let (r, copy) = restore_newest(&store, &env, &p, &stores, &dir.path().join("restored"));
        assert_eq!((r.seq, r.skipped.len()), (4, 0), "{r:?}");
        assert_eq!(copy.get(0, b"a").unwrap().as_deref(), Some(&b"3"[..]));
        assert_eq!(copy.get_meta_u64("cl/counts/0").unwrap(), Some(30));
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                out.extend(walk(&e.path()));
            } else {
                out.push(e.path());
            }
        }
        out
    }
}
