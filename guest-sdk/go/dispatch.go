package baton

import (
	"runtime"
	"strconv"
	"strings"
)

// What the handler's exports do, once the ABI glue (abi_wasip1.go) has lifted their arguments.

func handleInit(cfg Config) (err error) {
	defer recoverTo(&err)
	if registered.Init != nil {
		if err := registered.Init(cfg); err != nil {
			return err
		}
	}
	ctx.config = cfg
	return nil
}

// batch is the contract's `batch` record, its lists pointing into memory the host wrote.
type batch struct {
	topic     string
	slot      uint32
	eventTime int64
	data      []byte
	records   []uint64
	headers   []uint64
}

func handleProcess(b *batch) error {
	f := registered.Process
	if f == nil {
		return nil
	}
	c := ctx
	c.slot = b.slot
	c.eventTime = b.eventTime
	return c.run(func() error {
		msg := new(Message)
		for i := 0; i+5 <= len(b.records); i += 5 {
			r := b.records[i : i+5 : i+5]
			first, count := r[4]>>32, r[4]&0xffff_ffff
			var hs []uint64
			if count > 0 && (first+count)*2 <= uint64(len(b.headers)) {
				hs = b.headers[first*2 : (first+count)*2]
			}
			*msg = Message{
				Topic:     b.topic,
				Slot:      b.slot,
				Offset:    r[0],
				Timestamp: int64(r[1]),
				Key:       wordBytes(b.data, r[2]),
				Value:     wordBytes(b.data, r[3]),
				headers:   hs,
				data:      b.data,
			}
			c.timestamp = msg.Timestamp
			if msg.Timestamp > c.eventTime {
				c.eventTime = msg.Timestamp
			}
			if err := f(msg, c); err != nil {
				return err
			}
			// A processor may keep the message it was handed: it gets a fresh one then.
			msg = new(Message)
		}
		return nil
	})
}

func handleOnTimers(slot uint32, eventTime int64, fired []Timer) error {
	f := registered.OnTimer
	if f == nil {
		return nil
	}
	c := ctx
	c.slot = slot
	c.eventTime = eventTime
	return c.run(func() error {
		for i := range fired {
			c.timestamp = fired[i].At
			if err := f(&fired[i], c); err != nil {
				return err
			}
		}
		return nil
	})
}

// run runs body and then flushes; on any error (or panic) nothing buffered survives into the
// next call.
func (c *Context) run(body func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = Other(panicText(p))
		}
		if err != nil {
			c.discard()
		}
	}()
	if err = body(); err != nil {
		return err
	}
	return c.flush()
}

func recoverTo(err *error) {
	if p := recover(); p != nil {
		*err = Other(panicText(p))
	}
}

// panicText describes a recovered panic and where it happened: `panic: TEXT (at FILE:LINE in
// FUNC)`.
func panicText(p any) string {
	var text string
	switch v := p.(type) {
	case string:
		text = v
	case error:
		text = v.Error()
	case interface{ String() string }:
		text = v.String()
	case int:
		text = strconv.Itoa(v)
	case int64:
		text = strconv.FormatInt(v, 10)
	default:
		text = "(a value that is not a string or an error)"
	}
	text = "panic: " + text
	var pcs [32]uintptr
	n := runtime.Callers(2, pcs[:])
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		if f.Function != "" && !strings.HasPrefix(f.Function, "runtime.") &&
			!strings.HasPrefix(f.Function, "baton/sdk.") {
			return text + " (at " + f.File + ":" + strconv.Itoa(f.Line) + " in " + f.Function + ")"
		}
		if !more {
			return text
		}
	}
}
