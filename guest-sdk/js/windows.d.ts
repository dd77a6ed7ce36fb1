// Types of baton-sdk/windows (windows.js): event-time windows and sessions laid out exactly as
// the Rust SDK's `baton_sdk::windows`.

import type { Bytes, Context, Timer } from "./index.js";

/** A timestamp as 8 bytes that sort in time order. */
export declare function sortable(at: number | bigint): Uint8Array;

/** The timestamp of 8 `sortable` bytes. */
export declare function unsortable(b: Uint8Array): number;

/** A key's final count in a window (or session) that closed. */
export declare class Closed {
  private constructor();
  /** The record key. */
  readonly key: Uint8Array;
  /** The window's start (inclusive), in milliseconds. */
  readonly start: number;
  /** Its end (exclusive; for a session, its last record's timestamp). */
  readonly end: number;
  /** What was counted in it. */
  readonly count: number;
}

/** Counting windows over one store: windows of `size` starting every `advance` from the epoch,
 * closed when the slot's event time reaches their end plus `grace`. State: `sortable(start) +
 * key -> count`; one event-time timer per window, keyed `"W" + len(store) + store +
 * sortable(start)`. */
export declare class Windows {
  constructor(store: string, sizeMs: number, advanceMs?: number, graceMs?: number);
  readonly store: string;
  readonly size: number;
  readonly advance: number;
  readonly grace: number;
  /** Windows `[k·size, (k+1)·size)`, one per record. */
  static tumbling(store: string, sizeMs: number): Windows;
  /** Windows of `sizeMs` starting every `advanceMs`: a record counts in each that holds it. */
  static hopping(store: string, sizeMs: number, advanceMs: number): Windows;
  /** These windows, taking records until `graceMs` past their end (default 0). */
  withGrace(graceMs: number): Windows;
  /** The starts of the windows that hold timestamp `ts`, oldest first. */
  starts(ts: number): number[];
  /** When the window starting at `start` closes. */
  closes(start: number): number;
  /** Adds `delta` (default 1) to `key`'s count in every open window holding `ts`; `false` when
   * every such window had closed (a late record). */
  count(ctx: Context, key: Bytes, ts: number, delta?: number): boolean;
  /** The final counts of the window whose timer fired, in key order, its state deleted; `null`
   * when the timer is not one of these windows'. */
  closed(ctx: Context, timer: Timer): Closed[] | null;
}

/** Per-key activity sessions over one store (Kafka Streams' `SessionWindows`): records less than
 * `gap` apart form one session. State: `len(key) (4 bytes) + key + sortable(start) -> end,
 * count` (8 bytes each); one event-time timer per session at `end + gap + grace`. */
export declare class Sessions {
  constructor(store: string, gapMs: number, graceMs?: number);
  readonly store: string;
  readonly gap: number;
  readonly grace: number;
  /** These sessions, taking records until `graceMs` past their close (default 0). */
  withGrace(graceMs: number): Sessions;
  /** When a session whose last record is at `end` closes. */
  closes(end: number): number;
  /** Whether a record at `ts` joins the session `[start, end]`, open at event time `now`. */
  joins(start: number, end: number, ts: number, now: number): boolean;
  /** Adds `delta` (default 1) to the count of `key`'s session holding `ts` (starting, growing
   * or merging sessions); `false` when the record is late. */
  count(ctx: Context, key: Bytes, ts: number, delta?: number): boolean;
  /** The session whose timer fired, its state deleted; `null` for another timer. */
  closed(ctx: Context, timer: Timer): Closed | null;
}
