//! Records a guest refused go to the pipeline's dead-letter topic, cut to fit and named with
//! the error.

use super::*;

/// Makes a dead letter fit its topic: cuts its value, then its key, and says so in the header
/// `baton.truncated`, so that a record its dead-letter topic cannot take still leaves a trace.
pub(super) fn truncate_dead_letter(r: &mut Record, max: usize) {
    let headers: usize = r.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    let key = r.key.as_ref().map_or(0, Vec::len);
    let value = r.value.as_ref().map_or(0, Vec::len);
    // Room for the header saying what was cut.
    let room = max.saturating_sub(headers + 128);
    if key + value + headers <= max {
        return;
    }
    let mut note = Vec::new();
    let value_room = room.saturating_sub(key.min(room));
    if let Some(v) = r.value.as_mut() {
        v.truncate(value_room);
        note.push(format!("value of {value} bytes cut to {}", v.len()));
    }
    let key_room = room.saturating_sub(r.value.as_ref().map_or(0, Vec::len));
    if let Some(k) = r.key.as_mut()
        && k.len() > key_room
    {
        k.truncate(key_room);
        note.push(format!("key of {key} bytes cut to {}", k.len()));
    }
    note.push(format!("the dead-letter topic takes at most {max} bytes"));
    r.headers
        .push(("baton.truncated".into(), note.join("; ").into_bytes()));
}

impl PartitionTask {
    pub(super) fn dead_letter(&self, inst: &mut Instance, m: &Message, err: &CallError, dlq: &str) {
        let kind = match err {
            CallError::Guest(_) => EventKind::Error,
            CallError::Trap(_) => EventKind::Trap,
        };
        let out = self.dead_letter_output(m, &err.to_string(), kind, dlq);
        inst.ctx().push_dead_letter(out);
    }

    /// The dead letter of `m` with the reason `msg`, counted and reported as an event.
    pub(super) fn dead_letter_output(
        &self,
        m: &Message,
        msg: &str,
        kind: EventKind,
        dlq: &str,
    ) -> Output {
        let (topic, slot, offset) = (&m.topic, m.slot, m.offset);
        self.events.push(
            kind,
            None,
            format!("{msg}; record sent to {dlq}"),
            &self.id,
            Some(&Cursor {
                topic: topic.clone(),
                slot,
                offset,
                timestamp: m.timestamp,
            }),
        );
        tracing::warn!(%topic, slot, offset, "record sent to {dlq}: {msg}");
        let mut headers: Vec<(String, Vec<u8>)> = m
            .headers
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect();
        headers.push(("baton.error".into(), msg.as_bytes().to_vec()));
        headers.push(("baton.topic".into(), topic.as_bytes().to_vec()));
        headers.push(("baton.slot".into(), slot.to_string().into_bytes()));
        headers.push(("baton.offset".into(), offset.to_string().into_bytes()));
        let mut record = Record {
            key: m.key.clone(),
            value: m.value.clone(),
            headers,
            timestamp: m.timestamp,
        };
        let out = self.outputs.outputs.get(dlq).copied();
        if let Some(max) = out.and_then(|o| o.max_record_bytes) {
            truncate_dead_letter(&mut record, max);
        }
        let partitions = out
            .map_or(self.pipeline.spec.slots, |o| o.partitions)
            .max(1);
        self.status.dead_letters.fetch_add(1, Ordering::Relaxed);
        *self.status.last_error.lock() = Some(format!("{topic}/{slot}@{offset}: {msg}"));
        Output {
            topic: dlq.to_string(),
            partition: slot % partitions,
            record,
        }
    }
}
