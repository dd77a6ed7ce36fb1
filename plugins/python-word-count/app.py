"""word-count in Python: counts records per key into the store `counts`
(`groupByKey().count()`); records without a key are skipped."""

from baton_sdk import processor


@processor
def process(msg, ctx):
    if msg.key is not None:
        ctx.add("counts", msg.key, 1)
