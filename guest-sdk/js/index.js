// baton's JavaScript SDK: stateful stream processors for the baton host, as WebAssembly
// components built by componentize-js over the `baton:processor@0.2.0` world.
//
// A processor is an ES module that exports the handler this SDK makes:
//
//     import { processor } from "baton-sdk";
//
//     export const handler = processor({
//       process(msg, ctx) {
//         if (msg.key) ctx.add("counts", msg.key, 1);
//       },
//     });
//
// `process(msg, ctx)` is called for every record, `onTimer(timer, ctx)` for every timer that
// falls due, and `init(config)` once with the pipeline's config. Build it with `build.mjs`
// (esbuild, then componentize-js), test it with `baton test-plugin`, deploy it like any module.
//
// The SDK moves records in batches (the batch ABI): writes and outputs are buffered and handed
// to the host in one call per store (`store.apply`) and one for outputs (`output.send-batch`),
// and a store's writes are flushed before a read of it, so reads see the call's own writes. A
// call that throws leaves nothing behind: the host discards its writes, timers and outputs and
// retries its records one by one; a record that still fails goes to the dead-letter topic with
// the error.

import { Store } from "baton:processor/state@0.2.0";
import {
  schedule as hostSchedule,
  cancel as hostCancel,
  processingTime as hostProcessingTime,
} from "baton:processor/timers@0.2.0";
import { sendBatch } from "baton:processor/output@0.2.0";
import { log as hostLog } from "baton:processor/log@0.2.0";

// --- bytes -------------------------------------------------------------------------------------

const ENCODER = new TextEncoder();
const DECODER = new TextDecoder();

/** Keys and values are bytes: a Uint8Array as it is, a string as its UTF-8 encoding. */
export function bytes(v) {
  if (v instanceof Uint8Array) return v;
  if (typeof v === "string") return ENCODER.encode(v);
  // The bindings live in a realm of their own: what the host hands over (record keys, values,
  // scan results) are Uint8Arrays of that realm, not `instanceof` this one's.
  const tag = Object.prototype.toString.call(v);
  if (tag === "[object Uint8Array]") return v;
  if (ArrayBuffer.isView(v)) return new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
  if (tag === "[object ArrayBuffer]") return new Uint8Array(v);
  if (Array.isArray(v)) return Uint8Array.from(v);
  throw new TypeError(`bytes: expected a Uint8Array or a string, not ${describe(v)}`);
}

/** Bytes the bindings hand over as a Uint8Array of this realm (a view: nothing is copied). */
function own(b) {
  return b === undefined || b === null ? null : new Uint8Array(b.buffer, b.byteOffset, b.length);
}

/** Bytes as text (UTF-8; invalid sequences become U+FFFD). `null` stays `null`. */
export function text(b) {
  if (b === null || b === undefined) return null;
  return DECODER.decode(b);
}

function describe(v) {
  if (v === null) return "null";
  if (typeof v === "object") return v.constructor ? v.constructor.name : "an object";
  return typeof v;
}

function optBytes(v) {
  return v === null || v === undefined ? undefined : bytes(v);
}

/** An integer for an `s64` argument: a safe integer Number or a BigInt. */
function int64(v, what) {
  if (typeof v === "bigint") return v;
  if (typeof v === "number" && Number.isSafeInteger(v)) return v;
  throw new TypeError(`${what} must be an integer, not ${typeof v === "number" ? v : describe(v)}`);
}

/** An `s64` the bindings hand over as a Number. componentize-js 0.23 passes an `s64` that
 * travels as a core `i64` (an export's parameter, an import's result) as an unsigned BigInt
 * (`-1` as 2^64 - 1): read it back as two's complement. */
function s64(v) {
  return typeof v === "bigint" ? Number(BigInt.asIntN(64, v)) : Number(v);
}

/** Bytes appended back to back, each named by a span, for one batched host call. */
class Buffer {
  constructor() {
    this.buf = new Uint8Array(256);
    this.len = 0;
  }

  span(b) {
    const start = this.len;
    const end = start + b.length;
    if (end > this.buf.length) {
      let cap = this.buf.length * 2;
      while (cap < end) cap *= 2;
      const grown = new Uint8Array(cap);
      grown.set(this.buf.subarray(0, start));
      this.buf = grown;
    }
    this.buf.set(b, start);
    this.len = end;
    return { start, len: b.length };
  }

  /** Appends `a` then `b`, named by one span. */
  span2(a, b) {
    const s = this.span(a);
    s.len += this.span(b).len;
    return s;
  }

  bytes() {
    return this.buf.subarray(0, this.len);
  }

  clear() {
    this.len = 0;
  }
}

// --- errors ------------------------------------------------------------------------------------

/** An error the host knows: thrown by state, timer and output calls, and thrown by a processor
 * to fail its record with a kind the host reports. */
export class BatonError extends Error {
  constructor(message) {
    super(String(message));
    this.name = new.target.name;
  }
}

/** The pipeline declares no store of this name. */
export class NoSuchStore extends BatonError {}
/** The pipeline declares no output topic of this name. */
export class NoSuchTopic extends BatonError {}
/** A stored value cannot be used as asked (e.g. a counter that is not 8 bytes). */
export class InvalidValue extends BatonError {}
/** The processor rejects its input or its configuration. */
export class InvalidInput extends BatonError {}
/** A key, value or record is larger than the pipeline's limits allow. */
export class TooLarge extends BatonError {}
/** A limit of the pipeline was reached (e.g. pending timers). */
export class Limit extends BatonError {}
/** Anything else. */
export class Other extends BatonError {}

const KINDS = [
  ["no-such-store", NoSuchStore],
  ["no-such-topic", NoSuchTopic],
  ["invalid-value", InvalidValue],
  ["invalid-input", InvalidInput],
  ["too-large", TooLarge],
  ["limit", Limit],
  ["other", Other],
];

/** A host error (the `error` variant, or an `item-error` around one) as an exception; anything
 * else thrown by the bindings as it is. */
function fromWit(e) {
  if (e === null || typeof e !== "object" || !("payload" in e)) return e;
  let v = e.payload;
  if (v && typeof v === "object" && "error" in v && "index" in v) v = v.error;
  if (v && typeof v === "object" && "tag" in v) {
    for (const [tag, cls] of KINDS) {
      if (v.tag === tag) return new cls(v.val);
    }
  }
  return new Other(String(v));
}

/** Calls a host function, its errors as BatonErrors. */
function call(f, ...args) {
  try {
    return f(...args);
  } catch (e) {
    throw fromWit(e);
  }
}

/** Where an exception was thrown: the first frame of its stack, if the engine kept one
 * (SpiderMonkey writes frames as `fn@file:line:col`, V8 as `at fn (file:line:col)`). */
function where(e) {
  if (typeof e.stack !== "string") return "";
  for (const raw of e.stack.split("\n")) {
    const l = raw.trim();
    const at = l.indexOf("@");
    if (at >= 0) return ` (at ${l.slice(at + 1)} in ${l.slice(0, at) || "<anonymous>"})`;
    if (l.startsWith("at ")) return ` (${l})`;
  }
  return "";
}

/** An exception thrown by the processor as the host's `error` variant. */
function toWit(e) {
  if (e instanceof BatonError) {
    for (const [tag, cls] of KINDS) {
      if (e instanceof cls) return { tag, val: e.message };
    }
    return { tag: "other", val: e.message };
  }
  // An Error of any realm (the bindings throw their own TypeErrors).
  if (e !== null && typeof e === "object" && typeof e.message === "string") {
    return { tag: "other", val: `${e.name || "Error"}: ${e.message}${where(e)}` };
  }
  return { tag: "other", val: `thrown: ${safeString(e)}` };
}

function safeString(v) {
  try {
    return typeof v === "string" ? v : JSON.stringify(v) ?? String(v);
  } catch {
    return String(v);
  }
}

// --- what a processor sees ---------------------------------------------------------------------

/** Which clock a timer or a time-to-live follows. */
export const TimeKind = Object.freeze({
  /** The slot's event time: the highest record timestamp seen in the slot. */
  EVENT_TIME: "event-time",
  /** The host's wall clock, in milliseconds since the Unix epoch. */
  PROCESSING_TIME: "processing-time",
});

/** Log levels. */
export const Level = Object.freeze({
  TRACE: "trace",
  DEBUG: "debug",
  INFO: "info",
  WARN: "warn",
  ERROR: "error",
});

function timeKind(kind) {
  if (kind === undefined || kind === null) return TimeKind.EVENT_TIME;
  if (kind === TimeKind.EVENT_TIME || kind === TimeKind.PROCESSING_TIME) return kind;
  throw new TypeError(`a time kind is "event-time" or "processing-time", not ${safeString(kind)}`);
}

const LEVELS = new Set(Object.values(Level));

const TWO32 = 4294967296;
const NONE = 0xffffffff;

/** One input record. Its key, value and header values are views of the batch's bytes. */
export class Message {
  constructor(topic, slot, offset, timestamp, key, value, first, count, batch) {
    /** The input topic. */
    this.topic = topic;
    /** The partition of the input topic it was read from. */
    this.slot = slot;
    /** Its offset in the slot. */
    this.offset = offset;
    /** Milliseconds since the Unix epoch. */
    this.timestamp = timestamp;
    /** The key; `null` for a record without one. */
    this.key = key;
    /** The value; `null` for a tombstone. */
    this.value = value;
    this._first = first;
    this._count = count;
    this._batch = batch;
  }

  /** The headers, in order: `[name, value]`. */
  get headers() {
    const out = [];
    if (this._count === 0) return out;
    const w = this._batch.headerWords();
    const d = this._batch.data;
    for (let i = this._first; i < this._first + this._count; i++) {
      // Two words per header, each `start << 32 | len` (little-endian halves: len, start).
      const n = i * 4;
      const name = DECODER.decode(d.subarray(w[n + 1], w[n + 1] + w[n]));
      out.push([name, d.subarray(w[n + 3], w[n + 3] + w[n + 2])]);
    }
    return out;
  }

  /** The value of the first header called `name`, or `null`. */
  header(name) {
    for (const [n, v] of this.headers) {
      if (n === name) return v;
    }
    return null;
  }

  /** The key as text (UTF-8), or `null`. */
  get keyText() {
    return text(this.key);
  }

  /** The value as text (UTF-8), or `null`. */
  get valueText() {
    return text(this.value);
  }
}

/** A timer that fell due. */
export class Timer {
  constructor(kind, at, key, payload) {
    /** Its clock (`TimeKind`). */
    this.kind = kind;
    /** When it was due, in milliseconds of its clock. */
    this.at = at;
    /** The key it was scheduled for. */
    this.key = key;
    /** What it carries, or `null`. */
    this.payload = payload;
  }
}

/** The pipeline's `config` object, flattened: string values as they are, any other JSON value
 * as its JSON text. */
export class Config {
  constructor(pairs = []) {
    /** The entries, by key. */
    this.values = new Map(pairs);
  }

  /** The value of `key`, or `fallback` (default `null`). */
  get(key, fallback = null) {
    const v = this.values.get(key);
    return v === undefined ? fallback : v;
  }

  /** Whether `key` is set. */
  has(key) {
    return this.values.has(key);
  }

  /** The value of `key`; InvalidInput naming it when it is missing. */
  require(key) {
    const v = this.values.get(key);
    if (v === undefined) throw new InvalidInput(`config \`${key}\` is required`);
    return v;
  }

  /** The value of `key` as an integer; InvalidInput naming it otherwise. */
  requireInt(key) {
    const v = this.require(key);
    const n = /^\s*[+-]?\d+\s*$/.test(v) ? Number(v) : NaN;
    if (!Number.isSafeInteger(n)) {
      throw new InvalidInput(`config \`${key}\` must be an integer, not \`${v}\``);
    }
    return n;
  }
}

/** A store the processor opened, with its writes not yet handed to the host. */
class OpenStore {
  constructor(name, handle) {
    this.name = name;
    this.handle = handle;
    this.data = new Buffer();
    this.writes = [];
  }

  flush() {
    if (this.writes.length === 0) return;
    const data = this.data.bytes();
    const writes = this.writes;
    this.writes = [];
    try {
      call((d, w) => this.handle.apply(d, w), data, writes);
    } finally {
      this.data.clear();
    }
  }

  discard() {
    this.data.clear();
    this.writes = [];
  }
}

/** What a processor can do besides reading its record: state, timers, outputs, logs, config.
 *
 * Every call is scoped to the slot of the record (or timer) being handled. */
export class Context {
  constructor() {
    this._stores = new Map();
    this._out = new Buffer();
    this._outRecords = [];
    this._outHeaders = [];
    this._topics = new Map();
    /** The pipeline's config. */
    this.config = new Config();
    /** The timestamp of the record being processed (the `at` of the timer firing). */
    this.timestamp = 0;
    /** The slot's event time, this record counted. */
    this.eventTime = -1;
    /** The slot of the current call. */
    this.slot = 0;
    /** Timers this instance knows are scheduled, as `slot:key` (used by windows), so that it
     * schedules each once; forgotten with the call's effects when a call fails. */
    this.scheduled = new Set();
  }

  // state

  _open(name) {
    let s = this._stores.get(name);
    if (s === undefined) {
      if (typeof name !== "string") throw new TypeError(`a store name is a string, not ${describe(name)}`);
      s = new OpenStore(name, call((n) => Store.open(n), name));
      this._stores.set(name, s);
    }
    return s;
  }

  _flushed(name) {
    const s = this._open(name);
    s.flush();
    return s.handle;
  }

  /** The value of `key` (a Uint8Array), or `null`. */
  get(store, key) {
    const h = this._flushed(store);
    return own(call((k) => h.get(k), bytes(key)));
  }

  /** The values of many keys at once, in order (`null` where missing). */
  getMany(store, keys) {
    const h = this._flushed(store);
    const vs = call((ks) => h.getMany(ks), Array.from(keys, bytes));
    return vs.map(own);
  }

  /** Sets `key` to `value` (buffered until the end of the call or the next read of `store`). */
  set(store, key, value) {
    this._set(store, bytes(key), bytes(value), undefined);
  }

  /** Sets `key` to `value` until the slot's event time reaches this record's timestamp plus
   * `ttlMs`. */
  setWithTtl(store, key, value, ttlMs) {
    const at = this.timestamp + Number(int64(ttlMs, "ttlMs"));
    this._set(store, bytes(key), bytes(value), { kind: TimeKind.EVENT_TIME, at });
  }

  /** Sets `key` to `value` for `ttlMs` of the host's wall clock. */
  setWithProcessingTtl(store, key, value, ttlMs) {
    const at = this.processingTime() + Number(int64(ttlMs, "ttlMs"));
    this._set(store, bytes(key), bytes(value), { kind: TimeKind.PROCESSING_TIME, at });
  }

  /** Sets `key` to `value`, to expire at `expiry` (`{kind, at}`; `null`: never). */
  setWithExpiry(store, key, value, expiry) {
    const e =
      expiry === null || expiry === undefined
        ? undefined
        : { kind: timeKind(expiry.kind), at: int64(expiry.at, "expiry.at") };
    this._set(store, bytes(key), bytes(value), e);
  }

  _set(store, key, value, expiry) {
    const s = this._open(store);
    const k = s.data.span(key);
    const v = s.data.span(value);
    s.writes.push({ tag: "set", val: { key: k, value: v, expiry } });
  }

  /** Removes `key` (buffered). */
  delete(store, key) {
    const s = this._open(store);
    s.writes.push({ tag: "delete", val: s.data.span(bytes(key)) });
  }

  /** Removes every entry with `start <= key < end` (`end` null: no bound); how many. */
  deleteRange(store, start, end = null) {
    const h = this._flushed(store);
    return Number(call((a, b) => h.deleteRange(a, b), bytes(start), optBytes(end)));
  }

  /** Adds `delta` to the counter at `key` (an 8-byte big-endian integer, 0 if missing),
   * buffered: errors such as an overflow surface at the end of the call. */
  add(store, key, delta) {
    const d = int64(delta, "delta");
    const s = this._open(store);
    s.writes.push({ tag: "add", val: { key: s.data.span(bytes(key)), delta: d } });
  }

  /** `add` of the key `prefix + key` (for windows: no concatenation per record). */
  _add2(store, prefix, key, delta) {
    const d = int64(delta, "delta");
    const s = this._open(store);
    s.writes.push({ tag: "add", val: { key: s.data.span2(prefix, bytes(key)), delta: d } });
  }

  /** Adds `delta` to the counter at `key` and returns the new count (one host call). */
  increment(store, key, delta) {
    const d = int64(delta, "delta");
    const h = this._flushed(store);
    return s64(call((k, n) => h.increment(k, n), bytes(key), d));
  }

  /** The counter at `key`, 0 if missing. */
  counter(store, key) {
    const v = this.get(store, key);
    if (v === null) return 0;
    if (v.length !== 8) throw new InvalidValue(`counter of ${v.length} bytes, want 8`);
    return Number(new DataView(v.buffer, v.byteOffset, 8).getBigInt64(0));
  }

  /** Up to `limit` entries with `start <= key < end`, in key order: `[key, value]` pairs. */
  scan(store, start, end, limit) {
    const h = this._flushed(store);
    const rows = call((a, b, n) => h.scan(a, b, n), bytes(start), optBytes(end), limit >>> 0);
    return rows.map(([k, v]) => [own(k), own(v)]);
  }

  /** The value of `key` parsed as JSON, or `null`. */
  getJson(store, key) {
    const v = this.get(store, key);
    if (v === null) return null;
    try {
      return JSON.parse(DECODER.decode(v));
    } catch (e) {
      throw new InvalidValue(`JSON: ${e.message}`);
    }
  }

  /** Sets `key` to `value` as compact JSON. */
  setJson(store, key, value) {
    const json = JSON.stringify(value);
    if (json === undefined) throw new InvalidValue(`JSON: cannot encode ${describe(value)}`);
    this.set(store, key, json);
  }

  // outputs

  /** Sends a record to one of the pipeline's output topics, with this record's timestamp; it
   * becomes visible only if the call commits. `headers`: `[name, value]` pairs or an object. */
  send(topic, key, value, headers = null) {
    const o = this._out;
    let t = this._topics.get(topic);
    if (t === undefined) {
      if (typeof topic !== "string") throw new TypeError(`a topic is a string, not ${describe(topic)}`);
      t = ENCODER.encode(topic);
      this._topics.set(topic, t);
    }
    const ts = o.span(t);
    const k = key === null || key === undefined ? undefined : o.span(bytes(key));
    const v = value === null || value === undefined ? undefined : o.span(bytes(value));
    const first = this._outHeaders.length;
    if (headers !== null && headers !== undefined) {
      const pairs =
        typeof headers[Symbol.iterator] === "function" ? headers : Object.entries(headers);
      for (const [name, hv] of pairs) {
        this._outHeaders.push({ name: o.span(ENCODER.encode(String(name))), value: o.span(bytes(hv)) });
      }
    }
    const h = { start: first, len: this._outHeaders.length - first };
    this._outRecords.push({ topic: ts, key: k, value: v, headers: h, timestamp: this.timestamp });
  }

  // timers

  /** Schedules a timer for `key` at `at` on `kind`'s clock (one per kind, at and key; the same
   * again replaces its payload). */
  schedule(at, key, payload = null, kind = TimeKind.EVENT_TIME) {
    call(hostSchedule, timeKind(kind), int64(at, "at"), bytes(key), optBytes(payload));
  }

  /** Cancels a timer; `true` if it was pending. */
  cancel(at, key, kind = TimeKind.EVENT_TIME) {
    return call(hostCancel, timeKind(kind), int64(at, "at"), bytes(key));
  }

  /** The host's wall clock, ms since the Unix epoch. */
  processingTime() {
    return s64(hostProcessingTime());
  }

  // logs

  /** Writes `message` to the host's log with the pipeline, slot and offset. */
  log(level, message) {
    if (!LEVELS.has(level)) throw new TypeError(`a log level is one of ${[...LEVELS].join(", ")}`);
    hostLog(level, String(message));
  }

  // the call

  _flush() {
    for (const s of this._stores.values()) s.flush();
    if (this._outRecords.length > 0) {
      const data = this._out.bytes();
      const records = this._outRecords;
      const headers = this._outHeaders;
      this._outRecords = [];
      this._outHeaders = [];
      try {
        call(sendBatch, data, records, headers);
      } finally {
        this._out.clear();
      }
    }
  }

  _discard() {
    for (const s of this._stores.values()) s.discard();
    this._out.clear();
    this._outRecords = [];
    this._outHeaders = [];
    this.scheduled.clear();
  }
}

// --- registration ------------------------------------------------------------------------------

const registered = { process: null, onTimer: null, init: null };
const ASYNC =
  "a processor's functions are synchronous: one returned a Promise (drop `async`; state, " +
  "timer and output calls return their results directly)";
const ctx = new Context();

function fn(f, what) {
  if (typeof f !== "function") throw new TypeError(`${what} must be a function, not ${describe(f)}`);
  return f;
}

/** Runs `body`, then hands the buffered writes and outputs to the host; on any failure nothing
 * buffered survives and the call returns the error. */
function run(body) {
  try {
    body();
    ctx._flush();
  } catch (e) {
    ctx._discard();
    return { tag: "err", val: toWit(e) };
  }
  return undefined;
}

/** The component's export (the WIT interface `baton:processor/handler@0.2.0`): dispatches to
 * the registered functions. Export it from the processor module as `handler`. */
export const handler = {
  init(pairs) {
    const cfg = new Config(pairs);
    try {
      if (registered.init !== null && registered.init(cfg) instanceof Promise) throw new TypeError(ASYNC);
    } catch (e) {
      return { tag: "err", val: toWit(e) };
    }
    ctx.config = cfg;
    return undefined;
  },

  process(batch) {
    const f = registered.process;
    if (f === null) return undefined;
    const slot = batch.slot;
    ctx.slot = slot;
    ctx.eventTime = s64(batch.eventTime);
    return run(() => {
      // A view of this realm's (the bindings' arrays are another realm's, see `bytes`).
      const d = batch.data;
      const data = new Uint8Array(d.buffer, d.byteOffset, d.length);
      const topic = batch.topic;
      const rec = batch.records;
      const w = new Uint32Array(rec.buffer, rec.byteOffset, rec.length * 2);
      const hw = batch.headers;
      let h = null;
      const src = {
        data,
        // The headers' words as 32-bit halves, made when a record's headers are first read.
        headerWords: () => h ?? (h = new Uint32Array(hw.buffer, hw.byteOffset, hw.length * 2)),
      };
      // Five words per record; each word's halves little-endian: low then high.
      for (let i = 0; i < w.length; i += 10) {
        const offset = w[i + 1] * TWO32 + w[i];
        const timestamp = (w[i + 3] | 0) * TWO32 + w[i + 2];
        const kl = w[i + 4], ks = w[i + 5];
        const vl = w[i + 6], vs = w[i + 7];
        const key = ks === NONE && kl === NONE ? null : data.subarray(ks, ks + kl);
        const value = vs === NONE && vl === NONE ? null : data.subarray(vs, vs + vl);
        const msg = new Message(topic, slot, offset, timestamp, key, value, w[i + 9], w[i + 8], src);
        ctx.timestamp = timestamp;
        if (timestamp > ctx.eventTime) ctx.eventTime = timestamp;
        if (f(msg, ctx) instanceof Promise) throw new TypeError(ASYNC);
      }
    });
  },

  onTimers(slot, eventTime, fired) {
    const f = registered.onTimer;
    if (f === null) return undefined;
    ctx.slot = slot;
    ctx.eventTime = s64(eventTime);
    return run(() => {
      for (const t of fired) {
        const at = s64(t.at);
        ctx.timestamp = at;
        const r = f(new Timer(t.kind, at, own(t.key), own(t.payload)), ctx);
        if (r instanceof Promise) throw new TypeError(ASYNC);
      }
    });
  },
};

/** Registers the processor and returns the handler to export:
 *
 *     export const handler = processor({ process(msg, ctx) {...}, onTimer(timer, ctx) {...},
 *                                        init(config) {...} });
 *
 * or `processor(fn)` with the function called for every record. */
export function processor(spec) {
  if (typeof spec === "function") {
    registered.process = spec;
  } else if (spec !== null && typeof spec === "object") {
    const known = new Set(["process", "onTimer", "init"]);
    for (const k of Object.keys(spec)) {
      if (!known.has(k)) throw new TypeError(`processor: unknown entry \`${k}\` (process, onTimer, init)`);
    }
    if (spec.process !== undefined) registered.process = fn(spec.process, "process").bind(spec);
    if (spec.onTimer !== undefined) registered.onTimer = fn(spec.onTimer, "onTimer").bind(spec);
    if (spec.init !== undefined) registered.init = fn(spec.init, "init").bind(spec);
  } else {
    throw new TypeError(`processor: expected a function or { process, onTimer, init }, not ${describe(spec)}`);
  }
  return handler;
}

/** Registers the function called for every timer that falls due: `f(timer, ctx)`. */
export function onTimer(f) {
  registered.onTimer = fn(f, "onTimer");
  return f;
}

/** Registers the function called once per instance with the pipeline's config, before any
 * record; throwing InvalidInput stops the partition from starting with that reason. */
export function init(f) {
  registered.init = fn(f, "init");
  return f;
}
