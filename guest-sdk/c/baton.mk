# baton.mk: builds a baton processor written in C into a WebAssembly component.
#
# A processor's Makefile sets SDK to this directory and includes this file:
#
#     SDK = ../../guest-sdk/c
#     include $(SDK)/baton.mk
#
# `make` compiles every .c file of the directory with the SDK for wasm32-wasi (clang, lld and
# wasi-libc), links the core module target/$(NAME).core.wasm, and makes it into the component
# target/$(NAME).wasm with `baton componentize`. `make clean` removes target/.
#
# Variables (set them on the command line or before the include):
#   NAME          the processor's name (default: the directory's)
#   BATON         the baton binary (default: `baton` on PATH)
#   CC            a clang that targets wasm32 (default: clang)
#   WASI_SYSROOT  wasi-libc's sysroot, for a toolchain without a default one (e.g. wasi-sdk)
#   SRCS          the processor's sources (default: *.c)
#   CFLAGS        optimization and warnings (default: -O2 -Wall -Wextra)
#   LDFLAGS       extra link flags

SDK ?= $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
NAME ?= $(notdir $(CURDIR))
BATON ?= baton
ifeq ($(origin CC),default)
CC = clang
endif
CFLAGS ?= -O2 -Wall -Wextra
SRCS ?= $(wildcard *.c)
HDRS ?= $(wildcard *.h)

BATON_TARGET = --target=wasm32-wasi $(if $(WASI_SYSROOT),--sysroot=$(WASI_SYSROOT))
# A reactor: no `main`; `_initialize` runs C constructors when the component is instantiated.
# The name section stays, so that traps come back with function names.
BATON_LDFLAGS = -mexec-model=reactor -Wl,--strip-debug
# printf with long double support: without it, wasi-libc's printf family refers to stderr (to
# say long double is unsupported), which brings WASI imports, and their adapter, into every
# processor that formats a string.
BATON_LIBS = -lc-printscan-long-double
BATON_OBJ = target/obj
BATON_SDK_HDRS = $(SDK)/baton.h $(SDK)/windows.h $(SDK)/gen/processor.h
BATON_SDK_OBJS = $(BATON_OBJ)/sdk/baton.o $(BATON_OBJ)/sdk/windows.o $(BATON_OBJ)/sdk/processor.o
BATON_OBJS = $(patsubst %.c,$(BATON_OBJ)/%.o,$(SRCS))

all: target/$(NAME).wasm

target/$(NAME).wasm: target/$(NAME).core.wasm
	$(BATON) componentize $< -o $@

target/$(NAME).core.wasm: $(BATON_OBJS) $(BATON_SDK_OBJS)
	$(CC) $(BATON_TARGET) $(CFLAGS) $(BATON_LDFLAGS) $(LDFLAGS) $^ $(BATON_LIBS) -o $@

$(BATON_OBJ)/%.o: %.c $(HDRS) $(BATON_SDK_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BATON_TARGET) $(CFLAGS) -I$(SDK) -c $< -o $@

$(BATON_OBJ)/sdk/%.o: $(SDK)/%.c $(BATON_SDK_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BATON_TARGET) $(CFLAGS) -I$(SDK) -c $< -o $@

# The generated bindings, without the warnings of generated code.
$(BATON_OBJ)/sdk/processor.o: $(SDK)/gen/processor.c $(SDK)/gen/processor.h
	@mkdir -p $(@D)
	$(CC) $(BATON_TARGET) $(CFLAGS) -w -c $< -o $@

clean:
	rm -rf target

.PHONY: all clean
.DELETE_ON_ERROR:
