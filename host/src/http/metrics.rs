//! `/metrics` in the Prometheus text format: per partition (labels `pipeline`, `partition`)
//! records in and out, dead letters, batches and their latency, time in the guest, state size,
//! lag, restore progress and swaps; per host the shared RocksDB cache.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use super::AppState;
use crate::partition::HISTOGRAM_BOUNDS;

pub(super) async fn render(State(baton): State<AppState>) -> impl IntoResponse {
    let text = tokio::task::spawn_blocking(move || text(&baton))
        .await
        .unwrap_or_default();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
}

fn text(baton: &crate::Baton) -> String {
    let mut out = String::new();
    let handles = baton.partition_handles();
    let infos = baton.partitions();
    let labels = |pipeline: &str, id: &str| format!("pipeline=\"{pipeline}\",partition=\"{id}\"");
    let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, f64)>| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (l, v) in rows {
            let _ = writeln!(out, "{name}{{{l}}} {v}");
        }
    };
    let per = |f: &dyn Fn(&crate::app::PartitionHandle) -> f64| -> Vec<(String, f64)> {
        handles
            .iter()
            .map(|h| (labels(&h.pipeline, &h.id), f(h)))
            .collect()
    };
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as f64;
    family(
        "baton_records_in_total",
        "counter",
        "Input records processed and committed.",
        per(&|h| load(&h.status.records)),
    );
    family(
        "baton_records_out_total",
        "counter",
        "Records sent to output topics, dead letters included.",
        per(&|h| load(&h.status.records_out)),
    );
    family(
        "baton_dead_letters_total",
        "counter",
        "Records sent to the dead-letter topic.",
        per(&|h| load(&h.status.dead_letters)),
    );
    family(
        "baton_checkpoints_total",
        "counter",
        "Checkpoints of the partition taken on this host.",
        per(&|h| load(&h.status.checkpoints)),
    );
    family(
        "baton_checkpoint_failures_total",
        "counter",
        "Checkpoints of the partition that failed on this host.",
        per(&|h| load(&h.status.checkpoint_failures)),
    );
    family(
        "baton_checkpoint_uploaded_bytes_total",
        "counter",
        "Bytes the partition's checkpoints uploaded to the checkpoint store.",
        per(&|h| load(&h.status.checkpoint_uploaded_bytes)),
    );
    family(
        "baton_checkpoint_last_seconds",
        "gauge",
        "Duration of the partition's last checkpoint.",
        per(&|h| {
            h.status
                .last_checkpoint
                .lock()
                .as_ref()
                .map_or(0.0, |c| c.duration_ms / 1e3)
        }),
    );
    family(
        "baton_checkpoint_last_timestamp_seconds",
        "gauge",
        "When the partition's last checkpoint was taken (Unix time; 0: none).",
        per(&|h| {
            h.status
                .last_checkpoint
                .lock()
                .as_ref()
                .map_or(0.0, |c| c.taken_at as f64 / 1e3)
        }),
    );
    family(
        "baton_checkpoint_size_bytes",
        "gauge",
        "Bytes of the partition's last checkpoint: its state's size on disk.",
        per(&|h| {
            h.status
                .last_checkpoint
                .lock()
                .as_ref()
                .map_or(0.0, |c| c.size_bytes as f64)
        }),
    );
    family(
        "baton_batches_total",
        "counter",
        "Batches committed.",
        per(&|h| load(&h.status.batches)),
    );
    family(
        "baton_guest_seconds_total",
        "counter",
        "Time spent in guest calls (Wasm), state reads included.",
        per(&|h| load(&h.status.time.process_us) / 1e6),
    );
    family(
        "baton_commit_seconds_total",
        "counter",
        "Time spent committing batches.",
        per(&|h| load(&h.status.time.commit_us) / 1e6),
    );
    family(
        "baton_session_failures_total",
        "counter",
        "Sessions of the partition that ended in an error (a failed commit, a broker error, a \
         fenced producer, a stalled input) and were started again.",
        per(&|h| load(&h.status.session_failures)),
    );
    family(
        "baton_partition_failed",
        "gauge",
        "1 while the partition is stopped by an error it cannot get past (its `error` in the \
         partition table says which), else 0.",
        per(&|h| {
            let failed = matches!(*h.status.phase.lock(), crate::partition::Phase::Failed(_));
            f64::from(u8::from(failed))
        }),
    );
    family(
        "baton_state_bytes",
        "gauge",
        "Approximate bytes of state (live SST data and memtables).",
        per(&|h| h.db.approximate_size() as f64),
    );
    family(
        "baton_lag_records",
        "gauge",
        "Input records not yet processed.",
        infos
            .iter()
            .map(|p| (labels(&p.pipeline, &p.id), p.lag as f64))
            .collect(),
    );
    family(
        "baton_restore_records_done",
        "gauge",
        "Changelog records applied by the last restore.",
        infos
            .iter()
            .map(|p| {
                let done = p.restore.as_ref().map(|r| r.done).unwrap_or(0);
                (labels(&p.pipeline, &p.id), done as f64)
            })
            .collect(),
    );
    family(
        "baton_restore_records_total",
        "gauge",
        "Changelog records the last restore had to apply.",
        infos
            .iter()
            .map(|p| {
                let total = p.restore.as_ref().map(|r| r.total).unwrap_or(0);
                (labels(&p.pipeline, &p.id), total as f64)
            })
            .collect(),
    );
    family(
        "baton_last_move_pause_seconds",
        "gauge",
        "The pause of the partition's last live move: from the old owner's final commit to the \
         new owner's first guest call.",
        infos
            .iter()
            .filter_map(|p| {
                p.last_pause_ms
                    .map(|ms| (labels(&p.pipeline, &p.id), ms / 1e3))
            })
            .collect(),
    );
    family(
        "baton_moves_total",
        "counter",
        "Live moves of the partition that are done (the catalog keeps the last ten).",
        infos
            .iter()
            .map(|p| {
                let done = p
                    .moves
                    .iter()
                    .filter(|m| m.phase == crate::control::MovePhase::Done)
                    .count();
                (labels(&p.pipeline, &p.id), done as f64)
            })
            .collect(),
    );
    family(
        "baton_swaps_total",
        "counter",
        "Module versions switched to.",
        per(&|h| load(&h.status.swap.swaps)),
    );
    family(
        "baton_rollbacks_total",
        "counter",
        "Module versions rolled back.",
        per(&|h| load(&h.status.swap.rollbacks)),
    );
    family(
        "baton_last_swap_pause_seconds",
        "gauge",
        "Pause of the last module swap.",
        per(&|h| {
            h.status
                .swap
                .last
                .lock()
                .as_ref()
                .map(|r| r.pause_us as f64 / 1e6)
                .unwrap_or(0.0)
        }),
    );
    // The batch latency histogram.
    let name = "baton_batch_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Time from a batch's fetch to its commit.\n# TYPE {name} histogram"
    );
    for h in &handles {
        let l = labels(&h.pipeline, &h.id);
        let hist = &h.status.batch_latency;
        let mut cumulative = 0u64;
        for (i, bucket) in hist.buckets.iter().enumerate() {
            cumulative += bucket.load(Ordering::Relaxed);
            let le = HISTOGRAM_BOUNDS
                .get(i)
                .map(|b| b.to_string())
                .unwrap_or_else(|| "+Inf".into());
            let _ = writeln!(out, "{name}_bucket{{{l},le=\"{le}\"}} {cumulative}");
        }
        let sum = hist.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(
            out,
            "{name}_sum{{{l}}} {sum}\n{name}_count{{{l}}} {cumulative}"
        );
    }
    // Per host: splits and merges made here, and the balancer's decisions (on the controller).
    for (name, help, pauses) in [
        (
            "baton_split_pause_seconds",
            "Pauses of the splits this host made.",
            baton.split_pauses(),
        ),
        (
            "baton_merge_pause_seconds",
            "Pauses of the merges this host made.",
            baton.merge_pauses(),
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} summary");
        for q in [0.5, 0.99, 1.0] {
            if let Some(v) = crate::cluster::moves::quantile(&pauses, q) {
                let _ = writeln!(out, "{name}{{quantile=\"{q}\"}} {}", v / 1e3);
            }
        }
        let _ = writeln!(
            out,
            "{name}_sum {}\n{name}_count {}",
            pauses.iter().sum::<f64>() / 1e3,
            pauses.len()
        );
    }
    let _ = writeln!(
        out,
        "# HELP baton_balancer_decisions_total Decisions of the balancer while this host was the controller.\n\
         # TYPE baton_balancer_decisions_total counter"
    );
    for (pipeline, action, n) in baton.balancer_counts() {
        let _ = writeln!(
            out,
            "baton_balancer_decisions_total{{pipeline=\"{pipeline}\",action=\"{action}\"}} {n}"
        );
    }
    let pauses = baton.move_pauses();
    let _ = writeln!(
        out,
        "# HELP baton_move_pause_seconds Pauses of the live moves this host took over.\n\
         # TYPE baton_move_pause_seconds summary"
    );
    for q in [0.5, 0.99, 1.0] {
        if let Some(v) = crate::cluster::moves::quantile(&pauses, q) {
            let _ = writeln!(
                out,
                "baton_move_pause_seconds{{quantile=\"{q}\"}} {}",
                v / 1e3
            );
        }
    }
    let _ = writeln!(
        out,
        "baton_move_pause_seconds_sum {}\nbaton_move_pause_seconds_count {}",
        pauses.iter().sum::<f64>() / 1e3,
        pauses.len()
    );
    if let Some(heap) = crate::heap::report() {
        for (name, help, v) in [
            (
                "baton_heap_allocated_bytes",
                "Bytes the process has allocated (jemalloc).",
                heap.allocated,
            ),
            (
                "baton_heap_active_bytes",
                "Bytes in pages with allocations on them (jemalloc).",
                heap.active,
            ),
            (
                "baton_heap_resident_bytes",
                "Bytes of physical memory the allocator holds (jemalloc).",
                heap.resident,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
    }
    if crate::otlp::enabled() {
        for (name, help, v) in [
            (
                "baton_otlp_spans_exported_total",
                "Spans the OTLP collector (--otlp-endpoint) took.",
                crate::otlp::exported(),
            ),
            (
                "baton_otlp_spans_dropped_total",
                "Spans dropped: the exporter's queue was full or the collector refused them.",
                crate::otlp::dropped(),
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
    }
    let env = baton.state_env();
    let mem = env.report();
    let stats = mem.block_cache;
    let (compiles, compile_s) = baton.runtime.compiles();
    for (name, kind, help, v) in [
        (
            "baton_block_cache_usage_bytes",
            "gauge",
            "Bytes in the shared RocksDB block cache (memtable reservations included).",
            mem.block_cache_usage as f64,
        ),
        (
            "baton_block_cache_capacity_bytes",
            "gauge",
            "The block cache's capacity now: its share of --state-memory, less what the rest of the heap holds over its allowance.",
            mem.block_cache_capacity as f64,
        ),
        (
            "baton_state_memory_bound_bytes",
            "gauge",
            "The --state-memory bound: block cache, memtables and hot-key caches together.",
            mem.bound as f64,
        ),
        (
            "baton_block_cache_pinned_bytes",
            "gauge",
            "Bytes of the block cache pinned by readers and pinned metadata.",
            mem.block_cache_pinned as f64,
        ),
        (
            "baton_memtable_bytes",
            "gauge",
            "Bytes of RocksDB memtables over every partition of the host.",
            mem.memtable_usage as f64,
        ),
        (
            "baton_hot_cache_bytes",
            "gauge",
            "Bytes of the partitions' hot-key caches.",
            mem.hot_cache_usage as f64,
        ),
        (
            "baton_index_filter_bytes",
            "gauge",
            "Bytes of index and filter blocks in the block cache.",
            mem.index_filter_bytes as f64,
        ),
        (
            "baton_table_readers_bytes",
            "gauge",
            "Bytes of RocksDB table readers outside the block cache.",
            mem.table_readers_bytes as f64,
        ),
        (
            "baton_pending_compaction_bytes",
            "gauge",
            "Compaction debt: bytes RocksDB estimates it must rewrite, over every partition.",
            mem.pending_compaction_bytes as f64,
        ),
        (
            "baton_write_stall_seconds_total",
            "counter",
            "Seconds RocksDB stalled or slowed writes.",
            mem.write_stall_micros as f64 / 1e6,
        ),
        (
            "baton_block_cache_hits_total",
            "counter",
            "Block reads served from the cache.",
            stats.hits as f64,
        ),
        (
            "baton_block_cache_misses_total",
            "counter",
            "Block reads that went to disk.",
            stats.misses as f64,
        ),
        (
            "baton_block_cache_index_misses_total",
            "counter",
            "Index block reads that went to disk.",
            stats.index_misses as f64,
        ),
        (
            "baton_block_cache_filter_misses_total",
            "counter",
            "Filter block reads that went to disk.",
            stats.filter_misses as f64,
        ),
        (
            "baton_module_compiles_total",
            "counter",
            "Components compiled to native code since the host started (at upload, or at start when a module's compiled code was not kept); a restart or an upload of known bytes compiles nothing.",
            compiles as f64,
        ),
        (
            "baton_module_compile_seconds_total",
            "counter",
            "Seconds spent compiling components.",
            compile_s,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
        );
    }
    out
}
