package baton

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
)

// The buffered writes and outputs are laid out as the canonical ABI lays out the contract's
// `write` (48 bytes, align 8) and `out-record` (56 bytes, align 8) items; these tests read them
// back at the offsets the ABI gives each field.

func bytesOf(words []uint64) []byte {
	b := make([]byte, 8*len(words))
	for i, w := range words {
		binary.LittleEndian.PutUint64(b[8*i:], w)
	}
	return b
}

func testContext() (*Context, *openStore) {
	s := &openStore{name: "s", handle: 1}
	return &Context{stores: []*openStore{s}, scheduled: map[timerKey]struct{}{}}, s
}

func span32(b []byte, off int) (uint32, uint32) {
	return binary.LittleEndian.Uint32(b[off:]), binary.LittleEndian.Uint32(b[off+4:])
}

func TestWritesAreLaidOutAsTheContractsWriteVariant(t *testing.T) {
	c, s := testContext()
	c.timestamp = 1000
	must(t, c.Set("s", []byte("key"), []byte("value")))
	must(t, c.SetWithTTL("s", []byte("k2"), []byte(""), 50))
	must(t, c.Delete("s", []byte("gone")))
	must(t, c.Add("s", []byte("n"), -3))
	if s.n != 4 || len(s.writes) != 4*6 {
		t.Fatalf("%d writes in %d words", s.n, len(s.writes))
	}
	w := bytesOf(s.writes)
	item := func(i int) []byte { return w[48*i : 48*(i+1)] }
	data := string(s.data)
	str := func(start, n uint32) string { return data[start : start+n] }

	// set: case 0; set-op at 8: key span @8, value span @16, option<expiry> @24 (case), expiry
	// @32 (kind u8 @32, at s64 @40).
	set := item(0)
	if set[0] != 0 || str(span32(set, 8)) != "key" || str(span32(set, 16)) != "value" || set[24] != 0 {
		t.Fatalf("set: % x", set)
	}
	ttl := item(1)
	if ttl[0] != 0 || str(span32(ttl, 8)) != "k2" || ttl[24] != 1 || ttl[32] != byte(EventTime) ||
		int64(binary.LittleEndian.Uint64(ttl[40:])) != 1050 {
		t.Fatalf("set with ttl: % x", ttl)
	}
	if _, n := span32(ttl, 16); n != 0 {
		t.Fatalf("empty value: % x", ttl)
	}
	// delete: case 1, span @8.
	del := item(2)
	if del[0] != 1 || str(span32(del, 8)) != "gone" {
		t.Fatalf("delete: % x", del)
	}
	// add: case 2; add-op at 8: key span @8, delta s64 @16.
	add := item(3)
	if add[0] != 2 || str(span32(add, 8)) != "n" || int64(binary.LittleEndian.Uint64(add[16:])) != -3 {
		t.Fatalf("add: % x", add)
	}
	c.discard()
	if s.n != 0 || len(s.writes) != 0 || len(s.data) != 0 {
		t.Fatal("discard left writes")
	}
}

func TestOutputsAreLaidOutAsTheContractsOutRecord(t *testing.T) {
	c, _ := testContext()
	c.timestamp = -7
	must(t, c.Send("topic-a", nil, []byte("v")))
	must(t, c.SendWithHeaders("b", []byte("k"), nil, []Header{{"h1", []byte("x")}, {"h2", nil}}))
	o := &c.out
	if o.n != 2 || o.nh != 2 || len(o.records) != 14 || len(o.headers) != 4 {
		t.Fatalf("%d records, %d headers", o.n, o.nh)
	}
	r := bytesOf(o.records)
	data := string(o.data)
	str := func(start, n uint32) string { return data[start : start+n] }
	// topic span @0; key option<span> @8 (case u8, span @12); value option<span> @20 (case,
	// span @24); headers span @32; timestamp option<s64> @40 (case, value @48).
	a, b := r[:56], r[56:]
	if str(span32(a, 0)) != "topic-a" || a[8] != 0 || a[20] != 1 || str(span32(a, 24)) != "v" {
		t.Fatalf("first: % x", a)
	}
	if first, n := span32(a, 32); first != 0 || n != 0 {
		t.Fatalf("first's headers: % x", a)
	}
	if a[40] != 1 || int64(binary.LittleEndian.Uint64(a[48:])) != -7 {
		t.Fatalf("first's timestamp: % x", a)
	}
	if str(span32(b, 0)) != "b" || b[8] != 1 || str(span32(b, 12)) != "k" || b[20] != 0 {
		t.Fatalf("second: % x", b)
	}
	if first, n := span32(b, 32); first != 0 || n != 2 {
		t.Fatalf("second's headers: % x", b)
	}
	// header-entry: name span @0, value span @8; 16 bytes.
	h := bytesOf(o.headers)
	if str(span32(h, 0)) != "h1" || str(span32(h, 8)) != "x" || str(span32(h, 16)) != "h2" {
		t.Fatalf("headers: % x", h)
	}
	if _, n := span32(h, 24); n != 0 {
		t.Fatalf("empty header value: % x", h)
	}
}

func TestMessagesReadTheBatchWords(t *testing.T) {
	data := []byte("keyvaluehnhv")
	word := func(start, n int) uint64 { return uint64(start)<<32 | uint64(n) }
	m := Message{
		Key:     wordBytes(data, word(0, 3)),
		Value:   wordBytes(data, noneWord),
		headers: []uint64{word(8, 2), word(10, 2)},
		data:    data,
	}
	if string(m.Key) != "key" || m.Value != nil {
		t.Fatalf("key %q value %q", m.Key, m.Value)
	}
	if e := wordBytes(data, word(3, 0)); e == nil || len(e) != 0 {
		t.Fatalf("an empty value is empty, not nil: %#v", e)
	}
	hs := m.Headers()
	if len(hs) != 1 || hs[0].Name != "hn" || string(hs[0].Value) != "hv" {
		t.Fatalf("headers %q", hs)
	}
	if v, ok := m.Header("hn"); !ok || string(v) != "hv" {
		t.Fatalf("header %q %v", v, ok)
	}
	if _, ok := m.Header("nope"); ok {
		t.Fatal("a missing header")
	}
}

func TestErrorsReachTheHostWithTheirKind(t *testing.T) {
	for _, c := range []struct {
		err  error
		kind ErrorKind
		msg  string
	}{
		{InvalidInput("bad"), KindInvalidInput, "bad"},
		{fmt.Errorf("closing: %w", Limit("timers")), KindLimit, "closing: timers"},
		{errors.New("plain"), KindOther, "plain"},
		{Other("x"), KindOther, "x"},
	} {
		kind, msg := toWit(c.err)
		if kind != c.kind || msg != c.msg {
			t.Errorf("%v: %v %q, want %v %q", c.err, kind, msg, c.kind, c.msg)
		}
	}
	if InvalidValue("v").Error() != "invalid-value: v" || Other("o").Error() != "o" {
		t.Error("Error texts")
	}
	if !errors.Is(fmt.Errorf("w: %w", NoSuchStore("s")), &Error{Kind: KindNoSuchStore}) {
		t.Error("errors.Is by kind")
	}
	if KindOf(fmt.Errorf("w: %w", TooLarge("t"))) != KindTooLarge {
		t.Error("KindOf")
	}
}

func TestConfig(t *testing.T) {
	c := NewConfig(map[string]string{"n": "42", "s": "x"})
	if n, err := c.RequireInt("n"); err != nil || n != 42 {
		t.Fatal(n, err)
	}
	if _, err := c.RequireInt("s"); err == nil || err.Error() != "invalid-input: config key `s` must be an integer" {
		t.Fatal(err)
	}
	if _, err := c.Require("missing"); err == nil || err.Error() != "invalid-input: config key `missing` is required" {
		t.Fatal(err)
	}
}

func TestAFailedCallForgetsItsTimersAndEffects(t *testing.T) {
	c, s := testContext()
	c.slot = 3
	c.RememberTimer([]byte("t"))
	if !c.TimerKnown([]byte("t")) {
		t.Fatal("remembered")
	}
	c.slot = 4
	if c.TimerKnown([]byte("t")) {
		t.Fatal("timers are per slot")
	}
	must(t, c.Add("s", []byte("k"), 1))
	err := c.run(func() error { return InvalidInput("no") })
	if KindOf(err) != KindInvalidInput || s.n != 0 {
		t.Fatalf("%v, %d writes left", err, s.n)
	}
	c.slot = 3
	if c.TimerKnown([]byte("t")) {
		t.Fatal("a failed call forgets the timers")
	}
	err = c.run(func() error { panic("boom") })
	if err == nil || err.Error() == "" || KindOf(err) != KindOther {
		t.Fatal(err)
	}
	t.Log(err)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
