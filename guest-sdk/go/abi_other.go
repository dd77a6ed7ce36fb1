//go:build !wasip1

package baton

// Outside a component (go vet, go test, an editor's build) the SDK compiles, and every host
// call fails: a processor runs only inside a component, built with GOOS=wasip1.

func outside() *Error {
	return Other("baton: the host is reached only inside a component (GOOS=wasip1 GOARCH=wasm)")
}

func hostOpen(string) (uint32, error)                        { return 0, outside() }
func hostGet(uint32, []byte) ([]byte, error)                 { return nil, outside() }
func hostGetMany(uint32, [][]byte) ([][]byte, error)         { return nil, outside() }
func hostDeleteRange(uint32, []byte, []byte) (uint64, error) { return 0, outside() }
func hostIncrement(uint32, []byte, int64) (int64, error)     { return 0, outside() }
func hostScan(uint32, []byte, []byte, uint32) ([]Entry, error) {
	return nil, outside()
}
func hostApply(uint32, []byte, []uint64, int) error            { return outside() }
func hostSendBatch([]byte, []uint64, int, []uint64, int) error { return outside() }
func hostSchedule(TimeKind, int64, []byte, []byte) error       { return outside() }
func hostCancel(TimeKind, int64, []byte) (bool, error)         { return false, outside() }
func hostEventTime() int64                                     { return -1 }
func hostProcessingTime() int64                                { return 0 }
func hostLog(Level, string)                                    {}
