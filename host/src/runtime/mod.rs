//! The WebAssembly runtime: one wasmtime engine per host, module validation against the
//! `baton:processor` world, a compiled-code cache on disk, and instances with limits.

pub mod bindings;
pub mod host;
pub mod native;
pub mod stderr;

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, Store};

use bindings::{Processor, ProcessorPre, baton::processor::types};
pub use host::{Cursor, GuestLog, HostCtx, Output, OutputTopic, WriteLimits};
pub use native::{NativeFactory, NativeModule, NativeProcessor, NativeStore};

/// The WIT package this host speaks.
pub const WIT_PACKAGE: &str = "baton:processor";
/// Its version.
pub const WIT_VERSION: &str = "0.1.0";

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
    /// Built against another major version of the contract.
    #[error(
        "the component was built for {WIT_PACKAGE}@{found}, but this host speaks {WIT_PACKAGE}@{WIT_VERSION}; \
         rebuild it against baton-sdk for {WIT_VERSION}"
    )]
    IncompatibleVersion {
        /// The version the component names.
        found: String,
    },
    /// The component targets another world.
    #[error("the component does not fit the {WIT_PACKAGE}/processor@{WIT_VERSION} world: {0}")]
    WrongWorld(String),
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
    Wasm(ProcessorPre<HostCtx>),
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
}

/// One engine, one linker, the compiled-code cache, and the epoch ticker.
pub struct Runtime {
    engine: Engine,
    linker: Linker<HostCtx>,
    cache_dir: PathBuf,
    engine_hash: String,
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
        Processor::add_to_linker::<HostCtx, wasmtime::component::HasSelf<HostCtx>>(
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
        }))
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
        self.check_version(&component)?;
        let instance_pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| ModuleError::WrongWorld(format!("{e:#}")))?;
        let pre = ProcessorPre::new(instance_pre)
            .map_err(|e| ModuleError::WrongWorld(format!("{e:#}")))?;
        Ok(Module {
            sha256,
            size: bytes.len(),
            code: Code::Wasm(pre),
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
        tracing::info!(
            sha256,
            ms = started.elapsed().as_millis() as u64,
            "compiled component"
        );
        let code = component
            .serialize()
            .map_err(|e| ModuleError::Cache(format!("{e:#}")))?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, code)
            .and_then(|_| std::fs::rename(&tmp, &path))
            .map_err(|e| ModuleError::Cache(format!("{}: {e}", path.display())))?;
        Ok(component)
    }

    fn check_version(&self, component: &Component) -> Result<(), ModuleError> {
        let ty = component.component_type();
        let names = ty
            .imports(&self.engine)
            .map(|(n, _)| n.to_string())
            .chain(ty.exports(&self.engine).map(|(n, _)| n.to_string()));
        let prefix = format!("{WIT_PACKAGE}/");
        for name in names {
            if let Some(rest) = name.strip_prefix(&prefix) {
                let version = rest.split_once('@').map(|(_, v)| v).unwrap_or("");
                if !semver_compatible(version, WIT_VERSION) {
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
        Ok(())
    }

    /// A fresh instance of `module` over `ctx`.
    pub fn instantiate(&self, module: &Module, ctx: HostCtx) -> anyhow::Result<Instance> {
        let pre = match &module.code {
            Code::Wasm(pre) => pre,
            Code::Native(factory) => {
                return Ok(Instance {
                    inner: Inner::Native(Box::new(ctx), factory()),
                });
            }
        };
        let mut store = Store::new(&self.engine, ctx);
        store.limiter(|c| c.limiter());
        store.set_epoch_deadline(u64::MAX / 2);
        let processor = pre.instantiate(&mut store)?;
        Ok(Instance {
            inner: Inner::Wasm(store, processor),
        })
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
    Wasm(Store<HostCtx>, Processor),
    Native(Box<HostCtx>, Box<dyn NativeProcessor>),
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

/// A readable form of a guest error.
pub fn describe(e: &types::Error) -> String {
    match e {
        types::Error::NoSuchStore(s) => format!("no-such-store: {s}"),
        types::Error::NoSuchTopic(s) => format!("no-such-topic: {s}"),
        types::Error::InvalidValue(s) => format!("invalid-value: {s}"),
        types::Error::InvalidInput(s) => format!("invalid-input: {s}"),
        types::Error::Other(s) => s.clone(),
    }
}

pub use types::{Header, Message};

impl Instance {
    /// The host context.
    pub fn ctx(&mut self) -> &mut HostCtx {
        match &mut self.inner {
            Inner::Wasm(store, _) => store.data_mut(),
            Inner::Native(ctx, _) => ctx,
        }
    }

    /// Calls `init` with the pipeline config.
    pub fn init(&mut self, config: &[(String, String)]) -> Result<(), CallError> {
        let (store, processor) = match &mut self.inner {
            Inner::Wasm(store, processor) => (store, processor),
            Inner::Native(ctx, p) => return p.init(ctx, config).map_err(CallError::Guest),
        };
        store.set_epoch_deadline(u64::MAX / 2);
        match processor
            .baton_processor_handler()
            .call_init(&mut *store, config)
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(CallError::Guest(describe(&e))),
            Err(t) => Err(CallError::Trap(self.trap_message(t))),
        }
    }

    /// A one-line account of a trap: its kind and what the guest wrote to stderr (e.g. a panic).
    fn trap_message(&self, t: wasmtime::Error) -> String {
        let what = match t.downcast_ref::<wasmtime::Trap>() {
            Some(wasmtime::Trap::Interrupt) => "CPU time limit per call exceeded".to_string(),
            Some(trap) => trap.to_string(),
            None => format!("{t:#}")
                .lines()
                .next()
                .unwrap_or_default()
                .to_string(),
        };
        let tail = match &self.inner {
            Inner::Wasm(store, _) => store.data().stderr_tail(),
            Inner::Native(ctx, _) => ctx.stderr_tail(),
        };
        if tail.is_empty() {
            what
        } else {
            format!("{what}; guest stderr: {tail}")
        }
    }

    /// Calls `process` on one slot's records with a CPU budget of `ticks` epoch ticks.
    pub fn process(&mut self, batch: &[Message], ticks: u64) -> Result<(), CallError> {
        let (store, processor) = match &mut self.inner {
            Inner::Wasm(store, processor) => (store, processor),
            Inner::Native(ctx, p) => return p.process(ctx, batch).map_err(CallError::Guest),
        };
        store.set_epoch_deadline(ticks);
        match processor
            .baton_processor_handler()
            .call_process(&mut *store, batch)
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(CallError::Guest(describe(&e))),
            Err(t) => Err(CallError::Trap(self.trap_message(t))),
        }
    }

    /// Gives back the host context, ending the instance.
    pub fn into_ctx(self) -> HostCtx {
        match self.inner {
            Inner::Wasm(store, _) => store.into_data(),
            Inner::Native(ctx, _) => *ctx,
        }
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
        assert!(!semver_compatible("", "0.1.0"));
        assert!(semver_compatible("1.3.0", "1.0.0"));
    }
}
