/*
 * word-count in C: counts records per key into the store `counts` (`groupByKey().count()`);
 * records without a key are skipped, as Kafka Streams' `groupByKey` drops them. The same state
 * as the Rust `word-count`.
 */
#include "baton.h"

static baton_status process(const baton_message *msg, baton_ctx *ctx) {
    if (!baton_some(msg->key)) return BATON_OK;
    return baton_add(ctx, "counts", msg->key, 1);
}

BATON_PROCESSOR(process);
