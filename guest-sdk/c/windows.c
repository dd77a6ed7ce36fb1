/*
 * windows.c: tumbling and hopping windows in event time (see windows.h), the same state,
 * timers and host calls as the Rust SDK's `baton_sdk::windows::Windows`.
 */
#include "windows.h"

#include <string.h>

void baton_sortable(int64_t at, uint8_t out[8]) {
    uint64_t v = (uint64_t)at ^ (1ull << 63);
    for (int i = 7; i >= 0; i--, v >>= 8) out[i] = (uint8_t)v;
}

int64_t baton_unsortable(const uint8_t b[8]) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | b[i];
    return (int64_t)(v ^ (1ull << 63));
}

/* Arithmetic that wraps, as Rust's does in a release build. */
static int64_t wadd(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static int64_t wsub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
static int64_t wmul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }

static int64_t sat_add(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) return b > 0 ? INT64_MAX : INT64_MIN;
    return r;
}

/* `a.div_euclid(b)` for `b > 0`. */
static int64_t div_euclid(int64_t a, int64_t b) {
    int64_t q = a / b;
    if (a % b < 0) q -= 1;
    return q;
}

int64_t baton_windows_advance(const baton_windows *w) { return w->advance > 1 ? w->advance : 1; }

uint64_t baton_windows_starts(const baton_windows *w, int64_t ts, int64_t *first, int64_t *last) {
    int64_t size = w->size > 1 ? w->size : 1, advance = baton_windows_advance(w);
    *last = wmul(div_euclid(ts, advance), advance);
    *first = wadd(wmul(div_euclid(wsub(ts, size), advance), advance), advance);
    if (*first > *last) return 0;
    return ((uint64_t)*last - (uint64_t)*first) / (uint64_t)advance + 1;
}

int64_t baton_windows_closes(const baton_windows *w, int64_t start) {
    return sat_add(sat_add(start, w->size), w->grace);
}

/* The length of the timer keys' prefix: 'W', the store name's length, the store name. */
static size_t prefix_len(const baton_windows *w) { return 2 + strlen(w->store); }

/* The timer key of the window starting at `start`, into `out` (prefix_len + 8 bytes). */
static void timer_key(const baton_windows *w, int64_t start, uint8_t *out) {
    size_t n = strlen(w->store);
    out[0] = 'W';
    out[1] = (uint8_t)n;
    memcpy(out + 2, w->store, n);
    baton_sortable(start, out + 2 + n);
}

baton_status baton_windows_count(baton_ctx *ctx, const baton_windows *w, baton_bytes key,
                                 int64_t ts, int64_t delta, bool *counted) {
    int64_t first, last, advance = baton_windows_advance(w);
    uint64_t n = baton_windows_starts(w, ts, &first, &last);
    size_t plen = prefix_len(w);
    uint8_t small[512];
    uint8_t *state_key = 8 + key.len <= 256 ? small : baton_alloc_(ctx, 8 + key.len);
    uint8_t *tkey = plen + 8 <= 256 ? small + 256 : baton_alloc_(ctx, plen + 8);
    if (key.len) memcpy(state_key + 8, key.ptr, key.len);
    *counted = false;
    for (uint64_t i = 0; i < n; i++) {
        int64_t start = wadd(first, wmul((int64_t)i, advance));
        int64_t closes = baton_windows_closes(w, start);
        if (baton_event_time(ctx) >= closes) continue;
        *counted = true;
        baton_sortable(start, state_key);
        BATON_TRY(baton_add(ctx, w->store, (baton_bytes){state_key, 8 + key.len}, delta));
        timer_key(w, start, tkey);
        baton_bytes timer = {tkey, plen + 8};
        if (!baton_scheduled_has_(ctx, timer)) {
            BATON_TRY(baton_schedule(ctx, BATON_EVENT_TIME, closes, timer, BATON_NONE));
            BATON_TRY(baton_scheduled_set_(ctx, timer, true));
        }
    }
    return BATON_OK;
}

baton_status baton_windows_closed(baton_ctx *ctx, const baton_windows *w, const baton_timer *timer,
                                  baton_closed_list *out) {
    *out = (baton_closed_list){false, NULL, 0};
    size_t plen = prefix_len(w);
    baton_bytes k = timer->key;
    uint8_t *prefix = baton_alloc_(ctx, plen + 8);
    timer_key(w, 0, prefix);
    if (k.len != plen + 8 || memcmp(k.ptr, prefix, plen) != 0) return BATON_OK;
    int64_t start = baton_unsortable(k.ptr + plen);
    BATON_TRY(baton_scheduled_set_(ctx, k, false));

    uint8_t lo[8], hi[9];
    baton_sortable(start, lo);
    baton_bytes hi_bytes = {hi, 8};
    if (start < INT64_MAX) {
        baton_sortable(start + 1, hi);
    } else {
        memset(hi, 0xff, 9);
        hi_bytes.len = 9;
    }

    size_t len = 0, cap = 0;
    baton_closed *items = NULL;
    baton_bytes from = {lo, 8};
    for (;;) {
        const baton_entry *rows;
        size_t n;
        BATON_TRY(baton_scan(ctx, w->store, from, hi_bytes, 1000, &rows, &n));
        if (len + n > cap) {
            cap = (len + n) * 2;
            baton_closed *grown = baton_alloc_(ctx, cap * sizeof *grown);
            if (len) memcpy(grown, items, len * sizeof *items);
            items = grown;
        }
        for (size_t i = 0; i < n; i++) {
            baton_bytes rk = rows[i].key, rv = rows[i].value;
            if (rv.len != 8) return baton_error(BATON_INVALID_VALUE, "a window count is not 8 bytes");
            uint64_t count = 0;
            for (int b = 0; b < 8; b++) count = count << 8 | rv.ptr[b];
            uint8_t *next = baton_alloc_(ctx, rk.len + 1);
            memcpy(next, rk.ptr, rk.len);
            next[rk.len] = 0;
            from = (baton_bytes){next, rk.len + 1};
            baton_bytes key = rk.len >= 8 ? (baton_bytes){rk.ptr + 8, rk.len - 8} : rk;
            items[len++] = (baton_closed){key, start, wadd(start, w->size), (int64_t)count};
        }
        if (n < 1000) break;
    }
    BATON_TRY(baton_delete_range(ctx, w->store, (baton_bytes){lo, 8}, hi_bytes, NULL));
    *out = (baton_closed_list){true, items, len};
    return BATON_OK;
}
