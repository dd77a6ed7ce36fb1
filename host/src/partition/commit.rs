//! A partition's commits: the pending batch's state, outputs and input offsets handed to the
//! transport's `PartitionIo`, one transaction in flight while the next batch is processed.

use super::*;

impl PartitionTask {
    /// Commits everything and waits: the commit in flight, then the pending batches.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn commit_pending(
        &self,
        io: &mut dyn PartitionIo,
        inst: &mut Instance,
        pending: &mut Pending,
        in_flight: &mut Option<InFlight>,
        next: &[Vec<u64>],
        committed: &mut Vec<Vec<u64>>,
        dlq: &str,
    ) -> Result<(), SessionError> {
        if let Some(f) = in_flight.take() {
            self.finish_commit(io, inst, f, pending.batches > 0, committed, dlq)?;
        }
        if pending.batches == 0 {
            return Ok(());
        }
        let f = self.start_commit(io, inst, pending, next)?;
        self.finish_commit(io, inst, f, false, committed, dlq)
    }

    /// Starts committing the pending batches: their state writes, outputs and dead letters,
    /// and every owned slot's offset up to `next`. Their writes stay visible to reads until the
    /// commit is finished.
    pub(super) fn start_commit(
        &self,
        io: &mut dyn PartitionIo,
        inst: &mut Instance,
        pending: &mut Pending,
        next: &[Vec<u64>],
    ) -> Result<InFlight, SessionError> {
        let started = Instant::now();
        // Every owned slot's offset, idle or not: the broker expires a group's offset
        // `offsets.retention.minutes` after its last commit.
        let offsets = batch_offsets(next, self.slots.start);
        let ctx = inst.ctx();
        let writes = ctx.overlay.take();
        let mut outputs = std::mem::take(&mut ctx.outputs);
        outputs.append(&mut pending.unreplayable);
        let flight = InFlight {
            pending: std::mem::take(pending),
            next: next.to_vec(),
            outputs: outputs.len(),
            offsets: offsets.clone(),
            dead_letters: self.status.dead_letters.load(Ordering::Relaxed),
            started,
        };
        io.commit_start(
            &self.db,
            Arc::new(Batch {
                writes,
                outputs,
                offsets,
            }),
        )
        .map_err(SessionError::Retry)?;
        add_elapsed(&self.status.time.commit_us, started);
        Ok(flight)
    }

    /// Waits for the commit in flight. Once it is committed, `committed` is its `next` and the
    /// progress shows it. When Kafka refuses a record of it for good, the next session goes
    /// through its records one per commit to find it; when its one record is what Kafka
    /// refuses, that record is dead-lettered instead (and, when batches were processed over
    /// its writes, `on_top`, they are processed again in a new session).
    pub(super) fn finish_commit(
        &self,
        io: &mut dyn PartitionIo,
        inst: &mut Instance,
        mut flight: InFlight,
        on_top: bool,
        committed: &mut Vec<Vec<u64>>,
        dlq: &str,
    ) -> Result<(), SessionError> {
        let waited = Instant::now();
        let mut restart = false;
        if let Err(e) = io.commit_finish() {
            // Nothing of the batches is in RocksDB: the next session resumes before them.
            if !refused_for_good(&e) {
                return Err(SessionError::Retry(e));
            }
            let Some(one) = flight.pending.single.take() else {
                // Kafka refused a record of these batches for good: the next session goes
                // through their records one per commit to find it.
                tracing::warn!("{e:#}; processing the pending records one per commit");
                *self.isolate.lock() = Some(flight.next);
                return Err(SessionError::Retry(e));
            };
            // This record's outputs or state writes are what Kafka refuses: its writes are
            // discarded and it goes to the dead-letter topic, or, when even that is
            // refused, it is dropped with an event saying so.
            inst.ctx().overlay.discard_committing();
            // What the discarded writes removed (fired timers, say) is back in RocksDB's view.
            inst.ctx().forget_cached_state();
            restart = on_top;
            let reason = format!("{e:#}");
            let dead = self.dead_letter_output(&one, &reason, EventKind::Error, dlq);
            // Counted as a dead letter whether it commits or is dropped below.
            flight.dead_letters += 1;
            let dead_batch = Batch {
                writes: Writes::none(),
                outputs: vec![dead],
                offsets: flight.offsets.clone(),
            };
            flight.outputs = 1;
            if let Err(e2) = io.commit(&self.db, Arc::new(dead_batch)) {
                if !refused_for_good(&e2) {
                    return Err(SessionError::Retry(e2));
                }
                flight.outputs = 0;
                self.events.push(
                    EventKind::Error,
                    None,
                    format!(
                        "record dropped: Kafka refused it ({reason}) and its dead letter \
                         ({e2:#})"
                    ),
                    &self.id,
                    None,
                );
                io.commit(
                    &self.db,
                    Arc::new(Batch {
                        writes: Writes::none(),
                        outputs: Vec::new(),
                        offsets: flight.offsets.clone(),
                    }),
                )
                .map_err(SessionError::Retry)?;
            }
        } else {
            // In RocksDB now: the hot-key cache takes the new values of the keys it holds.
            inst.ctx().overlay.settle();
        }
        add_elapsed(&self.status.time.commit_us, waited);
        tracing::debug!(
            records = flight.pending.records,
            batches = flight.pending.batches,
            outputs = flight.outputs,
            cached = inst.ctx().overlay.cached_bytes(),
            us = flight.started.elapsed().as_micros() as u64,
            "committed"
        );
        self.account(io, flight, committed);
        if restart {
            // The batches processed since read the discarded writes.
            return Err(SessionError::Restart);
        }
        Ok(())
    }

    /// Counts a commit that landed and shows its progress: `committed` is its `next`.
    pub(super) fn account(
        &self,
        io: &mut dyn PartitionIo,
        flight: InFlight,
        committed: &mut Vec<Vec<u64>>,
    ) {
        if crate::otlp::enabled() {
            crate::otlp::Span::root("commit", flight.started, Instant::now())
                .attr("baton.partition", self.id.as_str())
                .attr("baton.pipeline", self.pipeline.spec.name.as_str())
                .attr("baton.records", flight.pending.records)
                .attr("baton.batches", flight.pending.batches)
                .attr("baton.outputs", flight.outputs)
                .export();
        }
        if let Some(first) = flight.pending.first_fetched {
            self.status.batch_latency.observe(first.elapsed());
        }
        self.status
            .records_out
            .fetch_add(flight.outputs as u64, Ordering::Relaxed);
        self.status
            .records
            .fetch_add(flight.pending.records, Ordering::Relaxed);
        self.status.batches.fetch_add(1, Ordering::Relaxed);
        self.status
            .committed_dead_letters
            .store(flight.dead_letters, Ordering::Relaxed);
        committed.clear();
        committed.extend_from_slice(&flight.next);
        self.update_progress(io, committed);
    }

    pub(super) fn update_progress(&self, io: &mut dyn PartitionIo, next: &[Vec<u64>]) {
        let mut v = Vec::new();
        for (ti, topic) in self.pipeline.spec.inputs.iter().enumerate() {
            for (idx, offset) in next[ti].iter().enumerate() {
                let slot = self.slots.start + idx as u32;
                let end = io
                    .end_offset(ti, slot, *offset)
                    .unwrap_or(*offset)
                    .max(*offset);
                v.push(SlotProgress {
                    topic: topic.clone(),
                    slot,
                    offset: *offset,
                    end,
                });
            }
        }
        *self.status.progress.lock() = v;
        let inputs = self.pipeline.spec.inputs.len();
        let mut replay = Vec::new();
        if let Some(row) = next.get(inputs) {
            let ranges = self.replays.ranges();
            for (idx, offset) in row.iter().enumerate() {
                let slot = self.slots.start + idx as u32;
                if let Some((_, to)) = ranges.get(&slot).and_then(|r| replay_window(r, *offset))
                    && !io.replay_done(slot, *offset)
                {
                    replay.push(ReplayProgress {
                        slot,
                        offset: *offset,
                        to,
                    });
                }
            }
        }
        *self.status.replay.lock() = replay;
    }
}
