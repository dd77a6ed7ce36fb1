// Event-time windows over a store, laid out exactly as the Rust SDK's `baton_sdk::windows` (and
// the Python SDK's `baton_sdk.windows`), so that a JavaScript processor and a Rust one leave the
// same state.
//
// Windows: a window of size `sizeMs` starting at `s` covers `[s, s + sizeMs)`; windows start
// every `advanceMs` from the epoch (tumbling: advance = size). A window closes when the slot's
// event time reaches its end plus `graceMs`; records for a closed window are not counted.
// Layout: the store holds `sortable(start) + key -> count` (8-byte big-endian counters), and one
// event-time timer per window, keyed `"W" + len(store) + store + sortable(start)`.
//
// Sessions (Kafka Streams' `SessionWindows`): a key's records less than `gapMs` apart form one
// session `[first, last]`; a record within the gap of two sessions merges them. Layout: one
// entry per open session, keyed `len(key) (4 bytes, big-endian) + key + sortable(start)`,
// holding its end and count (8 bytes each, big-endian); one event-time timer per session at
// `end + gap + grace`, keyed `"S" + len(store) + store + state key`, moved when it grows.
//
// Times are Numbers (milliseconds); they must be safe integers (|t| < 2^53), as every record
// timestamp is.

import { InvalidValue, Other, TimeKind, bytes as toKey } from "./index.js";

const TWO32 = 4294967296;
const ENCODER = new TextEncoder();

/** A timestamp as 8 bytes that sort in time order: the two's complement with its sign bit
 * flipped, big-endian. */
export function sortable(at) {
  const out = new Uint8Array(8);
  if (typeof at === "bigint") {
    new DataView(out.buffer).setBigUint64(0, BigInt.asUintN(64, at) ^ (1n << 63n));
    return out;
  }
  const hi = Math.floor(at / TWO32);
  const lo = at - hi * TWO32;
  const h = ((hi | 0) ^ 0x80000000) >>> 0;
  out[0] = h >>> 24;
  out[1] = (h >>> 16) & 0xff;
  out[2] = (h >>> 8) & 0xff;
  out[3] = h & 0xff;
  out[4] = lo >>> 24;
  out[5] = (lo >>> 16) & 0xff;
  out[6] = (lo >>> 8) & 0xff;
  out[7] = lo & 0xff;
  return out;
}

/** The timestamp of 8 `sortable` bytes. */
export function unsortable(b) {
  const hi = ((b[0] << 24) | (b[1] << 16) | (b[2] << 8) | b[3]) ^ 0x80000000;
  const lo = ((b[4] << 24) | (b[5] << 16) | (b[6] << 8) | b[7]) >>> 0;
  return hi * TWO32 + lo;
}

/** `a` divided by `b` (> 0), rounded down, exactly. */
function floorDiv(a, b) {
  let q = Math.floor(a / b);
  const r = a - q * b;
  if (r < 0) q -= 1;
  else if (r >= b) q += 1;
  return q;
}

function concat(...parts) {
  let n = 0;
  for (const p of parts) n += p.length;
  const out = new Uint8Array(n);
  let i = 0;
  for (const p of parts) {
    out.set(p, i);
    i += p.length;
  }
  return out;
}

function equal(a, b) {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

function latin1(b) {
  let s = "";
  for (let i = 0; i < b.length; i++) s += String.fromCharCode(b[i]);
  return s;
}

/** The big-endian i64 at word `i` of `v` (as a Number: exact below 2^53). */
function i64At(v, i, what) {
  const o = i * 8;
  if (v.length < o + 8) throw new InvalidValue(what);
  const hi = (v[o] << 24) | (v[o + 1] << 16) | (v[o + 2] << 8) | v[o + 3];
  const lo = ((v[o + 4] << 24) | (v[o + 5] << 16) | (v[o + 6] << 8) | v[o + 7]) >>> 0;
  return hi * TWO32 + lo;
}

function i64Bytes(...values) {
  const out = new Uint8Array(values.length * 8);
  const dv = new DataView(out.buffer);
  values.forEach((v, i) => dv.setBigInt64(i * 8, BigInt(v)));
  return out;
}

function ms(v, what) {
  if (!Number.isSafeInteger(v)) throw new TypeError(`${what} must be an integer, not ${v}`);
  return v;
}

/** A key's final count in a window (or session) that closed. */
export class Closed {
  constructor(key, start, end, count) {
    /** The record key. */
    this.key = key;
    /** The window's start (inclusive), in milliseconds. */
    this.start = start;
    /** Its end (exclusive; for a session its last record's timestamp). */
    this.end = end;
    /** What was counted in it. */
    this.count = count;
  }
}

/** Counting windows (tumbling or hopping, aligned to the epoch) over one store. */
export class Windows {
  constructor(store, sizeMs, advanceMs = sizeMs, graceMs = 0) {
    this.store = store;
    this.size = ms(sizeMs, "sizeMs");
    this.advance = ms(advanceMs, "advanceMs");
    this.grace = ms(graceMs, "graceMs");
    const name = ENCODER.encode(store);
    this._prefix = concat(Uint8Array.of(0x57 /* W */, name.length & 0xff), name);
    this._cache = new Map();
  }

  /** Windows `[k·size, (k+1)·size)`, one per record. */
  static tumbling(store, sizeMs) {
    return new Windows(store, sizeMs);
  }

  /** Windows of `sizeMs` starting every `advanceMs`: a record counts in each that holds it. */
  static hopping(store, sizeMs, advanceMs) {
    return new Windows(store, sizeMs, advanceMs);
  }

  /** These windows, taking records until `graceMs` past their end (default 0). */
  withGrace(graceMs) {
    return new Windows(this.store, this.size, this.advance, graceMs);
  }

  /** The starts of the windows that hold timestamp `ts`, oldest first. */
  starts(ts) {
    const size = Math.max(this.size, 1);
    const advance = Math.max(this.advance, 1);
    const last = floorDiv(ts, advance) * advance;
    const out = [];
    for (let s = floorDiv(ts - size, advance) * advance + advance; s <= last; s += advance) {
      out.push(s);
    }
    return out;
  }

  /** When the window starting at `start` closes. */
  closes(start) {
    return start + this.size + this.grace;
  }

  _timerKey(start) {
    return concat(this._prefix, sortable(start));
  }

  /** What a window needs per record, computed once per window start (`closes`, the state key
   * prefix, the timer key and its id in `ctx.scheduled`). */
  _window(start) {
    let w = this._cache.get(start);
    if (w === undefined) {
      if (this._cache.size >= 256) this._cache.clear();
      const timerKey = this._timerKey(start);
      w = { closes: this.closes(start), prefix: sortable(start), timerKey, id: latin1(timerKey) };
      this._cache.set(start, w);
    }
    return w;
  }

  /** Adds `delta` to `key`'s count in every open window holding `ts`; `false` when every such
   * window had closed (a late record). */
  count(ctx, key, ts, delta = 1) {
    const k = toKey(key);
    const size = Math.max(this.size, 1);
    const advance = Math.max(this.advance, 1);
    const last = floorDiv(ts, advance) * advance;
    let counted = false;
    // The starts of the windows that hold `ts`, as `starts` gives them.
    for (let start = floorDiv(ts - size, advance) * advance + advance; start <= last; start += advance) {
      const w = this._window(start);
      if (ctx.eventTime >= w.closes) continue;
      counted = true;
      ctx._add2(this.store, w.prefix, k, delta);
      const id = ctx.slot + ":" + w.id;
      if (!ctx.scheduled.has(id)) {
        ctx.schedule(w.closes, w.timerKey, null, TimeKind.EVENT_TIME);
        ctx.scheduled.add(id);
      }
    }
    return counted;
  }

  /** The final counts of the window whose timer fired, in key order, its state deleted; `null`
   * when the timer is not one of these windows'. */
  closed(ctx, timer) {
    const p = this._prefix;
    const k = timer.key;
    if (k.length !== p.length + 8 || !equal(k.subarray(0, p.length), p)) return null;
    const start = unsortable(k.subarray(p.length));
    ctx.scheduled.delete(ctx.slot + ":" + latin1(k));
    const lo = sortable(start);
    const hi = sortable(start + 1);
    const out = [];
    let from = lo;
    for (;;) {
      const rows = ctx.scan(this.store, from, hi, 1000);
      for (const [rk, rv] of rows) {
        if (rv.length !== 8) throw new InvalidValue("a window count is not 8 bytes");
        out.push(new Closed(rk.subarray(8), start, start + this.size, i64At(rv, 0, "")));
      }
      if (rows.length < 1000) break;
      from = concat(rows[rows.length - 1][0], Uint8Array.of(0));
    }
    ctx.deleteRange(this.store, lo, hi);
    return out;
  }
}

/** Per-key activity sessions over one store: a session closes once the slot's event time
 * reaches its last record's timestamp plus the gap (and the grace). */
export class Sessions {
  constructor(store, gapMs, graceMs = 0) {
    this.store = store;
    this.gap = ms(gapMs, "gapMs");
    this.grace = ms(graceMs, "graceMs");
    const name = ENCODER.encode(store);
    this._head = concat(Uint8Array.of(0x53 /* S */, name.length & 0xff), name);
  }

  /** These sessions, taking records until `graceMs` past their close (default 0). */
  withGrace(graceMs) {
    return new Sessions(this.store, this.gap, graceMs);
  }

  /** When a session whose last record is at `end` closes. */
  closes(end) {
    return end + this.gap + this.grace;
  }

  /** Whether a record at `ts` joins the session `[start, end]`, open at event time `now`. */
  joins(start, end, ts, now) {
    return ts > start - this.gap && ts < end + this.gap && now < this.closes(end);
  }

  static _prefix(key) {
    const p = new Uint8Array(4 + key.length);
    new DataView(p.buffer).setUint32(0, key.length);
    p.set(key, 4);
    return p;
  }

  _timerKey(stateKey) {
    return concat(this._head, stateKey);
  }

  /** Adds `delta` to the count of `key`'s session holding `ts`: it starts one, grows one, or
   * merges the sessions it bridges. `false` when the record is late (its session would already
   * have closed by the slot's event time); it then changes nothing. */
  count(ctx, key, ts, delta = 1) {
    const k = toKey(key);
    const now = ctx.eventTime;
    const prefix = Sessions._prefix(k);
    // Sessions starting before `ts + gap`: the only ones it can join.
    const to = concat(prefix, sortable(ts + this.gap));
    let start = ts;
    let end = ts;
    let count = delta;
    const merged = [];
    let next = concat(prefix, new Uint8Array(8));
    for (;;) {
      const rows = ctx.scan(this.store, next, to, 100);
      for (const [rk, rv] of rows) {
        next = concat(rk, Uint8Array.of(0));
        if (rk.length !== prefix.length + 8) throw new InvalidValue("a session key is malformed");
        const s = unsortable(rk.subarray(prefix.length));
        const e = i64At(rv, 0, "a session is not 16 bytes");
        const n = i64At(rv, 1, "a session is not 16 bytes");
        if (this.joins(s, e, ts, now)) {
          start = Math.min(start, s);
          end = Math.max(end, e);
          count += n;
          merged.push([rk, e]);
        }
      }
      if (rows.length < 100) break;
    }
    if (now >= this.closes(end)) return false;
    const stateKey = concat(prefix, sortable(start));
    for (const [mk, e] of merged) {
      ctx.cancel(this.closes(e), this._timerKey(mk), TimeKind.EVENT_TIME);
      if (!equal(mk, stateKey)) ctx.delete(this.store, mk);
    }
    ctx.set(this.store, stateKey, i64Bytes(end, count));
    ctx.schedule(this.closes(end), this._timerKey(stateKey), null, TimeKind.EVENT_TIME);
    return true;
  }

  /** The session whose timer fired, its state deleted; `null` for another timer (or a session
   * already gone). */
  closed(ctx, timer) {
    const head = this._head;
    const k = timer.key;
    if (k.length < head.length + 4 + 8 || !equal(k.subarray(0, head.length), head)) return null;
    const stateKey = k.subarray(head.length);
    const keyLen = new DataView(stateKey.buffer, stateKey.byteOffset, 4).getUint32(0);
    if (stateKey.length !== 4 + keyLen + 8) throw new Other("bad session timer");
    const v = ctx.get(this.store, stateKey);
    if (v === null) return null;
    const start = unsortable(stateKey.subarray(4 + keyLen));
    ctx.delete(this.store, stateKey);
    return new Closed(
      stateKey.slice(4, 4 + keyLen),
      start,
      i64At(v, 0, "a session is not 16 bytes"),
      i64At(v, 1, "a session is not 16 bytes"),
    );
  }
}
