package windows

import (
	"bytes"
	"math"
	"slices"
	"testing"
)

func TestARecordFallsInTheWindowsThatHoldIt(t *testing.T) {
	tw := Tumbling("w", 1000)
	for ts, want := range map[int64][]int64{0: {0}, 999: {0}, 1000: {1000}, -1: {-1000}} {
		if got := tw.Starts(ts); !slices.Equal(got, want) {
			t.Errorf("tumbling %d: %v, want %v", ts, got, want)
		}
	}
	h := Hopping("w", 1000, 250)
	for ts, want := range map[int64][]int64{
		1000: {250, 500, 750, 1000},
		1249: {250, 500, 750, 1000},
		1250: {500, 750, 1000, 1250},
	} {
		if got := h.Starts(ts); !slices.Equal(got, want) {
			t.Errorf("hopping %d: %v, want %v", ts, got, want)
		}
	}
	if got := h.WithGrace(5).Closes(500); got != 1505 {
		t.Errorf("closes %d", got)
	}
	if got := tw.Closes(math.MaxInt64 - 10); got != math.MaxInt64 {
		t.Errorf("closes saturates: %d", got)
	}
	if got := tw.Starts(math.MaxInt64); len(got) != 1 {
		t.Errorf("the last window: %v", got)
	}
	keys := [][]byte{Sortable(-5), Sortable(0), Sortable(7)}
	if !slices.IsSortedFunc(keys, bytes.Compare) {
		t.Error("sortable keys sort")
	}
	for _, v := range []int64{math.MinInt64, -1, 0, 1, math.MaxInt64} {
		if got, ok := Unsortable(Sortable(v)); !ok || got != v {
			t.Errorf("unsortable %d: %d", v, got)
		}
	}
}

func TestTheStateLayoutIsTheRustSDKs(t *testing.T) {
	// "W", len(store), store, sortable(start): as baton_sdk::windows::Windows::timer_key.
	want := append([]byte("W\x07windows"), 0x80, 0, 0, 0, 0, 0, 0x03, 0xe8)
	if got := Tumbling("windows", 1000).timerKey(1000); !bytes.Equal(got, want) {
		t.Errorf("timer key % x, want % x", got, want)
	}
	// "S", len(store), store, len(key) u32 BE, key, sortable(start).
	state := append(sessionPrefix([]byte("k")), Sortable(5)...)
	want = append([]byte("S\x01s\x00\x00\x00\x01k"), Sortable(5)...)
	if got := NewSessions("s", 10).timerKey(state); !bytes.Equal(got, want) {
		t.Errorf("session timer key % x, want % x", got, want)
	}
}

func TestARecordJoinsASessionWithinItsGapWhileItIsOpen(t *testing.T) {
	s := NewSessions("s", 100).WithGrace(50)
	for _, c := range []struct {
		start, end, ts, now int64
		want                bool
	}{
		{1000, 1200, 1299, 1299, true},
		{1000, 1200, 1300, 1300, false},
		{1000, 1200, 901, 1200, true},
		{1000, 1200, 900, 1200, false},
		{1000, 1200, 1250, 1349, true},
		{1000, 1200, 1250, 1350, false},
	} {
		if got := s.Joins(c.start, c.end, c.ts, c.now); got != c.want {
			t.Errorf("%+v: %v", c, got)
		}
	}
	if s.Closes(1200) != 1350 {
		t.Error("closes")
	}
}
