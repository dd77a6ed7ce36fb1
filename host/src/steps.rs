//! Named steps of baton's protocols, where a test can hold a thread to inject a fault at that
//! step and check every interleaving: a partition between its restore and its first batch, a
//! move between its drain and its take-over. And named faults a test injects (a consumer that
//! stops delivering).
//!
//! A step nobody holds costs one relaxed atomic load. A hold is set with [`Steps::hold`]; the
//! first thread that passes the step afterwards stops there until the hold is released (or
//! dropped), and [`Hold::wait_reached`] tells the test that it did.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// A partition session's step: its clients are open and its restore from the changelogs is
/// about to start (phase `starting`, state as the last session left it on disk).
pub const SESSION_RESTORE: &str = "session.restore";
/// A partition session's step: its restore is done and it is about to read its input
/// positions (phase `restoring`).
pub const SESSION_RESTORED: &str = "session.restored";

/// A partition loop's step: it committed what was pending and answered a stop or a drain,
/// and is about to close its clients and end (phase `stopped`).
pub const STOPPING: &str = "loop.stopping";

/// A move target's step: it is about to apply the next changelog records into its warming
/// replica (once per read while warming).
pub const MOVE_WARMING: &str = "move.warming";

/// A move target's step: the owner drained and the final changelog records are applied; the
/// target is about to record its take-over.
pub const MOVE_TAKE_OVER: &str = "move.take-over";

/// A fault, not a hold: a partition's input consumer stops fetching (its topic partitions are
/// paused), with no error, as librdkafka's consumers have been seen to after a broker restart.
pub const INPUT_STALL: &str = "input.stall";

/// The holds and faults of one host.
#[derive(Default)]
pub struct Steps {
    /// Whether any hold is set: the fast path of [`Steps::pass`].
    any: AtomicBool,
    holds: Mutex<HashMap<String, Arc<Gate>>>,
    /// Whether any fault is injected: the fast path of [`Steps::injected`].
    any_fault: AtomicBool,
    faults: Mutex<HashMap<String, usize>>,
}

#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    /// Threads stopped at the step now.
    waiting: usize,
    /// Threads that reached the step since the hold was set.
    reached: usize,
    released: bool,
}

impl Steps {
    /// Passes step `step` of `key` (a partition id, a move's partition): stops here while a
    /// hold of `step` for `key` (or for every key) is set and not released.
    pub fn pass(&self, step: &str, key: &str) {
        if !self.any.load(Ordering::Relaxed) {
            return;
        }
        let gate = {
            let holds = self.holds.lock();
            holds
                .get(&hold_name(step, Some(key)))
                .or_else(|| holds.get(&hold_name(step, None)))
                .cloned()
        };
        let Some(gate) = gate else { return };
        let mut st = gate.state.lock();
        st.reached += 1;
        st.waiting += 1;
        gate.changed.notify_all();
        tracing::info!(step, key, "held at a step");
        while !st.released {
            gate.changed.wait(&mut st);
        }
        st.waiting -= 1;
        gate.changed.notify_all();
    }

    /// Holds the next threads that pass `step` of `key` (every key with `None`) until the
    /// returned hold is released or dropped. A second hold of the same step and key replaces
    /// the first, which is released.
    pub fn hold(self: &Arc<Self>, step: &str, key: Option<&str>) -> Hold {
        let name = hold_name(step, key);
        let gate = Arc::new(Gate::default());
        let old = self.holds.lock().insert(name.clone(), gate.clone());
        if let Some(old) = old {
            release(&old);
        }
        self.any.store(true, Ordering::Relaxed);
        Hold {
            steps: self.clone(),
            name,
            gate,
        }
    }
}

impl Steps {
    /// Injects `fault` for `key` (every key with `None`) until the returned guard is dropped.
    pub fn inject(self: &Arc<Self>, fault: &str, key: Option<&str>) -> Injected {
        let name = hold_name(fault, key);
        *self.faults.lock().entry(name.clone()).or_default() += 1;
        self.any_fault.store(true, Ordering::Relaxed);
        Injected {
            steps: self.clone(),
            name,
        }
    }

    /// Whether `fault` is injected for `key`.
    pub fn injected(&self, fault: &str, key: &str) -> bool {
        if !self.any_fault.load(Ordering::Relaxed) {
            return false;
        }
        let faults = self.faults.lock();
        faults.contains_key(&hold_name(fault, Some(key)))
            || faults.contains_key(&hold_name(fault, None))
    }
}

/// A fault injected, taken back when dropped.
pub struct Injected {
    steps: Arc<Steps>,
    name: String,
}

impl Drop for Injected {
    fn drop(&mut self) {
        let mut faults = self.steps.faults.lock();
        if let Some(n) = faults.get_mut(&self.name) {
            *n -= 1;
            if *n == 0 {
                faults.remove(&self.name);
            }
        }
        self.steps
            .any_fault
            .store(!faults.is_empty(), Ordering::Relaxed);
    }
}

fn hold_name(step: &str, key: Option<&str>) -> String {
    match key {
        Some(k) => format!("{step}@{k}"),
        None => step.to_string(),
    }
}

fn release(gate: &Gate) {
    gate.state.lock().released = true;
    gate.changed.notify_all();
}

/// A hold on a step, released when dropped.
pub struct Hold {
    steps: Arc<Steps>,
    name: String,
    gate: Arc<Gate>,
}

impl Hold {
    /// Waits until a thread stopped at the step, or `timeout` passed; true when one did.
    pub fn wait_reached(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.gate.state.lock();
        while st.waiting == 0 {
            if self.gate.changed.wait_until(&mut st, deadline).timed_out() {
                return st.waiting > 0;
            }
        }
        true
    }

    /// How many threads reached the step since the hold was set.
    pub fn reached(&self) -> usize {
        self.gate.state.lock().reached
    }

    /// Lets the threads at the step go on, and every later one pass.
    pub fn release(self) {}
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut holds = self.steps.holds.lock();
        if holds
            .get(&self.name)
            .is_some_and(|g| Arc::ptr_eq(g, &self.gate))
        {
            holds.remove(&self.name);
        }
        self.steps.any.store(!holds.is_empty(), Ordering::Relaxed);
        drop(holds);
        release(&self.gate);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_step_stops_its_thread_until_released_and_other_keys_pass() {
        let steps = Arc::new(Steps::default());
        // Nothing held: passing is free.
        steps.pass(SESSION_RESTORE, "p-0");
        let hold = steps.hold(SESSION_RESTORE, Some("p-0"));
        // Another key passes.
        steps.pass(SESSION_RESTORE, "p-1");
        assert_eq!(hold.reached(), 0);
        let passed = Arc::new(AtomicBool::new(false));
        let t = {
            let (steps, passed) = (steps.clone(), passed.clone());
            std::thread::spawn(move || {
                steps.pass(SESSION_RESTORE, "p-0");
                passed.store(true, Ordering::SeqCst);
            })
        };
        assert!(hold.wait_reached(Duration::from_secs(10)));
        assert!(
            !passed.load(Ordering::SeqCst),
            "the thread went on while held"
        );
        assert_eq!(hold.reached(), 1);
        hold.release();
        t.join().unwrap();
        assert!(passed.load(Ordering::SeqCst));
        // Released: the step is free again.
        steps.pass(SESSION_RESTORE, "p-0");
        assert!(!steps.any.load(Ordering::Relaxed));
    }

    #[test]
    fn a_hold_of_every_key_stops_any_and_times_out_when_none_comes() {
        let steps = Arc::new(Steps::default());
        let hold = steps.hold(SESSION_RESTORED, None);
        assert!(!hold.wait_reached(Duration::from_millis(50)));
        let t = {
            let steps = steps.clone();
            std::thread::spawn(move || steps.pass(SESSION_RESTORED, "any"))
        };
        assert!(hold.wait_reached(Duration::from_secs(10)));
        drop(hold);
        t.join().unwrap();
    }
}
