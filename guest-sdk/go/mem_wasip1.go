//go:build wasip1

package baton

// Memory the host writes into.
//
// The host writes the arguments of an export, and the lists an import returns, into memory it
// gets from cabi_realloc. The component model forbids cabi_realloc to call any import ("cannot
// leave component instance"), and Go's allocator may: it reads the clock when it grows the heap
// or runs a collection, and the clock is an import. So cabi_realloc never allocates. It bumps
// through `arena`, a block of the Go heap set aside in advance, and calls nothing in the
// runtime (nosplit: not even a stack check).
//
// What the processor is handed is copied out of the arena into ordinary Go memory (one copy of
// a batch's data, one block for a scan's keys and values), after which the arena is used
// again: from the start once an export returns, from where an import's results began once they
// are copied out.
//
// When a transfer does not fit, cabi_realloc puts it in scratch memory past the end of linear
// memory (memory.grow, which is an instruction, not an import), and the SDK notices after the
// transfer: it zeroes the scratch memory (the Go runtime may take those pages for its heap
// later, and expects fresh pages to be zero), grows the arena to twice the need, and then
//   - retries an import that only reads (get, get-many, scan): the same call again, now fitting;
//   - for another import (whose only lists are error messages) reports the error without its
//     text;
//   - fails an export call with an `other` error before running the processor: the host
//     retries its records one by one (timers: later), and they fit.
// Each grows the arena once; it never shrinks.
//
// The WASI preview 1 adapter (which the Go runtime's clock, random and stderr calls go
// through) asks for its state with the first WASI call, while the runtime initializes, before
// the Go heap exists: it gets `cabi_realloc_adapter`, a bump allocator over a static array
// (wit-component hands `cabi_realloc_adapter`, when a module exports it, to adapters instead of
// `cabi_realloc`).

import (
	"strconv"
	"unsafe"
)

const (
	arenaMin       = 256 << 10 // bytes
	importRoomMin  = 64 << 10  // free bytes asked for before an import
	adapterArenaSz = 3 << 13   // words: 192 KiB (the adapter asks for two blocks of 64 KiB)
	pageSize       = 64 << 10
	noMemory       = ^uint32(0) &^ 7 // a pointer past any memory: the host traps on it
)

// Implemented in mem_wasm.s: the memory.grow and memory.size instructions.
func memoryGrow(pages int32) int32
func memorySize() int32

var (
	arena     []uint64   // the Go memory cabi_realloc hands out
	arenaBase uintptr    // &arena[0]
	arenaSize uintptr    // in bytes
	arenaUsed uintptr    // bytes handed out from the start of the arena
	arenaPeak uintptr    // the most of the arena a call used
	retired   [][]uint64 // arenas replaced during the current call, kept until it returns

	// Scratch memory: [scratchStart, scratchEnd) past what the Go runtime knows of, of which
	// [scratchStart, scratchNext) was handed out since the last check.
	scratchStart, scratchNext, scratchEnd uintptr

	importNeed uintptr // the most bytes an import's results took
)

func init() { newArena(arenaMin) }

func newArena(size uintptr) {
	if arena != nil && arenaUsed > 0 {
		retired = append(retired, arena)
	}
	arena = make([]uint64, (size+7)/8)
	arenaBase = uintptr(unsafe.Pointer(&arena[0]))
	arenaSize = uintptr(len(arena)) * 8
	arenaUsed = 0
}

// cabiRealloc hands the host memory for the arguments of an export and for the lists an
// import returns (the canonical ABI's realloc). The host does not reallocate (strings are
// UTF-8 on both sides), but a non-zero oldPtr is honored.
//
//go:wasmexport cabi_realloc
//go:nosplit
func cabiRealloc(oldPtr, oldSize, align, newSize uint32) uint32 {
	if newSize == 0 {
		return align // any aligned address in bounds does for zero bytes
	}
	a := uintptr(max(align, 1))
	p := (arenaBase + arenaUsed + a - 1) &^ (a - 1)
	if p+uintptr(newSize) <= arenaBase+arenaSize {
		arenaUsed = p + uintptr(newSize) - arenaBase
		arenaPeak = max(arenaPeak, arenaUsed)
	} else if p = scratchAlloc(a, uintptr(newSize)); p == 0 {
		return noMemory
	}
	copyBytes(p, uintptr(oldPtr), uintptr(min(oldSize, newSize)))
	return uint32(p)
}

// scratchAlloc is size bytes of scratch memory, grown past the end of linear memory; 0 when
// memory cannot grow.
//
//go:nosplit
func scratchAlloc(align, size uintptr) uintptr {
	if scratchNext == scratchStart {
		// The first spill since the last check: reuse the scratch pages when they are still
		// the end of memory (the Go heap has not grown over them), else start at the end.
		if top := uintptr(memorySize()) * pageSize; scratchEnd != top {
			scratchStart, scratchNext, scratchEnd = top, top, top
		}
	}
	p := (scratchNext + align - 1) &^ (align - 1)
	if p+size > scratchEnd {
		pages := (p + size - scratchEnd + pageSize - 1) / pageSize
		if memoryGrow(int32(pages)) < 0 {
			return 0
		}
		scratchEnd += pages * pageSize
	}
	scratchNext = p + size
	return p
}

// at is linear-memory address p as a pointer. Sound here, though `go vet` cannot tell: the
// memory is the arena (kept alive by `arena` or `retired`), scratch memory past the Go heap, or
// the static adapter arena, and Go's collector does not move objects.
//
//go:nosplit
func at(p uintptr) unsafe.Pointer {
	return unsafe.Pointer(p)
}

//go:nosplit
func copyBytes(dst, src, n uintptr) {
	if src == 0 {
		return
	}
	for i := uintptr(0); i < n; i++ {
		*(*byte)(at(dst + i)) = *(*byte)(at(src + i))
	}
}

// spilled reports whether a transfer since the last check went to scratch memory. If so its
// contents are lost: the scratch memory is zeroed, and the bytes it took are returned.
func spilled() (bool, uintptr) {
	if scratchNext == scratchStart {
		return false, 0
	}
	n := scratchNext - scratchStart
	clear(unsafe.Slice((*byte)(at(scratchStart)), n))
	scratchNext = scratchStart
	return true, n
}

// beginImport makes room in the arena for an import's results (twice the most an import
// needed, 64 KiB at least) and returns where they start.
func beginImport() uintptr {
	if want := max(importRoomMin, 2*importNeed); arenaSize-arenaUsed < want {
		newArena(max(arenaSize, want))
	}
	return arenaUsed
}

// importSpilled reports whether the import's results went partly to scratch memory (and are
// lost); the next beginImport then makes room for them.
func importSpilled(mark uintptr) bool {
	ok, n := spilled()
	if ok {
		importNeed = max(importNeed, arenaUsed-mark+n)
		arenaUsed = mark
	}
	return ok
}

// endImport lets go of an import's results, copied out: the arena is used again from mark.
func endImport(mark uintptr) {
	importNeed = max(importNeed, arenaUsed-mark)
	arenaUsed = mark
}

// argsSpilled is, when an export's arguments went partly to scratch memory, the error that
// fails the call (the host retries it), with the arena grown to take them the next time.
func argsSpilled() error {
	ok, n := spilled()
	if !ok {
		return nil
	}
	need := arenaUsed + n
	arenaUsed = 0
	newArena(2 * need)
	msg := "baton Go SDK: the call's " + strconv.FormatUint(uint64(need), 10) +
		" bytes of arguments did not fit its transfer buffer, grown now to " +
		strconv.FormatUint(uint64(arenaSize), 10) + " bytes; the call is to be retried"
	hostLog(LevelWarn, msg)
	return Other(msg)
}

// callDone ends an export call: the processor has its copies of everything, so the arena is
// used again from its start, grown first when the call needed more than half of it.
func callDone() {
	spilled()
	clear(retired)
	retired = retired[:0]
	peak := arenaPeak
	arenaPeak, arenaUsed = 0, 0
	if peak > arenaSize/2 {
		newArena(2 * peak)
	}
}

// adapterArena is the memory of the WASI preview 1 adapter (its state and stack).
var (
	adapterArena [adapterArenaSz]uint64 // in the module's zeroed data
	adapterNext  uintptr
)

//go:wasmexport cabi_realloc_adapter
//go:nosplit
func cabiReallocAdapter(oldPtr, oldSize, align, newSize uint32) uint32 {
	base := uintptr(unsafe.Pointer(&adapterArena))
	a := uintptr(max(align, 1))
	p := (base + adapterNext + a - 1) &^ (a - 1)
	end := p + uintptr(newSize)
	if end > base+unsafe.Sizeof(adapterArena) {
		return noMemory
	}
	adapterNext = end - base
	copyBytes(p, uintptr(oldPtr), uintptr(min(oldSize, newSize)))
	return uint32(p)
}
