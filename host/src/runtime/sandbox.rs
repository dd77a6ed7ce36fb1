//! The WASI sandbox a guest runs in: nothing granted (no files, environment, arguments or
//! sockets), a frozen clock and a fixed random sequence unless the pipeline grants them, and
//! stderr captured.

use wasmtime_wasi::WasiCtx;

use super::stderr::StderrTail;

/// Bytes of guest stderr kept per instance, shown with a trap.
const STDERR_TAIL: usize = 1024;

/// A WASI context that grants nothing (no preopened directories, environment, arguments or
/// sockets; without `grants` a clock frozen at the Unix epoch and a fixed pseudo-random
/// sequence) and captures stderr.
pub(crate) fn new_wasi(grants: &WasiGrants) -> (WasiCtx, StderrTail) {
    let stderr = StderrTail::new(STDERR_TAIL);
    let mut b = WasiCtx::builder();
    b.stderr(stderr.clone());
    if !grants.clocks {
        b.wall_clock(FrozenClock).monotonic_clock(FrozenClock);
    }
    if !grants.random {
        b.secure_random(FixedSequence(0x9E37_79B9_7F4A_7C15))
            .insecure_random(FixedSequence(0x2545_F491_4F6C_DD1D))
            .insecure_random_seed(0);
    }
    (b.build(), stderr)
}

/// What a pipeline's guests may see of the host beyond their inputs (`wasi = { ... }` in the
/// spec). Without a grant a guest still runs (Rust's std asks for randomness to seed hash maps),
/// but deterministically: processing the same records gives the same results on any host.
#[derive(
    Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields, default)]
pub struct WasiGrants {
    /// Real wall and monotonic clocks (otherwise frozen at the Unix epoch).
    pub clocks: bool,
    /// Real randomness (otherwise a fixed sequence).
    pub random: bool,
}

/// A clock that never moves.
struct FrozenClock;

impl wasmtime_wasi::HostWallClock for FrozenClock {
    fn resolution(&self) -> std::time::Duration {
        std::time::Duration::from_secs(1)
    }
    fn now(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

impl wasmtime_wasi::HostMonotonicClock for FrozenClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    /// One nanosecond, not zero: Go's runtime refuses to start on a monotonic clock that reads
    /// 0 ("nanotime returning zero").
    fn now(&self) -> u64 {
        1
    }
}

/// The same xorshift sequence every time: "randomness" that is not.
struct FixedSequence(u64);

impl rand_core::TryRng for FixedSequence {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok(self.try_next_u64()? as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Ok(self.0)
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        for chunk in dst.chunks_mut(8) {
            let v = self.try_next_u64()?.to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        Ok(())
    }
}
