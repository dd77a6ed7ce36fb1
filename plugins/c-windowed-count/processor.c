/*
 * windowed-count in C: counts records per key in tumbling event-time windows and sends each
 * window's final count once, when it closes. The same config, state and outputs as the Rust
 * `windowed-count`.
 *
 * Config: `window_ms` (window size), `grace_ms` (how long a window stays open past its end for
 * late records, default 0), `output` (the topic of final counts), `late` (the topic of records
 * that arrive after their window closed).
 *
 * A window `[s, e)` closes when the slot's event time reaches `e + grace_ms`; its count then
 * goes to `output` with the record key as key and `{"start":s,"end":e,"count":n}` as value, and
 * its state is deleted. Built on the SDK's windows (windows.h): the store `windows`, keyed by
 * the window start (8 bytes that sort by time) and the record key, one timer per window, and a
 * range delete when it closes.
 */
#include <stdio.h>

#include "baton.h"
#include "windows.h"

static baton_windows windows;
static const char *output;
static const char *late;

static baton_status process(const baton_message *msg, baton_ctx *ctx) {
    if (!baton_some(msg->key)) return BATON_OK;
    bool counted;
    BATON_TRY(baton_windows_count(ctx, &windows, msg->key, msg->timestamp, 1, &counted));
    if (!counted) return baton_send_with_headers_of(ctx, late, msg->key, msg->value, msg);
    return BATON_OK;
}

/* A window closed: each key's final count goes out, and the window's state is deleted. */
static baton_status close_window(const baton_timer *timer, baton_ctx *ctx) {
    baton_closed_list closed;
    BATON_TRY(baton_windows_closed(ctx, &windows, timer, &closed));
    for (size_t i = 0; i < closed.len; i++) {
        const baton_closed *w = &closed.items[i];
        char value[96];
        snprintf(value, sizeof value, "{\"start\":%lld,\"end\":%lld,\"count\":%lld}",
                 (long long)w->start, (long long)w->end, (long long)w->count);
        BATON_TRY(baton_send(ctx, output, w->key, baton_str(value)));
    }
    return BATON_OK;
}

static baton_status setup(const baton_config *config) {
    int64_t window, grace = 0;
    BATON_TRY(baton_config_require_i64(config, "window_ms", &window));
    if (window <= 0) return baton_error(BATON_INVALID_INPUT, "config `window_ms` must be positive");
    if (baton_config_get(config, "grace_ms") != NULL)
        BATON_TRY(baton_config_require_i64(config, "grace_ms", &grace));
    if (grace < 0)
        return baton_error(BATON_INVALID_INPUT, "config `grace_ms` must not be negative");
    const char *out, *late_topic;
    BATON_TRY(baton_config_require(config, "output", &out));
    BATON_TRY(baton_config_require(config, "late", &late_topic));
    /* The config outlives this call: the SDK keeps it for the instance's life. */
    windows = BATON_TUMBLING("windows", window, grace);
    output = out;
    late = late_topic;
    return BATON_OK;
}

BATON_PROCESSOR(process, .on_timer = close_window, .init = setup);
