//! Named steps of baton's protocols, where a test can hold a thread to inject a fault at that
//! step and check every interleaving: a partition between its restore and its first batch, a
//! move between its drain and its take-over. And named faults a test injects (a consumer that
//! stops delivering).
//!
//! A step nobody holds costs one relaxed atomic load. A hold is set with [`Steps::hold`]; the
//! first thread that passes the step afterwards stops there until the hold is released (or
//! dropped), and [`Hold::wait_reached`] tells the test that it did.
//!
//! A test that runs `baton` as a process (a fault harness killing it at a chosen step) sets
//! holds and faults from the environment instead: [`STEPS_ENV`] lists them, and
//! [`STEPS_LOG_ENV`] names a file where the host appends a line for each hold reached. Nothing
//! else reads these variables, and neither is part of the HTTP API.

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

/// A partition session's step: its committer is about to send a batch's changelog and
/// output records (the writes of one commit). A host stopped here and cut off from the cluster
/// comes back as a zombie owner with a commit to make.
pub const COMMIT_SEND: &str = "commit.send";

/// A checkpoint's step: its files are in the checkpoint store and its manifest is about to be
/// written. The key is `<partition>/<seq>` (`wc-0/3`: checkpoint 3 of `wc-0`).
pub const CHECKPOINT_UPLOAD: &str = "checkpoint.upload";

/// A split's step: it is recorded as begun and its owner flushed the partition's memtables;
/// the partition is about to stop at a batch boundary. The key is the partition split.
pub const SPLIT_QUIESCE: &str = "split.quiesce";

/// A split's step: the partition committed and stopped, and its halves' databases are made
/// (hard links, each with the other half's slots deleted); the split is about to be recorded
/// as done. The key is the partition split.
pub const SPLIT_RECORD: &str = "split.record";

/// A merge's step: it is recorded as begun and the merged partition is made ready while both
/// sides run; they are about to stop. The key is the left (lower) side.
pub const MERGE_QUIESCE: &str = "merge.quiesce";

/// A merge's step: both sides committed and stopped and the merged partition caught up; the
/// merge is about to be recorded as done. The key is the left (lower) side.
pub const MERGE_RECORD: &str = "merge.record";

/// A fault, not a hold: a partition's input consumer stops fetching (its topic partitions are
/// paused), with no error, as librdkafka's consumers have been seen to after a broker restart.
pub const INPUT_STALL: &str = "input.stall";

/// A fault: a move's owner releases its partition naming changelog ends one record past what
/// its state holds, as if it had written a record the target cannot read (the target's replica
/// must end at exactly the released ends, and the target gives up when it does not).
pub const RELEASE_CHANGELOG_AHEAD: &str = "release.changelog-ahead";

/// A fault: a move's owner releases its partition naming input offsets one record short of
/// what it committed (the target must find the group's offsets equal to the released ones).
pub const RELEASE_OFFSETS_BEHIND: &str = "release.offsets-behind";

/// A fault: this host's appends to the control log fail (the key is the control topic).
pub const CONTROL_APPEND_FAILS: &str = "control.append-fails";

/// Every step a thread can be held at.
pub const STEPS: &[&str] = &[
    SESSION_RESTORE,
    SESSION_RESTORED,
    STOPPING,
    MOVE_WARMING,
    MOVE_TAKE_OVER,
    COMMIT_SEND,
    CHECKPOINT_UPLOAD,
    SPLIT_QUIESCE,
    SPLIT_RECORD,
    MERGE_QUIESCE,
    MERGE_RECORD,
];

/// Every fault that can be injected.
pub const FAULTS: &[&str] = &[
    INPUT_STALL,
    RELEASE_CHANGELOG_AHEAD,
    RELEASE_OFFSETS_BEHIND,
    CONTROL_APPEND_FAILS,
];

/// Holds and faults a host sets at its start, for tests that run it as a process: entries
/// separated by `;`, each `STEP[@KEY]=DURATION[*TIMES]` (the next `TIMES` threads, 1 by
/// default, that pass the step stop there for `DURATION`, as `250ms` or `2s`) or
/// `FAULT[@KEY]` (injected for the host's life). Example:
/// `BATON_TEST_STEPS="move.take-over@wc-0=3s;release.offsets-behind@wc-1"`.
pub const STEPS_ENV: &str = "BATON_TEST_STEPS";

/// A file where a host appends `STEP KEY` for each thread stopped by a hold of [`STEPS_ENV`],
/// as it stops.
pub const STEPS_LOG_ENV: &str = "BATON_TEST_STEPS_LOG";

/// A topic of one partition where every partition session of a host on Kafka writes a record
/// with each commit, in the commit's transaction: `{host, partition, epoch, session, seq,
/// offsets, at}`, keyed by the partition. A fault harness reads it `read_committed` to check that
/// no two hosts committed for one partition at one epoch. The topic must exist.
pub const COMMITS_ENV: &str = "BATON_TEST_COMMITS";

/// The holds and faults of one host.
#[derive(Default)]
pub struct Steps {
    /// Whether any hold is set: the fast path of [`Steps::pass`].
    any: AtomicBool,
    holds: Mutex<HashMap<String, Arc<Gate>>>,
    /// Whether any fault is injected: the fast path of [`Steps::injected`].
    any_fault: AtomicBool,
    faults: Mutex<HashMap<String, usize>>,
    /// Timed holds of [`STEPS_ENV`]: how long each stops a thread, and for how many more.
    timed: Mutex<HashMap<String, (Duration, usize)>>,
    /// Where reached timed holds are written ([`STEPS_LOG_ENV`]).
    log: Option<std::path::PathBuf>,
    /// The topic of [`COMMITS_ENV`].
    commits: Option<String>,
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
    /// The holds and faults of [`STEPS_ENV`] (none when it is not set), reported to the file
    /// of [`STEPS_LOG_ENV`]; an error names an entry that is not understood.
    pub fn from_env() -> Result<Self, String> {
        let mut steps = Steps::default();
        if let Ok(spec) = std::env::var(STEPS_ENV) {
            steps.set(&spec)?;
        }
        steps.log = std::env::var_os(STEPS_LOG_ENV).map(Into::into);
        steps.commits = std::env::var(COMMITS_ENV).ok().filter(|t| !t.is_empty());
        Ok(steps)
    }

    /// The topic each commit is recorded in ([`COMMITS_ENV`]), if one is set.
    pub fn commits_topic(&self) -> Option<&str> {
        self.commits.as_deref()
    }

    /// Sets the holds and faults of `spec`, in the syntax of [`STEPS_ENV`].
    fn set(&mut self, spec: &str) -> Result<(), String> {
        for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, hold) = match entry.split_once('=') {
                Some((n, h)) => (n.trim(), Some(h.trim())),
                None => (entry, None),
            };
            let (what, key) = match name.split_once('@') {
                Some((w, k)) => (w, Some(k)),
                None => (name, None),
            };
            let known = if hold.is_some() { STEPS } else { FAULTS };
            if !known.contains(&what) {
                return Err(format!(
                    "{STEPS_ENV}: `{what}` in `{entry}` is not a {} (known: {})",
                    if hold.is_some() { "step" } else { "fault" },
                    known.join(", ")
                ));
            }
            let full = hold_name(what, key);
            match hold {
                Some(h) => {
                    let (d, times) = match h.split_once('*') {
                        Some((d, t)) => (
                            d,
                            t.parse::<usize>().map_err(|_| {
                                format!("{STEPS_ENV}: `{t}` in `{entry}` is not a count")
                            })?,
                        ),
                        None => (h, 1),
                    };
                    let d = crate::config::parse_duration(d)
                        .map_err(|e| format!("{STEPS_ENV}: in `{entry}`: {e}"))?;
                    self.timed.get_mut().insert(full, (d, times));
                    *self.any.get_mut() = true;
                }
                None => {
                    *self.faults.get_mut().entry(full).or_default() += 1;
                    *self.any_fault.get_mut() = true;
                }
            }
        }
        Ok(())
    }

    /// Stops the thread for a timed hold of `step` of `key`, if one is left.
    fn pass_timed(&self, step: &str, key: &str) {
        let stop = {
            let mut timed = self.timed.lock();
            let name = [hold_name(step, Some(key)), hold_name(step, None)]
                .into_iter()
                .find(|n| timed.get(n).is_some_and(|(_, left)| *left > 0));
            name.and_then(|n| timed.get_mut(&n)).map(|(d, left)| {
                *left -= 1;
                *d
            })
        };
        let Some(d) = stop else { return };
        tracing::info!(
            step,
            key,
            ms = d.as_millis() as u64,
            "held at a step for a time"
        );
        if let Some(path) = &self.log {
            use std::io::Write;
            let written = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| writeln!(f, "{step} {key}"));
            if let Err(e) = written {
                tracing::warn!("writing {}: {e}", path.display());
            }
        }
        std::thread::sleep(d);
    }

    /// Passes step `step` of `key` (a partition id, a move's partition): stops here while a
    /// hold of `step` for `key` (or for every key) is set and not released.
    pub fn pass(&self, step: &str, key: &str) {
        if !self.any.load(Ordering::Relaxed) {
            return;
        }
        self.pass_timed(step, key);
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
        let timed = !self.steps.timed.lock().is_empty();
        self.steps
            .any
            .store(!holds.is_empty() || timed, Ordering::Relaxed);
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
    fn holds_and_faults_from_the_environment_syntax_stop_for_a_time_and_inject() {
        let mut steps = Steps::default();
        steps
            .set("move.take-over@p-0=300ms*2; release.offsets-behind@p-1")
            .unwrap();
        let steps = Arc::new(steps);
        assert!(steps.injected(RELEASE_OFFSETS_BEHIND, "p-1"));
        assert!(!steps.injected(RELEASE_OFFSETS_BEHIND, "p-0"));
        let t0 = Instant::now();
        steps.pass(MOVE_TAKE_OVER, "p-1");
        let other = t0.elapsed();
        steps.pass(MOVE_TAKE_OVER, "p-0");
        steps.pass(MOVE_TAKE_OVER, "p-0");
        let two = t0.elapsed() - other;
        let t1 = Instant::now();
        steps.pass(MOVE_TAKE_OVER, "p-0");
        let third = t1.elapsed();
        assert!(two >= Duration::from_millis(600), "two holds took {two:?}");
        assert!(
            other < Duration::from_millis(300) && third < Duration::from_millis(300),
            "another key took {other:?}, a third pass {third:?}"
        );
        for bad in [
            "move.takeover=1s",
            "release.offsets-behind=1s",
            "move.take-over",
            "move.take-over=soon",
            "move.take-over=1s*x",
        ] {
            let err = Steps::default().set(bad).unwrap_err();
            assert!(err.contains(STEPS_ENV) && err.contains(bad), "{bad}: {err}");
        }
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
