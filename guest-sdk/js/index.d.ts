// Types of baton-sdk (index.js): stateful stream processors for the baton host, built into
// components of the `baton:processor@0.2.0` world by componentize-js.

/** Keys, values and payloads: bytes, or a string taken as its UTF-8 encoding. */
export type Bytes = Uint8Array | string;

/** Bytes as a Uint8Array: a Uint8Array as it is, a string as its UTF-8 encoding. */
export declare function bytes(v: Bytes | ArrayBuffer | ArrayBufferView | readonly number[]): Uint8Array;

/** Bytes as text (UTF-8; invalid sequences become U+FFFD); `null` stays `null`. */
export declare function text(b: Uint8Array): string;
export declare function text(b: Uint8Array | null | undefined): string | null;

/** An error the host knows: thrown by state, timer and output calls, and thrown by a processor to
 * fail its record (or timers, or `init`) with that kind. Any other exception fails the call as
 * `other`, with its name, message and where it was thrown. */
export declare class BatonError extends Error {
  constructor(message: string);
}
/** The pipeline declares no store of this name. */
export declare class NoSuchStore extends BatonError {}
/** The pipeline declares no output topic of this name. */
export declare class NoSuchTopic extends BatonError {}
/** A stored value cannot be used as asked (e.g. a counter that is not 8 bytes, an overflow). */
export declare class InvalidValue extends BatonError {}
/** The processor rejects its input or its configuration. */
export declare class InvalidInput extends BatonError {}
/** A key, value or record is larger than the pipeline's limits allow. */
export declare class TooLarge extends BatonError {}
/** A limit of the pipeline was reached (e.g. `limits.max_timers` pending timers). */
export declare class Limit extends BatonError {}
/** Anything else. */
export declare class Other extends BatonError {}

/** Which clock a timer or a time-to-live follows. */
export type TimeKind = "event-time" | "processing-time";
export declare const TimeKind: {
  /** The slot's event time: the highest record timestamp seen in the slot. */
  readonly EVENT_TIME: "event-time";
  /** The host's wall clock, in milliseconds since the Unix epoch. */
  readonly PROCESSING_TIME: "processing-time";
};

/** Log levels. */
export type Level = "trace" | "debug" | "info" | "warn" | "error";
export declare const Level: {
  readonly TRACE: "trace";
  readonly DEBUG: "debug";
  readonly INFO: "info";
  readonly WARN: "warn";
  readonly ERROR: "error";
};

/** One input record. Its key, value and header values are views of the batch's bytes. */
export declare class Message {
  private constructor();
  /** The input topic. */
  readonly topic: string;
  /** The partition of the input topic it was read from. */
  readonly slot: number;
  /** Its offset in the slot. */
  readonly offset: number;
  /** Milliseconds since the Unix epoch. */
  readonly timestamp: number;
  /** The key; `null` for a record without one. */
  readonly key: Uint8Array | null;
  /** The value; `null` for a tombstone. */
  readonly value: Uint8Array | null;
  /** The headers, in order: `[name, value]`. */
  readonly headers: [string, Uint8Array][];
  /** The value of the first header called `name`, or `null`. */
  header(name: string): Uint8Array | null;
  /** The key as text (UTF-8), or `null`. */
  readonly keyText: string | null;
  /** The value as text (UTF-8), or `null`. */
  readonly valueText: string | null;
}

/** A timer that fell due. */
export declare class Timer {
  private constructor();
  /** Its clock. */
  readonly kind: TimeKind;
  /** When it was due, in milliseconds of its clock. */
  readonly at: number;
  /** The key it was scheduled for. */
  readonly key: Uint8Array;
  /** What it carries, or `null`. */
  readonly payload: Uint8Array | null;
}

/** The pipeline's `config` object, flattened: string values as they are, any other JSON value as
 * its JSON text. */
export declare class Config {
  constructor(pairs?: Iterable<readonly [string, string]>);
  /** The entries, by key. */
  readonly values: Map<string, string>;
  /** The value of `key`, or `fallback` (default `null`). */
  get(key: string): string | null;
  get(key: string, fallback: string): string;
  get<T>(key: string, fallback: T): string | T;
  /** Whether `key` is set. */
  has(key: string): boolean;
  /** The value of `key`; InvalidInput naming it when it is missing. */
  require(key: string): string;
  /** The value of `key` as an integer; InvalidInput naming it otherwise. */
  requireInt(key: string): number;
}

/** When an entry expires: once `kind`'s clock reaches `at` (milliseconds). */
export interface Expiry {
  kind: TimeKind;
  at: number | bigint;
}

/** Headers of an output: `[name, value]` pairs (as `Message.headers` gives them) or an object. */
export type Headers = Iterable<readonly [string, Bytes]> | Record<string, Bytes>;

/** What a processor can do besides reading its record: state, timers, outputs, logs, config.
 * Every call is scoped to the slot of the record (or timers) being handled. Writes that return
 * nothing (`set`, `delete`, `add`) and outputs (`send`) are buffered: they reach the host in one
 * call per store at the end of the call, or before any read of the same store. */
export declare class Context {
  private constructor();
  /** The pipeline's config. */
  readonly config: Config;
  /** The timestamp of the record being processed (the `at` of the timer firing). */
  readonly timestamp: number;
  /** The slot's event time, this record counted (in `onTimer`: with the whole batch counted). */
  readonly eventTime: number;
  /** The slot of the current call. */
  readonly slot: number;
  /** Timers this instance knows are scheduled, as `slot:key` (used by windows). */
  readonly scheduled: Set<string>;

  /** The value of `key`, or `null` when it is missing or expired. */
  get(store: string, key: Bytes): Uint8Array | null;
  /** The values of many keys at once, in order (`null` where missing). */
  getMany(store: string, keys: Iterable<Bytes>): (Uint8Array | null)[];
  /** Sets `key` to `value` (buffered). */
  set(store: string, key: Bytes, value: Bytes): void;
  /** Sets `key` to `value` until the slot's event time reaches this record's timestamp plus
   * `ttlMs`. */
  setWithTtl(store: string, key: Bytes, value: Bytes, ttlMs: number): void;
  /** Sets `key` to `value` for `ttlMs` of the host's wall clock. */
  setWithProcessingTtl(store: string, key: Bytes, value: Bytes, ttlMs: number): void;
  /** Sets `key` to `value`, to expire at `expiry` (`null`: never). */
  setWithExpiry(store: string, key: Bytes, value: Bytes, expiry: Expiry | null): void;
  /** Removes `key` (buffered); removing a missing key does nothing. */
  delete(store: string, key: Bytes): void;
  /** Removes every entry with `start <= key < end` (`end` null: no bound); how many. */
  deleteRange(store: string, start: Bytes, end?: Bytes | null): number;
  /** Adds `delta` to the counter at `key` (an 8-byte big-endian integer, 0 if missing),
   * buffered: errors such as an overflow surface at the end of the call. */
  add(store: string, key: Bytes, delta: number | bigint): void;
  /** Adds `delta` to the counter at `key` and returns the new count (one host call). */
  increment(store: string, key: Bytes, delta: number | bigint): number;
  /** The counter at `key`, 0 if missing. */
  counter(store: string, key: Bytes): number;
  /** Up to `limit` entries with `start <= key < end` (`end` null: no bound), in key order. */
  scan(store: string, start: Bytes, end: Bytes | null, limit: number): [Uint8Array, Uint8Array][];
  /** The value of `key` parsed as JSON, or `null`. */
  getJson<T = unknown>(store: string, key: Bytes): T | null;
  /** Sets `key` to `value` as JSON. */
  setJson(store: string, key: Bytes, value: unknown): void;

  /** Sends a record to one of the pipeline's output topics, with this record's timestamp
   * (buffered; it becomes visible only if the call commits). */
  send(topic: string, key: Bytes | null, value: Bytes | null, headers?: Headers | null): void;

  /** Schedules a timer for `key` at `at` on `kind`'s clock (default event time); the same
   * `(kind, at, key)` again replaces its payload. */
  schedule(at: number, key: Bytes, payload?: Bytes | null, kind?: TimeKind): void;
  /** Cancels a timer; `true` if it was pending. */
  cancel(at: number, key: Bytes, kind?: TimeKind): boolean;
  /** The host's wall clock, milliseconds since the Unix epoch. */
  processingTime(): number;

  /** Writes `message` to the host's log with the pipeline, slot and offset. */
  log(level: Level, message: string): void;
}

/** What `processor` takes: the functions of a processor. */
export interface Processor {
  /** Called for every record, in offset order. */
  process?(msg: Message, ctx: Context): void;
  /** Called for every timer that falls due, in order of `at`. */
  onTimer?(timer: Timer, ctx: Context): void;
  /** Called once per instance with the pipeline's config, before any record; throwing
   * InvalidInput stops the partition from starting with that reason. */
  init?(config: Config): void;
}

/** The host's `error` variant. */
export type WitError = { tag: "no-such-store" | "no-such-topic" | "invalid-value" | "invalid-input" | "too-large" | "limit" | "other"; val: string };
type WitResult = undefined | { tag: "err"; val: WitError };

/** A batch of records as the host hands it over (the batch ABI). */
export interface Batch {
  topic: string;
  slot: number;
  eventTime: bigint;
  data: Uint8Array;
  records: BigUint64Array;
  headers: BigUint64Array;
}

/** A timer as the host hands it over. */
export interface Fired {
  kind: TimeKind;
  at: bigint;
  key: Uint8Array;
  payload?: Uint8Array;
}

/** The component's export, the WIT interface `baton:processor/handler@0.2.0`: export it from
 * the processor module as `handler`. */
export interface Handler {
  init(config: [string, string][]): WitResult;
  process(batch: Batch): WitResult;
  onTimers(slot: number, eventTime: bigint, fired: Fired[]): WitResult;
}

/** The handler, dispatching to the registered functions. */
export declare const handler: Handler;

/** Registers the processor's functions and returns the handler to export:
 *
 *     export const handler = processor({ process(msg, ctx) { ... } });
 */
export declare function processor(spec: Processor | ((msg: Message, ctx: Context) => void)): Handler;

/** Registers the function called for every timer that falls due. */
export declare function onTimer<F extends (timer: Timer, ctx: Context) => void>(f: F): F;

/** Registers the function called once per instance with the pipeline's config. */
export declare function init<F extends (config: Config) => void>(f: F): F;
