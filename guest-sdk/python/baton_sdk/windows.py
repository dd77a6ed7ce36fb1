"""Event-time windows over a store, laid out exactly as the Rust SDK's `baton_sdk::windows`, so
that a Python processor and a Rust one leave the same state.

A window of size `size_ms` starting at `s` covers `[s, s + size_ms)`; windows start every
`advance_ms` from the epoch (tumbling: advance = size). A window closes when the slot's event
time reaches its end plus `grace_ms`; records for a closed window are not counted.

Layout: the store holds `sortable(start) + key -> count` (8-byte big-endian counters), and one
event-time timer per window, keyed `b"W" + len(store) + store + sortable(start)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Optional

from . import Context, Other, InvalidValue, Timer, TimeKind

_SIGN = 1 << 63
_MASK = (1 << 64) - 1
_MIN, _MAX = -(1 << 63), (1 << 63) - 1


def sortable(at: int) -> bytes:
    """A timestamp as 8 bytes that sort in time order."""
    return (((at & _MASK) ^ _SIGN)).to_bytes(8, "big")


def unsortable(b: bytes) -> int:
    v = int.from_bytes(b, "big") ^ _SIGN
    return v - (1 << 64) if v >= _SIGN else v


def _sat(v: int) -> int:
    return max(_MIN, min(_MAX, v))


@dataclass
class Closed:
    """A key's final count in a window that closed."""

    key: bytes
    start: int
    end: int
    count: int


class Windows:
    """Windows counted in the store `store`."""

    def __init__(self, store: str, size_ms: int, advance_ms: Optional[int] = None, grace_ms: int = 0):
        self.store = store
        self.size = size_ms
        self.advance = size_ms if advance_ms is None else advance_ms
        self.grace = grace_ms

    @classmethod
    def tumbling(cls, store: str, size_ms: int) -> "Windows":
        return cls(store, size_ms)

    @classmethod
    def hopping(cls, store: str, size_ms: int, advance_ms: int) -> "Windows":
        return cls(store, size_ms, advance_ms)

    def with_grace(self, grace_ms: int) -> "Windows":
        return Windows(self.store, self.size, self.advance, grace_ms)

    def starts(self, ts: int) -> Iterator[int]:
        """The starts of the windows that hold timestamp `ts`, oldest first."""
        size, advance = max(self.size, 1), max(self.advance, 1)
        last = (ts // advance) * advance
        s = ((ts - size) // advance) * advance + advance
        while s <= last:
            yield s
            s += advance

    def closes(self, start: int) -> int:
        return _sat(_sat(start + self.size) + self.grace)

    def _timer_key(self, start: int) -> bytes:
        name = self.store.encode()
        return b"W" + bytes([len(name)]) + name + sortable(start)

    def count(self, ctx: Context, key: bytes, ts: int, delta: int = 1) -> bool:
        """Adds `delta` to `key`'s count in every open window holding `ts`; False when every
        such window had closed (a late record)."""
        counted = False
        for start in self.starts(ts):
            closes = self.closes(start)
            if ctx.event_time >= closes:
                continue
            counted = True
            ctx.add(self.store, sortable(start) + bytes(key), delta)
            timer = (ctx.slot, self._timer_key(start))
            if timer not in ctx.scheduled:
                ctx.schedule(closes, timer[1], None, TimeKind.EVENT_TIME)
                ctx.scheduled.add(timer)
        return counted

    def closed(self, ctx: Context, timer: Timer) -> Optional[List[Closed]]:
        """The final counts of the window whose timer fired, its state deleted; None when the
        timer is not one of these windows'."""
        prefix = self._timer_key(0)[:-8]
        k = bytes(timer.key)
        if len(k) != len(prefix) + 8 or k[: len(prefix)] != prefix:
            return None
        start = unsortable(k[len(prefix) :])
        ctx.scheduled.discard((ctx.slot, k))
        lo = sortable(start)
        hi = sortable(start + 1) if start < _MAX else b"\xff" * 9
        out: List[Closed] = []
        frm = lo
        while True:
            rows = ctx.scan(self.store, frm, hi, 1000)
            for rk, rv in rows:
                if len(rv) != 8:
                    raise InvalidValue("a window count is not 8 bytes")
                frm = bytes(rk) + b"\x00"
                out.append(
                    Closed(bytes(rk[8:]), start, start + self.size, int.from_bytes(rv, "big", signed=True))
                )
            if len(rows) < 1000:
                break
        ctx.delete_range(self.store, lo, hi)
        return out
