#!/usr/bin/env bash
# Regenerates gen/ (the C bindings of the world `processor` of ../../wit) with wit-bindgen's C
# generator. Run it after the contract's WIT changes; the generated files are committed, so
# building a processor needs only clang.
#
#   cargo install wit-bindgen-cli --version 0.63.0 --root ~/.cache/baton/tools
#   guest-sdk/c/regen.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=0.63.0
bin=${WIT_BINDGEN:-$HOME/.cache/baton/tools/bin/wit-bindgen}
if ! [ -x "$bin" ]; then bin=$(command -v wit-bindgen || true); fi
if [ -z "$bin" ] || [ "$("$bin" --version)" != "wit-bindgen-cli $version" ]; then
  echo "regen.sh: needs wit-bindgen $version:" >&2
  echo "  cargo install wit-bindgen-cli --version $version --root ~/.cache/baton/tools" >&2
  exit 1
fi
# --no-object-file: `baton componentize` embeds the world's type information itself, so the
# generated processor_component_type.o is not needed (baton.c defines the symbol that
# processor.c asks for to force-link it).
rm -rf "$here/gen"
"$bin" c "$here/../../wit" --world processor --no-object-file --out-dir "$here/gen"
