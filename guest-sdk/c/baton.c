/*
 * baton.c: the handler exports of the `baton:processor@0.2.0` world over the bindings that
 * wit-bindgen generates into gen/, dispatching to the functions BATON_PROCESSOR registers.
 *
 * Writes and outputs are buffered per store (and for outputs) and handed to the host with the
 * batch ABI (`store.apply`, `output.send-batch`) at the end of each call or before a read of
 * the same store; a call that fails discards them.
 */
#include "baton.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/processor.h"

/* gen/processor.c forces the link of the type information wit-bindgen can write as an object
 * file (processor_component_type.o). regen.sh leaves that object out: `baton componentize`
 * embeds the world's type information itself. This stands in for it. */
void __component_type_object_force_link_processor(void);
void __component_type_object_force_link_processor(void) {}

/* The processor BATON_PROCESSOR registers. */
extern const baton_processor baton_processor_;

typedef baton_processor_types_span_t span_t;
typedef processor_list_u8_t list_u8_t;

/* A non-NULL pointer for present but empty bytes. */
static const uint8_t EMPTY[1];

/* --- memory ------------------------------------------------------------------------------ */

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (q == NULL) abort(); /* out of memory: trap */
    return q;
}

/* A growable array of `elem`-sized items. */
typedef struct vec {
    void *ptr;
    size_t len, cap;
} vec;

static void *vec_push(vec *v, size_t elem, size_t n) {
    if (v->len + n > v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        while (cap < v->len + n) cap *= 2;
        v->ptr = xrealloc(v->ptr, cap * elem);
        v->cap = cap;
    }
    void *at = (uint8_t *)v->ptr + v->len * elem;
    v->len += n;
    return at;
}

/* Appends `b` to a batched call's data and names it. */
static span_t push_span(vec *data, const uint8_t *ptr, size_t len) {
    span_t s = {(uint32_t)data->len, (uint32_t)len};
    if (len) memcpy(vec_push(data, 1, len), ptr, len);
    return s;
}

static list_u8_t as_list(baton_bytes b) {
    return (list_u8_t){(uint8_t *)(b.ptr ? b.ptr : EMPTY), b.len};
}

baton_bytes baton_str(const char *s) {
    if (s == NULL) return BATON_NONE;
    return (baton_bytes){(const uint8_t *)s, strlen(s)};
}

bool baton_bytes_eq(baton_bytes b, const char *s) {
    size_t n = strlen(s);
    return b.ptr != NULL && b.len == n && (n == 0 || memcmp(b.ptr, s, n) == 0);
}

static int64_t sat_add(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) return b > 0 ? INT64_MAX : INT64_MIN;
    return r;
}

/* --- errors ------------------------------------------------------------------------------ */

static char *error_message;
static bool error_set;

static void set_message(char *owned) {
    free(error_message);
    error_message = owned;
    error_set = true;
}

static void clear_message(void) {
    free(error_message);
    error_message = NULL;
    error_set = false;
}

static char *vformat(const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) n = 0;
    char *s = xrealloc(NULL, (size_t)n + 1);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

baton_status baton_error(baton_status kind, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_message(vformat(fmt, ap));
    va_end(ap);
    return kind;
}

const char *baton_error_message(void) { return error_message ? error_message : ""; }

/* A host error as a status, its message kept; frees the error's string. */
static baton_status from_wit(baton_processor_types_error_t *e) {
    /* Every case of the variant holds a string, at the same place. */
    processor_string_t *s = &e->val.other;
    char *msg = xrealloc(NULL, s->len + 1);
    if (s->len) memcpy(msg, s->ptr, s->len);
    msg[s->len] = 0;
    set_message(msg);
    baton_status kind = e->tag <= BATON_PROCESSOR_TYPES_ERROR_OTHER ? (baton_status)(e->tag + 1)
                                                                      : BATON_OTHER;
    processor_string_free(s);
    return kind;
}

/* A status returned by the processor as the contract's error variant. */
static void to_wit(baton_status kind, baton_processor_types_error_t *err) {
    const char *msg = error_set ? baton_error_message() : "error without a message";
    err->tag = kind >= BATON_NO_SUCH_STORE && kind <= BATON_OTHER ? (uint8_t)(kind - 1)
                                                                   : BATON_PROCESSOR_TYPES_ERROR_OTHER;
    processor_string_dup(&err->val.other, msg);
}

/* --- config ------------------------------------------------------------------------------ */

struct baton_config {
    size_t len;
    char **keys;
    char **values;
};

static char *dup_n(const uint8_t *p, size_t n) {
    char *s = xrealloc(NULL, n + 1);
    if (n) memcpy(s, p, n);
    s[n] = 0;
    return s;
}

static void config_free(baton_config *c) {
    for (size_t i = 0; i < c->len; i++) {
        free(c->keys[i]);
        free(c->values[i]);
    }
    free(c->keys);
    free(c->values);
    *c = (baton_config){0};
}

const char *baton_config_get(const baton_config *config, const char *key) {
    /* The last of repeated keys wins, as in a map built from the pairs. */
    for (size_t i = config->len; i-- > 0;)
        if (strcmp(config->keys[i], key) == 0) return config->values[i];
    return NULL;
}

baton_status baton_config_require(const baton_config *config, const char *key, const char **out) {
    const char *v = baton_config_get(config, key);
    if (v == NULL) return baton_error(BATON_INVALID_INPUT, "config key `%s` is required", key);
    *out = v;
    return BATON_OK;
}

/* An integer as Rust's `i64::from_str` reads it: an optional sign, then decimal digits. */
static bool parse_i64(const char *s, int64_t *out) {
    bool neg = false;
    if (*s == '+' || *s == '-') neg = *s++ == '-';
    if (*s == 0) return false;
    int64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return false;
        int d = *s - '0';
        if (__builtin_mul_overflow(v, 10, &v)) return false;
        if (neg ? __builtin_sub_overflow(v, d, &v) : __builtin_add_overflow(v, d, &v)) return false;
    }
    *out = v;
    return true;
}

baton_status baton_config_require_i64(const baton_config *config, const char *key, int64_t *out) {
    const char *v;
    BATON_TRY(baton_config_require(config, key, &v));
    if (!parse_i64(v, out))
        return baton_error(BATON_INVALID_INPUT, "config key `%s` must be an integer", key);
    return BATON_OK;
}

/* --- the context ------------------------------------------------------------------------- */

/* A store the processor opened, with its writes not yet handed to the host. */
typedef struct open_store {
    char *name;
    baton_processor_state_own_store_t handle;
    vec data;   /* uint8_t */
    vec writes; /* baton_processor_state_write_t */
} open_store;

/* A timer this instance knows is scheduled: its slot and key. */
typedef struct scheduled {
    struct scheduled *next;
    uint64_t hash;
    uint32_t slot;
    size_t len;
    uint8_t key[];
} scheduled;

struct baton_ctx {
    open_store *stores;
    size_t nstores;
    /* Outputs not yet handed to the host. */
    vec out_data;    /* uint8_t */
    vec out_records; /* baton_processor_output_out_record_t */
    vec out_headers; /* baton_processor_types_header_entry_t */
    baton_config config;
    /* The timestamp of the record being processed (the `at` of the timer firing). */
    int64_t timestamp;
    /* The slot's event time. */
    int64_t event_time;
    /* The slot of the current call. */
    uint32_t slot;
    /* Timers this instance knows are scheduled, per slot (by the windows), so that it
     * schedules each once; forgotten with the call's effects when a call fails. */
    scheduled **buckets;
    size_t nbuckets, nscheduled;
    /* Memory handed to the processor function running, freed when it returns. */
    vec arena; /* void * */
};

static baton_ctx CTX = {.event_time = -1};

const baton_config *baton_config_of(const baton_ctx *ctx) { return &ctx->config; }
int64_t baton_timestamp(const baton_ctx *ctx) { return ctx->timestamp; }
int64_t baton_event_time(const baton_ctx *ctx) { return ctx->event_time; }
uint32_t baton_slot(const baton_ctx *ctx) { return ctx->slot; }

int64_t baton_processing_time(baton_ctx *ctx) {
    (void)ctx;
    return baton_processor_timers_processing_time();
}

/* Keeps `p` (of `len` bytes from the bindings; nothing to free when 0) until the function
 * running returns. */
static void keep(baton_ctx *ctx, void *p, size_t len) {
    if (len > 0) *(void **)vec_push(&ctx->arena, sizeof(void *), 1) = p;
}

void *baton_alloc_(baton_ctx *ctx, size_t size) {
    void *p = xrealloc(NULL, size);
    keep(ctx, p, 1);
    return p;
}

static void release(baton_ctx *ctx) {
    void **p = ctx->arena.ptr;
    for (size_t i = 0; i < ctx->arena.len; i++) free(p[i]);
    ctx->arena.len = 0;
}

/* Bytes from the bindings, kept until the function running returns. */
static baton_bytes kept(baton_ctx *ctx, list_u8_t l) {
    keep(ctx, l.ptr, l.len);
    return (baton_bytes){l.len ? l.ptr : EMPTY, l.len};
}

/* --- scheduled timers -------------------------------------------------------------------- */

static uint64_t hash_key(uint32_t slot, const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull ^ slot;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static scheduled **find_scheduled(baton_ctx *ctx, uint64_t h, baton_bytes key) {
    if (ctx->nbuckets == 0) return NULL;
    scheduled **at = &ctx->buckets[h & (ctx->nbuckets - 1)];
    for (; *at; at = &(*at)->next) {
        scheduled *s = *at;
        if (s->hash == h && s->slot == ctx->slot && s->len == key.len &&
            (key.len == 0 || memcmp(s->key, key.ptr, key.len) == 0))
            return at;
    }
    return at;
}

bool baton_scheduled_has_(baton_ctx *ctx, baton_bytes key) {
    scheduled **at = find_scheduled(ctx, hash_key(ctx->slot, key.ptr, key.len), key);
    return at != NULL && *at != NULL;
}

static void grow_scheduled(baton_ctx *ctx) {
    size_t n = ctx->nbuckets ? ctx->nbuckets * 2 : 64;
    scheduled **b = xrealloc(NULL, n * sizeof *b);
    memset(b, 0, n * sizeof *b);
    for (size_t i = 0; i < ctx->nbuckets; i++) {
        for (scheduled *s = ctx->buckets[i], *next; s; s = next) {
            next = s->next;
            s->next = b[s->hash & (n - 1)];
            b[s->hash & (n - 1)] = s;
        }
    }
    free(ctx->buckets);
    ctx->buckets = b;
    ctx->nbuckets = n;
}

baton_status baton_scheduled_set_(baton_ctx *ctx, baton_bytes key, bool on) {
    uint64_t h = hash_key(ctx->slot, key.ptr, key.len);
    if (on && ctx->nscheduled >= ctx->nbuckets) grow_scheduled(ctx);
    scheduled **at = find_scheduled(ctx, h, key);
    if (at == NULL) return BATON_OK;
    if (on && *at == NULL) {
        scheduled *s = xrealloc(NULL, sizeof *s + key.len);
        *s = (scheduled){.next = NULL, .hash = h, .slot = ctx->slot, .len = key.len};
        if (key.len) memcpy(s->key, key.ptr, key.len);
        *at = s;
        ctx->nscheduled++;
    } else if (!on && *at != NULL) {
        scheduled *s = *at;
        *at = s->next;
        free(s);
        ctx->nscheduled--;
    }
    return BATON_OK;
}

static void clear_scheduled(baton_ctx *ctx) {
    for (size_t i = 0; i < ctx->nbuckets; i++) {
        for (scheduled *s = ctx->buckets[i], *next; s; s = next) {
            next = s->next;
            free(s);
        }
        ctx->buckets[i] = NULL;
    }
    ctx->nscheduled = 0;
}

/* --- state ------------------------------------------------------------------------------- */

/* Store `name`, opened on first use. */
static baton_status open_store_named(baton_ctx *ctx, const char *name, open_store **out) {
    for (size_t i = 0; i < ctx->nstores; i++) {
        if (strcmp(ctx->stores[i].name, name) == 0) {
            *out = &ctx->stores[i];
            return BATON_OK;
        }
    }
    processor_string_t n = {(uint8_t *)name, strlen(name)};
    baton_processor_state_own_store_t handle;
    baton_processor_types_error_t err;
    if (!baton_processor_state_static_store_open(&n, &handle, &err)) return from_wit(&err);
    ctx->stores = xrealloc(ctx->stores, (ctx->nstores + 1) * sizeof *ctx->stores);
    open_store *s = &ctx->stores[ctx->nstores++];
    *s = (open_store){.name = dup_n((const uint8_t *)name, strlen(name)), .handle = handle};
    *out = s;
    return BATON_OK;
}

static void store_discard(open_store *s) {
    s->data.len = 0;
    s->writes.len = 0;
}

static baton_status store_flush(open_store *s) {
    if (s->writes.len == 0) return BATON_OK;
    list_u8_t data = {s->data.ptr ? s->data.ptr : (uint8_t *)EMPTY, s->data.len};
    baton_processor_state_list_write_t writes = {s->writes.ptr, s->writes.len};
    baton_processor_types_item_error_t err;
    bool ok = baton_processor_state_method_store_apply(baton_processor_state_borrow_store(s->handle),
                                                       &data, &writes, &err);
    store_discard(s);
    return ok ? BATON_OK : from_wit(&err.error);
}

/* Store `name` with its buffered writes handed to the host, ready for a read. */
static baton_status flushed(baton_ctx *ctx, const char *name,
                            baton_processor_state_borrow_store_t *out) {
    open_store *s;
    BATON_TRY(open_store_named(ctx, name, &s));
    BATON_TRY(store_flush(s));
    *out = baton_processor_state_borrow_store(s->handle);
    return BATON_OK;
}

static baton_processor_state_write_t *push_write(open_store *s) {
    return vec_push(&s->writes, sizeof(baton_processor_state_write_t), 1);
}

baton_status baton_get(baton_ctx *ctx, const char *store, baton_bytes key, baton_bytes *out) {
    baton_processor_state_borrow_store_t h;
    BATON_TRY(flushed(ctx, store, &h));
    list_u8_t k = as_list(key);
    processor_option_list_u8_t v;
    baton_processor_types_error_t err;
    if (!baton_processor_state_method_store_get(h, &k, &v, &err)) return from_wit(&err);
    *out = v.is_some ? kept(ctx, v.val) : BATON_NONE;
    return BATON_OK;
}

baton_status baton_get_many(baton_ctx *ctx, const char *store, const baton_bytes *keys, size_t n,
                            baton_bytes *out) {
    baton_processor_state_borrow_store_t h;
    BATON_TRY(flushed(ctx, store, &h));
    list_u8_t *ks = baton_alloc_(ctx, n * sizeof *ks);
    for (size_t i = 0; i < n; i++) ks[i] = as_list(keys[i]);
    processor_list_list_u8_t list = {ks, n};
    processor_list_option_list_u8_t vs;
    baton_processor_types_error_t err;
    if (!baton_processor_state_method_store_get_many(h, &list, &vs, &err)) return from_wit(&err);
    keep(ctx, vs.ptr, vs.len);
    for (size_t i = 0; i < n; i++)
        out[i] = i < vs.len && vs.ptr[i].is_some ? kept(ctx, vs.ptr[i].val) : BATON_NONE;
    return BATON_OK;
}

baton_status baton_set_with_expiry(baton_ctx *ctx, const char *store, baton_bytes key,
                                   baton_bytes value, const baton_expiry *expiry) {
    open_store *s;
    BATON_TRY(open_store_named(ctx, store, &s));
    baton_processor_state_set_op_t op = {
        .key = push_span(&s->data, key.ptr, key.len),
        .value = push_span(&s->data, value.ptr, value.len),
    };
    if (expiry) {
        op.expiry.is_some = true;
        op.expiry.val = (baton_processor_state_expiry_t){(uint8_t)expiry->kind, expiry->at};
    }
    baton_processor_state_write_t *w = push_write(s);
    w->tag = BATON_PROCESSOR_STATE_WRITE_SET;
    w->val.set = op;
    return BATON_OK;
}

baton_status baton_set(baton_ctx *ctx, const char *store, baton_bytes key, baton_bytes value) {
    return baton_set_with_expiry(ctx, store, key, value, NULL);
}

baton_status baton_set_with_ttl(baton_ctx *ctx, const char *store, baton_bytes key,
                                baton_bytes value, int64_t ttl_ms) {
    baton_expiry e = {BATON_EVENT_TIME, sat_add(ctx->timestamp, ttl_ms)};
    return baton_set_with_expiry(ctx, store, key, value, &e);
}

baton_status baton_set_with_processing_ttl(baton_ctx *ctx, const char *store, baton_bytes key,
                                           baton_bytes value, int64_t ttl_ms) {
    baton_expiry e = {BATON_PROCESSING_TIME, sat_add(baton_processing_time(ctx), ttl_ms)};
    return baton_set_with_expiry(ctx, store, key, value, &e);
}

baton_status baton_delete(baton_ctx *ctx, const char *store, baton_bytes key) {
    open_store *s;
    BATON_TRY(open_store_named(ctx, store, &s));
    span_t k = push_span(&s->data, key.ptr, key.len);
    baton_processor_state_write_t *w = push_write(s);
    w->tag = BATON_PROCESSOR_STATE_WRITE_DELETE;
    w->val.delete_ = k;
    return BATON_OK;
}

baton_status baton_add(baton_ctx *ctx, const char *store, baton_bytes key, int64_t delta) {
    open_store *s;
    BATON_TRY(open_store_named(ctx, store, &s));
    span_t k = push_span(&s->data, key.ptr, key.len);
    baton_processor_state_write_t *w = push_write(s);
    w->tag = BATON_PROCESSOR_STATE_WRITE_ADD;
    w->val.add = (baton_processor_state_add_op_t){k, delta};
    return BATON_OK;
}

baton_status baton_delete_range(baton_ctx *ctx, const char *store, baton_bytes start,
                                baton_bytes end, uint64_t *removed) {
    baton_processor_state_borrow_store_t h;
    BATON_TRY(flushed(ctx, store, &h));
    list_u8_t s = as_list(start), e = as_list(end);
    uint64_t n;
    baton_processor_types_error_t err;
    if (!baton_processor_state_method_store_delete_range(h, &s, end.ptr ? &e : NULL, &n, &err))
        return from_wit(&err);
    if (removed) *removed = n;
    return BATON_OK;
}

baton_status baton_increment(baton_ctx *ctx, const char *store, baton_bytes key, int64_t delta,
                             int64_t *out) {
    baton_processor_state_borrow_store_t h;
    BATON_TRY(flushed(ctx, store, &h));
    list_u8_t k = as_list(key);
    int64_t v;
    baton_processor_types_error_t err;
    if (!baton_processor_state_method_store_increment(h, &k, delta, &v, &err)) return from_wit(&err);
    if (out) *out = v;
    return BATON_OK;
}

baton_status baton_counter(baton_ctx *ctx, const char *store, baton_bytes key, int64_t *out) {
    baton_bytes v;
    BATON_TRY(baton_get(ctx, store, key, &v));
    if (v.ptr == NULL) {
        *out = 0;
        return BATON_OK;
    }
    if (v.len != 8) return baton_error(BATON_INVALID_VALUE, "counter of %zu bytes, want 8", v.len);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n = n << 8 | v.ptr[i];
    *out = (int64_t)n;
    return BATON_OK;
}

baton_status baton_scan(baton_ctx *ctx, const char *store, baton_bytes start, baton_bytes end,
                        uint32_t limit, const baton_entry **rows, size_t *n) {
    baton_processor_state_borrow_store_t h;
    BATON_TRY(flushed(ctx, store, &h));
    list_u8_t s = as_list(start), e = as_list(end);
    processor_list_tuple2_list_u8_list_u8_t list;
    baton_processor_types_error_t err;
    if (!baton_processor_state_method_store_scan(h, &s, end.ptr ? &e : NULL, limit, &list, &err))
        return from_wit(&err);
    baton_entry *out = baton_alloc_(ctx, list.len * sizeof *out);
    for (size_t i = 0; i < list.len; i++) {
        out[i].key = kept(ctx, list.ptr[i].f0);
        out[i].value = kept(ctx, list.ptr[i].f1);
    }
    keep(ctx, list.ptr, list.len);
    *rows = out;
    *n = list.len;
    return BATON_OK;
}

/* --- outputs ----------------------------------------------------------------------------- */

baton_status baton_send_with_headers(baton_ctx *ctx, const char *topic, baton_bytes key,
                                     baton_bytes value, const baton_header *headers, size_t n) {
    vec *d = &ctx->out_data;
    baton_processor_output_out_record_t r = {0};
    r.topic = push_span(d, (const uint8_t *)topic, strlen(topic));
    if (key.ptr) r.key = (baton_processor_output_option_span_t){true, push_span(d, key.ptr, key.len)};
    if (value.ptr)
        r.value = (baton_processor_output_option_span_t){true, push_span(d, value.ptr, value.len)};
    uint32_t first = (uint32_t)ctx->out_headers.len;
    for (size_t i = 0; i < n; i++) {
        baton_processor_types_header_entry_t h;
        h.name = push_span(d, headers[i].name.ptr, headers[i].name.len);
        h.value = push_span(d, headers[i].value.ptr, headers[i].value.len);
        *(baton_processor_types_header_entry_t *)vec_push(&ctx->out_headers, sizeof h, 1) = h;
    }
    r.headers = (span_t){first, (uint32_t)ctx->out_headers.len - first};
    r.timestamp = (processor_option_s64_t){true, ctx->timestamp};
    *(baton_processor_output_out_record_t *)vec_push(&ctx->out_records, sizeof r, 1) = r;
    return BATON_OK;
}

baton_status baton_send(baton_ctx *ctx, const char *topic, baton_bytes key, baton_bytes value) {
    return baton_send_with_headers(ctx, topic, key, value, NULL, 0);
}

baton_status baton_send_with_headers_of(baton_ctx *ctx, const char *topic, baton_bytes key,
                                        baton_bytes value, const baton_message *msg) {
    size_t n = msg->header_count;
    baton_header small[8];
    baton_header *hs = n <= 8 ? small : xrealloc(NULL, n * sizeof *hs);
    for (size_t i = 0; i < n; i++) hs[i] = baton_header_at(msg, i);
    baton_status st = baton_send_with_headers(ctx, topic, key, value, hs, n);
    if (hs != small) free(hs);
    return st;
}

static void out_discard(baton_ctx *ctx) {
    ctx->out_data.len = 0;
    ctx->out_records.len = 0;
    ctx->out_headers.len = 0;
}

static baton_status out_flush(baton_ctx *ctx) {
    if (ctx->out_records.len == 0) return BATON_OK;
    list_u8_t data = {ctx->out_data.ptr ? ctx->out_data.ptr : (uint8_t *)EMPTY, ctx->out_data.len};
    baton_processor_output_list_out_record_t records = {ctx->out_records.ptr, ctx->out_records.len};
    baton_processor_output_list_header_entry_t headers = {ctx->out_headers.ptr,
                                                          ctx->out_headers.len};
    baton_processor_types_item_error_t err;
    bool ok = baton_processor_output_send_batch(&data, &records, &headers, &err);
    out_discard(ctx);
    return ok ? BATON_OK : from_wit(&err.error);
}

/* --- timers and logs --------------------------------------------------------------------- */

baton_status baton_schedule(baton_ctx *ctx, baton_time_kind kind, int64_t at, baton_bytes key,
                            baton_bytes payload) {
    (void)ctx;
    list_u8_t k = as_list(key), p = as_list(payload);
    baton_processor_types_error_t err;
    if (!baton_processor_timers_schedule((uint8_t)kind, at, &k, payload.ptr ? &p : NULL, &err))
        return from_wit(&err);
    return BATON_OK;
}

baton_status baton_cancel(baton_ctx *ctx, baton_time_kind kind, int64_t at, baton_bytes key,
                          bool *was_pending) {
    (void)ctx;
    list_u8_t k = as_list(key);
    bool r;
    baton_processor_types_error_t err;
    if (!baton_processor_timers_cancel((uint8_t)kind, at, &k, &r, &err)) return from_wit(&err);
    if (was_pending) *was_pending = r;
    return BATON_OK;
}

void baton_log(baton_ctx *ctx, baton_level level, const char *fmt, ...) {
    (void)ctx;
    va_list ap;
    va_start(ap, fmt);
    char *s = vformat(fmt, ap);
    va_end(ap);
    processor_string_t m = {(uint8_t *)s, strlen(s)};
    baton_processor_log_log((uint8_t)level, &m);
    free(s);
}

/* --- messages ---------------------------------------------------------------------------- */

/* The bytes a word of the host's batch names (`start << 32 | len`), BATON_NONE for all ones
 * (empty when out of range, which the host never sends). */
static baton_bytes word_bytes(const uint8_t *data, size_t data_len, uint64_t w) {
    if (w == UINT64_MAX) return BATON_NONE;
    uint64_t start = w >> 32, len = w & 0xffffffffu;
    if (len == 0 || start + len > data_len) return (baton_bytes){EMPTY, 0};
    return (baton_bytes){data + start, (size_t)len};
}

/* Whether `b` is valid UTF-8. */
static bool is_utf8(baton_bytes b) {
    const uint8_t *p = b.ptr, *end = b.ptr + b.len;
    while (p < end) {
        uint8_t c = *p++;
        if (c < 0x80) continue;
        int n;
        uint32_t cp;
        if (c >= 0xc2 && c <= 0xdf) n = 1, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef) n = 2, cp = c & 0x0f;
        else if (c >= 0xf0 && c <= 0xf4) n = 3, cp = c & 0x07;
        else return false;
        if (end - p < n) return false;
        for (int i = 0; i < n; i++) {
            if ((p[i] & 0xc0) != 0x80) return false;
            cp = cp << 6 | (p[i] & 0x3f);
        }
        p += n;
        if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return false;
    }
    return true;
}

baton_header baton_header_at(const baton_message *msg, size_t i) {
    if (i >= msg->header_count) return (baton_header){BATON_NONE, BATON_NONE};
    const uint64_t *h = msg->header_words_ + 2 * i;
    baton_bytes name = word_bytes(msg->data_, msg->data_len_, h[0]);
    baton_bytes value = word_bytes(msg->data_, msg->data_len_, h[1]);
    if (name.ptr == NULL || !is_utf8(name)) name = (baton_bytes){EMPTY, 0};
    if (value.ptr == NULL) value = (baton_bytes){EMPTY, 0};
    return (baton_header){name, value};
}

baton_bytes baton_header_value(const baton_message *msg, const char *name) {
    for (size_t i = 0; i < msg->header_count; i++) {
        baton_header h = baton_header_at(msg, i);
        if (baton_bytes_eq(h.name, name)) return h.value;
    }
    return BATON_NONE;
}

/* --- the calls --------------------------------------------------------------------------- */

/* Hands every buffered write and output to the host. */
static baton_status flush_all(baton_ctx *ctx) {
    for (size_t i = 0; i < ctx->nstores; i++) BATON_TRY(store_flush(&ctx->stores[i]));
    return out_flush(ctx);
}

/* Forgets every buffered write and output (the host discards the call's effects). */
static void discard_all(baton_ctx *ctx) {
    for (size_t i = 0; i < ctx->nstores; i++) store_discard(&ctx->stores[i]);
    out_discard(ctx);
    clear_scheduled(ctx);
    release(ctx);
}

/* The end of a call: flushes unless it failed; on any error nothing buffered survives into
 * the next call, and the error goes back to the host. */
static bool finish(baton_ctx *ctx, baton_status st, baton_processor_types_error_t *err) {
    if (st == BATON_OK) st = flush_all(ctx);
    if (st == BATON_OK) return true;
    discard_all(ctx);
    to_wit(st, err);
    return false;
}

bool exports_baton_processor_handler_init(processor_list_tuple2_string_string_t *pairs,
                                          baton_processor_types_error_t *err) {
    baton_config config = {0};
    config.keys = xrealloc(NULL, pairs->len * sizeof(char *));
    config.values = xrealloc(NULL, pairs->len * sizeof(char *));
    for (size_t i = 0; i < pairs->len; i++) {
        config.keys[i] = dup_n(pairs->ptr[i].f0.ptr, pairs->ptr[i].f0.len);
        config.values[i] = dup_n(pairs->ptr[i].f1.ptr, pairs->ptr[i].f1.len);
        config.len++;
    }
    processor_list_tuple2_string_string_free(pairs);
    clear_message();
    baton_init_fn setup = baton_processor_.init;
    baton_status st = setup ? setup(&config) : BATON_OK;
    if (st != BATON_OK) {
        config_free(&config);
        to_wit(st, err);
        return false;
    }
    config_free(&CTX.config);
    CTX.config = config;
    return true;
}

/* Calls `f` for each record of the batch, stopping at the first error, then hands the buffered
 * writes and outputs to the host. */
static bool run_batch(baton_ctx *ctx, const baton_processor_types_batch_t *batch,
                      baton_process_fn f, baton_processor_types_error_t *err) {
    clear_message();
    ctx->event_time = batch->event_time;
    ctx->slot = batch->slot;
    const uint8_t *data = batch->data.len ? batch->data.ptr : EMPTY;
    size_t data_len = batch->data.len;
    const uint64_t *words = batch->records.ptr;
    size_t nheaders = batch->headers.len / 2;
    baton_message msg = {
        .topic = {batch->topic.len ? batch->topic.ptr : EMPTY, batch->topic.len},
        .slot = batch->slot,
        .data_ = data,
        .data_len_ = data_len,
    };
    baton_status st = BATON_OK;
    for (size_t i = 0; i + 5 <= batch->records.len; i += 5) {
        const uint64_t *r = words + i;
        uint64_t first = r[4] >> 32, count = r[4] & 0xffffffffu;
        msg.offset = r[0];
        msg.timestamp = (int64_t)r[1];
        msg.key = word_bytes(data, data_len, r[2]);
        msg.value = word_bytes(data, data_len, r[3]);
        if (first + count <= nheaders) {
            msg.header_words_ = batch->headers.ptr + 2 * first;
            msg.header_count = (size_t)count;
        } else {
            msg.header_words_ = NULL;
            msg.header_count = 0;
        }
        ctx->timestamp = msg.timestamp;
        if (msg.timestamp > ctx->event_time) ctx->event_time = msg.timestamp;
        st = f(&msg, ctx);
        release(ctx);
        if (st != BATON_OK) break;
    }
    return finish(ctx, st, err);
}

bool exports_baton_processor_handler_process(baton_processor_types_batch_t *batch,
                                             baton_processor_types_error_t *err) {
    baton_process_fn f = baton_processor_.process;
    bool ok = f == NULL || run_batch(&CTX, batch, f, err);
    baton_processor_types_batch_free(batch);
    return ok;
}

bool exports_baton_processor_handler_on_timers(uint32_t slot, int64_t event_time,
                                               exports_baton_processor_handler_list_fired_t *fired,
                                               baton_processor_types_error_t *err) {
    baton_timer_fn f = baton_processor_.on_timer;
    baton_ctx *ctx = &CTX;
    bool ok = true;
    if (f != NULL) {
        clear_message();
        ctx->event_time = event_time;
        ctx->slot = slot;
        baton_status st = BATON_OK;
        for (size_t i = 0; i < fired->len; i++) {
            exports_baton_processor_handler_fired_t *t = &fired->ptr[i];
            baton_timer timer = {
                .kind = t->kind == BATON_PROCESSOR_TYPES_TIME_KIND_EVENT_TIME ? BATON_EVENT_TIME
                                                                              : BATON_PROCESSING_TIME,
                .at = t->at,
                .key = {t->key.len ? t->key.ptr : EMPTY, t->key.len},
                .payload = t->payload.is_some
                               ? (baton_bytes){t->payload.val.len ? t->payload.val.ptr : EMPTY,
                                               t->payload.val.len}
                               : BATON_NONE,
            };
            ctx->timestamp = t->at;
            st = f(&timer, ctx);
            release(ctx);
            if (st != BATON_OK) break;
        }
        ok = finish(ctx, st, err);
    }
    /* The generated exports_baton_processor_handler_fired_free leaves the payload out: free
     * each field here. */
    for (size_t i = 0; i < fired->len; i++) {
        processor_list_u8_free(&fired->ptr[i].key);
        processor_option_list_u8_free(&fired->ptr[i].payload);
    }
    if (fired->len > 0) free(fired->ptr);
    return ok;
}
