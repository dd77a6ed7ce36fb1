//! Following the control log, and the one way a control event takes effect on a host.
//!
//! Every event, this host's own and every other host's, takes effect through
//! [`Baton::apply_event`], in log order: on Kafka when the follower reads it (an appender waits
//! for that, [`Baton::commit_event`]); on the embedded log, which this host alone writes, right
//! after its append, under the control lock, so the append's order is the log's. Its effects
//! are the same everywhere: modules load, pipelines start and stop, swaps and settings reach
//! the partitions, dead letters are replayed, and assignments and moves start and stop
//! partitions here. An append changes nothing by itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::app::Baton;
use crate::control::{ControlEvent, parse_event};
use crate::error::{Error, Result};
use crate::partition::Settings;

/// The header naming the host that appended a control event.
pub const ORIGIN: &str = "baton.origin";

/// How long an appender waits for its event to be read back before it answers `Unavailable`.
pub(crate) const READ_BACK_WAIT: Duration = Duration::from_secs(30);

/// The kind of an event, for logs.
fn event_kind(e: &ControlEvent) -> &'static str {
    match e {
        ControlEvent::Module(_) => "module",
        ControlEvent::ModuleDeleted(_) => "module-deleted",
        ControlEvent::Pipeline(_) => "pipeline",
        ControlEvent::PipelineDeleted(_) => "pipeline-deleted",
        ControlEvent::PipelineUpdated(_) => "pipeline-updated",
        ControlEvent::Swap(_) => "swap",
        ControlEvent::DeadLettersReplayed(_) => "dead-letters-replayed",
        ControlEvent::Assigned(_) => "assigned",
        ControlEvent::Move(_) => "move",
        ControlEvent::Released(_) => "released",
    }
}

impl Baton {
    /// Tails the control log from `from` on a thread of its own until `stop` is set.
    /// `log_catalog` starts as the catalog the log's records before `from` make; the follower
    /// applies every record to it in log order (this host's own too), and the controller
    /// writes it as a snapshot every `control_snapshot_every` records.
    pub(crate) fn follow_control(
        self: &Arc<Self>,
        from: u64,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let me = Arc::downgrade(self);
        let topic = self.control.topic().to_string();
        let wake = self.control.waker();
        // A reader that stays assigned where the transport has one (Kafka): records arrive as
        // they land, with no idle wait.
        let mut tail = self.log.tail(&topic, 0, from).unwrap_or_else(|e| {
            tracing::warn!("a reader of the control log: {e}; reading it a batch at a time");
            None
        });
        std::thread::Builder::new()
            .name("baton-control".into())
            .spawn(move || {
                let mut offset = from;
                let mut since_snapshot = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let read = match tail.as_mut() {
                        Some(t) => t.next(256, Duration::from_millis(50)),
                        None => match me.upgrade() {
                            Some(baton) => baton.log.read_from(&topic, 0, offset, 256),
                            None => return,
                        },
                    };
                    let Some(baton) = me.upgrade() else { return };
                    let (records, next) = match read {
                        Ok(r) => r,
                        Err(e) => {
                            tracing::warn!("following the control log at {offset}: {e}");
                            drop(baton);
                            std::thread::sleep(Duration::from_millis(500));
                            continue;
                        }
                    };
                    if records.is_empty() {
                        // Past markers and aborted records, if that is all there was.
                        if next > offset {
                            offset = next;
                            baton.control.set_applied(offset);
                        }
                        drop(baton);
                        // A tail waited for records already.
                        if tail.is_none() {
                            wake.wait(Duration::from_millis(50));
                        }
                        continue;
                    }
                    for r in records {
                        offset = r.offset + 1;
                        let bytes = r.record.value.unwrap_or_default();
                        match parse_event(&bytes) {
                            Ok(e) => {
                                since_snapshot += 1;
                                baton.log_catalog.lock().apply(e.clone());
                                baton.apply_event(e, r.offset);
                            }
                            Err(e) => tracing::error!(
                                "control log record {} cannot be read, skipped: {e}",
                                r.offset
                            ),
                        }
                    }
                    offset = offset.max(next);
                    baton.control.set_applied(offset);
                    if since_snapshot >= baton.config.control_snapshot_every.max(1)
                        && baton.is_controller()
                    {
                        let shadow = baton.log_catalog.lock().clone();
                        match crate::control::log::write_snapshot(
                            &*baton.log,
                            &topic,
                            &shadow,
                            offset,
                        ) {
                            Ok(()) => since_snapshot = 0,
                            Err(e) => {
                                tracing::warn!("control-log snapshot: {e:#}");
                                since_snapshot = 0;
                            }
                        }
                    }
                }
            })
    }

    /// Appends `event` to the control log and has it take effect here: on Kafka once the
    /// follower has read it back and applied it (with every event before it), on the embedded
    /// log at once. Answers the event's offset; whether it counted at its place in the log the
    /// caller reads from the catalog. An event not read back within [`READ_BACK_WAIT`] is
    /// `Unavailable`: it is in the log and takes effect when the follower gets to it.
    pub(crate) fn commit_event(&self, event: ControlEvent) -> Result<u64> {
        let at = self.control.append(&event)?;
        match self.log.as_embedded() {
            Some(_) => {
                self.log_catalog.lock().apply(event.clone());
                self.apply_event(event, at);
                self.control.set_applied(at + 1);
            }
            None => {
                self.control.wake_follower();
                if !self.control.read_back(at, READ_BACK_WAIT) {
                    return Err(Error::Unavailable(format!(
                        "the control-log event at offset {at} is recorded but not read back \
                         after {} s; it takes effect when this host's follower reaches it",
                        READ_BACK_WAIT.as_secs()
                    )));
                }
            }
        }
        Ok(at)
    }

    /// Applies the control-log event at offset `at`, with its effects here: the one place an
    /// event takes effect, whichever host appended it.
    pub(crate) fn apply_event(&self, event: ControlEvent, at: u64) {
        if !self.catalog.lock().applies(&event) {
            tracing::info!(
                at,
                "control-log event {} does not count at its place in the log",
                event_kind(&event)
            );
            return;
        }
        match &event {
            ControlEvent::Module(m) => {
                if !self.modules.read().contains_key(&m.sha256) {
                    let loaded = self
                        .module_bytes(&m.sha256)
                        .and_then(|b| self.runtime.load(&b).map_err(|e| anyhow::anyhow!("{e}")));
                    match loaded {
                        Ok(module) => {
                            self.modules.write().insert(m.sha256.clone(), module);
                        }
                        Err(e) => tracing::error!(
                            "module {} {} from the control log cannot be loaded: {e:#}",
                            m.name,
                            m.version
                        ),
                    }
                }
                self.catalog.lock().apply(event);
            }
            ControlEvent::Pipeline(p) => {
                let record = Arc::new((**p).clone());
                self.catalog.lock().apply(event);
                self.start_or_record(record);
            }
            ControlEvent::PipelineDeleted(d) => {
                self.stop_pipeline(&d.pipeline);
                self.catalog.lock().apply(event);
            }
            ControlEvent::Swap(s) => {
                let module = self.modules.read().get(&s.sha256).cloned();
                let target = self.targets.read().get(&s.pipeline).cloned();
                let rollback = s.rollback_reason.is_some();
                // The catalog first: once the partitions see the new generation, the catalog
                // says why (an automatic rollback's reason).
                self.catalog.lock().apply(event.clone());
                if let (Some(module), Some(target)) = (module, target) {
                    let version = match &event {
                        ControlEvent::Swap(s) => s.version.clone(),
                        _ => unreachable!(),
                    };
                    let generation = if rollback {
                        target.set_back(version, module)
                    } else {
                        target.set(version, module)
                    };
                    target.made(at, generation);
                }
            }
            ControlEvent::PipelineUpdated(u) => {
                let pipeline = u.pipeline.clone();
                self.catalog.lock().apply(event);
                let spec = self
                    .catalog
                    .lock()
                    .pipelines
                    .get(&pipeline)
                    .map(|p| p.spec.clone());
                if let (Some(spec), Some(target)) =
                    (spec, self.targets.read().get(&pipeline).cloned())
                {
                    let generation = target.set_settings(Settings::of(&spec));
                    target.made(at, generation);
                }
            }
            ControlEvent::DeadLettersReplayed(r) => {
                let ranges = self.catalog.lock().replay_ranges(r);
                if let Some(plan) = self.replay_plans.read().get(&r.pipeline) {
                    for range in &ranges {
                        plan.add(range.slot, range.from, range.to);
                    }
                }
                self.catalog.lock().apply(event);
            }
            ControlEvent::ModuleDeleted(_) => self.catalog.lock().apply(event),
            ControlEvent::Assigned(a) => {
                let pipeline = a.pipeline.clone();
                self.catalog.lock().apply(event);
                self.follow_assignments(&pipeline);
            }
            ControlEvent::Move(m) => {
                let (partition, id) = (m.partition.clone(), m.id.clone());
                self.catalog.lock().apply(event);
                // As the log made it: a take-over before an abandonment reads as done, and a
                // move that began while another was under way never began.
                let effective = self
                    .catalog
                    .lock()
                    .moves
                    .get(&partition)
                    .and_then(|ms| ms.iter().find(|m| m.id == id))
                    .cloned();
                if let Some(m) = effective {
                    self.on_move(&m);
                }
            }
            // The target reads it from the log-ordered catalog.
            ControlEvent::Released(_) => self.catalog.lock().apply(event),
        }
    }

    /// Starts and stops this host's partitions of `pipeline` to match the catalog's
    /// assignments.
    pub(crate) fn follow_assignments(&self, pipeline: &str) {
        // A standby of a partition this host now owns stops before the partition starts.
        self.standbys.follow();
        if !self.runs.read().contains_key(pipeline) {
            return;
        }
        let mine = self.local_assignments(pipeline);
        if let Err(e) = self.assign(pipeline, &mine) {
            tracing::error!(pipeline, "following its assignments: {e:#}");
        }
    }
}
