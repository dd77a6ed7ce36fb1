//! Timers a partition fires at batch boundaries, as event time or wall-clock time passes.

use super::*;

impl PartitionTask {
    /// Fires the timers of `slot` that fell due and removes its expired entries, as calls of
    /// their own that commit with the pending batches. Returns the instance to use next and
    /// how many timers and entries there were.
    pub(super) fn fire_timers(
        &self,
        mut inst: Instance,
        target: &Target,
        slot: u32,
        dlq: &str,
    ) -> Result<(Instance, usize), SessionError> {
        let cursor = Cursor {
            topic: self.pipeline.spec.inputs[0].clone(),
            slot,
            offset: 0,
            timestamp: 0,
        };
        inst.ctx().begin_call(cursor.clone());
        let now = crate::runtime::host::now_ms();
        let swept = inst.ctx().sweep_expired(slot, now, MAX_SWEEP);
        let mut n = host_op(&mut inst, swept)?;
        inst.ctx().keep_call();
        if !inst.takes_timers() {
            return Ok((inst, n));
        }
        let ticks = self.call_ticks(&target.settings);
        for _ in 0..MAX_TIMER_CALLS {
            inst.ctx().begin_call(cursor.clone());
            let due = inst.ctx().due_timers(slot, now, MAX_TIMERS_PER_CALL);
            let due = host_op(&mut inst, due)?;
            let Some(first) = due.first() else {
                inst.ctx().keep_call();
                break;
            };
            inst.ctx().cursor.timestamp = first.at;
            n += due.len();
            inst = self.fire(inst, target, &due, ticks, dlq)?;
        }
        Ok((inst, n))
    }

    /// Fires `due` in one call; when it fails, each timer alone, and one that still fails is
    /// dropped with a dead letter. The call was begun by the caller.
    pub(super) fn fire(
        &self,
        mut inst: Instance,
        target: &Target,
        due: &[crate::runtime::time::DueTimer],
        ticks: u64,
        dlq: &str,
    ) -> Result<Instance, SessionError> {
        let cursor = inst.ctx().cursor.clone();
        let removed = inst.ctx().remove_timers(due);
        host_op(&mut inst, removed)?;
        let result = inst.on_timers(due, ticks);
        let (mut inst, err) = self.end_call(inst, target, result)?;
        let Some(err) = err else {
            return Ok(inst);
        };
        if due.len() > 1 {
            for t in due {
                inst.ctx().begin_call(Cursor {
                    timestamp: t.at,
                    ..cursor.clone()
                });
                inst = self.fire(inst, target, std::slice::from_ref(t), ticks, dlq)?;
            }
            return Ok(inst);
        }
        // One timer that fails alone: it is removed, and its dead letter says why.
        let t = &due[0];
        inst.ctx().begin_call(cursor.clone());
        let removed = inst.ctx().remove_timers(due);
        host_op(&mut inst, removed)?;
        inst.ctx().keep_call();
        let clock = match t.clock {
            crate::runtime::time::Clock::Event => "event-time",
            crate::runtime::time::Clock::Processing => "processing-time",
        };
        let msg = format!("timer ({clock} at {}) failed: {err}", t.at);
        self.events.push(
            EventKind::Error,
            None,
            format!("{msg}; sent to {dlq}"),
            &self.id,
            Some(&cursor),
        );
        tracing::warn!(slot = cursor.slot, "{msg}; sent to {dlq}");
        let partitions = self
            .outputs
            .outputs
            .get(dlq)
            .map_or(self.pipeline.spec.slots, |o| o.partitions)
            .max(1);
        self.status.dead_letters.fetch_add(1, Ordering::Relaxed);
        *self.status.last_error.lock() = Some(format!("slot {}: {msg}", cursor.slot));
        inst.ctx().push_dead_letter(Output {
            topic: dlq.to_string(),
            partition: cursor.slot % partitions,
            record: Record {
                key: Some(t.key.clone()),
                value: t.payload.clone(),
                headers: vec![
                    ("baton.error".into(), msg.into_bytes()),
                    (
                        "baton.timer".into(),
                        format!("{clock}:{}", t.at).into_bytes(),
                    ),
                    ("baton.slot".into(), cursor.slot.to_string().into_bytes()),
                ],
                timestamp: t.at,
            },
        });
        Ok(inst)
    }
}
