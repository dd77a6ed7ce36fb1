//! Following the control log: on Kafka every host tails `<cluster>.control` after its replay and
//! applies what other hosts (and the controller) appended, with the same effects the host that
//! appended it had: modules load, pipelines start and stop, swaps and settings reach the
//! partitions, and assignments start and stop partitions here. Assignments, moves and
//! releases take effect only this way, this host's own too: in log order, once read back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::app::Baton;
use crate::control::{ControlEvent, parse_event};
use crate::partition::Settings;

/// The header naming the host that appended a control event.
pub const ORIGIN: &str = "baton.origin";

/// Whether `event`, appended by this host, takes effect here only when the follower reads it
/// back, in log order, like every other host's: the events of assignments and moves, which
/// hosts must agree on. (This host applies its other events as it appends them.)
pub(crate) fn only_read_back_applies(event: &ControlEvent) -> bool {
    matches!(
        event,
        ControlEvent::Assigned(_) | ControlEvent::Move(_) | ControlEvent::Released(_)
    )
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
        let topic = self.control_topic.clone();
        let wake = self.control_wake.clone();
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
                            baton.set_control_offset(offset);
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
                        let mine = r
                            .record
                            .headers
                            .iter()
                            .any(|(k, v)| k == ORIGIN && v == baton.host_id.as_bytes());
                        let bytes = r.record.value.unwrap_or_default();
                        match parse_event(&bytes) {
                            Ok(e) => {
                                since_snapshot += 1;
                                baton.log_catalog.lock().apply(e.clone());
                                if !mine || only_read_back_applies(&e) {
                                    baton.apply_followed(e);
                                }
                            }
                            Err(e) => tracing::error!(
                                "control log record {} cannot be read, skipped: {e}",
                                r.offset
                            ),
                        }
                    }
                    offset = offset.max(next);
                    baton.set_control_offset(offset);
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

    /// Applies an event read from the control log (another host's, or one of this host's own
    /// that takes effect only when read back), with its effects here.
    pub(crate) fn apply_followed(&self, event: ControlEvent) {
        let _control = self.control.lock();
        match &event {
            ControlEvent::Module(m) => {
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
                if let (Some(module), Some(target)) = (module, target) {
                    target.set(s.version.clone(), module);
                }
                self.catalog.lock().apply(event);
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
                    target.set_settings(Settings::of(&spec));
                }
            }
            ControlEvent::DeadLettersReplayed(r) => {
                if let Some(plan) = self.replay_plans.read().get(&r.pipeline) {
                    for range in &r.ranges {
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
        self.follow_standbys();
        if !self.runs.read().contains_key(pipeline) {
            return;
        }
        let mine = self.local_assignments(pipeline);
        if let Err(e) = self.assign(pipeline, &mine) {
            tracing::error!(pipeline, "following its assignments: {e:#}");
        }
    }
}
