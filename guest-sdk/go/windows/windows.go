// Package windows counts in event-time windows over a store, laid out exactly as the Rust
// SDK's baton_sdk::windows (and the Python SDK's baton_sdk.windows), so that a Go processor
// and a Rust one leave the same state and timers: tumbling and hopping windows aligned to the
// epoch (Windows) and per-key activity sessions (Sessions), with a grace period, each closed
// window handed back once.
//
// Windows: a window of size S starting at s covers [s, s+S); windows start every advance A
// from the epoch (tumbling: A = S). A window closes when the slot's event time reaches its
// end plus the grace; records for a closed window are not counted. The store holds
// sortable(start) ‖ key -> count (8-byte big-endian counters), with one event-time timer per
// window (not per key), keyed "W" ‖ len(store) ‖ store ‖ sortable(start), at end + grace; the
// whole window goes with one range delete when it closes.
//
// Sessions, as Kafka Streams' SessionWindows: a key's records less than the gap apart form one
// session [first, last]; a record that falls within the gap of two sessions merges them. The
// store holds len(key) (4 bytes BE) ‖ key ‖ sortable(start) -> end ‖ count (8 bytes BE each),
// with one event-time timer per session keyed "S" ‖ len(store) ‖ store ‖ state key, at
// end + gap + grace, moved when the session grows.
package windows

import (
	"bytes"
	"encoding/binary"
	"math"

	baton "baton/sdk"
	"baton/sdk/internal/sat"
)

// Sortable is at as 8 bytes that sort as the number.
func Sortable(at int64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, uint64(at)^(1<<63))
	return b
}

// Unsortable is the number of 8 bytes made by Sortable; false for another length.
func Unsortable(b []byte) (int64, bool) {
	if len(b) != 8 {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(b) ^ (1 << 63)), true
}

func satSub(a, b int64) int64 {
	if b == math.MinInt64 {
		if a >= 0 {
			return math.MaxInt64
		}
		return a - b
	}
	return sat.Add(a, -b)
}

// floorDiv is a divided by b > 0, rounded down (Rust's div_euclid for a positive divisor).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

func concat(parts ...[]byte) []byte {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	out := make([]byte, 0, n)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// Closed is a window (or session) that closed, for one key.
type Closed struct {
	// Key is the record key.
	Key []byte
	// Start is the window's start (inclusive), in milliseconds.
	Start int64
	// End is its end (exclusive for windows; for sessions, the last record's timestamp).
	End int64
	// Count is what was counted in it.
	Count int64
}

// Windows are counting windows over one store.
type Windows struct {
	store   string
	size    int64
	advance int64
	grace   int64
}

// Tumbling is windows [k·size, (k+1)·size), one per record.
func Tumbling(store string, sizeMs int64) Windows {
	return Windows{store: store, size: sizeMs, advance: sizeMs}
}

// Hopping is windows of sizeMs starting every advanceMs ([k·advance, k·advance + size)): a
// record counts in each window that holds it.
func Hopping(store string, sizeMs, advanceMs int64) Windows {
	return Windows{store: store, size: sizeMs, advance: advanceMs}
}

// WithGrace is w with a grace period: how long past its end a window still takes records
// (default 0).
func (w Windows) WithGrace(graceMs int64) Windows {
	w.grace = graceMs
	return w
}

// Store is the store the windows count in.
func (w Windows) Store() string { return w.store }

// Starts are the starts of the windows that hold ts, earliest first.
func (w Windows) Starts(ts int64) []int64 {
	size, advance := max(w.size, 1), max(w.advance, 1)
	last := floorDiv(ts, advance) * advance
	var out []int64
	for s := floorDiv(ts-size, advance)*advance + advance; s <= last; s += advance {
		out = append(out, s)
		if s > math.MaxInt64-advance {
			break
		}
	}
	return out
}

// Closes is when the window starting at start closes.
func (w Windows) Closes(start int64) int64 {
	return sat.Add(sat.Add(start, w.size), w.grace)
}

func (w Windows) timerKey(start int64) []byte {
	k := make([]byte, 0, 2+len(w.store)+8)
	k = append(k, 'W', byte(len(w.store)))
	k = append(k, w.store...)
	return append(k, Sortable(start)...)
}

// Count adds delta to key's count in every window holding ts that has not closed by the
// slot's event time; false when every one had (the record is late).
func (w Windows) Count(ctx *baton.Context, key []byte, ts, delta int64) (bool, error) {
	counted := false
	for _, start := range w.Starts(ts) {
		closes := w.Closes(start)
		if ctx.EventTime() >= closes {
			continue
		}
		counted = true
		if err := ctx.Add(w.store, concat(Sortable(start), key), delta); err != nil {
			return false, err
		}
		tk := w.timerKey(start)
		if !ctx.TimerKnown(tk) {
			if err := ctx.Schedule(baton.EventTime, closes, tk, nil); err != nil {
				return false, err
			}
			ctx.RememberTimer(tk)
		}
	}
	return counted, nil
}

// Closed is, when t closes one of these windows, every key's count in it, in key order, with
// the window's state deleted; ok is false for another timer.
func (w Windows) Closed(ctx *baton.Context, t *baton.Timer) (out []Closed, ok bool, err error) {
	prefixLen := 2 + len(w.store)
	k := t.Key
	if len(k) != prefixLen+8 || !bytes.Equal(k[:prefixLen], w.timerKey(0)[:prefixLen]) {
		return nil, false, nil
	}
	start, _ := Unsortable(k[prefixLen:])
	ctx.ForgetTimer(k)
	lo := Sortable(start)
	var hi []byte
	if start < math.MaxInt64 {
		hi = Sortable(start + 1)
	} else {
		hi = bytes.Repeat([]byte{0xff}, 9)
	}
	out = []Closed{}
	from := lo
	for {
		rows, err := ctx.Scan(w.store, from, hi, 1000)
		if err != nil {
			return nil, true, err
		}
		for _, r := range rows {
			if len(r.Value) != 8 {
				return nil, true, baton.InvalidValue("a window count is not 8 bytes")
			}
			from = concat(r.Key, []byte{0})
			out = append(out, Closed{
				Key:   r.Key[8:],
				Start: start,
				End:   start + w.size,
				Count: int64(binary.BigEndian.Uint64(r.Value)),
			})
		}
		if len(rows) < 1000 {
			break
		}
	}
	if _, err := ctx.DeleteRange(w.store, lo, hi); err != nil {
		return nil, true, err
	}
	return out, true, nil
}

// Sessions are per-key activity sessions over one store: a session closes once the slot's
// event time reaches its last record's timestamp plus the gap (and the grace).
type Sessions struct {
	store string
	gap   int64
	grace int64
}

// NewSessions is sessions of records less than gapMs apart.
func NewSessions(store string, gapMs int64) Sessions {
	return Sessions{store: store, gap: gapMs}
}

// WithGrace is s with a grace period: how long past its close a session still takes records
// (default 0).
func (s Sessions) WithGrace(graceMs int64) Sessions {
	s.grace = graceMs
	return s
}

// Closes is when a session whose last record is at end closes.
func (s Sessions) Closes(end int64) int64 {
	return sat.Add(sat.Add(end, s.gap), s.grace)
}

// Joins reports whether a record at ts joins the session [start, end], open at event time
// now.
func (s Sessions) Joins(start, end, ts, now int64) bool {
	return ts > satSub(start, s.gap) && ts < sat.Add(end, s.gap) && now < s.Closes(end)
}

func sessionPrefix(key []byte) []byte {
	p := make([]byte, 4, 4+len(key)+8)
	binary.BigEndian.PutUint32(p, uint32(len(key)))
	return append(p, key...)
}

func (s Sessions) timerKey(stateKey []byte) []byte {
	k := make([]byte, 0, 2+len(s.store)+len(stateKey))
	k = append(k, 'S', byte(len(s.store)))
	k = append(k, s.store...)
	return append(k, stateKey...)
}

func readI64(v []byte, i int) (int64, error) {
	if len(v) < i*8+8 {
		return 0, baton.InvalidValue("a session is not 16 bytes")
	}
	return int64(binary.BigEndian.Uint64(v[i*8:])), nil
}

type merged struct {
	key []byte
	end int64
}

// Count adds delta to the count of key's session holding ts: it starts one, grows one, or
// merges the sessions it bridges. False when the record is late (its session would already
// have closed by the slot's event time); it then changes nothing.
func (s Sessions) Count(ctx *baton.Context, key []byte, ts, delta int64) (bool, error) {
	now := ctx.EventTime()
	prefix := sessionPrefix(key)
	from := concat(prefix, Sortable(math.MinInt64))
	// Sessions starting before ts + gap: the only ones it can join.
	var to []byte
	if t := ts + s.gap; (s.gap >= 0) == (t >= ts) {
		to = concat(prefix, Sortable(t))
	} else {
		to = concat(prefix, bytes.Repeat([]byte{0xff}, 9))
	}
	start, end, count := ts, ts, delta
	var joined []merged
	next := from
	for {
		rows, err := ctx.Scan(s.store, next, to, 100)
		if err != nil {
			return false, err
		}
		for _, r := range rows {
			next = concat(r.Key, []byte{0})
			st, ok := Unsortable(r.Key[min(len(prefix), len(r.Key)):])
			if !ok {
				return false, baton.InvalidValue("a session key is malformed")
			}
			e, err := readI64(r.Value, 0)
			if err != nil {
				return false, err
			}
			n, err := readI64(r.Value, 1)
			if err != nil {
				return false, err
			}
			if s.Joins(st, e, ts, now) {
				start = min(start, st)
				end = max(end, e)
				count += n
				joined = append(joined, merged{r.Key, e})
			}
		}
		if len(rows) < 100 {
			break
		}
	}
	if now >= s.Closes(end) {
		return false, nil
	}
	stateKey := concat(prefix, Sortable(start))
	for _, m := range joined {
		if _, err := ctx.Cancel(baton.EventTime, s.Closes(m.end), s.timerKey(m.key)); err != nil {
			return false, err
		}
		if !bytes.Equal(m.key, stateKey) {
			if err := ctx.Delete(s.store, m.key); err != nil {
				return false, err
			}
		}
	}
	value := make([]byte, 16)
	binary.BigEndian.PutUint64(value, uint64(end))
	binary.BigEndian.PutUint64(value[8:], uint64(count))
	if err := ctx.Set(s.store, stateKey, value); err != nil {
		return false, err
	}
	if err := ctx.Schedule(baton.EventTime, s.Closes(end), s.timerKey(stateKey), nil); err != nil {
		return false, err
	}
	return true, nil
}

// Closed is, when t closes one of these sessions, the session, whose state is deleted; ok is
// false for another timer (or a session already gone).
func (s Sessions) Closed(ctx *baton.Context, t *baton.Timer) (c Closed, ok bool, err error) {
	head := 2 + len(s.store)
	k := t.Key
	if len(k) < head+4+8 || !bytes.Equal(k[:head], s.timerKey(nil)) {
		return Closed{}, false, nil
	}
	stateKey := k[head:]
	keyLen := int(binary.BigEndian.Uint32(stateKey))
	if len(stateKey) != 4+keyLen+8 {
		return Closed{}, false, baton.Other("bad session timer")
	}
	v, err := ctx.Get(s.store, stateKey)
	if err != nil || v == nil {
		return Closed{}, false, err
	}
	start, _ := Unsortable(stateKey[4+keyLen:])
	if err := ctx.Delete(s.store, stateKey); err != nil {
		return Closed{}, false, err
	}
	end, err := readI64(v, 0)
	if err != nil {
		return Closed{}, false, err
	}
	count, err := readI64(v, 1)
	if err != nil {
		return Closed{}, false, err
	}
	return Closed{Key: stateKey[4 : 4+keyLen], Start: start, End: end, Count: count}, true, nil
}
