// Package baton is baton's Go SDK: stateful stream processors for the baton host, as
// WebAssembly components of the baton:processor@0.2.0 world.
//
// A processor is a main package that registers its functions from init:
//
//	package main
//
//	import baton "baton/sdk"
//
//	func init() {
//		baton.Register(baton.Processor{
//			Process: func(msg *baton.Message, ctx *baton.Context) error {
//				if msg.Key == nil {
//					return nil
//				}
//				return ctx.Add("counts", msg.Key, 1)
//			},
//		})
//	}
//
//	func main() {}
//
// Build it as a WASI reactor and make the core module a component:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o target/NAME.core.wasm .
//	baton componentize target/NAME.core.wasm -o target/NAME.wasm
//
// (`baton build DIR` runs both.)
//
// The SDK moves records in batches (the batch ABI): writes and outputs are buffered and handed
// to the host in one call per store (one for the outputs), at the end of the call or before a
// read of the same store, so reads see the call's own writes. A call that returns an error (or
// panics) leaves nothing behind: the host discards its writes, timers and outputs and retries
// its records one by one; a record that still fails goes to the dead-letter topic with the
// error.
package baton

import "unicode/utf8"

// Processor is what a component does: Process for every record, OnTimer for every timer that
// falls due, Init once per instance with the pipeline's config, before any record. Only Process
// is required; without OnTimer, timers that fall due are acknowledged and dropped.
type Processor struct {
	// Init is called once per instance with the pipeline's config; an error (InvalidInput,
	// say) stops the partition from starting and is reported.
	Init func(cfg Config) error
	// Process is called for each record of a batch, in offset order. An error fails the
	// whole call: its effects are discarded and the host retries each record alone.
	Process func(msg *Message, ctx *Context) error
	// OnTimer is called for each timer that fell due, in order of At.
	OnTimer func(t *Timer, ctx *Context) error
}

var registered Processor

// Register makes p the component's processor. Call it from an init function of the main
// package: the host instantiates the component (which runs the package initializers) before
// its first call. A later Register replaces an earlier one.
func Register(p Processor) {
	registered = p
}

// TimeKind says which clock a timer or a time-to-live follows.
type TimeKind uint8

const (
	// EventTime is the slot's event time: the highest record timestamp seen in the slot. It
	// moves only when records arrive, and is the same on every replay.
	EventTime TimeKind = 0
	// ProcessingTime is the host's wall clock, in milliseconds since the Unix epoch.
	ProcessingTime TimeKind = 1
)

// Level is a log level.
type Level uint8

// Log levels.
const (
	LevelTrace Level = iota
	LevelDebug
	LevelInfo
	LevelWarn
	LevelError
)

// Expiry says when an entry expires: once Kind's clock reaches At (milliseconds).
type Expiry struct {
	Kind TimeKind
	At   int64
}

// Header is a record header: a name and opaque bytes, as in Kafka.
type Header struct {
	Name  string
	Value []byte
}

// Entry is a key and its value, as Scan returns them.
type Entry struct {
	Key   []byte
	Value []byte
}

const noneWord = ^uint64(0)

// Message is one input record. Its Key and Value point into the batch the host handed over:
// reading a record copies nothing.
type Message struct {
	// Topic is the input topic.
	Topic string
	// Slot is the partition of the input topic it was read from.
	Slot uint32
	// Offset is its position in the slot.
	Offset uint64
	// Timestamp is its creation time in milliseconds since the Unix epoch.
	Timestamp int64
	// Key is nil for a record without a key (an empty key is an empty, non-nil slice).
	Key []byte
	// Value is nil for a tombstone (an empty value is an empty, non-nil slice).
	Value []byte

	headers []uint64 // two words per header (name, value), as the batch lays them out
	data    []byte
}

// wordBytes is the bytes a word of the host's batch names (start<<32 | len): nil for all ones,
// empty (not nil) when out of range, which the host never sends.
func wordBytes(data []byte, w uint64) []byte {
	if w == noneWord {
		return nil
	}
	start, n := w>>32, w&0xffff_ffff
	if start+n > uint64(len(data)) {
		return []byte{}
	}
	if n == 0 {
		return []byte{}
	}
	return data[start : start+n : start+n]
}

// Headers are the record's headers, in order.
func (m *Message) Headers() []Header {
	if len(m.headers) < 2 {
		return nil
	}
	out := make([]Header, 0, len(m.headers)/2)
	for i := 0; i+1 < len(m.headers); i += 2 {
		out = append(out, Header{
			Name:  headerName(wordBytes(m.data, m.headers[i])),
			Value: wordBytes(m.data, m.headers[i+1]),
		})
	}
	return out
}

// headerName is a header's name: empty when it is not UTF-8 (as the Rust SDK reads it).
func headerName(b []byte) string {
	if !utf8.Valid(b) {
		return ""
	}
	return string(b)
}

// Header is the value of the first header called name; false when there is none.
func (m *Message) Header(name string) ([]byte, bool) {
	for i := 0; i+1 < len(m.headers); i += 2 {
		if headerName(wordBytes(m.data, m.headers[i])) == name {
			return wordBytes(m.data, m.headers[i+1]), true
		}
	}
	return nil, false
}

// Timer is a timer that fell due (see Context.Schedule).
type Timer struct {
	// Kind is its clock.
	Kind TimeKind
	// At is when it was due, in milliseconds of its clock.
	At int64
	// Key is the key it was scheduled for.
	Key []byte
	// Payload is what it carries; nil for none.
	Payload []byte
}
