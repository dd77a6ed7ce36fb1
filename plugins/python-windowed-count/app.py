"""windowed-count in Python: counts records per key in tumbling event-time windows and sends
each window's final count once, when it closes. The same config, state and outputs as the Rust
`windowed-count`: `window_ms`, `grace_ms` (default 0), `output`, `late`."""

from baton_sdk import InvalidInput, init, on_timer, processor
from baton_sdk.windows import Windows

settings = {}


@init
def setup(config):
    window = config.require_int("window_ms")
    if window <= 0:
        raise InvalidInput("config `window_ms` must be positive")
    grace = config.require_int("grace_ms") if "grace_ms" in config else 0
    if grace < 0:
        raise InvalidInput("config `grace_ms` must not be negative")
    settings["windows"] = Windows.tumbling("windows", window).with_grace(grace)
    settings["output"] = config.require("output")
    settings["late"] = config.require("late")


@processor
def process(msg, ctx):
    if msg.key is None:
        return
    if not settings["windows"].count(ctx, msg.key, msg.timestamp, 1):
        ctx.send(settings["late"], msg.key, msg.value, msg.headers)


@on_timer
def close(timer, ctx):
    for w in settings["windows"].closed(ctx, timer) or []:
        value = '{"start":%d,"end":%d,"count":%d}' % (w.start, w.end, w.count)
        ctx.send(settings["output"], w.key, value.encode())
