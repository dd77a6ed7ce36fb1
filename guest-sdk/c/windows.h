/*
 * windows.h: windowed counts in event time, built on timers and range deletes: tumbling and
 * hopping windows aligned to the epoch, with a grace period, each closed window handed back
 * once. Laid out exactly as the Rust SDK's `baton_sdk::windows::Windows` (and the Python SDK's
 * `baton_sdk.windows`), so that a C processor and a Rust one leave the same state:
 *
 *   - the store's keys are the window start (8 bytes that sort as the number) then the record
 *     key, each holding an 8-byte big-endian count;
 *   - one event-time timer per window (not per key) at `start + size + grace`, keyed
 *     `'W' + len(store) (1 byte) + store + sortable(start)`, closes it, and the whole window
 *     goes with one range delete.
 *
 *     static const baton_windows WINDOWS = BATON_TUMBLING("windows", 60000, 5000);
 *
 *     static baton_status process(const baton_message *msg, baton_ctx *ctx) {
 *         bool counted;
 *         if (!baton_some(msg->key)) return BATON_OK;
 *         BATON_TRY(baton_windows_count(ctx, &WINDOWS, msg->key, msg->timestamp, 1, &counted));
 *         if (!counted) // every window of it had closed
 *             return baton_send(ctx, "late", msg->key, msg->value);
 *         return BATON_OK;
 *     }
 *
 *     static baton_status close_window(const baton_timer *timer, baton_ctx *ctx) {
 *         baton_closed_list closed;
 *         BATON_TRY(baton_windows_closed(ctx, &WINDOWS, timer, &closed));
 *         for (size_t i = 0; i < closed.len; i++) {
 *             const baton_closed *w = &closed.items[i];
 *             char json[96];
 *             snprintf(json, sizeof json, "{\"start\":%lld,\"end\":%lld,\"count\":%lld}",
 *                      (long long)w->start, (long long)w->end, (long long)w->count);
 *             BATON_TRY(baton_send(ctx, "counts", w->key, baton_str(json)));
 *         }
 *         return BATON_OK;
 *     }
 *
 *     BATON_PROCESSOR(process, .on_timer = close_window);
 */
#ifndef BATON_WINDOWS_H
#define BATON_WINDOWS_H

#include "baton.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Counting windows over one store: windows of `size` ms starting every `advance` ms from the
 * epoch (`[k·advance, k·advance + size)`), open for records until the slot's event time
 * reaches their end plus `grace`. */
typedef struct baton_windows {
    const char *store;
    int64_t size;
    int64_t advance;
    int64_t grace;
} baton_windows;

/* Windows `[k·size, (k+1)·size)`, one per record, with `grace` ms of grace: a constant
 * initializer. */
#define BATON_TUMBLING(store, size_ms, grace_ms) \
    ((baton_windows){(store), (size_ms), (size_ms), (grace_ms)})

/* Windows of `size_ms` starting every `advance_ms`, with `grace_ms` of grace; a record counts
 * in each window that holds it. A constant initializer. */
#define BATON_HOPPING(store, size_ms, advance_ms, grace_ms) \
    ((baton_windows){(store), (size_ms), (advance_ms), (grace_ms)})

/* A window that closed, for one key. */
typedef struct baton_closed {
    /* The record key. */
    baton_bytes key;
    /* The window's start (inclusive), in milliseconds. */
    int64_t start;
    /* Its end (exclusive). */
    int64_t end;
    /* What was counted in it. */
    int64_t count;
} baton_closed;

/* What baton_windows_closed found. */
typedef struct baton_closed_list {
    /* Whether the timer was one of these windows' (false: another timer; `len` is 0). */
    bool matched;
    /* Every key's count in the window, in key order. */
    const baton_closed *items;
    size_t len;
} baton_closed_list;

/* The starts of the windows that hold `ts`, earliest first: `*first`, then every `advance`
 * (the value of baton_windows_advance) up to `*last`; returns how many there are (0: none). */
uint64_t baton_windows_starts(const baton_windows *w, int64_t ts, int64_t *first, int64_t *last);

/* The step between window starts (`advance`, at least 1). */
int64_t baton_windows_advance(const baton_windows *w);

/* When the window starting at `start` closes: `start + size + grace`, saturating. */
int64_t baton_windows_closes(const baton_windows *w, int64_t start);

/* Adds `delta` to `key`'s count in every window holding `ts` that has not closed by the slot's
 * event time; `*counted` is false when every one had (the record is late). */
baton_status baton_windows_count(baton_ctx *ctx, const baton_windows *w, baton_bytes key,
                                 int64_t ts, int64_t delta, bool *counted);

/* When `timer` closes one of these windows: every key's count in it, in key order, and the
 * window's state is deleted. The list stays valid until the timer function returns. */
baton_status baton_windows_closed(baton_ctx *ctx, const baton_windows *w, const baton_timer *timer,
                                  baton_closed_list *out);

/* `at` as 8 bytes that sort as the number (big-endian with the sign bit flipped). */
void baton_sortable(int64_t at, uint8_t out[8]);

/* The number baton_sortable wrote into `b`. */
int64_t baton_unsortable(const uint8_t b[8]);

#ifdef __cplusplus
}
#endif

#endif
