#include "textflag.h"

// func memoryGrow(pages int32) int32
TEXT ·memoryGrow(SB), NOSPLIT, $0
	Get SP
	I32Load pages+0(FP)
	GrowMemory
	I32Store ret+8(FP)
	RET

// func memorySize() int32
TEXT ·memorySize(SB), NOSPLIT, $0
	Get SP
	CurrentMemory
	I32Store ret+0(FP)
	RET
