//! `GET /api/v1/openapi.json`: the OpenAPI 3.1 document of this API. Request and response
//! schemas are generated from the Rust types the handlers use (serde attributes included), so
//! they cannot drift from the code; the operations are listed once here.

use axum::Json;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value, json};

use super::pipelines::{ReplayBody, SwapBody};
use super::topics::{NewRecord, ReadOut, TopicInfo};
use crate::control::{
    DeadLetterReplay, ModuleDeletion, ModuleRecord, PipelineDeletion, PipelineSpec,
};
use crate::http::model::{
    Lookup, PartitionInfo, PipelineInfo, PipelinePatch, Produced, ScanPage, SwapResult,
};
use crate::partition::Event;

type Param = (&'static str, &'static str, bool, &'static str, &'static str);

const P_PIPELINE: Param = ("pipeline", "path", true, "Pipeline name.", "string");

/// One operation.
struct Op {
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    /// (name, where, required, description, type)
    params: &'static [Param],
    request: Option<(&'static str, Value)>,
    ok: (u16, &'static str, Option<Value>),
    errors: &'static [u16],
}

fn error_schema() -> Value {
    json!({
        "type": "object",
        "required": ["error", "status"],
        "properties": {
            "error": { "type": "string", "description": "What went wrong, naming the problem." },
            "status": { "type": "integer" }
        }
    })
}

fn ops(g: &mut SchemaGenerator) -> Vec<Op> {
    let mut s = |f: fn(&mut SchemaGenerator) -> schemars::Schema| f(g).to_value();
    let arr = |v: Value| json!({ "type": "array", "items": v });
    vec![
        Op {
            method: "get",
            path: "/healthz",
            summary: "Liveness.",
            params: &[],
            request: None,
            ok: (200, "application/json", Some(json!({"type": "object"}))),
            errors: &[],
        },
        Op {
            method: "get",
            path: "/api/v1/stream",
            summary: "The dashboard's live view of the whole cluster, as Server-Sent Events (`text/event-stream`). Each `snapshot` event's data is `{\"state\": {...}, \"events\": [...]}`. `state` replaces the last one: `host` (the answering host), `transport`, `token_required`, `hosts` (with their load and `memory`: the RocksDB bound, usage and block-cache hit rate), `partitions` (the rows of GET /api/v1/partitions, each with `records_per_s` over the last second and `rates`, a point a second over the last minute), `retired`, `splits`, `merges`, `pipelines`, `modules` and `balancer` (the controller's last 50 decisions). `events` holds the events of every host (guest logs, dead letters with their error, swaps and rollbacks; each with `host`, `pipeline`, and the topic, slot and offset of its record) that this client has not had. One snapshot is built at most 4 times a second per host, whatever the record rate, and a client gets at most 4 messages a second, only when something changed. The event id is `BOOT-N`: a client that reconnects with `Last-Event-ID` (or `?last_event_id=`, for a page that switched hosts) gets only the events it missed. Pages served by another host of the cluster may call this one (CORS for the cluster's hosts' origins).",
            params: &[(
                "last_event_id",
                "query",
                false,
                "The id of the last message seen, for a client that cannot send `Last-Event-ID`.",
                "string",
            )],
            request: None,
            ok: (200, "text/event-stream", Some(json!({"type": "string"}))),
            errors: &[400],
        },
        Op {
            method: "post",
            path: "/api/v1/auth/check",
            summary: "Checks the bearer token a client was given: 204 when it is right (or when the host runs without `--token`), 401 naming the problem when it is wrong or missing. Reads need no token; every call that changes something does.",
            params: &[],
            request: None,
            ok: (204, "application/json", None),
            errors: &[401],
        },
        Op {
            method: "get",
            path: "/readyz",
            summary: "Readiness: every partition running; 503 lists those that are not.",
            params: &[],
            request: None,
            ok: (200, "application/json", Some(json!({"type": "object"}))),
            errors: &[503],
        },
        Op {
            method: "get",
            path: "/metrics",
            summary: "Prometheus metrics per pipeline and partition.",
            params: &[],
            request: None,
            ok: (200, "text/plain", Some(json!({"type": "string"}))),
            errors: &[],
        },
        Op {
            method: "get",
            path: "/api/v1/openapi.json",
            summary: "This document.",
            params: &[],
            request: None,
            ok: (200, "application/json", Some(json!({"type": "object"}))),
            errors: &[],
        },
        Op {
            method: "get",
            path: "/api/v1/host",
            summary: "This host: transport, cluster, RocksDB memory and block-cache hit rate.",
            params: &[],
            request: None,
            ok: (200, "application/json", Some(json!({"type": "object"}))),
            errors: &[],
        },
        Op {
            method: "post",
            path: "/api/v1/modules",
            summary: "Uploads a component as name/version; it is validated before it is stored.",
            params: &[
                ("name", "query", true, "Module name.", "string"),
                ("version", "query", true, "Version label.", "string"),
            ],
            request: Some((
                "application/wasm",
                json!({"type": "string", "format": "binary"}),
            )),
            ok: (
                201,
                "application/json",
                Some(s(|g| g.subschema_for::<ModuleRecord>())),
            ),
            errors: &[400, 401, 409, 413, 422],
        },
        Op {
            method: "get",
            path: "/api/v1/modules",
            summary: "Every module version with its size, WIT version and upload time.",
            params: &[],
            request: None,
            ok: (
                200,
                "application/json",
                Some(arr(s(|g| g.subschema_for::<ModuleRecord>()))),
            ),
            errors: &[],
        },
        Op {
            method: "post",
            path: "/api/v1/pipelines",
            summary: "Creates a pipeline and starts its partitions.",
            params: &[],
            request: Some(("application/json", s(|g| g.subschema_for::<PipelineSpec>()))),
            ok: (
                201,
                "application/json",
                Some(s(|g| g.subschema_for::<PipelineInfo>())),
            ),
            errors: &[400, 401, 409, 413],
        },
        Op {
            method: "get",
            path: "/api/v1/pipelines",
            summary: "Every pipeline.",
            params: &[],
            request: None,
            ok: (
                200,
                "application/json",
                Some(arr(s(|g| g.subschema_for::<PipelineInfo>()))),
            ),
            errors: &[],
        },
        Op {
            method: "get",
            path: "/api/v1/pipelines/{pipeline}",
            summary: "One pipeline, with its swap history.",
            params: &[P_PIPELINE],
            request: None,
            ok: (
                200,
                "application/json",
                Some(s(|g| g.subschema_for::<PipelineInfo>())),
            ),
            errors: &[404],
        },
        Op {
            method: "put",
            path: "/api/v1/pipelines/{pipeline}/module",
            summary: "Hot swap (or rollback) to another version at every partition's next batch boundary.",
            params: &[P_PIPELINE],
            request: Some(("application/json", s(|g| g.subschema_for::<SwapBody>()))),
            ok: (
                200,
                "application/json",
                Some(s(|g| g.subschema_for::<SwapResult>())),
            ),
            errors: &[400, 401, 404, 409],
        },
        Op {
            method: "get",
            path: "/api/v1/pipelines/{pipeline}/events",
            summary: "Recent guest logs, errors, traps and swaps, with the record that caused each.",
            params: &[
                P_PIPELINE,
                (
                    "after",
                    "query",
                    false,
                    "Only events with a larger seq.",
                    "integer",
                ),
                (
                    "limit",
                    "query",
                    false,
                    "At most this many (1 to 1000, default 100).",
                    "integer",
                ),
            ],
            request: None,
            ok: (
                200,
                "application/json",
                Some(arr(s(|g| g.subschema_for::<Event>()))),
            ),
            errors: &[400, 404],
        },
        Op {
            method: "get",
            path: "/api/v1/pipelines/{pipeline}/stores/{store}/keys",
            summary: "Scans a store in (slot, key) order, a page at a time.",
            params: &[
                P_PIPELINE,
                ("store", "path", true, "Store name.", "string"),
                (
                    "prefix",
                    "query",
                    false,
                    "Only keys starting with this.",
                    "string",
                ),
                (
                    "limit",
                    "query",
                    false,
                    "Page size, 1 to 1000 (default 100).",
                    "integer",
                ),
                (
                    "cursor",
                    "query",
                    false,
                    "next_cursor of the previous page.",
                    "string",
                ),
                (
                    "slot",
                    "query",
                    false,
                    "Only this slot (a host asks the owner of a slot it does not own this way).",
                    "integer",
                ),
            ],
            request: None,
            ok: (
                200,
                "application/json",
                Some(s(|g| g.subschema_for::<ScanPage>())),
            ),
            errors: &[400, 404, 503],
        },
        Op {
            method: "get",
            path: "/api/v1/pipelines/{pipeline}/stores/{store}/keys/{key}",
            summary: "Looks up one key in every slot the pipeline's partitioner allows (murmur2 slot first); `matches` lists each slot holding it.",
            params: &[
                P_PIPELINE,
                ("store", "path", true, "Store name.", "string"),
                ("key", "path", true, "The key (UTF-8).", "string"),
                ("slot", "query", false, "Read only this slot.", "integer"),
            ],
            request: None,
            ok: (
                200,
                "application/json",
                Some(s(|g| g.subschema_for::<Lookup>())),
            ),
            errors: &[400, 404, 503],
        },
        Op {
            method: "post",
            path: "/api/v1/pipelines/{pipeline}/dead-letters/replay",
            summary: "Processes dead letters again through the pipeline's current version, exactly once: all of them ({}), or one slot's offset range ({slot, from?, to?}). Progress shows in the partitions' `replay`. 409 for a range that overlaps one replayed before.",
            params: &[P_PIPELINE],
            request: Some(("application/json", s(|g| g.subschema_for::<ReplayBody>()))),
            ok: (
                202,
                "application/json",
                Some(s(|g| g.subschema_for::<DeadLetterReplay>())),
            ),
            errors: &[400, 404, 409, 503],
        },
        Op {
            method: "patch",
            path: "/api/v1/pipelines/{pipeline}",
            summary: "Changes a running pipeline's limits, config, swap policy or WASI grants, at each partition's next batch boundary (as a swap). The new config must pass the module's init. 202 when a partition had not reached a batch boundary in time.",
            params: &[P_PIPELINE],
            request: Some((
                "application/json",
                s(|g| g.subschema_for::<PipelinePatch>()),
            )),
            ok: (
                200,
                "application/json",
                Some(s(|g| g.subschema_for::<PipelineInfo>())),
            ),
            errors: &[400, 404, 503],
        },
        Op {
            method: "delete",
            path: "/api/v1/pipelines/{pipeline}",
            summary: "Deletes a pipeline: stops its partitions on every host and records the deletion. With purge=true its changelogs, dead letters, consumer group and local state go too and the name is free again; without, the name stays taken.",
            params: &[
                P_PIPELINE,
                ("purge", "query", false, "Also delete its state.", "boolean"),
            ],
            request: None,
            ok: (
                200,
                "application/json",
                Some(s(|g| g.subschema_for::<PipelineDeletion>())),
            ),
            errors: &[400, 404, 409, 503],
        },
        Op {
            method: "delete",
            path: "/api/v1/modules/{name}/{version}",
            summary: "Deletes a module version; 409 naming the pipelines that still run it.",
            params: &[
                ("name", "path", true, "Module name.", "string"),
                ("version", "path", true, "Version label.", "string"),
            ],
            request: None,
            ok: (
                200,
                "application/json",
                Some(s(|g| g.subschema_for::<ModuleDeletion>())),
            ),
            errors: &[404, 409, 503],
        },
        Op {
            method: "get",
            path: "/api/v1/partitions",
            summary: "The partition table: slots, owner, state, offsets, lag, restore, swaps, moves. With `retired=true`: the partitions retired by splits instead, each with its last shape, owner and epoch, the split that retired it, the partitions that replaced it, and its moves.",
            params: &[(
                "retired",
                "query",
                false,
                "With true, the retired partitions.",
                "boolean",
            )],
            request: None,
            ok: (
                200,
                "application/json",
                Some(json!({"oneOf": [
                    arr(s(|g| g.subschema_for::<PartitionInfo>())),
                    arr(s(|g| g.subschema_for::<crate::control::RetiredPartition>())),
                ]})),
            ),
            errors: &[400],
        },
        Op {
            method: "get",
            path: "/api/v1/balancer/log",
            summary: "The auto-balancer's decisions, oldest first (answered by the controller; other hosts forward the call): each with its pipeline, action (split, move, merge), partitions, target host, reason (the numbers and the setting that decided it), inputs (every partition's records/s, guest CPU share, slots and owner), the hosts' loads, and its outcome. A pipeline is balanced when its spec's `balance.enabled` is true.",
            params: &[],
            request: None,
            ok: (
                200,
                "application/json",
                Some(arr(s(|g| {
                    g.subschema_for::<crate::cluster::balancer::Decision>()
                }))),
            ),
            errors: &[],
        },
        Op {
            method: "post",
            path: "/api/v1/partitions/merge",
            summary: "Merges two adjacent partitions of one pipeline (`left` and `right`, either order) into one while they run, on the owner of `left` (the call is forwarded there); a side on another host is first moved there, warm. The merge is recorded in the control log; the merged database is made from a hard-link checkpoint of the lower side, into which the upper side's slots are ingested (SST files, IngestExternalFile) from a checkpoint of it, with its clients and changelog reader ready; then both sides stop at a batch boundary with their final commits, the merged partition reads their last changelog records, and the merge is recorded done: both are retired and the merged partition (new id, epoch and transactional id) runs. The answer carries `merged`, `pause_ms` (from the earlier final commit to the merged partition's first guest call) and its steps. 400 for partitions of two pipelines or one named twice; 404 for one that does not exist; 409 for partitions that are not adjacent, or one moving, splitting or merging.",
            params: &[],
            request: Some((
                "application/json",
                s(|g| g.subschema_for::<crate::cluster::merge::MergeRequest>()),
            )),
            ok: (
                200,
                "application/json",
                Some(s(|g| g.subschema_for::<crate::control::MergeRecord>())),
            ),
            errors: &[400, 401, 404, 409, 503],
        },
        Op {
            method: "post",
            path: "/api/v1/partitions/{id}/split",
            summary: "Splits a partition in two while it runs, on its owner (another host's partition is asked of it), and answers once the halves run. The body `{\"at\": SLOT}` names the first slot of the right half; without it (or with no body), the slot that halves the partition's records/s per slot over a second. The split is recorded in the control log; the owner flushes, stops the partition at a batch boundary with its final commit, makes each half from a hard-link checkpoint cut to its slots (DeleteRange, DeleteFilesInRange), and records the split done: the partition is retired and its halves, with new ids (`<pipeline>-<n>`), epochs and transactional ids, run on the owner. The answer carries the halves, `pause_ms` (from the final commit to the later of the halves' first guest calls) and its steps. 409 for a partition of one slot (move it instead), one moving or splitting already, or a split given up; 400 for `at` outside the partition.",
            params: &[("id", "path", true, "Partition id.", "string")],
            request: Some((
                "application/json",
                s(|g| g.subschema_for::<crate::cluster::split::SplitRequest>()),
            )),
            ok: (
                200,
                "application/json",
                Some(s(|g| g.subschema_for::<crate::control::SplitRecord>())),
            ),
            errors: &[400, 401, 404, 409, 503],
        },
        Op {
            method: "post",
            path: "/api/v1/partitions/{id}/move",
            summary: "Moves a partition to another host while it runs. Answers 202 {\"move\": id} at once. The target restores the partition from its changelogs and tails them while the owner goes on; once it is close, the owner stops at a batch boundary and commits, and the target catches up and takes over at the next epoch. Progress (warming, handoff, done with pause_ms, or abandoned with a reason) shows in the partition's `moves`. 409 when the partition is moving already or the host owns it; 400 for a host that is not a live member.",
            params: &[("id", "path", true, "Partition id.", "string")],
            request: Some((
                "application/json",
                s(|g| g.subschema_for::<crate::cluster::moves::MoveRequest>()),
            )),
            ok: (
                202,
                "application/json",
                Some(s(|g| {
                    g.subschema_for::<crate::cluster::moves::MoveAccepted>()
                })),
            ),
            errors: &[400, 401, 404, 409, 503],
        },
        Op {
            method: "post",
            path: "/api/v1/partitions/{id}/drain",
            summary: "Between hosts, during a move's handoff: the owner stops the partition at a batch boundary, commits what is pending, holds it for the move's target, and answers the offsets committed. 409 when that move is not under way from this host.",
            params: &[("id", "path", true, "Partition id.", "string")],
            request: Some((
                "application/json",
                s(|g| g.subschema_for::<crate::cluster::moves::DrainRequest>()),
            )),
            ok: (
                200,
                "application/json",
                Some(s(|g| g.subschema_for::<crate::cluster::moves::Drained>())),
            ),
            errors: &[400, 401, 409, 503],
        },
        Op {
            method: "post",
            path: "/api/v1/partitions/{id}/checkpoint",
            summary: "Takes an incremental checkpoint of a partition now, on its owner (another host's partition is asked of it): what is pending commits, then a RocksDB checkpoint (hard links) holding the state and the offsets of one commit, whose files the checkpoint store does not have yet are uploaded, then its manifest; older checkpoints beyond --checkpoint-retain are deleted with the files only they named. 404 when no host runs it; 409 while it restores.",
            params: &[("id", "path", true, "Partition id.", "string")],
            request: None,
            ok: (
                200,
                "application/json",
                Some(s(|g| {
                    g.subschema_for::<crate::http::model::CheckpointInfo>()
                })),
            ),
            errors: &[401, 404, 409, 503],
        },
        Op {
            method: "post",
            path: "/api/v1/partitions/{id}/rewind",
            summary: "Puts a partition back to one of its retained checkpoints, on its owner (another host's partition is asked of it): at a batch boundary, every key that differs from the checkpoint is set to the checkpoint's value (or deleted) in one commit with the checkpoint's input offsets, so that RocksDB, the changelogs and the consumer group agree; the partition then processes its input again from those offsets. Outputs sent since stay sent. 404 for a checkpoint not retained; 409 for one whose files fail their check.",
            params: &[("id", "path", true, "Partition id.", "string")],
            request: Some((
                "application/json",
                s(|g| g.subschema_for::<crate::http::partitions::RewindRequest>()),
            )),
            ok: (
                200,
                "application/json",
                Some(s(|g| g.subschema_for::<crate::http::model::RewindReport>())),
            ),
            errors: &[400, 401, 404, 409, 503],
        },
        Op {
            method: "post",
            path: "/api/v1/pipelines/{pipeline}/rewind",
            summary: "Puts every partition of a pipeline back to a retained checkpoint (each named in `checkpoints`), each on its owner as POST /api/v1/partitions/{id}/rewind does: the way back from a bad deploy (swap back first, so that the input is processed again by the good version). Outputs sent since stay sent. 400 when a partition is missing or not of the pipeline.",
            params: &[P_PIPELINE],
            request: Some((
                "application/json",
                s(|g| g.subschema_for::<crate::http::pipelines::PipelineRewind>()),
            )),
            ok: (
                200,
                "application/json",
                Some(arr(s(|g| {
                    g.subschema_for::<crate::http::model::RewindReport>()
                }))),
            ),
            errors: &[400, 401, 404, 409, 503],
        },
        Op {
            method: "get",
            path: "/api/v1/partitions/{id}/checkpoints",
            summary: "A partition's retained checkpoints in this host's checkpoint store, oldest first: each manifest with its input and changelog offsets and its files (object, size, CRC-32).",
            params: &[("id", "path", true, "Partition id.", "string")],
            request: None,
            ok: (
                200,
                "application/json",
                Some(arr(s(|g| {
                    g.subschema_for::<crate::http::model::Manifest>()
                }))),
            ),
            errors: &[404, 503],
        },
        Op {
            method: "get",
            path: "/api/v1/hosts",
            summary: "The hosts of the cluster: id, address, alive, controller, load, last heartbeat.",
            params: &[],
            request: None,
            ok: (
                200,
                "application/json",
                Some(arr(s(|g| g.subschema_for::<crate::cluster::HostInfo>()))),
            ),
            errors: &[],
        },
        Op {
            method: "get",
            path: "/api/v1/topics",
            summary: "Topics and their partition counts.",
            params: &[],
            request: None,
            ok: (
                200,
                "application/json",
                Some(arr(s(|g| g.subschema_for::<TopicInfo>()))),
            ),
            errors: &[],
        },
        Op {
            method: "post",
            path: "/api/v1/topics/{topic}/records",
            summary: "Produces records; returns where each landed once it is durable.",
            params: &[("topic", "path", true, "Topic.", "string")],
            request: Some((
                "application/json",
                arr(s(|g| g.subschema_for::<NewRecord>())),
            )),
            ok: (
                200,
                "application/json",
                Some(arr(s(|g| g.subschema_for::<Produced>()))),
            ),
            errors: &[400, 401, 404, 413],
        },
        Op {
            method: "get",
            path: "/api/v1/topics/{topic}/records",
            summary: "Reads records of one slot from an offset.",
            params: &[
                ("topic", "path", true, "Topic.", "string"),
                ("slot", "query", true, "Slot (partition).", "integer"),
                (
                    "offset",
                    "query",
                    false,
                    "First offset (default 0).",
                    "integer",
                ),
                (
                    "limit",
                    "query",
                    false,
                    "At most this many (1 to 10000, default 100).",
                    "integer",
                ),
            ],
            request: None,
            ok: (
                200,
                "application/json",
                Some(s(|g| g.subschema_for::<ReadOut>())),
            ),
            errors: &[400, 404],
        },
    ]
}

/// The document.
pub fn document() -> Value {
    let mut settings = SchemaSettings::draft2020_12();
    settings.definitions_path = "/components/schemas".into();
    settings.meta_schema = None;
    let mut g = settings.into_generator();
    let mut paths = Map::new();
    for op in ops(&mut g) {
        let mut o = Map::new();
        o.insert("summary".into(), op.summary.into());
        o.insert(
            "operationId".into(),
            format!(
                "{}{}",
                op.method,
                op.path
                    .replace(['/', '{', '}', '.'], "_")
                    .trim_end_matches('_')
            )
            .into(),
        );
        if !op.params.is_empty() {
            let params: Vec<Value> = op
                .params
                .iter()
                .map(|(name, at, required, description, ty)| {
                    json!({ "name": name, "in": at, "required": required,
                            "description": description, "schema": { "type": ty } })
                })
                .collect();
            o.insert("parameters".into(), params.into());
        }
        if let Some((content_type, schema)) = op.request {
            o.insert(
                "requestBody".into(),
                json!({ "required": true, "content": { content_type: { "schema": schema } } }),
            );
        }
        let mut responses = Map::new();
        let (code, content_type, schema) = op.ok;
        let mut ok = json!({ "description": "Success." });
        if let Some(schema) = schema {
            ok["content"] = json!({ content_type: { "schema": schema } });
        }
        responses.insert(code.to_string(), ok);
        for e in op.errors {
            let description = match e {
                400 => "Bad input; the message names the problem.",
                401 => "A token is configured and the call lacks `Authorization: Bearer <token>`.",
                404 => "Not found.",
                409 => "Conflicts with what exists (or a swap was rolled back).",
                413 => "The body is over the size limit.",
                422 => "A module that is not a valid component of the processor world.",
                503 => "Not available yet (restoring, not ready, or owned elsewhere).",
                _ => "Error.",
            };
            responses.insert(
                e.to_string(),
                json!({ "description": description,
                        "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }),
            );
        }
        o.insert("responses".into(), responses.into());
        if op.path.starts_with("/api/v1/") && op.method != "get" {
            o.insert("security".into(), json!([{ "bearer": [] }]));
        }
        let entry = paths
            .entry(op.path.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        entry[op.method] = Value::Object(o);
    }
    let mut schemas = g.take_definitions(true);
    schemas.insert("Error".into(), error_schema());
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "baton",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "A host for stateful stream processors written as WebAssembly components."
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } }
        }
    })
}

pub(super) async fn serve() -> Json<Value> {
    Json(document())
}
