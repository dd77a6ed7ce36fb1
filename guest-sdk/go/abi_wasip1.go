//go:build wasip1

package baton

// The Component Model's canonical ABI for the baton:processor@0.2.0 world, written out by hand:
// the handler's exports and the host's imports (mem_wasip1.go: cabi_realloc and the memory the
// host writes into). Layouts (little-endian, natural alignment) are noted where they are used.
//
// Return areas: an import with more than one flat result writes them to a pointer it is given.
// That area is the package-level `ret` (never a local: a goroutine's stack can move when it
// grows).

import (
	"encoding/binary"
	"runtime"
	"unsafe"
)

// --- reading what the host wrote ----------------------------------------------------------

// mem is n bytes of linear memory at p, which the host wrote (into memory cabiRealloc handed
// out): a view, valid until the arena is used again. Empty (not nil) for n = 0.
func mem(p, n uint32) []byte {
	if n == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(at(uintptr(p))), n)
}

// owned is a copy of n bytes at p in ordinary Go memory, for the processor to keep. Empty (not
// nil) for n = 0.
func owned(p, n uint32) []byte {
	if n == 0 {
		return []byte{}
	}
	out := make([]byte, n)
	copy(out, mem(p, n))
	return out
}

// words is a view of n words at p.
func words(p, n uint32) []uint64 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*uint64)(at(uintptr(p))), n)
}

func u32(b []byte, off int) uint32 { return binary.LittleEndian.Uint32(b[off:]) }
func u64(b []byte, off int) uint64 { return binary.LittleEndian.Uint64(b[off:]) }

// addr is the address of b's first byte (0 when b is empty), for an import's (ptr, len).
func addr(b []byte) uint32 {
	if len(b) == 0 {
		return 0
	}
	return uint32(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}

func waddr(w []uint64) uint32 {
	if len(w) == 0 {
		return 0
	}
	return uint32(uintptr(unsafe.Pointer(unsafe.SliceData(w))))
}

func saddr(s string) uint32 {
	if len(s) == 0 {
		return 0
	}
	return uint32(uintptr(unsafe.Pointer(unsafe.StringData(s))))
}

// ret is the return area of imports: 32 bytes, align 8 (the largest result is
// result<u64, error>, 24 bytes).
var ret [4]uint64

func retPtr() uint32 {
	ret = [4]uint64{}
	return uint32(uintptr(unsafe.Pointer(&ret)))
}

func retBytes() []byte { return unsafe.Slice((*byte)(unsafe.Pointer(&ret)), 32) }

// liftError is the `error` variant at b: case u8 @0, string (ptr @4, len @8); 12 bytes. lost:
// the string did not fit the transfer buffer (and is gone).
func liftError(b []byte, lost bool) *Error {
	if lost {
		return &Error{Kind: ErrorKind(b[0]), Message: "(the error's text did not fit the Go SDK's transfer buffer)"}
	}
	return &Error{Kind: ErrorKind(b[0]), Message: string(mem(u32(b, 4), u32(b, 8)))}
}

// --- imports -------------------------------------------------------------------------------

//go:wasmimport baton:processor/state@0.2.0 [static]store.open
func wasmStoreOpen(namePtr, nameLen, ret uint32)

//go:wasmimport baton:processor/state@0.2.0 [method]store.get
func wasmStoreGet(self, keyPtr, keyLen, ret uint32)

//go:wasmimport baton:processor/state@0.2.0 [method]store.get-many
func wasmStoreGetMany(self, keysPtr, keysLen, ret uint32)

//go:wasmimport baton:processor/state@0.2.0 [method]store.delete-range
func wasmStoreDeleteRange(self, startPtr, startLen, endSome, endPtr, endLen, ret uint32)

//go:wasmimport baton:processor/state@0.2.0 [method]store.increment
func wasmStoreIncrement(self, keyPtr, keyLen uint32, delta int64, ret uint32)

//go:wasmimport baton:processor/state@0.2.0 [method]store.scan
func wasmStoreScan(self, startPtr, startLen, endSome, endPtr, endLen, limit, ret uint32)

//go:wasmimport baton:processor/state@0.2.0 [method]store.apply
func wasmStoreApply(self, dataPtr, dataLen, writesPtr, writesLen, ret uint32)

//go:wasmimport baton:processor/output@0.2.0 send-batch
func wasmSendBatch(dataPtr, dataLen, recordsPtr, recordsLen, headersPtr, headersLen, ret uint32)

//go:wasmimport baton:processor/timers@0.2.0 schedule
func wasmSchedule(kind uint32, at int64, keyPtr, keyLen, payloadSome, payloadPtr, payloadLen, ret uint32)

//go:wasmimport baton:processor/timers@0.2.0 cancel
func wasmCancel(kind uint32, at int64, keyPtr, keyLen, ret uint32)

//go:wasmimport baton:processor/timers@0.2.0 event-time
func wasmEventTime() int64

//go:wasmimport baton:processor/timers@0.2.0 processing-time
func wasmProcessingTime() int64

//go:wasmimport baton:processor/log@0.2.0 log
func wasmLog(level, msgPtr, msgLen uint32)

// Every import whose results hold a list runs between beginImport and endImport (see
// mem_wasip1.go); one that only reads runs again when its results did not fit.

// result<store, error>: case u8 @0, handle or error @4; 16 bytes.
func hostOpen(name string) (uint32, error) {
	mark := beginImport()
	defer endImport(mark)
	wasmStoreOpen(saddr(name), uint32(len(name)), retPtr())
	runtime.KeepAlive(name)
	lost := importSpilled(mark)
	b := retBytes()
	if b[0] != 0 {
		return 0, liftError(b[4:], lost)
	}
	return u32(b, 4), nil
}

// result<option<list<u8>>, error>: case @0, then option case @4 and list (ptr @8, len @12),
// or the error @4; 16 bytes.
func hostGet(h uint32, key []byte) ([]byte, error) {
	for {
		mark := beginImport()
		wasmStoreGet(h, addr(key), uint32(len(key)), retPtr())
		runtime.KeepAlive(key)
		if importSpilled(mark) {
			continue
		}
		var v []byte
		var err error
		b := retBytes()
		if b[0] != 0 {
			err = liftError(b[4:], false)
		} else if b[4] != 0 {
			v = owned(u32(b, 8), u32(b, 12))
		}
		endImport(mark)
		return v, err
	}
}

// keys: list<list<u8>>, 8 bytes per item (ptr, len). Result: result<list<option<list<u8>>>,
// error>, each item 12 bytes (case u8 @0, ptr @4, len @8).
func hostGetMany(h uint32, keys [][]byte) ([][]byte, error) {
	table := make([]uint64, len(keys))
	for i, k := range keys {
		table[i] = uint64(addr(k)) | uint64(len(k))<<32
	}
	for {
		mark := beginImport()
		wasmStoreGetMany(h, waddr(table), uint32(len(keys)), retPtr())
		runtime.KeepAlive(keys)
		runtime.KeepAlive(table)
		if importSpilled(mark) {
			continue
		}
		out, err := liftGetMany()
		endImport(mark)
		return out, err
	}
}

func liftGetMany() ([][]byte, error) {
	b := retBytes()
	if b[0] != 0 {
		return nil, liftError(b[4:], false)
	}
	n := u32(b, 8)
	items := mem(u32(b, 4), n*12)
	out := make([][]byte, n)
	for i := range out {
		it := items[i*12:]
		if it[0] != 0 {
			out[i] = owned(u32(it, 4), u32(it, 8))
		}
	}
	return out, nil
}

// option<list<u8>> flattened: case, ptr, len.
func optList(b []byte) (uint32, uint32, uint32) {
	if b == nil {
		return 0, 0, 0
	}
	return 1, addr(b), uint32(len(b))
}

// result<u64, error>: case @0, u64 or error @8; 24 bytes.
func hostDeleteRange(h uint32, start, end []byte) (uint64, error) {
	es, ep, el := optList(end)
	mark := beginImport()
	defer endImport(mark)
	wasmStoreDeleteRange(h, addr(start), uint32(len(start)), es, ep, el, retPtr())
	runtime.KeepAlive(start)
	runtime.KeepAlive(end)
	lost := importSpilled(mark)
	b := retBytes()
	if b[0] != 0 {
		return 0, liftError(b[8:], lost)
	}
	return u64(b, 8), nil
}

// result<s64, error>: as result<u64, error>.
func hostIncrement(h uint32, key []byte, delta int64) (int64, error) {
	mark := beginImport()
	defer endImport(mark)
	wasmStoreIncrement(h, addr(key), uint32(len(key)), delta, retPtr())
	runtime.KeepAlive(key)
	lost := importSpilled(mark)
	b := retBytes()
	if b[0] != 0 {
		return 0, liftError(b[8:], lost)
	}
	return int64(u64(b, 8)), nil
}

// result<list<tuple<list<u8>, list<u8>>>, error>: case @0, list (ptr @4, len @8) of 16-byte
// items (key ptr, key len, value ptr, value len), or the error @4.
func hostScan(h uint32, start, end []byte, limit uint32) ([]Entry, error) {
	es, ep, el := optList(end)
	for {
		mark := beginImport()
		wasmStoreScan(h, addr(start), uint32(len(start)), es, ep, el, limit, retPtr())
		runtime.KeepAlive(start)
		runtime.KeepAlive(end)
		if importSpilled(mark) {
			continue
		}
		out, err := liftScan()
		endImport(mark)
		return out, err
	}
}

func liftScan() ([]Entry, error) {
	b := retBytes()
	if b[0] != 0 {
		return nil, liftError(b[4:], false)
	}
	n := u32(b, 8)
	items := mem(u32(b, 4), n*16)
	// One block for every key and value: one allocation instead of two per entry.
	total := 0
	for i := uint32(0); i < n; i++ {
		it := items[i*16:]
		total += int(u32(it, 4)) + int(u32(it, 12))
	}
	block := make([]byte, 0, total)
	out := make([]Entry, n)
	for i := range out {
		it := items[i*16:]
		k := len(block)
		block = append(block, mem(u32(it, 0), u32(it, 4))...)
		v := len(block)
		block = append(block, mem(u32(it, 8), u32(it, 12))...)
		out[i] = Entry{Key: block[k:v:v], Value: block[v:len(block):len(block)]}
	}
	return out, nil
}

// writes: n items of 48 bytes (six words; see Context.SetWithExpiry). Result: result<_,
// item-error>: case @0, item-error @4 (index u32 @4, error @8); 20 bytes.
func hostApply(h uint32, data []byte, writes []uint64, n int) error {
	mark := beginImport()
	defer endImport(mark)
	wasmStoreApply(h, addr(data), uint32(len(data)), waddr(writes), uint32(n), retPtr())
	runtime.KeepAlive(data)
	runtime.KeepAlive(writes)
	lost := importSpilled(mark)
	b := retBytes()
	if b[0] != 0 {
		return liftError(b[8:], lost)
	}
	return nil
}

// records: n items of 56 bytes (seven words; see Context.SendWithHeaders); headers: nh items
// of 16 bytes. Result: result<_, item-error>.
func hostSendBatch(data []byte, records []uint64, n int, headers []uint64, nh int) error {
	mark := beginImport()
	defer endImport(mark)
	wasmSendBatch(addr(data), uint32(len(data)), waddr(records), uint32(n), waddr(headers), uint32(nh), retPtr())
	runtime.KeepAlive(data)
	runtime.KeepAlive(records)
	runtime.KeepAlive(headers)
	lost := importSpilled(mark)
	b := retBytes()
	if b[0] != 0 {
		return liftError(b[8:], lost)
	}
	return nil
}

// result<_, error>: case @0, error @4; 16 bytes.
func hostSchedule(kind TimeKind, at int64, key, payload []byte) error {
	ps, pp, pl := optList(payload)
	mark := beginImport()
	defer endImport(mark)
	wasmSchedule(uint32(kind), at, addr(key), uint32(len(key)), ps, pp, pl, retPtr())
	runtime.KeepAlive(key)
	runtime.KeepAlive(payload)
	lost := importSpilled(mark)
	b := retBytes()
	if b[0] != 0 {
		return liftError(b[4:], lost)
	}
	return nil
}

// result<bool, error>: case @0, bool u8 or error @4; 16 bytes.
func hostCancel(kind TimeKind, at int64, key []byte) (bool, error) {
	mark := beginImport()
	defer endImport(mark)
	wasmCancel(uint32(kind), at, addr(key), uint32(len(key)), retPtr())
	runtime.KeepAlive(key)
	lost := importSpilled(mark)
	b := retBytes()
	if b[0] != 0 {
		return false, liftError(b[4:], lost)
	}
	return b[4] != 0, nil
}

func hostEventTime() int64      { return wasmEventTime() }
func hostProcessingTime() int64 { return wasmProcessingTime() }

func hostLog(level Level, message string) {
	wasmLog(uint32(level), saddr(message), uint32(len(message)))
	runtime.KeepAlive(message)
}

// --- exports -------------------------------------------------------------------------------

// exportRet is the return area of the exports: result<_, error> (case @0, error @4: case u8
// @4, string ptr @8, len @12), read by the host after the export returns; exportMsg keeps the
// error's text alive until the next call.
var (
	exportRet [2]uint64
	exportMsg string
)

func lowerResult(err error) uint32 {
	exportRet = [2]uint64{}
	exportMsg = ""
	if err != nil {
		kind, msg := toWit(err)
		exportMsg = msg
		exportRet[0] = 1 | uint64(kind)<<32
		exportRet[1] = uint64(saddr(msg)) | uint64(len(msg))<<32
	}
	return uint32(uintptr(unsafe.Pointer(&exportRet)))
}

// init(config: list<tuple<string, string>>): 16 bytes per pair (key ptr, len, value ptr, len).
//
//go:wasmexport baton:processor/handler@0.2.0#init
func exportInit(pairsPtr, pairsLen uint32) uint32 {
	defer callDone()
	if err := argsSpilled(); err != nil {
		return lowerResult(err)
	}
	items := mem(pairsPtr, pairsLen*16)
	values := make(map[string]string, pairsLen)
	for i := uint32(0); i < pairsLen; i++ {
		it := items[i*16:]
		values[string(mem(u32(it, 0), u32(it, 4)))] = string(mem(u32(it, 8), u32(it, 12)))
	}
	return lowerResult(handleInit(Config{values: values}))
}

// process(batch: batch): the record flattened to topic (ptr, len), slot, event-time, data
// (ptr, len), records (ptr, len), headers (ptr, len).
//
//go:wasmexport baton:processor/handler@0.2.0#process
func exportProcess(topicPtr, topicLen, slot uint32, eventTime int64, dataPtr, dataLen, recordsPtr, recordsLen, headersPtr, headersLen uint32) uint32 {
	defer callDone()
	if err := argsSpilled(); err != nil {
		return lowerResult(err)
	}
	// Keys, values and headers are the processor's to keep: data and headers are copied out
	// of the arena (one copy each); the records' words are read from it.
	b := batch{
		topic:     string(mem(topicPtr, topicLen)),
		slot:      slot,
		eventTime: eventTime,
		data:      owned(dataPtr, dataLen),
		records:   words(recordsPtr, recordsLen),
		headers:   append([]uint64(nil), words(headersPtr, headersLen)...),
	}
	return lowerResult(handleProcess(&b))
}

// on-timers(slot, event-time, fired: list<fired>): 40 bytes per timer: kind u8 @0, at s64 @8,
// key (ptr @16, len @20), payload option<list<u8>> (case @24, ptr @28, len @32).
//
//go:wasmexport baton:processor/handler@0.2.0#on-timers
func exportOnTimers(slot uint32, eventTime int64, firedPtr, firedLen uint32) uint32 {
	defer callDone()
	if err := argsSpilled(); err != nil {
		return lowerResult(err)
	}
	items := mem(firedPtr, firedLen*40)
	fired := make([]Timer, firedLen)
	for i := range fired {
		it := items[i*40:]
		t := Timer{Kind: TimeKind(it[0]), At: int64(u64(it, 8)), Key: owned(u32(it, 16), u32(it, 20))}
		if it[24] != 0 {
			t.Payload = owned(u32(it, 28), u32(it, 32))
		}
		fired[i] = t
	}
	return lowerResult(handleOnTimers(slot, eventTime, fired))
}
