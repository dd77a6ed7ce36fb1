//! The module registry: uploads (validated, compiled, stored by content address, chunked into
//! `<cluster>.modules` on Kafka), listing and deletion, and the compiled modules this host
//! holds. A narrow handle: the log, the control log, the catalog and the runtime.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::control::log::ControlLog;
use crate::control::{Catalog, ControlEvent, ModuleDeletion, ModuleRecord, now_ms};
use crate::error::{Error, Result};
use crate::runtime::{Module, NativeModule, Runtime};
use crate::transport::{Log, Record};

/// Size of a module chunk: well under Kafka's default 1 MB message limit.
pub(crate) const MODULE_CHUNK: usize = 512 << 10;

/// Writes a file atomically: temp file, fsync, rename.
fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The modules of the cluster as this host knows them: registered versions (in the catalog),
/// their bytes (on disk by content address, and in the modules topic), and the compiled
/// modules loaded here, by content address.
pub struct Registry {
    /// `<data dir>/modules`: a module's bytes by content address.
    dir: PathBuf,
    log: Log,
    /// `<cluster>.modules`: module bytes in chunks keyed `<sha256>:<i>:<n>`.
    topic: String,
    runtime: Arc<Runtime>,
    catalog: Arc<Mutex<Catalog>>,
    control: Arc<ControlLog>,
    native: Vec<NativeModule>,
    /// Compiled modules loaded on this host, by content address.
    loaded: RwLock<BTreeMap<String, Module>>,
}

impl Registry {
    /// The registry over `dir` and `topic`; the host's native modules are loaded at once.
    pub fn new(
        dir: PathBuf,
        log: Log,
        topic: String,
        runtime: Arc<Runtime>,
        catalog: Arc<Mutex<Catalog>>,
        control: Arc<ControlLog>,
        native: Vec<NativeModule>,
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        let loaded = native
            .iter()
            .map(|m| (m.address(), Module::native(m)))
            .collect();
        Ok(Registry {
            dir,
            log,
            topic,
            runtime,
            catalog,
            control,
            native,
            loaded: RwLock::new(loaded),
        })
    }

    /// The compiled module with content address `sha256`, if it is loaded here.
    pub fn get(&self, sha256: &str) -> Option<Module> {
        self.loaded.read().get(sha256).cloned()
    }

    /// Whether the module with content address `sha256` is loaded here.
    pub fn is_loaded(&self, sha256: &str) -> bool {
        self.loaded.read().contains_key(sha256)
    }

    /// Loads the module of `m` here (from disk, or reassembled from the modules topic) unless
    /// it is loaded already.
    pub fn load(&self, m: &ModuleRecord) -> anyhow::Result<()> {
        if self.is_loaded(&m.sha256) {
            return Ok(());
        }
        let module = self
            .bytes(&m.sha256)
            .and_then(|b| self.runtime.load(&b).map_err(|e| anyhow::anyhow!("{e}")))
            .map_err(|e| anyhow::anyhow!("module {} {}: {e:#}", m.name, m.version))?;
        self.loaded.write().insert(m.sha256.clone(), module);
        Ok(())
    }

    fn path(&self, sha256: &str) -> PathBuf {
        self.dir.join(format!("{sha256}.wasm"))
    }

    /// The bytes of a module: the local copy, or (on Kafka) reassembled from `baton.modules`.
    pub fn bytes(&self, sha256: &str) -> anyhow::Result<Vec<u8>> {
        let path = self.path(sha256);
        if let Ok(bytes) = std::fs::read(&path) {
            return Ok(bytes);
        }
        let mut chunks: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
        let mut count = None;
        let end = self.log.end_offset(&self.topic, 0)?;
        let mut offset = 0;
        while offset < end {
            let records = self.log.read(&self.topic, 0, offset, 256)?;
            if records.is_empty() {
                break;
            }
            for r in records {
                offset = r.offset + 1;
                let key = String::from_utf8_lossy(r.record.key.as_deref().unwrap_or_default())
                    .into_owned();
                let mut parts = key.split(':');
                if parts.next() != Some(sha256) {
                    continue;
                }
                let (Some(i), Some(n)) = (
                    parts.next().and_then(|p| p.parse().ok()),
                    parts.next().and_then(|p| p.parse().ok()),
                ) else {
                    continue;
                };
                count = Some(n);
                chunks.insert(i, r.record.value.unwrap_or_default());
            }
        }
        let n: usize =
            count.ok_or_else(|| anyhow::anyhow!("module {sha256} is not in {}", self.topic))?;
        anyhow::ensure!(
            chunks.len() == n,
            "module {sha256}: {} of {n} chunks in {}",
            chunks.len(),
            self.topic
        );
        let bytes: Vec<u8> = chunks.into_values().flatten().collect();
        anyhow::ensure!(
            crate::runtime::sha256_hex(&bytes) == sha256,
            "module {sha256}: chunks do not match the hash"
        );
        write_file(&path, &bytes)?;
        Ok(bytes)
    }

    /// Validates a component against the world, stores it by content and registers
    /// `name`/`version`. Re-uploading identical bytes under the same name and version is a no-op.
    pub fn upload(&self, name: &str, version: &str, bytes: &[u8]) -> Result<ModuleRecord> {
        let ok = crate::control::names::is_dotted_name;
        if !ok(name) {
            return Err(Error::BadRequest(format!(
                "invalid module name `{name}`: use 1 to 64 ASCII letters, digits, '-', '_' and '.'"
            )));
        }
        if !ok(version) {
            return Err(Error::BadRequest(format!(
                "invalid version `{version}`: use 1 to 64 ASCII letters, digits, '-', '_' and '.'"
            )));
        }
        let module = self.runtime.load(bytes)?;
        let conflict = |catalog: &Catalog| -> Option<Result<ModuleRecord>> {
            let existing = catalog
                .modules
                .get(&(name.to_string(), version.to_string()))?;
            Some(if existing.sha256 == module.sha256 {
                Ok(existing.clone())
            } else {
                Err(Error::Conflict(format!(
                    "module {name} version {version} already exists with other content (sha256 {}); upload under a new version",
                    existing.sha256
                )))
            })
        };
        if let Some(answer) = conflict(&self.catalog.lock()) {
            return answer;
        }
        // The bytes are content-addressed, so storing them needs no lock: no partition or
        // other admin call waits behind the chunks' appends.
        let path = self.path(&module.sha256);
        if !path.exists() {
            write_file(&path, bytes)
                .map_err(|e| Error::Internal(format!("storing module: {e}")))?;
        }
        let known = self
            .catalog
            .lock()
            .modules
            .values()
            .any(|m| m.sha256 == module.sha256);
        if !known {
            // Every host of the cluster can fetch it from the log: no shared filesystem.
            let chunks: Vec<&[u8]> = bytes.chunks(MODULE_CHUNK).collect();
            let n = chunks.len();
            for (i, c) in chunks.into_iter().enumerate() {
                let r = Record {
                    key: Some(format!("{}:{i}:{n}", module.sha256).into_bytes()),
                    value: Some(c.to_vec()),
                    headers: vec![],
                    timestamp: now_ms(),
                };
                self.log.append(&self.topic, 0, std::slice::from_ref(&r))?;
            }
        }
        let record = ModuleRecord {
            name: name.to_string(),
            version: version.to_string(),
            sha256: module.sha256.clone(),
            size: module.size,
            wit: module.wit(),
            uploaded_at: now_ms(),
        };
        let _g = self.control.lock();
        if let Some(answer) = conflict(&self.catalog.lock()) {
            return answer;
        }
        // Compiled already: when the event is applied, here as on every host, it finds the
        // module loaded.
        self.loaded
            .write()
            .entry(module.sha256.clone())
            .or_insert_with(|| module.clone());
        self.control.commit(ControlEvent::Module(record.clone()))?;
        // Another host may have registered other content under this version first, in the log.
        match conflict(&self.catalog.lock()) {
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e),
            None => {
                return Err(Error::Internal(format!(
                    "module {name} version {version} was recorded but is not in the catalog"
                )));
            }
        }
        tracing::info!(name, version, sha256 = %record.sha256, "module registered");
        Ok(record)
    }

    /// Every module version.
    pub fn list(&self) -> Vec<ModuleRecord> {
        self.catalog.lock().modules.values().cloned().collect()
    }

    /// Deletes a module version; refused (409) while a pipeline runs it.
    pub fn delete(&self, name: &str, version: &str) -> Result<ModuleDeletion> {
        let _g = self.control.lock();
        {
            let catalog = self.catalog.lock();
            if !catalog
                .modules
                .contains_key(&(name.to_string(), version.to_string()))
            {
                return Err(Error::NotFound(format!(
                    "module `{name}` version `{version}` does not exist"
                )));
            }
            let users: Vec<&str> = catalog
                .pipelines
                .values()
                .filter(|p| p.spec.module == name && p.spec.version == version)
                .map(|p| p.spec.name.as_str())
                .collect();
            if !users.is_empty() {
                return Err(Error::Conflict(format!(
                    "module `{name}` version `{version}` is run by pipelines [{}]; swap them to \
                     another version or delete them first",
                    users.join(", ")
                )));
            }
        }
        let deletion = ModuleDeletion {
            name: name.to_string(),
            version: version.to_string(),
            at: now_ms(),
        };
        self.control
            .commit(ControlEvent::ModuleDeleted(deletion.clone()))?;
        Ok(deletion)
    }

    /// The content address of a module version (uploaded or native).
    pub fn address(&self, name: &str, version: &str) -> Option<String> {
        if let Some(m) = self
            .catalog
            .lock()
            .modules
            .get(&(name.to_string(), version.to_string()))
        {
            return Some(m.sha256.clone());
        }
        self.native
            .iter()
            .find(|m| m.name == name && m.version == version)
            .map(NativeModule::address)
    }
}
