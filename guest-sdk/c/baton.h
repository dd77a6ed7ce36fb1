/*
 * baton.h: write baton stream processors in C.
 *
 * A processor is a function called once per input record; BATON_PROCESSOR registers it (and,
 * optionally, a function for timers and one for the pipeline's config) as the exports of a
 * WebAssembly component of the `baton:processor@0.2.0` world:
 *
 *     #include "baton.h"
 *
 *     // Counts records per key into the store `counts`.
 *     static baton_status process(const baton_message *msg, baton_ctx *ctx) {
 *         if (msg->key.ptr == NULL) return BATON_OK;
 *         return baton_add(ctx, "counts", msg->key, 1);
 *     }
 *
 *     BATON_PROCESSOR(process);
 *
 * Build it with a Makefile that includes baton.mk (see README.md): `make` compiles for
 * wasm32-wasi with clang and makes `target/<name>.wasm` with `baton componentize`.
 *
 * Errors: every function that can fail returns a baton_status, BATON_OK (0) or the kind of the
 * error, with its message in baton_error_message(). A processor function returns one too: any
 * status but BATON_OK fails the call, which the host turns into a retry of each record alone and
 * then a dead letter carrying the kind and the message. baton_error() sets the message:
 *
 *     if (n > 10) return baton_error(BATON_INVALID_INPUT, "too many: %d", n);
 *
 * Batches: the host hands over a whole batch of one slot's records in one call, and messages
 * point into it: reading a record copies nothing. Writes that return nothing (baton_set,
 * baton_delete, baton_add) and outputs (baton_send) are buffered and reach the host in one call
 * per store at the end of the batch, or before any read of the same store, so a read always
 * sees every earlier write. Prefer baton_add to baton_increment when the new value is not
 * needed: baton_increment is a host call per record.
 *
 * Memory: bytes the SDK hands back (baton_get, baton_scan, ...) stay valid until the processor
 * function that asked for them returns; the SDK frees them then. Bytes passed in are copied.
 *
 * Guarantees: state calls are scoped to the slot of the record being processed, and a batch is
 * atomic: when the function fails for a record (or traps), every state write, timer and output
 * of the call is discarded.
 */
#ifndef BATON_H
#define BATON_H

/* The version of this SDK's source API (semver; CHANGELOG.md at the repository's root), and the
 * contract it builds for. */
#define BATON_SDK_VERSION_MAJOR 0
#define BATON_SDK_VERSION_MINOR 2
#define BATON_SDK_VERSION_PATCH 0
#define BATON_SDK_VERSION "0.2.0"
#define BATON_CONTRACT_VERSION "0.2.0"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* --- bytes ------------------------------------------------------------------------------- */

/* A run of bytes; `ptr == NULL` means none (a record without a key, a tombstone, a missing
 * value). A present but empty value has a non-NULL `ptr` and `len == 0`. */
typedef struct baton_bytes {
    const uint8_t *ptr;
    size_t len;
} baton_bytes;

/* No bytes at all (`None`). */
#define BATON_NONE ((baton_bytes){NULL, 0})

/* The bytes of a NUL-terminated string (without the NUL); BATON_NONE for NULL. */
baton_bytes baton_str(const char *s);

/* Whether `b` holds bytes (possibly zero of them). */
static inline bool baton_some(baton_bytes b) { return b.ptr != NULL; }

/* Whether `b` holds exactly the bytes of the NUL-terminated string `s`. */
bool baton_bytes_eq(baton_bytes b, const char *s);

/* --- errors ------------------------------------------------------------------------------ */

/* The outcome of a call: BATON_OK, or the kind of the contract's `error` variant. */
typedef enum baton_status {
    BATON_OK = 0,
    /* The pipeline declares no store of this name. */
    BATON_NO_SUCH_STORE,
    /* The pipeline declares no output topic of this name. */
    BATON_NO_SUCH_TOPIC,
    /* A stored value cannot be used as asked (a counter that is not 8 bytes, an overflow). */
    BATON_INVALID_VALUE,
    /* The processor rejects its input or its configuration. */
    BATON_INVALID_INPUT,
    /* A key, value or record is larger than the pipeline's limits allow. */
    BATON_TOO_LARGE,
    /* A limit of the pipeline was reached (e.g. pending timers). */
    BATON_LIMIT,
    /* Anything else. */
    BATON_OTHER,
} baton_status;

/* Sets the message of the current error (printf-style) and returns `kind`. */
baton_status baton_error(baton_status kind, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The message of the last error (empty when none was set since the call began). */
const char *baton_error_message(void);

/* Evaluates `expr` (a baton_status) and returns it from the enclosing function unless OK. */
#define BATON_TRY(expr)                                                                         \
    do {                                                                                        \
        baton_status baton_try_status_ = (expr);                                                \
        if (baton_try_status_ != BATON_OK) return baton_try_status_;                            \
    } while (0)

/* --- what a processor sees --------------------------------------------------------------- */

/* Which clock a timer or a time-to-live follows. */
typedef enum baton_time_kind {
    /* The slot's event time: the highest record timestamp seen in the slot. */
    BATON_EVENT_TIME = 0,
    /* The host's wall clock, in milliseconds since the Unix epoch. */
    BATON_PROCESSING_TIME = 1,
} baton_time_kind;

/* Log levels. */
typedef enum baton_level {
    BATON_TRACE = 0,
    BATON_DEBUG,
    BATON_INFO,
    BATON_WARN,
    BATON_ERROR,
} baton_level;

/* A header: a name (UTF-8) and opaque bytes. */
typedef struct baton_header {
    baton_bytes name;
    baton_bytes value;
} baton_header;

/* One input record; it points into the batch the host handed over. */
typedef struct baton_message {
    /* The input topic (UTF-8). */
    baton_bytes topic;
    /* The slot (partition of the input topic) it was read from. */
    uint32_t slot;
    /* Its position in the slot. */
    uint64_t offset;
    /* Its creation time in milliseconds since the Unix epoch. */
    int64_t timestamp;
    /* BATON_NONE for a record without a key. */
    baton_bytes key;
    /* BATON_NONE for a tombstone. */
    baton_bytes value;
    /* Its headers: use baton_header_count and baton_header_at. */
    size_t header_count;
    const uint64_t *header_words_; /* two words per header, as the batch lays them out */
    const uint8_t *data_;
    size_t data_len_;
} baton_message;

/* Its `i`th header (`i < msg->header_count`), in order. A name that is not UTF-8 reads as "". */
baton_header baton_header_at(const baton_message *msg, size_t i);

/* The value of the first header named `name`; BATON_NONE when there is none. */
baton_bytes baton_header_value(const baton_message *msg, const char *name);

/* A timer that fell due (see baton_schedule). */
typedef struct baton_timer {
    /* Its clock. */
    baton_time_kind kind;
    /* When it was due, in milliseconds of its clock. */
    int64_t at;
    /* The key it was scheduled for. */
    baton_bytes key;
    /* What it carries; BATON_NONE for nothing. */
    baton_bytes payload;
} baton_timer;

/* The pipeline's `config` object, flattened: string values as they are, any other JSON value
 * as its JSON text. The SDK keeps the config that `init` accepted for the instance's life, so
 * the strings it hands out stay valid: a processor may keep them (in globals, say). */
typedef struct baton_config baton_config;

/* The value of `key` (NUL-terminated), NULL when it is not set. */
const char *baton_config_get(const baton_config *config, const char *key);

/* The value of `key` in `*out`, or BATON_INVALID_INPUT naming the missing key. */
baton_status baton_config_require(const baton_config *config, const char *key, const char **out);

/* The value of `key` as an integer in `*out`, or BATON_INVALID_INPUT naming the key. */
baton_status baton_config_require_i64(const baton_config *config, const char *key, int64_t *out);

/* What a processor function can do besides reading its record: state, timers, outputs, logs. */
typedef struct baton_ctx baton_ctx;

/* The pipeline's config. */
const baton_config *baton_config_of(const baton_ctx *ctx);

/* The timestamp of the record being processed (in a timer callback: the timer's `at`). */
int64_t baton_timestamp(const baton_ctx *ctx);

/* The slot's event time: the highest record timestamp seen in it, up to and including the
 * record being processed (in a timer callback: with the whole batch counted). */
int64_t baton_event_time(const baton_ctx *ctx);

/* The slot of the current call. */
uint32_t baton_slot(const baton_ctx *ctx);

/* The host's wall clock, in milliseconds since the Unix epoch. */
int64_t baton_processing_time(baton_ctx *ctx);

/* --- state -------------------------------------------------------------------------------
 * `store` names one of the pipeline's stores (BATON_NO_SUCH_STORE otherwise). */

/* When an entry expires: once `kind`'s clock reaches `at` (milliseconds). */
typedef struct baton_expiry {
    baton_time_kind kind;
    int64_t at;
} baton_expiry;

/* An entry of a scan. */
typedef struct baton_entry {
    baton_bytes key;
    baton_bytes value;
} baton_entry;

/* The value of `key` in `*out`; BATON_NONE when it is missing or expired. */
baton_status baton_get(baton_ctx *ctx, const char *store, baton_bytes key, baton_bytes *out);

/* The values of `n` keys at once, in the order asked, in `out[0..n]`. */
baton_status baton_get_many(baton_ctx *ctx, const char *store, const baton_bytes *keys, size_t n,
                            baton_bytes *out);

/* Sets `key` to `value` (buffered until the end of the batch or the next read). */
baton_status baton_set(baton_ctx *ctx, const char *store, baton_bytes key, baton_bytes value);

/* Sets `key` to `value`, to expire `ttl_ms` after the record's timestamp (in event time). */
baton_status baton_set_with_ttl(baton_ctx *ctx, const char *store, baton_bytes key,
                                baton_bytes value, int64_t ttl_ms);

/* Sets `key` to `value`, to expire `ttl_ms` from now on the host's wall clock. */
baton_status baton_set_with_processing_ttl(baton_ctx *ctx, const char *store, baton_bytes key,
                                           baton_bytes value, int64_t ttl_ms);

/* Sets `key` to `value`, to expire at `*expiry` (NULL: never). */
baton_status baton_set_with_expiry(baton_ctx *ctx, const char *store, baton_bytes key,
                                   baton_bytes value, const baton_expiry *expiry);

/* Deletes `key` (buffered). */
baton_status baton_delete(baton_ctx *ctx, const char *store, baton_bytes key);

/* Deletes every entry with `start <= key < end` (`end` BATON_NONE: no upper bound); how many
 * there were goes to `*removed` unless it is NULL. */
baton_status baton_delete_range(baton_ctx *ctx, const char *store, baton_bytes start,
                                baton_bytes end, uint64_t *removed);

/* Adds `delta` to the counter at `key` (8-byte big-endian, Kafka's LongSerializer), buffered:
 * errors such as an overflow surface at the end of the batch. */
baton_status baton_add(baton_ctx *ctx, const char *store, baton_bytes key, int64_t delta);

/* Adds `delta` to the counter at `key`; the new value goes to `*out` unless it is NULL (one
 * host call). */
baton_status baton_increment(baton_ctx *ctx, const char *store, baton_bytes key, int64_t delta,
                             int64_t *out);

/* The counter at `key` in `*out`, 0 when missing. */
baton_status baton_counter(baton_ctx *ctx, const char *store, baton_bytes key, int64_t *out);

/* Up to `limit` entries with `start <= key < end` (`end` BATON_NONE: no upper bound), in
 * ascending byte order of the key: `*rows` and `*n`. */
baton_status baton_scan(baton_ctx *ctx, const char *store, baton_bytes start, baton_bytes end,
                        uint32_t limit, const baton_entry **rows, size_t *n);

/* --- outputs -----------------------------------------------------------------------------
 * Buffered: an unknown topic surfaces at the end of the batch. Records carry the timestamp of
 * the record being processed (of the timer's `at` in a timer callback). */

/* Sends a record to a declared output topic. */
baton_status baton_send(baton_ctx *ctx, const char *topic, baton_bytes key, baton_bytes value);

/* Sends a record with `n` headers to a declared output topic. */
baton_status baton_send_with_headers(baton_ctx *ctx, const char *topic, baton_bytes key,
                                     baton_bytes value, const baton_header *headers, size_t n);

/* Sends a record with the headers of `msg` to a declared output topic. */
baton_status baton_send_with_headers_of(baton_ctx *ctx, const char *topic, baton_bytes key,
                                        baton_bytes value, const baton_message *msg);

/* --- timers ------------------------------------------------------------------------------ */

/* Schedules a timer for `key` in this slot at `at` (milliseconds of `kind`'s clock); the same
 * `(kind, at, key)` again replaces its payload (BATON_NONE: none). */
baton_status baton_schedule(baton_ctx *ctx, baton_time_kind kind, int64_t at, baton_bytes key,
                            baton_bytes payload);

/* Cancels a timer; whether one was pending goes to `*was_pending` unless it is NULL. */
baton_status baton_cancel(baton_ctx *ctx, baton_time_kind kind, int64_t at, baton_bytes key,
                          bool *was_pending);

/* --- logs -------------------------------------------------------------------------------- */

/* Writes a message (printf-style) to the host's log, which adds pipeline, slot and offset.
 * Logging never fails and is not part of the call's transaction. */
void baton_log(baton_ctx *ctx, baton_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* --- registration ------------------------------------------------------------------------ */

/* Called for each record of a batch, in offset order. */
typedef baton_status (*baton_process_fn)(const baton_message *msg, baton_ctx *ctx);
/* Called for each timer that fell due, in order of `at`. */
typedef baton_status (*baton_timer_fn)(const baton_timer *timer, baton_ctx *ctx);
/* Called once per instance with the pipeline's config, before any record; an error stops the
 * partition from starting, with its message as the reason. */
typedef baton_status (*baton_init_fn)(const baton_config *config);

typedef struct baton_processor {
    baton_process_fn process;
    baton_timer_fn on_timer;
    baton_init_fn init;
} baton_processor;

/* Registers the processor, once per program: the record function, then optionally
 * `.on_timer = f` and `.init = f`:
 *
 *     BATON_PROCESSOR(process, .on_timer = close, .init = setup);
 *
 * Without `.on_timer`, timers that fall due are acknowledged and dropped. */
#define BATON_PROCESSOR(...)                                                                    \
    _Pragma("GCC diagnostic push")                                                              \
    _Pragma("GCC diagnostic ignored \"-Wmissing-field-initializers\"")                          \
    const baton_processor baton_processor_ = {__VA_ARGS__};                                     \
    _Pragma("GCC diagnostic pop")                                                               \
    extern const baton_processor baton_processor_

/* --- for the SDK's own modules (windows.c); not a public API ------------------------------ */

/* Whether this instance knows the timer `key` of the current slot is scheduled. */
bool baton_scheduled_has_(baton_ctx *ctx, baton_bytes key);
/* Remembers (`on`) or forgets the timer `key` of the current slot; forgotten with the call's
 * effects when a call fails. */
baton_status baton_scheduled_set_(baton_ctx *ctx, baton_bytes key, bool on);
/* Memory that lives until the current processor function returns. */
void *baton_alloc_(baton_ctx *ctx, size_t size);

#ifdef __cplusplus
}
#endif

#endif
