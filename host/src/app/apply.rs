//! What each control event does on this host: the one way an event takes effect.
//!
//! Every event, this host's own and every other host's, takes effect through
//! [`Baton::apply_event`], in log order: the control log ([`crate::control::log::ControlLog`])
//! calls it for each record it applies, on Kafka as its follower reads the record, on the
//! embedded log (which this host alone writes) right after the append. Its effects are the same
//! everywhere: modules load, pipelines start and stop, swaps and settings reach the partitions,
//! dead letters are replayed, and assignments and moves start and stop partitions here. An
//! append changes nothing by itself. This is wiring: each effect is a call into the part that
//! owns it.

use std::sync::Arc;

use crate::app::Baton;
use crate::control::ControlEvent;
use crate::partition::Settings;

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
        ControlEvent::Split(_) => "split",
        ControlEvent::Merge(_) => "merge",
    }
}

impl Baton {
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
                if let Err(e) = self.registry.load(m) {
                    tracing::error!("a module from the control log cannot be loaded: {e:#}");
                }
                self.catalog.lock().apply(event);
            }
            ControlEvent::Pipeline(p) => {
                let record = Arc::new((**p).clone());
                self.catalog.lock().apply(event);
                self.supervisor.start_or_record(record);
            }
            ControlEvent::PipelineDeleted(d) => {
                self.supervisor.stop_pipeline(&d.pipeline);
                self.catalog.lock().apply(event);
            }
            ControlEvent::Swap(s) => {
                let module = self.registry.get(&s.sha256);
                let target = self.supervisor.target(&s.pipeline);
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
                if let (Some(spec), Some(target)) = (spec, self.supervisor.target(&pipeline)) {
                    let generation = target.set_settings(Settings::of(&spec));
                    target.made(at, generation);
                }
            }
            ControlEvent::DeadLettersReplayed(r) => {
                let ranges = self.catalog.lock().replay_ranges(r);
                if let Some(plan) = self.supervisor.replay_plan(&r.pipeline) {
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
                self.supervisor.follow_assignments(&pipeline);
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
                    self.moves.on_move(&m);
                }
            }
            // The target reads it from the log-ordered catalog.
            ControlEvent::Released(_) => self.catalog.lock().apply(event),
            ControlEvent::Split(s) => {
                let (pipeline, id) = (s.pipeline.clone(), s.id.clone());
                self.catalog.lock().apply(event);
                let effective = self.catalog.lock().split(&pipeline, &id).cloned();
                if let Some(s) = effective {
                    self.splits.on_split(&s);
                }
            }
            ControlEvent::Merge(m) => {
                let (pipeline, id) = (m.pipeline.clone(), m.id.clone());
                self.catalog.lock().apply(event);
                let effective = self.catalog.lock().merge(&pipeline, &id).cloned();
                if let Some(m) = effective {
                    self.splits.on_merge(&m);
                }
            }
        }
    }
}
