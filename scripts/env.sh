# Shared settings of baton's scripts; sourced, not run.
# Builds and downloads live outside the checkout so that every clone reuses them.
BATON_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export BATON_CACHE=${BATON_CACHE:-$HOME/.cache/baton}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$BATON_CACHE/target}
# Plugins build in a target dir of their own: the tests' build script builds them while the
# outer cargo holds the lock on CARGO_TARGET_DIR.
PLUGIN_TARGET_DIR=${PLUGIN_TARGET_DIR:-$CARGO_TARGET_DIR/plugins}
KAFKA_VERSION=${KAFKA_VERSION:-4.1.1}
KAFKA_HOME=${KAFKA_HOME:-$BATON_CACHE/kafka-$KAFKA_VERSION}
KAFKA_RUN=${KAFKA_RUN:-$BATON_CACHE/kafka-run}
if [ -d "$HOME/.cargo/bin" ]; then PATH="$HOME/.cargo/bin:$PATH"; fi
# Go's own installs put it here, outside the default PATH of non-login shells.
if [ -d /usr/local/go/bin ] && ! command -v go >/dev/null 2>&1; then PATH="$PATH:/usr/local/go/bin"; fi
say() { printf '[baton] %s\n' "$*" >&2; }
