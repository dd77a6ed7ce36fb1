"""baton's Python SDK: stateful stream processors for the baton host, as WebAssembly components.

A processor is a module with decorated functions::

    from baton_sdk import processor

    @processor
    def process(msg, ctx):
        if msg.key is not None:
            ctx.add("counts", msg.key, 1)

``@processor`` marks the function called for every record, ``@on_timer`` the one called for
every timer that falls due, and ``@init`` the one called once with the pipeline's config. Build
it with ``baton build`` (componentize-py over the ``baton:processor@0.2.0`` world), test it with
``baton test-plugin``, deploy it like any module.

The SDK moves records in batches (the batch ABI): writes and outputs are buffered and handed to
the host in one call per store, and flushed before a read of the same store, so reads see the
call's own writes. A call that raises leaves nothing behind: the host discards its writes,
timers and outputs and retries its records one by one; a record that still fails goes to the
dead-letter topic with the error.
"""

from __future__ import annotations

import sys
import traceback
from enum import Enum
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

__all__ = [
    "processor",
    "on_timer",
    "init",
    "Message",
    "Timer",
    "Context",
    "Config",
    "TimeKind",
    "Level",
    "BatonError",
    "NoSuchStore",
    "NoSuchTopic",
    "InvalidValue",
    "InvalidInput",
    "TooLarge",
    "Limit",
    "Other",
    "Handler",
]

Bytes = Union[bytes, bytearray, memoryview, str]


def _b(v: Bytes) -> bytes:
    """Keys and values are bytes; a str is taken as its UTF-8 encoding."""
    if isinstance(v, str):
        return v.encode()
    return bytes(v)


# --- errors ------------------------------------------------------------------------------------


class BatonError(Exception):
    """An error the host knows: raised by state, timer and output calls, and raised by a
    processor to fail its record with a kind the host reports."""


class NoSuchStore(BatonError):
    """The pipeline declares no store of this name."""


class NoSuchTopic(BatonError):
    """The pipeline declares no output topic of this name."""


class InvalidValue(BatonError):
    """A stored value cannot be used as asked (e.g. a counter that is not 8 bytes)."""


class InvalidInput(BatonError):
    """The processor rejects its input or its configuration."""


class TooLarge(BatonError):
    """A key, value or record is larger than the pipeline's limits allow."""


class Limit(BatonError):
    """A limit of the pipeline was reached (e.g. pending timers)."""


class Other(BatonError):
    """Anything else."""


try:
    # The bindings componentize-py generates for the world: present when the processor is built
    # into a component (and imported then, so that the component holds them all).
    from componentize_py_types import Err as _Err
    from wit_world.imports import log as _log
    from wit_world.imports import output as _output
    from wit_world.imports import state as _state
    from wit_world.imports import timers as _timers
    from wit_world.imports import types as _types
except ImportError:  # outside a component: the API can be imported, not called
    _Err = _log = _output = _state = _timers = _types = None


def _wit():
    if _types is None:
        raise RuntimeError(
            "baton_sdk runs inside a component: build the processor with `baton build`"
        )
    return _types, _state, _timers, _output, _log


_KINDS = (
    ("Error_NoSuchStore", NoSuchStore),
    ("Error_NoSuchTopic", NoSuchTopic),
    ("Error_InvalidValue", InvalidValue),
    ("Error_InvalidInput", InvalidInput),
    ("Error_TooLarge", TooLarge),
    ("Error_Limit", Limit),
    ("Error_Other", Other),
)


def _from_wit(e) -> BatonError:
    """A host error (the `error` variant, or an `item-error` around one) as an exception."""
    value = getattr(e, "value", e)
    if hasattr(value, "error") and hasattr(value, "index"):
        value = value.error
    name = type(value).__name__
    for wit_name, cls in _KINDS:
        if name == wit_name:
            return cls(value.value)
    return Other(str(value))


def _to_wit(e: BaseException):
    """An exception raised by the processor as the host's `error` variant."""
    types = _wit()[0]
    for wit_name, cls in _KINDS:
        if type(e) is cls or (isinstance(e, cls) and cls is not Other):
            return getattr(types, wit_name)(str(e.args[0]) if e.args else str(e))
    text = "".join(traceback.format_exception_only(type(e), e)).strip()
    tb = traceback.extract_tb(e.__traceback__)
    if tb:
        f = tb[-1]
        text += f" (at {f.filename}:{f.lineno} in {f.name})"
    return types.Error_Other(text)


def _call(f, *args):
    try:
        return f(*args)
    except _Err as e:
        raise _from_wit(e) from None


# --- what a processor sees ---------------------------------------------------------------------


class TimeKind(Enum):
    """Which clock a timer or a time-to-live follows."""

    EVENT_TIME = 0
    """The slot's event time: the highest record timestamp seen in the slot."""
    PROCESSING_TIME = 1
    """The host's wall clock, in milliseconds since the Unix epoch."""

    def _wit(self):
        t = _wit()[0].TimeKind
        return t.EVENT_TIME if self is TimeKind.EVENT_TIME else t.PROCESSING_TIME


class Level(Enum):
    """Log levels."""

    TRACE = 0
    DEBUG = 1
    INFO = 2
    WARN = 3
    ERROR = 4


_NONE = 0xFFFF_FFFF_FFFF_FFFF


class Message:
    """One input record."""

    __slots__ = ("topic", "slot", "offset", "timestamp", "key", "value", "_headers", "_data")

    def __init__(self, topic, slot, offset, timestamp, key, value, headers, data):
        self.topic: str = topic
        """The input topic."""
        self.slot: int = slot
        """The partition of the input topic it was read from."""
        self.offset: int = offset
        """Its offset in the slot."""
        self.timestamp: int = timestamp
        """Milliseconds since the Unix epoch."""
        self.key: Optional[bytes] = key
        """The key; None for a record without one."""
        self.value: Optional[bytes] = value
        """The value; None for a tombstone."""
        self._headers = headers
        self._data = data

    @property
    def headers(self) -> List[Tuple[str, bytes]]:
        """The headers, in order: (name, value)."""
        out = []
        d = self._data
        for i in range(0, len(self._headers), 2):
            n, v = self._headers[i], self._headers[i + 1]
            name = d[n >> 32 : (n >> 32) + (n & 0xFFFF_FFFF)].decode("utf-8", "replace")
            out.append((name, bytes(d[v >> 32 : (v >> 32) + (v & 0xFFFF_FFFF)])))
        return out

    def header(self, name: str) -> Optional[bytes]:
        """The value of the first header called `name`."""
        for n, v in self.headers:
            if n == name:
                return v
        return None

    def __repr__(self) -> str:
        return f"Message(slot={self.slot}, offset={self.offset}, key={self.key!r}, value={self.value!r})"


class Timer:
    """A timer that fell due."""

    __slots__ = ("kind", "at", "key", "payload")

    def __init__(self, kind: TimeKind, at: int, key: bytes, payload: Optional[bytes]):
        self.kind = kind
        self.at = at
        """When it was due, in milliseconds of its clock."""
        self.key = key
        """The key it was scheduled for."""
        self.payload = payload


class Config:
    """The pipeline's `config` object, flattened: string values as they are, any other JSON
    value as its JSON text."""

    def __init__(self, pairs: Iterable[Tuple[str, str]] = ()):
        self.values: Dict[str, str] = dict(pairs)

    def get(self, key: str, default: Optional[str] = None) -> Optional[str]:
        return self.values.get(key, default)

    def require(self, key: str) -> str:
        """The value of `key`; InvalidInput naming it when it is missing."""
        v = self.values.get(key)
        if v is None:
            raise InvalidInput(f"config `{key}` is required")
        return v

    def require_int(self, key: str) -> int:
        """The value of `key` as an integer; InvalidInput naming it otherwise."""
        v = self.require(key)
        try:
            return int(v)
        except ValueError:
            raise InvalidInput(f"config `{key}` must be an integer, not `{v}`") from None

    def __contains__(self, key: str) -> bool:
        return key in self.values


class _Store:
    """A store the processor opened, with its writes not yet handed to the host."""

    __slots__ = ("name", "handle", "data", "writes")

    def __init__(self, name: str, handle):
        self.name = name
        self.handle = handle
        self.data = bytearray()
        self.writes: list = []

    def span(self, b: bytes):
        types = _wit()[0]
        start = len(self.data)
        self.data += b
        return types.Span(start, len(b))

    def flush(self) -> None:
        if not self.writes:
            return
        data, writes = bytes(self.data), self.writes
        self.data, self.writes = bytearray(), []
        _call(self.handle.apply, data, writes)

    def discard(self) -> None:
        self.data, self.writes = bytearray(), []


class Context:
    """What a processor can do besides reading its record: state, timers, outputs, logs, config.

    Every call is scoped to the slot of the record (or timer) being handled."""

    def __init__(self):
        self._stores: Dict[str, _Store] = {}
        self._out_data = bytearray()
        self._out_records: list = []
        self._out_headers: list = []
        self.config = Config()
        """The pipeline's config."""
        self.timestamp = 0
        """The timestamp of the record being processed (the `at` of the timer firing)."""
        self.event_time = -1
        """The slot's event time, this record counted."""
        self.slot = 0
        """The slot of the current call."""
        # Timers this instance knows are scheduled, per slot (by windows), so that it schedules
        # each once; forgotten with the call's effects when a call fails.
        self.scheduled: set = set()

    # state

    def _open(self, name: str) -> _Store:
        s = self._stores.get(name)
        if s is None:
            state = _wit()[1]
            s = _Store(name, _call(state.Store.open, name))
            self._stores[name] = s
        return s

    def _flushed(self, name: str):
        s = self._open(name)
        s.flush()
        return s.handle

    def get(self, store: str, key: Bytes) -> Optional[bytes]:
        """The value of `key`, or None."""
        return _call(self._flushed(store).get, _b(key))

    def get_many(self, store: str, keys: List[Bytes]) -> List[Optional[bytes]]:
        """The values of many keys at once, in order."""
        return _call(self._flushed(store).get_many, [_b(k) for k in keys])

    def set(self, store: str, key: Bytes, value: Bytes) -> None:
        """Sets `key` to `value`."""
        self._set(store, _b(key), _b(value), None)

    def set_with_ttl(self, store: str, key: Bytes, value: Bytes, ttl_ms: int) -> None:
        """Sets `key` to `value` until the slot's event time reaches this record's timestamp
        plus `ttl_ms`."""
        state = _wit()[1]
        expiry = state.Expiry(TimeKind.EVENT_TIME._wit(), self.timestamp + ttl_ms)
        self._set(store, _b(key), _b(value), expiry)

    def set_with_processing_ttl(self, store: str, key: Bytes, value: Bytes, ttl_ms: int) -> None:
        """Sets `key` to `value` for `ttl_ms` of the host's wall clock."""
        state = _wit()[1]
        expiry = state.Expiry(TimeKind.PROCESSING_TIME._wit(), self.processing_time() + ttl_ms)
        self._set(store, _b(key), _b(value), expiry)

    def _set(self, store, key, value, expiry) -> None:
        state = _wit()[1]
        s = self._open(store)
        s.writes.append(state.Write_Set(state.SetOp(s.span(key), s.span(value), expiry)))

    def delete(self, store: str, key: Bytes) -> None:
        """Removes `key`."""
        state = _wit()[1]
        s = self._open(store)
        s.writes.append(state.Write_Delete(s.span(_b(key))))

    def delete_range(self, store: str, start: Bytes, end: Optional[Bytes]) -> int:
        """Removes every entry with start <= key < end (end None: no bound); how many."""
        return _call(
            self._flushed(store).delete_range, _b(start), None if end is None else _b(end)
        )

    def add(self, store: str, key: Bytes, delta: int) -> None:
        """Adds `delta` to the counter at `key` (an 8-byte big-endian integer, 0 if missing)."""
        state = _wit()[1]
        s = self._open(store)
        s.writes.append(state.Write_Add(state.AddOp(s.span(_b(key)), delta)))

    def increment(self, store: str, key: Bytes, delta: int) -> int:
        """Adds `delta` to the counter at `key` and returns the new count."""
        return _call(self._flushed(store).increment, _b(key), delta)

    def counter(self, store: str, key: Bytes) -> int:
        """The counter at `key`, 0 if missing."""
        v = self.get(store, key)
        if v is None:
            return 0
        if len(v) != 8:
            raise InvalidValue(f"counter of {len(v)} bytes, want 8")
        return int.from_bytes(v, "big", signed=True)

    def scan(
        self, store: str, start: Bytes, end: Optional[Bytes], limit: int
    ) -> List[Tuple[bytes, bytes]]:
        """Up to `limit` entries with start <= key < end, in key order."""
        return _call(
            self._flushed(store).scan, _b(start), None if end is None else _b(end), limit
        )

    def get_json(self, store: str, key: Bytes):
        """The value of `key` as JSON, or None."""
        import json

        v = self.get(store, key)
        return None if v is None else json.loads(v)

    def set_json(self, store: str, key: Bytes, value) -> None:
        """Sets `key` to `value` as compact JSON."""
        import json

        self.set(store, key, json.dumps(value, separators=(",", ":")).encode())

    # outputs

    def send(
        self,
        topic: str,
        key: Optional[Bytes],
        value: Optional[Bytes],
        headers: Iterable[Tuple[str, Bytes]] = (),
    ) -> None:
        """Sends a record to one of the pipeline's output topics, with this record's timestamp;
        it becomes visible only if the call commits."""
        types, _, _, output, _ = _wit()
        d = self._out_data

        def span(b: bytes):
            start = len(d)
            d.extend(b)
            return types.Span(start, len(b))

        t = span(topic.encode())
        k = None if key is None else span(_b(key))
        v = None if value is None else span(_b(value))
        first = len(self._out_headers)
        for name, hv in headers:
            self._out_headers.append(types.HeaderEntry(span(name.encode()), span(_b(hv))))
        h = types.Span(first, len(self._out_headers) - first)
        self._out_records.append(output.OutRecord(t, k, v, h, self.timestamp))

    # timers

    def schedule(
        self,
        at: int,
        key: Bytes,
        payload: Optional[Bytes] = None,
        kind: TimeKind = TimeKind.EVENT_TIME,
    ) -> None:
        """Schedules a timer for `key` at `at` on `kind`'s clock (one per kind, at and key)."""
        timers = _wit()[2]
        _call(timers.schedule, kind._wit(), at, _b(key), None if payload is None else _b(payload))

    def cancel(self, at: int, key: Bytes, kind: TimeKind = TimeKind.EVENT_TIME) -> bool:
        """Cancels a timer; True if it was pending."""
        timers = _wit()[2]
        return _call(timers.cancel, kind._wit(), at, _b(key))

    def processing_time(self) -> int:
        """The host's wall clock, ms since the Unix epoch."""
        return _wit()[2].processing_time()

    # logs

    def log(self, level: Level, message: str) -> None:
        """Writes `message` to the host's log with the pipeline, slot and offset."""
        log = _wit()[4]
        log.log(getattr(log.Level, level.name), message)

    # the call

    def _flush(self) -> None:
        for s in self._stores.values():
            s.flush()
        if self._out_records:
            data, records, headers = bytes(self._out_data), self._out_records, self._out_headers
            self._out_data, self._out_records, self._out_headers = bytearray(), [], []
            _call(_wit()[3].send_batch, data, records, headers)

    def _discard(self) -> None:
        for s in self._stores.values():
            s.discard()
        self._out_data, self._out_records, self._out_headers = bytearray(), [], []
        self.scheduled.clear()


# --- registration ------------------------------------------------------------------------------

_process: Optional[Callable[[Message, Context], None]] = None
_on_timer: Optional[Callable[[Timer, Context], None]] = None
_init: Optional[Callable[[Config], None]] = None
_ctx = Context()


def _expose(f) -> None:
    """Makes the component's export class visible in the module that defines the processor,
    which is the module componentize-py builds."""
    module = sys.modules.get(f.__module__)
    if module is not None and not hasattr(module, "Handler"):
        module.Handler = Handler


def processor(f: Callable[[Message, Context], None]):
    """Marks the function called for every record: `f(msg, ctx)`."""
    global _process
    _process = f
    _expose(f)
    return f


def on_timer(f: Callable[[Timer, Context], None]):
    """Marks the function called for every timer that falls due: `f(timer, ctx)`."""
    global _on_timer
    _on_timer = f
    _expose(f)
    return f


def init(f: Callable[[Config], None]):
    """Marks the function called once per instance with the pipeline's config, before any
    record; raising InvalidInput stops the partition from starting with that reason."""
    global _init
    _init = f
    _expose(f)
    return f


def _run(body) -> None:
    try:
        body()
        _ctx._flush()
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the host
        _ctx._discard()
        raise _Err(_to_wit(e)) from None


class Handler:
    """The component's export (the `handler` interface); dispatches to the decorated
    functions."""

    def init(self, config: List[Tuple[str, str]]) -> None:
        cfg = Config(config)
        try:
            if _init is not None:
                _init(cfg)
        except BaseException as e:  # noqa: BLE001
            raise _Err(_to_wit(e)) from None
        _ctx.config = cfg

    def process(self, batch) -> None:
        f = _process
        if f is None:
            return
        ctx = _ctx
        ctx.slot = batch.slot
        ctx.event_time = batch.event_time

        def body():
            data = batch.data
            words = batch.records
            headers = batch.headers
            topic, slot = batch.topic, batch.slot
            for i in range(0, len(words), 5):
                k, v, h = words[i + 2], words[i + 3], words[i + 4]
                ts = words[i + 1]
                if ts >= 1 << 63:
                    ts -= 1 << 64
                key = None if k == _NONE else data[k >> 32 : (k >> 32) + (k & 0xFFFF_FFFF)]
                value = None if v == _NONE else data[v >> 32 : (v >> 32) + (v & 0xFFFF_FFFF)]
                first, count = h >> 32, h & 0xFFFF_FFFF
                msg = Message(
                    topic,
                    slot,
                    words[i],
                    ts,
                    key,
                    value,
                    headers[first * 2 : (first + count) * 2],
                    data,
                )
                ctx.timestamp = ts
                if ts > ctx.event_time:
                    ctx.event_time = ts
                f(msg, ctx)

        _run(body)

    def on_timers(self, slot: int, event_time: int, fired) -> None:
        f = _on_timer
        if f is None:
            return
        ctx = _ctx
        ctx.slot = slot
        ctx.event_time = event_time
        types = _wit()[0]

        def body():
            for t in fired:
                kind = (
                    TimeKind.EVENT_TIME
                    if t.kind == types.TimeKind.EVENT_TIME
                    else TimeKind.PROCESSING_TIME
                )
                ctx.timestamp = t.at
                f(Timer(kind, t.at, t.key, t.payload), ctx)

        _run(body)
