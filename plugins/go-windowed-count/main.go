// windowed-count in Go: counts records per key in tumbling event-time windows and sends each
// window's final count once, when it closes. The same config, state and outputs as the Rust
// `windowed-count`: `window_ms` (window size), `grace_ms` (how long a window stays open past
// its end for late records, default 0), `output` (the topic of final counts), `late` (the
// topic of records that arrive after their window closed).
//
// A window [s, e) closes when the slot's event time reaches e + grace_ms; its count then goes
// to `output` with the record key as key and {"start":s,"end":e,"count":n} as value, and its
// state is deleted. Built on the SDK's windows package: the store `windows`, keyed by the
// window start (8 bytes that sort by time) and the record key, one timer per window, and a
// range delete when it closes.
package main

import (
	"strconv"

	baton "baton/sdk"
	"baton/sdk/windows"
)

var settings struct {
	windows windows.Windows
	output  string
	late    string
}

func init() {
	baton.Register(baton.Processor{Init: setup, Process: process, OnTimer: closeWindow})
}

func setup(cfg baton.Config) error {
	window, err := cfg.RequireInt("window_ms")
	if err != nil {
		return err
	}
	if window <= 0 {
		return baton.InvalidInput("config `window_ms` must be positive")
	}
	var grace int64
	if cfg.Has("grace_ms") {
		if grace, err = cfg.RequireInt("grace_ms"); err != nil {
			return err
		}
	}
	if grace < 0 {
		return baton.InvalidInput("config `grace_ms` must not be negative")
	}
	output, err := cfg.Require("output")
	if err != nil {
		return err
	}
	late, err := cfg.Require("late")
	if err != nil {
		return err
	}
	settings.windows = windows.Tumbling("windows", window).WithGrace(grace)
	settings.output, settings.late = output, late
	return nil
}

func process(msg *baton.Message, ctx *baton.Context) error {
	if msg.Key == nil {
		return nil
	}
	counted, err := settings.windows.Count(ctx, msg.Key, msg.Timestamp, 1)
	if err != nil || counted {
		return err
	}
	// Every window of it had closed: the record goes to `late` as it came.
	return ctx.SendWithHeaders(settings.late, msg.Key, msg.Value, msg.Headers())
}

// closeWindow: a window closed; each key's final count goes out, and its state is deleted.
func closeWindow(t *baton.Timer, ctx *baton.Context) error {
	closed, _, err := settings.windows.Closed(ctx, t)
	if err != nil {
		return err
	}
	for _, w := range closed {
		v := []byte(`{"start":`)
		v = strconv.AppendInt(v, w.Start, 10)
		v = append(v, `,"end":`...)
		v = strconv.AppendInt(v, w.End, 10)
		v = append(v, `,"count":`...)
		v = strconv.AppendInt(v, w.Count, 10)
		v = append(v, '}')
		if err := ctx.Send(settings.output, w.Key, v); err != nil {
			return err
		}
	}
	return nil
}

func main() {}
