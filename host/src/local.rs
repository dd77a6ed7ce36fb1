//! `baton test-plugin`: runs a component over records from a file, with no broker and no host
//! process. State lives in a database in a temporary directory, deleted at the end: each
//! batch's writes go to it once the batch and its timers ran, as a host commits them. Time comes from the records: a slot's event time is its
//! highest record timestamp, and processing time is the highest timestamp of the whole input.
//! Records go to the guest in batches of one slot's consecutive records, as a host sends them;
//! a batch that fails is retried one record at a time, and a record that still fails is
//! reported as a dead letter, with the trap's backtrace.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::runtime::time::TIME_STORE;
use crate::runtime::{CallError, Cursor, HostCtx, Instance, Message, Runtime, WriteLimits};
use crate::state::StateEnv;

/// The topic name the records are read from, as the guest sees it.
pub const INPUT_TOPIC: &str = "input";

/// Most records per guest call.
const MAX_CALL: usize = 100;

/// Most timers handed to one `on-timers` call.
const TIMERS_PER_CALL: usize = 1000;

/// One line of the input file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputLine {
    key: Option<String>,
    value: Option<String>,
    key_base64: Option<String>,
    value_base64: Option<String>,
    timestamp: i64,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    slot: Option<u32>,
}

/// A record of the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputRecord {
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// Timestamp (ms).
    pub timestamp: i64,
    /// Headers.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Its slot, when the line names it.
    pub slot: Option<u32>,
}

fn bytes(text: Option<String>, b64: Option<String>, what: &str) -> Result<Option<Vec<u8>>, String> {
    match (text, b64) {
        (Some(_), Some(_)) => Err(format!("give `{what}` or `{what}_base64`, not both")),
        (Some(t), None) => Ok(Some(t.into_bytes())),
        (None, Some(b)) => B64
            .decode(b.as_bytes())
            .map(Some)
            .map_err(|e| format!("`{what}_base64` is not base64: {e}")),
        (None, None) => Ok(None),
    }
}

/// Parses the input file: one JSON object per line (blank lines skipped); an error names the
/// line.
pub fn parse_input(text: &str) -> Result<Vec<InputRecord>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = |e: String| format!("input line {}: {e}", i + 1);
        let l: InputLine = serde_json::from_str(line).map_err(|e| at(e.to_string()))?;
        out.push(InputRecord {
            key: bytes(l.key, l.key_base64, "key").map_err(at)?,
            value: bytes(l.value, l.value_base64, "value").map_err(at)?,
            timestamp: l.timestamp,
            headers: l
                .headers
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect(),
            slot: l.slot,
        });
    }
    Ok(out)
}

/// One entry of a store, as `--expect` files and the final state list them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateEntry {
    /// Store name.
    pub store: String,
    /// Slot.
    pub slot: u32,
    /// Key, as UTF-8 (lossy when it is not; `key_base64` then holds the bytes).
    pub key: String,
    /// The key's bytes, when they are not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_base64: Option<String>,
    /// The value's bytes.
    pub value_base64: String,
}

impl StateEntry {
    fn new(store: &str, slot: u32, key: &[u8], value: &[u8]) -> Self {
        let (key, key_base64) = match std::str::from_utf8(key) {
            Ok(k) => (k.to_string(), None),
            Err(_) => (
                String::from_utf8_lossy(key).into_owned(),
                Some(B64.encode(key)),
            ),
        };
        StateEntry {
            store: store.to_string(),
            slot,
            key,
            key_base64,
            value_base64: B64.encode(value),
        }
    }

    /// The entry's key bytes.
    fn key_bytes(&self) -> Vec<u8> {
        self.key_base64
            .as_ref()
            .and_then(|b| B64.decode(b.as_bytes()).ok())
            .unwrap_or_else(|| self.key.clone().into_bytes())
    }
}

/// Parses an `--expect` file; an error names the line.
pub fn parse_state(text: &str) -> Result<Vec<StateEntry>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let e: StateEntry = serde_json::from_str(line)
            .map_err(|e| format!("expected state line {}: {e}", i + 1))?;
        B64.decode(e.value_base64.as_bytes())
            .map_err(|err| format!("expected state line {}: `value_base64`: {err}", i + 1))?;
        out.push(e);
    }
    Ok(out)
}

/// What to run.
pub struct LocalRun {
    /// The component's bytes.
    pub component: Vec<u8>,
    /// Its config, for `init`.
    pub config: Vec<(String, String)>,
    /// Slots of the input (a key's slot is murmur2 of it, modulo this).
    pub slots: u32,
    /// The stores the processor may open.
    pub stores: Vec<String>,
}

/// What a run leaves: the state, sorted by store, slot and key.
pub struct Outcome {
    /// Every entry of every store.
    pub state: Vec<StateEntry>,
    /// Records that failed alone (dead letters).
    pub failed: usize,
}

fn text_or_b64(name: &str, b: &Option<Vec<u8>>) -> (String, Value) {
    match b {
        None => (name.to_string(), Value::Null),
        Some(b) => match std::str::from_utf8(b) {
            Ok(t) => (name.to_string(), Value::String(t.to_string())),
            Err(_) => (format!("{name}_base64"), Value::String(B64.encode(b))),
        },
    }
}

struct Runner<'a> {
    runtime: Arc<Runtime>,
    module: crate::runtime::Module,
    config: Vec<(String, String)>,
    emit: &'a mut dyn FnMut(Value),
    failed: usize,
}

impl Runner<'_> {
    /// Prints the call's logs and outputs.
    fn report(&mut self, inst: &mut Instance) {
        for l in std::mem::take(&mut inst.ctx().logs) {
            (self.emit)(json!({"log": {"level": l.level, "message": l.message,
                "slot": l.cursor.slot, "offset": l.cursor.offset}}));
        }
        for o in std::mem::take(&mut inst.ctx().outputs) {
            let (k, kv) = text_or_b64("key", &o.record.key);
            let (v, vv) = text_or_b64("value", &o.record.value);
            let headers: BTreeMap<String, String> = o
                .record
                .headers
                .iter()
                .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned()))
                .collect();
            let mut out = serde_json::Map::new();
            out.insert("topic".into(), o.topic.into());
            out.insert(k, kv);
            out.insert(v, vv);
            out.insert("timestamp".into(), o.record.timestamp.into());
            if !headers.is_empty() {
                out.insert("headers".into(), json!(headers));
            }
            (self.emit)(json!({ "output": out }));
        }
    }

    /// Ends a call: kept, or dropped with its error (a trapped instance is replaced over the
    /// same state).
    fn end(
        &mut self,
        mut inst: Instance,
        r: Result<(), CallError>,
    ) -> anyhow::Result<(Instance, Option<CallError>)> {
        if let Some(e) = inst.ctx().host_fault.take() {
            anyhow::bail!("the host failed: {e}");
        }
        match r {
            Ok(()) => {
                inst.ctx().keep_call();
                self.report(&mut inst);
                Ok((inst, None))
            }
            Err(e) => {
                inst.ctx().drop_call();
                inst.ctx().outputs.truncate(0);
                std::mem::take(&mut inst.ctx().logs);
                if matches!(e, CallError::Trap(_)) {
                    let mut ctx = inst.into_ctx();
                    ctx.reset_instance_resources();
                    inst = self.runtime.instantiate(&self.module, ctx)?;
                    inst.init(&self.config)
                        .map_err(|e| anyhow::anyhow!("init after a trap: {e}"))?;
                }
                Ok((inst, Some(e)))
            }
        }
    }

    fn failure(&mut self, inst: &mut Instance, what: Value, e: &CallError) {
        self.failed += 1;
        let backtrace = inst.ctx().last_backtrace.lock().take();
        let kind = match e {
            CallError::Guest(_) => "error",
            CallError::Trap(_) => "trap",
        };
        (self.emit)(json!({"dead_letter": {"kind": kind, "error": e.to_string(),
            "backtrace": backtrace, "record": what}}));
    }

    fn process(
        &mut self,
        mut inst: Instance,
        msgs: &[Message],
        lines: &[usize],
    ) -> anyhow::Result<Instance> {
        inst.ctx().begin_call(cursor(&msgs[0]));
        let r = inst.process(msgs, u64::MAX / 2);
        let (next, err) = self.end(inst, r)?;
        inst = next;
        if err.is_none() {
            return Ok(inst);
        }
        for (m, line) in msgs.iter().zip(lines) {
            inst.ctx().begin_call(cursor(m));
            let r = inst.process(std::slice::from_ref(m), u64::MAX / 2);
            let (next, err) = self.end(inst, r)?;
            inst = next;
            if let Some(e) = err {
                let (k, kv) = text_or_b64("key", &m.key);
                let what = json!({"line": line, "slot": m.slot, "offset": m.offset,
                    "timestamp": m.timestamp, k: kv});
                self.failure(&mut inst, what, &e);
            }
        }
        Ok(inst)
    }

    /// Expiries and timers of `slot` that fell due by its event time and by `now`.
    fn fire(&mut self, mut inst: Instance, slot: u32, now: i64) -> anyhow::Result<Instance> {
        let c = Cursor {
            topic: INPUT_TOPIC.into(),
            slot,
            offset: 0,
            timestamp: 0,
        };
        inst.ctx().begin_call(c.clone());
        inst.ctx().sweep_expired(slot, now, usize::MAX)?;
        inst.ctx().keep_call();
        if !inst.takes_timers() {
            return Ok(inst);
        }
        loop {
            inst.ctx().begin_call(c.clone());
            let due = inst.ctx().due_timers(slot, now, TIMERS_PER_CALL)?;
            let Some(first) = due.first() else {
                inst.ctx().keep_call();
                return Ok(inst);
            };
            inst.ctx().cursor.timestamp = first.at;
            inst.ctx().remove_timers(&due)?;
            let r = inst.on_timers(&due, u64::MAX / 2);
            let (next, err) = self.end(inst, r)?;
            inst = next;
            if let Some(e) = err {
                // Dropped with the call: remove them for good, and say which.
                inst.ctx().begin_call(c.clone());
                inst.ctx().remove_timers(&due)?;
                inst.ctx().keep_call();
                let what: Vec<Value> = due
                    .iter()
                    .map(|t| json!({"at": t.at, "key": String::from_utf8_lossy(&t.key)}))
                    .collect();
                self.failure(&mut inst, json!({"slot": slot, "timers": what}), &e);
            }
        }
    }
}

fn cursor(m: &Message) -> Cursor {
    Cursor {
        topic: m.topic.clone(),
        slot: m.slot,
        offset: m.offset,
        timestamp: m.timestamp,
    }
}

/// Runs `input` through the component; `emit` gets each log line, output and dead letter as a
/// JSON object, in order.
pub fn run(
    spec: &LocalRun,
    input: &[InputRecord],
    emit: &mut dyn FnMut(Value),
) -> anyhow::Result<Outcome> {
    anyhow::ensure!(spec.slots > 0, "--slots must be at least 1");
    for s in &spec.stores {
        anyhow::ensure!(
            !s.is_empty()
                && s.len() <= 64
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !s.starts_with("__"),
            "invalid store name `{s}`: use 1 to 64 ASCII letters, digits, '-' and '_', not \
             starting with `__`"
        );
    }
    for (i, r) in input.iter().enumerate() {
        if let Some(slot) = r.slot {
            anyhow::ensure!(
                slot < spec.slots,
                "input line {}: slot {slot} is not below --slots {}",
                i + 1,
                spec.slots
            );
        }
    }
    let dir = tempfile::tempdir()?;
    let runtime = Runtime::new(compiled_cache().unwrap_or_else(|| dir.path().join("compiled")))?;
    let module = runtime
        .load(&spec.component)
        .map_err(|e| anyhow::anyhow!("the component: {e}"))?;
    let env = StateEnv::new(64 << 20);
    let mut stores = spec.stores.clone();
    stores.push(TIME_STORE.to_string());
    let db = Arc::new(env.open_partition(&dir.path().join("state"), &stores)?);
    let limits = WriteLimits {
        any_output: true,
        ..WriteLimits::default()
    };
    let mut ctx = HostCtx::new(
        "local".into(),
        db.clone(),
        Arc::new(limits),
        256 << 20,
        Default::default(),
    );
    let now = input.iter().map(|r| r.timestamp).max().unwrap_or(0);
    ctx.clock = Some(now);
    let mut inst = runtime.instantiate(&module, ctx)?;
    if let Err(e) = inst.init(&spec.config) {
        anyhow::bail!("init refuses the config: {e}");
    }
    let mut runner = Runner {
        runtime,
        module,
        config: spec.config.clone(),
        emit,
        failed: 0,
    };
    // Records by slot, in file order, with their offsets in the slot.
    let mut next_offset = vec![0u64; spec.slots as usize];
    let (msgs, lines): (Vec<Message>, Vec<usize>) = input
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let slot = r.slot.unwrap_or_else(|| match &r.key {
                Some(k) => crate::partitioner::partition_for_key(k, spec.slots),
                None => (i as u32) % spec.slots,
            });
            let offset = next_offset[slot as usize];
            next_offset[slot as usize] += 1;
            let m = Message {
                topic: INPUT_TOPIC.into(),
                slot,
                offset,
                timestamp: r.timestamp,
                key: r.key.clone(),
                value: r.value.clone(),
                headers: r
                    .headers
                    .iter()
                    .map(|(k, v)| crate::runtime::Header {
                        key: k.clone(),
                        value: v.clone(),
                    })
                    .collect(),
            };
            (m, i + 1)
        })
        .unzip();
    let mut i = 0;
    while i < msgs.len() {
        let slot = msgs[i].slot;
        let mut j = i + 1;
        while j < msgs.len() && j - i < MAX_CALL && msgs[j].slot == slot {
            j += 1;
        }
        inst = runner.process(inst, &msgs[i..j], &lines[i..j])?;
        inst = runner.fire(inst, slot, now)?;
        commit(&mut inst, &db)?;
        i = j;
    }
    // Processing time is at the last record's: what fell due by then fires in every slot.
    for slot in 0..spec.slots {
        inst = runner.fire(inst, slot, now)?;
    }
    commit(&mut inst, &db)?;
    let failed = runner.failed;
    let mut state = Vec::new();
    for (id, store) in spec.stores.iter().enumerate() {
        // Keys are the slot (4 bytes, big-endian) and the processor's key.
        for (k, value) in db.scan(id, b"", &[0xff; 5], usize::MAX)? {
            let (slot, key) = k.split_at(4);
            let slot = u32::from_be_bytes(slot.try_into()?);
            state.push(StateEntry::new(store, slot, key, &value));
        }
    }
    state.sort();
    Ok(Outcome { state, failed })
}

/// Writes what the calls so far kept to the database, as a host's commit does: reads and scans
/// then go to it rather than through an ever larger batch overlay.
fn commit(inst: &mut Instance, db: &crate::state::PartitionDb) -> anyhow::Result<()> {
    let writes = inst.ctx().overlay.take();
    db.commit(writes.iter(), &[])?;
    inst.ctx().overlay.settle();
    Ok(())
}

/// The differences between `got` and `want`, one line each (empty when they are the same).
pub fn diff(got: &[StateEntry], want: &[StateEntry]) -> Vec<String> {
    let index = |v: &[StateEntry]| -> BTreeMap<(String, u32, Vec<u8>), String> {
        v.iter()
            .map(|e| {
                (
                    (e.store.clone(), e.slot, e.key_bytes()),
                    e.value_base64.clone(),
                )
            })
            .collect()
    };
    let (g, w) = (index(got), index(want));
    let mut out = Vec::new();
    for (k, wv) in &w {
        let name = format!(
            "{} slot {} key {:?}",
            k.0,
            k.1,
            String::from_utf8_lossy(&k.2)
        );
        match g.get(k) {
            None => out.push(format!("missing: {name} (want value_base64 {wv})")),
            Some(gv) if gv != wv => {
                out.push(format!("differs: {name}: got value_base64 {gv}, want {wv}"))
            }
            Some(_) => {}
        }
    }
    for (k, gv) in &g {
        if !w.contains_key(k) {
            out.push(format!(
                "unexpected: {} slot {} key {:?} (value_base64 {gv})",
                k.0,
                k.1,
                String::from_utf8_lossy(&k.2)
            ));
        }
    }
    out
}

/// Where `baton test-plugin` keeps compiled code across runs, so that a large component (Python,
/// JavaScript) compiles once: `$BATON_COMPILED_CACHE`, else `$XDG_CACHE_HOME/baton/compiled`,
/// else `~/.cache/baton/compiled`; `None` (a fresh directory per run) without a home.
pub fn compiled_cache() -> Option<std::path::PathBuf> {
    if let Some(d) = std::env::var_os("BATON_COMPILED_CACHE") {
        return Some(d.into());
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache")))?;
    Some(base.join("baton").join("compiled"))
}
