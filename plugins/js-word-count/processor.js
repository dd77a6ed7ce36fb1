// word-count in JavaScript: counts records per key into the store `counts`
// (`groupByKey().count()`); records without a key are skipped.
import { processor } from "baton-sdk";

export const handler = processor({
  process(msg, ctx) {
    if (msg.key !== null) ctx.add("counts", msg.key, 1);
  },
});
