//! A core WebAssembly module made into a processor component, for languages whose toolchains
//! build core modules (C with clang, Go with `GOOS=wasip1`): the WIT of
//! `baton:processor@0.2.0` is embedded (the world `processor`), and the module's WASI preview 1
//! imports, if any, are adapted to WASI 0.2 with Wasmtime's reactor adapter. A module that
//! exports `_initialize` (a Go reactor, a C library with constructors) has it run when the
//! component is instantiated.

use std::path::Path;

use wit_component::{ComponentEncoder, StringEncoding};
use wit_parser::Resolve;

/// The contract's WIT files, as this baton was built with them.
const WIT: &[(&str, &str)] = &[
    ("world.wit", include_str!("../../wit/world.wit")),
    ("handler.wit", include_str!("../../wit/handler.wit")),
    ("state.wit", include_str!("../../wit/state.wit")),
    ("timers.wit", include_str!("../../wit/timers.wit")),
    ("output.wit", include_str!("../../wit/output.wit")),
    ("log.wit", include_str!("../../wit/log.wit")),
    ("types.wit", include_str!("../../wit/types.wit")),
];

/// Writes the contract's WIT files into `dir` (the bindings generators of other languages
/// read them from there).
pub fn write_wit(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, text) in WIT {
        std::fs::write(dir.join(name), text)?;
    }
    Ok(())
}

/// The component of the core module `core`, over the world `processor` of the WIT in `wit`
/// (default: the contract this baton was built with).
pub fn componentize(core: &[u8], wit: Option<&Path>) -> Result<Vec<u8>, String> {
    let tmp;
    let dir = match wit {
        Some(d) => d,
        None => {
            tmp = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
            write_wit(tmp.path()).map_err(|e| format!("writing the WIT: {e}"))?;
            tmp.path()
        }
    };
    let mut resolve = Resolve::default();
    let (pkg, _) = resolve
        .push_dir(dir)
        .map_err(|e| format!("the WIT in {}: {e:#}", dir.display()))?;
    let world = resolve
        .select_world(&[pkg], Some("processor"))
        .map_err(|e| format!("the world `processor`: {e:#}"))?;
    let mut module = core.to_vec();
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        world,
        StringEncoding::UTF8,
        false,
    )
    .map_err(|e| format!("embedding the WIT: {e:#}"))?;
    ComponentEncoder::default()
        .validate(true)
        .module(&module)
        .and_then(|e| {
            e.adapter(
                "wasi_snapshot_preview1",
                wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
            )
        })
        .and_then(|e| e.encode())
        .map_err(|e| format!("making the component: {e:#}"))
}
