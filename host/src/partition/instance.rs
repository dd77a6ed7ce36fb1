//! A partition's guest instance: made for a target (module and settings), replaced on a hot
//! swap at a batch boundary, and refused (rolled back) when the new version fails.

use super::*;

/// Why no instance could be made.
pub(super) enum InstanceError {
    /// The module's fault (it does not instantiate, or its `init` fails): another try fails too.
    Module(String),
    /// The host's fault (a state read failed during `init`): worth another session.
    Host(String),
}

impl InstanceError {
    fn into_session(self) -> SessionError {
        match self {
            InstanceError::Module(m) => SessionError::Fatal(m),
            InstanceError::Host(m) => SessionError::Retry(anyhow::anyhow!(m)),
        }
    }
}

/// Ends the session when the last guest call failed through a fault of the host (state I/O):
/// the batch is processed again by the next session, and no record is dead-lettered for it.
pub(super) fn host_fault(inst: &mut Instance) -> Result<(), SessionError> {
    match inst.ctx().host_fault.take() {
        None => Ok(()),
        Some(f) => Err(SessionError::Retry(anyhow::anyhow!(
            "host failure during a guest call: {f}; the batch is processed again"
        ))),
    }
}

/// The result of a host operation on state outside a guest call (timers, expiries): a failure
/// ends the session, as a host fault during a call does.
pub(super) fn host_op<T>(inst: &mut Instance, r: wasmtime::Result<T>) -> Result<T, SessionError> {
    host_fault(inst)?;
    r.map_err(|e| SessionError::Retry(e.into()))
}

impl PartitionTask {
    pub(super) fn new_instance(&self, target: &Target) -> Result<Instance, SessionError> {
        self.try_instance(target)
            .map_err(InstanceError::into_session)
    }

    /// An initialised instance of a target (its module with its settings), or why there is none.
    pub(super) fn try_instance(&self, target: &Target) -> Result<Instance, InstanceError> {
        self.instance_with(target, self.fresh_ctx(&target.settings))
    }

    pub(super) fn instance_with(
        &self,
        target: &Target,
        ctx: HostCtx,
    ) -> Result<Instance, InstanceError> {
        let name = &self.pipeline.spec.module;
        let mut inst = self
            .runtime
            .instantiate(&target.module, ctx)
            .map_err(|e| InstanceError::Module(format!("instantiating module {name}: {e:#}")))?;
        if let Err(e) = inst.init(&target.settings.config) {
            // A state read that failed during `init` is the host's fault, not the module's.
            return Err(match inst.ctx().host_fault.take() {
                Some(f) => InstanceError::Host(format!("host failure during init: {f}")),
                None => InstanceError::Module(format!("init of module {name} failed: {e}")),
            });
        }
        Ok(inst)
    }

    /// Replaces a trapped instance, keeping the batch's pending writes and outputs.
    pub(super) fn replace_instance(
        &self,
        target: &Target,
        inst: Instance,
    ) -> Result<Instance, SessionError> {
        let mut ctx = inst.into_ctx();
        ctx.reset_instance_resources();
        self.instance_with(target, ctx)
            .map_err(InstanceError::into_session)
    }

    pub(super) fn fresh_ctx(&self, settings: &Settings) -> HostCtx {
        let mut limits = (*self.outputs).clone();
        limits.max_key_bytes = settings.limits.max_key_bytes as usize;
        limits.max_value_bytes = settings.limits.max_value_bytes as usize;
        limits.max_timers = settings.limits.max_timers;
        HostCtx::new(
            self.pipeline.spec.name.as_str().into(),
            self.db.clone(),
            Arc::new(limits),
            settings.limits.memory_bytes as usize,
            settings.wasi.clone(),
        )
    }

    /// Epoch ticks of one guest call's CPU budget. Each call gets the whole of `limits.cpu_ms`:
    /// a long batch never shortens the calls that follow it. The deadline fires on a tick, so
    /// one tick more makes the budget at least `cpu_ms`, never less.
    pub(super) fn call_ticks(&self, settings: &Settings) -> u64 {
        (settings.limits.cpu_ms / crate::runtime::EPOCH_TICK.as_millis() as u64).max(1) + 1
    }

    /// At a batch boundary: switches to the target's new generation, if any. On failure the
    /// partition keeps (or goes back to) the version it ran and reports the rollback.
    pub(super) fn maybe_swap(
        &self,
        mut inst: Instance,
        run: &mut Running,
    ) -> Result<Instance, SessionError> {
        let generation = self.target.generation();
        if generation == run.current.generation || generation == run.rejected {
            return Ok(inst);
        }
        let target = self.target.get();
        if target.module.sha256 == run.current.module.sha256
            && target.settings == run.current.settings
        {
            // Same code (e.g. the pipeline went back to what this partition already runs).
            *self.status.version.lock() = target.version.clone();
            self.status.swap.record(SwapReport {
                at: crate::control::now_ms(),
                generation: target.generation,
                version: target.version.clone(),
                outcome: SwapOutcome::Swapped,
                reason: None,
                pause_us: 0,
                timers_pending: 0,
            });
            run.current = target;
            run.previous = None;
            run.probation = 0;
            return Ok(inst);
        }
        let started = Instant::now();
        // A commit boundary: nothing is pending in the old instance's context.
        debug_assert!(inst.ctx().overlay.is_empty() && !inst.ctx().overlay.is_committing());
        drop(inst);
        match self.try_instance(&target) {
            Ok(mut new) => {
                let pause_us = started.elapsed().as_micros() as u64;
                let timers_pending = if new.takes_timers() {
                    0
                } else {
                    let n = new.ctx().pending_timers(self.slots.clone());
                    host_op(&mut new, n)?
                };
                tracing::info!(version = %target.version, pause_us, "module swapped");
                self.events.push(
                    EventKind::Swap,
                    None,
                    format!(
                        "now running version {} (paused {pause_us} µs)",
                        target.version
                    ),
                    &self.id,
                    None,
                );
                *self.status.version.lock() = target.version.clone();
                self.status.swap.record(SwapReport {
                    at: crate::control::now_ms(),
                    generation: target.generation,
                    version: target.version.clone(),
                    outcome: SwapOutcome::Swapped,
                    reason: None,
                    pause_us,
                    timers_pending,
                });
                run.probation = target.settings.swap.probation_batches;
                run.previous = Some(std::mem::replace(&mut run.current, target));
                Ok(new)
            }
            Err(InstanceError::Host(e)) => Err(SessionError::Retry(anyhow::anyhow!(e))),
            Err(InstanceError::Module(reason)) => {
                let back = self.new_instance(&run.current)?;
                self.reject(run, &target, reason, started);
                Ok(back)
            }
        }
    }

    pub(super) fn reject(
        &self,
        run: &mut Running,
        target: &Target,
        reason: String,
        started: Instant,
    ) {
        let pause_us = started.elapsed().as_micros() as u64;
        tracing::warn!(version = %target.version, "module version rolled back: {reason}");
        self.events.push(
            EventKind::Rollback,
            None,
            format!("version {} rolled back: {reason}", target.version),
            &self.id,
            None,
        );
        run.rejected = target.generation;
        // Kept across sessions: until the rollback is recorded the target still names this
        // generation, and a new session must not start on it.
        self.rejected.store(target.generation, Ordering::Relaxed);
        // The pipeline goes back first, so that whoever sees this report sees the rollback.
        (self.on_rollback)(target.generation, reason.clone());
        self.status.swap.record(SwapReport {
            at: crate::control::now_ms(),
            generation: target.generation,
            version: target.version.clone(),
            outcome: SwapOutcome::RolledBack,
            reason: Some(reason),
            pause_us,
            timers_pending: 0,
        });
    }
}
