//! The WebAssembly runtime: one wasmtime engine per host, module validation against the
//! `baton:processor` world, a compiled-code cache on disk, and instances with limits.

pub mod bindings;
pub mod host;
pub mod limits;
pub mod native;
pub mod sandbox;
pub mod stderr;
pub mod time;

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, Store};

use bindings::{v0_1, v0_2};
pub use host::{Cursor, GuestError, GuestLog, HostCtx, Output, OutputTopic, WriteLimits};
pub use native::{NativeFactory, NativeModule, NativeProcessor, NativeStore};

/// The WIT package this host speaks.
pub const WIT_PACKAGE: &str = "baton:processor";
/// The version of it that `baton-sdk` builds for (`wit/`).
pub const WIT_VERSION: &str = "0.2.0";
/// Every version this host serves, newest first; a component may be built for any `0.x` of one.
pub const WIT_VERSIONS: [&str; 2] = ["0.2.0", "0.1.0"];

/// How often the engine's epoch advances; CPU limits are counted in these ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Why a module was refused.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// The bytes are not WebAssembly at all.
    #[error("not a WebAssembly component: the upload does not start with the `\\0asm` magic bytes")]
    NotWasm,
    /// A core module instead of a component.
    #[error(
        "this is a core WebAssembly module, not a component; build for the `wasm32-wasip2` target \
         (or wrap it with `wasm-tools component new`)"
    )]
    CoreModule,
    /// The component does not validate or compile.
    #[error("invalid component: {0}")]
    Invalid(String),
    /// Built against a version of the contract this host does not serve.
    #[error(
        "the component was built for {WIT_PACKAGE}@{found}, but this host speaks {WIT_PACKAGE}@0.1.x \
         and @0.2.x; rebuild it against baton-sdk for {WIT_VERSION}"
    )]
    IncompatibleVersion {
        /// The version the component names.
        found: String,
    },
    /// The component targets another world.
    #[error("the component does not fit the {WIT_PACKAGE}/processor@{version} world: {why}")]
    WrongWorld {
        /// The contract version it was checked against.
        version: &'static str,
        /// What does not fit.
        why: String,
    },
    /// The compiled-code cache could not be written.
    #[error("compiled-code cache: {0}")]
    Cache(String),
}

/// A validated, compiled processor module.
#[derive(Clone)]
pub struct Module {
    /// Hex sha256 of the component bytes (`native:<name>@<version>` for a native module).
    pub sha256: String,
    /// Size of the component in bytes (0 for a native module).
    pub size: usize,
    code: Code,
}

#[derive(Clone)]
enum Code {
    V0_1(v0_1::ProcessorPre<HostCtx>),
    V0_2(v0_2::ProcessorPre<HostCtx>),
    Native(NativeFactory),
}

impl Module {
    /// A module of processors linked into the host.
    pub fn native(m: &NativeModule) -> Self {
        Module {
            sha256: m.address(),
            size: 0,
            code: Code::Native(m.factory.clone()),
        }
    }

    /// The contract the module speaks, e.g. `baton:processor@0.2.0` (native modules speak the
    /// newest).
    pub fn wit(&self) -> String {
        let version = match self.code {
            Code::V0_1(_) => "0.1.0",
            Code::V0_2(_) | Code::Native(_) => "0.2.0",
        };
        format!("{WIT_PACKAGE}@{version}")
    }
}

/// One engine, one linker, the compiled-code cache, and the epoch ticker.
pub struct Runtime {
    engine: Engine,
    linker: Linker<HostCtx>,
    cache_dir: PathBuf,
    engine_hash: String,
    /// Components compiled to native code (not found in the cache), and the time it took.
    compiles: std::sync::atomic::AtomicU64,
    compile_us: std::sync::atomic::AtomicU64,
}

/// The hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl Runtime {
    /// A runtime whose compiled code is cached under `cache_dir`.
    pub fn new(cache_dir: PathBuf) -> anyhow::Result<Arc<Self>> {
        let mut cfg = Config::new();
        cfg.wasm_component_model(true);
        cfg.epoch_interruption(true);
        cfg.cranelift_opt_level(wasmtime::OptLevel::Speed);
        let engine = Engine::new(&cfg)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
        v0_1::Processor::add_to_linker::<HostCtx, wasmtime::component::HasSelf<HostCtx>>(
            &mut linker,
            |s| s,
        )?;
        v0_2::Processor::add_to_linker::<HostCtx, wasmtime::component::HasSelf<HostCtx>>(
            &mut linker,
            |s| s,
        )?;
        std::fs::create_dir_all(&cache_dir)?;
        let mut h = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        let engine_hash = format!("{:016x}", h.finish());
        let weak = engine.weak();
        std::thread::Builder::new()
            .name("baton-epoch".into())
            .spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(EPOCH_TICK);
                }
            })?;
        Ok(Arc::new(Runtime {
            engine,
            linker,
            cache_dir,
            engine_hash,
            compiles: Default::default(),
            compile_us: Default::default(),
        }))
    }

    /// How many components this runtime compiled (not found in its cache), and the seconds it
    /// spent compiling them.
    pub fn compiles(&self) -> (u64, f64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.compiles.load(Relaxed),
            self.compile_us.load(Relaxed) as f64 / 1e6,
        )
    }

    /// Checks that `bytes` are a component of the processor world in a compatible version.
    /// Cheap checks first, then compilation (cached by content hash).
    pub fn load(&self, bytes: &[u8]) -> Result<Module, ModuleError> {
        if bytes.len() < 8 || &bytes[0..4] != b"\0asm" {
            return Err(ModuleError::NotWasm);
        }
        // Core modules have version 1 in bytes 4..8; components use layer 1 in bytes 6..8.
        if bytes[4..8] == [1, 0, 0, 0] {
            return Err(ModuleError::CoreModule);
        }
        let sha256 = sha256_hex(bytes);
        let component = self.compile_cached(&sha256, bytes)?;
        let version = self.check_version(&component)?;
        let wrong = |e: wasmtime::Error| ModuleError::WrongWorld {
            version,
            why: format!("{e:#}"),
        };
        let instance_pre = self.linker.instantiate_pre(&component).map_err(wrong)?;
        let code = if version == "0.1.0" {
            Code::V0_1(v0_1::ProcessorPre::new(instance_pre).map_err(wrong)?)
        } else {
            Code::V0_2(v0_2::ProcessorPre::new(instance_pre).map_err(wrong)?)
        };
        Ok(Module {
            sha256,
            size: bytes.len(),
            code,
        })
    }

    fn compile_cached(&self, sha256: &str, bytes: &[u8]) -> Result<Component, ModuleError> {
        let path = self
            .cache_dir
            .join(format!("{sha256}-{}.cwasm", self.engine_hash));
        if path.exists() {
            // SAFETY: the file was written by `Component::serialize` of an engine with the same
            // compatibility hash (it is in the name), in the host's own data directory.
            #[allow(unsafe_code)]
            match unsafe { Component::deserialize_file(&self.engine, &path) } {
                Ok(c) => return Ok(c),
                Err(e) => {
                    tracing::warn!(path = %path.display(), "recompiling: cached code unusable: {e:#}")
                }
            }
        }
        let started = std::time::Instant::now();
        let component = Component::new(&self.engine, bytes)
            .map_err(|e| ModuleError::Invalid(format!("{e:#}")))?;
        let took = started.elapsed();
        self.compiles
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.compile_us.fetch_add(
            took.as_micros() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        tracing::info!(
            sha256,
            ms = took.as_millis() as u64,
            size = bytes.len(),
            "compiled component"
        );
        let code = component
            .serialize()
            .map_err(|e| ModuleError::Cache(format!("{e:#}")))?;
        // Several processes may share a cache (`baton test-plugin`): each writes its own file
        // and renames it into place, so a reader never sees a partial one.
        let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
        std::fs::write(&tmp, code)
            .and_then(|_| std::fs::rename(&tmp, &path))
            .map_err(|e| ModuleError::Cache(format!("{}: {e}", path.display())))?;
        Ok(component)
    }

    /// The contract version the component was built for, one of [`WIT_VERSIONS`]: every name
    /// of the package it imports or exports must be of a version compatible with the same one.
    /// A component that names none is checked against the newest (and fails to fit it).
    fn check_version(&self, component: &Component) -> Result<&'static str, ModuleError> {
        let ty = component.component_type();
        let names = ty
            .imports(&self.engine)
            .map(|(n, _)| n.to_string())
            .chain(ty.exports(&self.engine).map(|(n, _)| n.to_string()));
        let prefix = format!("{WIT_PACKAGE}/");
        let mut chosen: Option<&'static str> = None;
        for name in names {
            let Some(rest) = name.strip_prefix(&prefix) else {
                continue;
            };
            let version = rest.split_once('@').map(|(_, v)| v).unwrap_or("");
            let fits = WIT_VERSIONS
                .into_iter()
                .find(|want| semver_compatible(version, want));
            match (fits, chosen) {
                (Some(v), None) => chosen = Some(v),
                (Some(v), Some(c)) if v == c => {}
                _ => {
                    return Err(ModuleError::IncompatibleVersion {
                        found: if version.is_empty() {
                            "(no version)".into()
                        } else {
                            version.into()
                        },
                    });
                }
            }
        }
        Ok(chosen.unwrap_or(WIT_VERSION))
    }

    /// A fresh instance of `module` over `ctx`.
    pub fn instantiate(&self, module: &Module, ctx: HostCtx) -> anyhow::Result<Instance> {
        let new_store = |ctx| {
            let mut store = Store::new(&self.engine, ctx);
            store.limiter(|c: &mut HostCtx| c.limiter());
            store.set_epoch_deadline(u64::MAX / 2);
            store
        };
        let inner = match &module.code {
            Code::Native(factory) => Inner::Native(Box::new(ctx), factory()),
            Code::V0_1(pre) => {
                let mut store = new_store(ctx);
                let p = pre.instantiate(&mut store)?;
                Inner::V0_1(store, p)
            }
            Code::V0_2(pre) => {
                let mut store = new_store(ctx);
                let p = pre.instantiate(&mut store)?;
                Inner::V0_2(store, p, Box::default())
            }
        };
        Ok(Instance { inner })
    }
}

/// `found` can be used where `want` is expected: same major, or for 0.x the same minor.
fn semver_compatible(found: &str, want: &str) -> bool {
    let parse = |v: &str| -> Option<(u64, u64)> {
        let mut it = v.split(['.', '-', '+']);
        Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
    };
    match (parse(found), parse(want)) {
        (Some((fa, fb)), Some((wa, wb))) => fa == wa && (fa != 0 || fb == wb),
        _ => false,
    }
}

/// An instance of a processor, with its store.
pub struct Instance {
    inner: Inner,
}

enum Inner {
    V0_1(Store<HostCtx>, v0_1::Processor),
    V0_2(Store<HostCtx>, v0_2::Processor, Box<BatchBuffer>),
    Native(Box<HostCtx>, Box<dyn NativeProcessor>),
}

/// The batch of contract 0.2, kept between calls so that its buffers are reused.
struct BatchBuffer(v0_2::baton::processor::types::Batch);

impl Default for BatchBuffer {
    fn default() -> Self {
        BatchBuffer(v0_2::baton::processor::types::Batch {
            topic: String::new(),
            slot: 0,
            event_time: -1,
            data: Vec::new(),
            records: Vec::new(),
            headers: Vec::new(),
        })
    }
}

/// A word of a batch's tables for `len` bytes from `start`.
fn span_word(start: usize, len: usize) -> u64 {
    ((start as u64) << 32) | len as u64
}

/// The word of a missing key or value.
const NONE_WORD: u64 = u64::MAX;

impl BatchBuffer {
    /// Lays `msgs` (one slot's records) out as one data buffer and two tables of words (see
    /// `batch` in `wit/types.wit`).
    fn fill(&mut self, msgs: &[Message], event_time: i64) {
        let b = &mut self.0;
        b.data.clear();
        b.records.clear();
        b.headers.clear();
        b.event_time = event_time;
        let Some(first) = msgs.first() else {
            return;
        };
        if b.topic != first.topic {
            b.topic.clone_from(&first.topic);
        }
        b.slot = first.slot;
        b.records.reserve(msgs.len() * 5);
        let data = &mut b.data;
        let mut put = |bytes: &[u8]| {
            let start = data.len();
            data.extend_from_slice(bytes);
            span_word(start, bytes.len())
        };
        for m in msgs {
            let key = m.key.as_deref().map_or(NONE_WORD, &mut put);
            let value = m.value.as_deref().map_or(NONE_WORD, &mut put);
            let first_header = b.headers.len() / 2;
            for h in &m.headers {
                let name = put(h.key.as_bytes());
                let value = put(&h.value);
                b.headers.extend([name, value]);
            }
            b.records.extend([
                m.offset,
                m.timestamp as u64,
                key,
                value,
                span_word(first_header, m.headers.len()),
            ]);
        }
    }
}

/// How a guest call ended, when it did not succeed.
#[derive(Debug, Clone)]
pub enum CallError {
    /// The guest returned an error.
    Guest(String),
    /// The guest trapped (or hit a limit); the instance must be replaced.
    Trap(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Guest(e) => write!(f, "processor error: {e}"),
            CallError::Trap(e) => write!(f, "processor trapped: {e}"),
        }
    }
}

/// The host's record type: contract 0.1's `message`, which the partition loop builds and
/// contract 0.2 lays out as a batch.
pub use v0_1::baton::processor::types::{Header, Message};

/// The result of a guest call, in the host's terms.
fn outcome<E: Into<GuestError>>(
    r: wasmtime::Result<Result<(), E>>,
    trap: impl FnOnce(wasmtime::Error) -> String,
) -> Result<(), CallError> {
    match r {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(CallError::Guest(e.into().to_string())),
        Err(t) => Err(CallError::Trap(trap(t))),
    }
}

impl Instance {
    /// The host context.
    pub fn ctx(&mut self) -> &mut HostCtx {
        match &mut self.inner {
            Inner::V0_1(store, _) | Inner::V0_2(store, ..) => store.data_mut(),
            Inner::Native(ctx, _) => ctx,
        }
    }

    /// Calls `init` with the pipeline config.
    pub fn init(&mut self, config: &[(String, String)]) -> Result<(), CallError> {
        match &mut self.inner {
            Inner::Native(ctx, p) => p.init(ctx, config).map_err(CallError::Guest),
            Inner::V0_1(store, p) => {
                store.set_epoch_deadline(u64::MAX / 2);
                outcome(
                    p.baton_processor_handler().call_init(&mut *store, config),
                    |t| trap_message(store.data(), t),
                )
            }
            Inner::V0_2(store, p, _) => {
                store.set_epoch_deadline(u64::MAX / 2);
                outcome(
                    p.baton_processor_handler().call_init(&mut *store, config),
                    |t| trap_message(store.data(), t),
                )
            }
        }
    }

    /// Calls `process` on one slot's records with a CPU budget of `ticks` epoch ticks. The
    /// slot's event time moves up to the records' highest timestamp first, as a write of the
    /// call; the guest gets the event time before the batch and follows it record by record.
    pub fn process(&mut self, batch: &[Message], ticks: u64) -> Result<(), CallError> {
        let seen = batch.iter().map(|m| m.timestamp).max().unwrap_or(-1);
        let before = match self.ctx().advance_event_time(seen) {
            Ok(t) => t,
            Err(e) => return Err(CallError::Trap(format!("{e:#}"))),
        };
        match &mut self.inner {
            Inner::Native(ctx, p) => p.process(ctx, batch).map_err(CallError::Guest),
            Inner::V0_1(store, p) => {
                store.set_epoch_deadline(ticks);
                let r = p.baton_processor_handler().call_process(&mut *store, batch);
                outcome(r, |t| trap_message(store.data(), t))
            }
            Inner::V0_2(store, p, buf) => {
                buf.fill(batch, before);
                store.set_epoch_deadline(ticks);
                let r = p
                    .baton_processor_handler()
                    .call_process(&mut *store, &buf.0);
                outcome(r, |t| trap_message(store.data(), t))
            }
        }
    }

    /// Whether the module takes timers (contract 0.2). Timers of a slot whose module does not
    /// stay pending until one that does runs.
    pub fn takes_timers(&self) -> bool {
        matches!(self.inner, Inner::V0_2(..))
    }

    /// Calls `on-timers` with timers of the current call's slot that fell due.
    pub fn on_timers(&mut self, fired: &[time::DueTimer], ticks: u64) -> Result<(), CallError> {
        use v0_2::baton::processor::types::TimeKind;
        use v0_2::exports::baton::processor::handler::Fired;
        if let Err(e) = self.ctx().load_event_time() {
            return Err(CallError::Trap(format!("{e:#}")));
        }
        let Inner::V0_2(store, p, _) = &mut self.inner else {
            return Ok(());
        };
        let fired: Vec<Fired> = fired
            .iter()
            .map(|t| Fired {
                kind: match t.clock {
                    time::Clock::Event => TimeKind::EventTime,
                    time::Clock::Processing => TimeKind::ProcessingTime,
                },
                at: t.at,
                key: t.key.clone(),
                payload: t.payload.clone(),
            })
            .collect();
        let (slot, event_time) = (store.data().cursor.slot, store.data().event_time);
        store.set_epoch_deadline(ticks);
        let r = p
            .baton_processor_handler()
            .call_on_timers(&mut *store, slot, event_time, &fired);
        outcome(r, |t| trap_message(store.data(), t))
    }

    /// Gives back the host context, ending the instance.
    pub fn into_ctx(self) -> HostCtx {
        match self.inner {
            Inner::V0_1(store, _) | Inner::V0_2(store, ..) => store.into_data(),
            Inner::Native(ctx, _) => *ctx,
        }
    }
}

/// A one-line account of a trap: its kind and what the guest wrote to stderr (e.g. a panic).
fn trap_message(ctx: &HostCtx, t: wasmtime::Error) -> String {
    let what = match t.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::Interrupt) => "CPU time limit per call exceeded".to_string(),
        Some(trap) => trap.to_string(),
        None => format!("{t:#}")
            .lines()
            .next()
            .unwrap_or_default()
            .to_string(),
    };
    if let Some(bt) = t.downcast_ref::<wasmtime::WasmBacktrace>() {
        *ctx.last_backtrace.lock() = Some(format!("{bt}"));
    }
    let tail = ctx.stderr_tail();
    if tail.is_empty() {
        what
    } else {
        format!("{what}; guest stderr: {tail}")
    }
}

#[cfg(test)]
mod tests {
    use super::semver_compatible;

    #[test]
    fn versions() {
        assert!(semver_compatible("0.1.0", "0.1.0"));
        assert!(semver_compatible("0.1.7", "0.1.0"));
        assert!(!semver_compatible("0.2.0", "0.1.0"));
        assert!(semver_compatible("0.2.3", "0.2.0"));
        assert!(!semver_compatible("0.3.0", "0.2.0"));
        assert!(!semver_compatible("", "0.1.0"));
        assert!(semver_compatible("1.3.0", "1.0.0"));
    }
}
