// Package sat is saturating arithmetic on int64 for the SDK's times: a time-to-live or a
// window's end past the range of int64 stops at its bound instead of wrapping, as in the Rust
// SDK.
package sat

import "math"

// Add is a + b, held to [math.MinInt64, math.MaxInt64].
func Add(a, b int64) int64 {
	s := a + b
	if a > 0 && b > 0 && s < 0 {
		return math.MaxInt64
	}
	if a < 0 && b < 0 && s >= 0 {
		return math.MinInt64
	}
	return s
}
