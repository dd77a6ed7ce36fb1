// windowed-count in JavaScript: counts records per key in tumbling event-time windows and sends
// each window's final count once, when it closes. The same config, state and outputs as the
// Rust `windowed-count`: `window_ms`, `grace_ms` (default 0), `output`, `late`.
import { InvalidInput, processor } from "baton-sdk";
import { Windows } from "baton-sdk/windows";

let windows, output, late;

export const handler = processor({
  init(config) {
    const window = config.requireInt("window_ms");
    if (window <= 0) throw new InvalidInput("config `window_ms` must be positive");
    const grace = config.has("grace_ms") ? config.requireInt("grace_ms") : 0;
    if (grace < 0) throw new InvalidInput("config `grace_ms` must not be negative");
    windows = Windows.tumbling("windows", window).withGrace(grace);
    output = config.require("output");
    late = config.require("late");
  },

  process(msg, ctx) {
    if (msg.key === null) return;
    if (!windows.count(ctx, msg.key, msg.timestamp, 1)) {
      ctx.send(late, msg.key, msg.value, msg.headers);
    }
  },

  onTimer(timer, ctx) {
    for (const w of windows.closed(ctx, timer) ?? []) {
      ctx.send(output, w.key, `{"start":${w.start},"end":${w.end},"count":${w.count}}`);
    }
  },
});
