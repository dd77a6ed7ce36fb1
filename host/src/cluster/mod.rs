//! The control plane: pipeline specs, the module registry and the partition table, recorded as
//! events in the control log (`<cluster>.control`, by default `baton.control`, one partition,
//! read from the start on every boot). The log's total order is the source of truth; the in-memory catalog is its replay.

pub mod pipeline;

pub use pipeline::{Guarantee, PipelineRecord, PipelineSpec, Start};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A module version in the registry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModuleRecord {
    /// Module name.
    pub name: String,
    /// Version label chosen by the uploader.
    pub version: String,
    /// Hex sha256 of the component bytes (the content address).
    pub sha256: String,
    /// Size in bytes.
    pub size: usize,
    /// The WIT package the component was validated against.
    pub wit: String,
    /// Upload time, milliseconds since the Unix epoch.
    pub uploaded_at: i64,
}

/// One record of the control log.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum ControlEvent {
    /// A module version was uploaded.
    Module(ModuleRecord),
    /// A pipeline was created.
    Pipeline(PipelineRecord),
    /// A pipeline switched module version.
    Swap(SwapRecord),
}

/// A pipeline's switch to another version of its module.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SwapRecord {
    /// The pipeline.
    pub pipeline: String,
    /// The version before.
    pub from: String,
    /// The version after.
    pub version: String,
    /// sha256 of the version after.
    pub sha256: String,
    /// When (ms since the epoch).
    pub at: i64,
    /// Set for an automatic rollback: why the version `from` was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_reason: Option<String>,
}

/// The replayed state of the control log.
#[derive(Debug, Default)]
pub struct Catalog {
    /// Modules by (name, version).
    pub modules: BTreeMap<(String, String), ModuleRecord>,
    /// Pipelines by name.
    pub pipelines: BTreeMap<String, PipelineRecord>,
}

impl Catalog {
    /// Applies one event.
    pub fn apply(&mut self, e: ControlEvent) {
        match e {
            ControlEvent::Module(m) => {
                self.modules.insert((m.name.clone(), m.version.clone()), m);
            }
            ControlEvent::Pipeline(p) => {
                self.pipelines.insert(p.spec.name.clone(), p);
            }
            ControlEvent::Swap(s) => {
                if let Some(p) = self.pipelines.get_mut(&s.pipeline) {
                    p.spec.version = s.version.clone();
                    p.sha256 = s.sha256.clone();
                    p.swaps.push(s);
                    let n = p.swaps.len();
                    if n > 20 {
                        p.swaps.drain(..n - 20);
                    }
                }
            }
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
