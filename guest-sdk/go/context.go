package baton

import (
	"encoding/binary"
	"encoding/json"
	"strconv"

	"baton/sdk/internal/sat"
)

// span is a run of a batched call's data, laid out as the contract's `span` record (start,
// then len, both u32) read as one little-endian word.
func span(start, n int) uint64 { return uint64(uint32(start)) | uint64(uint32(n))<<32 }

// pushSpan appends b to data and names it.
func pushSpan(data *[]byte, b []byte) uint64 {
	start := len(*data)
	*data = append(*data, b...)
	return span(start, len(b))
}

// openStore is a store the processor opened, with its writes not yet handed to the host.
type openStore struct {
	name   string
	handle uint32
	data   []byte
	// writes holds six words per write, laid out as the contract's `write` variant (48 bytes,
	// align 8): the case, then its payload from byte 8.
	writes []uint64
	n      int
}

func (s *openStore) flush() error {
	if s.n == 0 {
		return nil
	}
	err := hostApply(s.handle, s.data, s.writes, s.n)
	s.discard()
	return err
}

func (s *openStore) discard() {
	s.data = s.data[:0]
	s.writes = s.writes[:0]
	s.n = 0
}

// outbox holds the outputs not yet handed to the host: seven words per `out-record` (56
// bytes, align 8) and two per `header-entry` (16 bytes).
type outbox struct {
	data    []byte
	records []uint64
	n       int
	headers []uint64
	nh      int
}

func (o *outbox) flush() error {
	if o.n == 0 {
		return nil
	}
	err := hostSendBatch(o.data, o.records, o.n, o.headers, o.nh)
	o.discard()
	return err
}

func (o *outbox) discard() {
	o.data = o.data[:0]
	o.records = o.records[:0]
	o.headers = o.headers[:0]
	o.n, o.nh = 0, 0
}

type timerKey struct {
	slot uint32
	key  string
}

// Context is what a processor can do besides reading its record: state, timers, outputs,
// logs, config. Every call is scoped to the slot of the record (or timer) being handled.
type Context struct {
	stores    []*openStore
	out       outbox
	config    Config
	timestamp int64
	eventTime int64
	slot      uint32
	// Timers this instance knows are scheduled, per slot (by the windows package), so that it
	// schedules each once; forgotten with the call's effects when a call fails.
	scheduled map[timerKey]struct{}
}

var ctx = &Context{eventTime: -1, scheduled: map[timerKey]struct{}{}}

// Config is the pipeline's config.
func (c *Context) Config() Config { return c.config }

// Timestamp is the timestamp of the record being processed (in a timer callback: the timer's
// At).
func (c *Context) Timestamp() int64 { return c.timestamp }

// EventTime is the slot's event time: the highest record timestamp seen in it, up to and
// including the record being processed (in a timer callback: with the whole batch counted).
func (c *Context) EventTime() int64 { return c.eventTime }

// Slot is the slot of the current call.
func (c *Context) Slot() uint32 { return c.slot }

// open is store name, opened on first use.
func (c *Context) open(name string) (*openStore, error) {
	for _, s := range c.stores {
		if s.name == name {
			return s, nil
		}
	}
	h, err := hostOpen(name)
	if err != nil {
		return nil, err
	}
	s := &openStore{name: name, handle: h}
	c.stores = append(c.stores, s)
	return s, nil
}

// flushed is store name with its buffered writes handed to the host, ready for a read.
func (c *Context) flushed(name string) (*openStore, error) {
	s, err := c.open(name)
	if err != nil {
		return nil, err
	}
	if err := s.flush(); err != nil {
		return nil, err
	}
	return s, nil
}

// Get is the value of key, nil when it is missing or expired (an empty value is an empty,
// non-nil slice).
func (c *Context) Get(store string, key []byte) ([]byte, error) {
	s, err := c.flushed(store)
	if err != nil {
		return nil, err
	}
	return hostGet(s.handle, key)
}

// GetMany is the values of many keys at once, in the order asked; nil where a key is missing.
func (c *Context) GetMany(store string, keys [][]byte) ([][]byte, error) {
	s, err := c.flushed(store)
	if err != nil {
		return nil, err
	}
	return hostGetMany(s.handle, keys)
}

// Set sets key to value (buffered until the end of the call or the next read of the store).
func (c *Context) Set(store string, key, value []byte) error {
	return c.SetWithExpiry(store, key, value, nil)
}

// SetWithTTL sets key to value, to expire ttlMs after the record's timestamp (in event time).
func (c *Context) SetWithTTL(store string, key, value []byte, ttlMs int64) error {
	return c.SetWithExpiry(store, key, value, &Expiry{EventTime, sat.Add(c.timestamp, ttlMs)})
}

// SetWithProcessingTTL sets key to value, to expire ttlMs from now on the host's wall clock.
func (c *Context) SetWithProcessingTTL(store string, key, value []byte, ttlMs int64) error {
	return c.SetWithExpiry(store, key, value, &Expiry{ProcessingTime, sat.Add(c.ProcessingTime(), ttlMs)})
}

// SetWithExpiry sets key to value, to expire at expiry (nil: never). Buffered.
func (c *Context) SetWithExpiry(store string, key, value []byte, expiry *Expiry) error {
	s, err := c.open(store)
	if err != nil {
		return err
	}
	k := pushSpan(&s.data, key)
	v := pushSpan(&s.data, value)
	var some, kind uint64
	var at int64
	if expiry != nil {
		some, kind, at = 1, uint64(expiry.Kind), expiry.At
	}
	s.writes = append(s.writes, 0, k, v, some, kind, uint64(at))
	s.n++
	return nil
}

// Delete removes key; removing a missing key does nothing. Buffered.
func (c *Context) Delete(store string, key []byte) error {
	s, err := c.open(store)
	if err != nil {
		return err
	}
	s.writes = append(s.writes, 1, pushSpan(&s.data, key), 0, 0, 0, 0)
	s.n++
	return nil
}

// DeleteRange removes every entry with start <= key < end (end nil: no upper bound) and
// returns how many it removed.
func (c *Context) DeleteRange(store string, start, end []byte) (uint64, error) {
	s, err := c.flushed(store)
	if err != nil {
		return 0, err
	}
	return hostDeleteRange(s.handle, start, end)
}

// Add adds delta to the counter at key (an 8-byte big-endian integer, Kafka's
// LongSerializer; 0 when missing). Buffered: errors such as an overflow surface at the end of
// the call. Prefer it to Increment when the new value is not needed.
func (c *Context) Add(store string, key []byte, delta int64) error {
	s, err := c.open(store)
	if err != nil {
		return err
	}
	s.writes = append(s.writes, 2, pushSpan(&s.data, key), uint64(delta), 0, 0, 0)
	s.n++
	return nil
}

// Increment adds delta to the counter at key and returns the new value (one host call).
func (c *Context) Increment(store string, key []byte, delta int64) (int64, error) {
	s, err := c.flushed(store)
	if err != nil {
		return 0, err
	}
	return hostIncrement(s.handle, key, delta)
}

// Counter is the counter at key, 0 when missing.
func (c *Context) Counter(store string, key []byte) (int64, error) {
	v, err := c.Get(store, key)
	if err != nil || v == nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, InvalidValue("counter of " + strconv.Itoa(len(v)) + " bytes, want 8")
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}

// Scan is up to limit entries with start <= key < end (end nil: no upper bound), in
// ascending byte order of the key. It sees this call's own writes.
func (c *Context) Scan(store string, start, end []byte, limit uint32) ([]Entry, error) {
	s, err := c.flushed(store)
	if err != nil {
		return nil, err
	}
	return hostScan(s.handle, start, end, limit)
}

// GetJSON decodes the value of key as JSON into v; false when the key is missing. A value
// that is not JSON of v's type is an InvalidValue error.
func (c *Context) GetJSON(store string, key []byte, v any) (bool, error) {
	b, err := c.Get(store, key)
	if err != nil || b == nil {
		return false, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return true, InvalidValue("JSON: " + err.Error())
	}
	return true, nil
}

// SetJSON sets key to v as compact JSON (buffered, as Set).
func (c *Context) SetJSON(store string, key []byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return InvalidValue("JSON: " + err.Error())
	}
	return c.Set(store, key, b)
}

// Send sends a record to one of the pipeline's declared output topics (key nil: none; value
// nil: a tombstone), with the timestamp of the record being processed. Buffered: it becomes
// visible only if the call commits, and an unknown topic surfaces at the end of the call.
func (c *Context) Send(topic string, key, value []byte) error {
	return c.SendWithHeaders(topic, key, value, nil)
}

// SendWithHeaders sends a record with headers to a declared output topic.
func (c *Context) SendWithHeaders(topic string, key, value []byte, headers []Header) error {
	o := &c.out
	start := len(o.data)
	o.data = append(o.data, topic...)
	t := span(start, len(topic))
	// out-record: topic span @0; key option<span> @8 (case u8, span @12); value option<span>
	// @20 (case, span @24); headers span @32; timestamp option<s64> @40 (case, value @48).
	var w1, w2, w3 uint64
	if key != nil {
		k := pushSpan(&o.data, key)
		w1 = 1 | (k&0xffff_ffff)<<32
		w2 = k >> 32
	}
	if value != nil {
		v := pushSpan(&o.data, value)
		w2 |= 1 << 32
		w3 = v
	}
	first := o.nh
	for _, h := range headers {
		start := len(o.data)
		o.data = append(o.data, h.Name...)
		name := span(start, len(h.Name))
		o.headers = append(o.headers, name, pushSpan(&o.data, h.Value))
		o.nh++
	}
	o.records = append(o.records, t, w1, w2, w3, span(first, o.nh-first), 1, uint64(c.timestamp))
	o.n++
	return nil
}

// Schedule schedules a timer for key in this slot at `at` (milliseconds of kind's clock); the
// same (kind, at, key) again replaces its payload (nil: none).
func (c *Context) Schedule(kind TimeKind, at int64, key, payload []byte) error {
	return hostSchedule(kind, at, key, payload)
}

// Cancel cancels a timer; false when none was pending.
func (c *Context) Cancel(kind TimeKind, at int64, key []byte) (bool, error) {
	return hostCancel(kind, at, key)
}

// ProcessingTime is the host's wall clock, in milliseconds since the Unix epoch.
func (c *Context) ProcessingTime() int64 { return hostProcessingTime() }

// Log writes message at level to the host's log, with the pipeline, slot and offset.
func (c *Context) Log(level Level, message string) { hostLog(level, message) }

// TimerKnown reports whether this instance scheduled the timer of key in the current slot
// (RememberTimer) and has not forgotten it since: for helpers such as the windows package
// that schedule a timer once per window. A call that fails forgets every timer.
func (c *Context) TimerKnown(key []byte) bool {
	_, ok := c.scheduled[timerKey{c.slot, string(key)}]
	return ok
}

// RememberTimer records that the timer of key is scheduled in the current slot.
func (c *Context) RememberTimer(key []byte) {
	c.scheduled[timerKey{c.slot, string(key)}] = struct{}{}
}

// ForgetTimer forgets the timer of key in the current slot.
func (c *Context) ForgetTimer(key []byte) {
	delete(c.scheduled, timerKey{c.slot, string(key)})
}

// flush hands every buffered write and output to the host.
func (c *Context) flush() error {
	for _, s := range c.stores {
		if err := s.flush(); err != nil {
			return err
		}
	}
	return c.out.flush()
}

// discard forgets every buffered write and output (the host discards the call's effects).
func (c *Context) discard() {
	for _, s := range c.stores {
		s.discard()
	}
	c.out.discard()
	clear(c.scheduled)
}
