//! Trace export over OTLP/HTTP (`baton run --otlp-endpoint URL`): spans of batches, commits and
//! moves (a `move` span with a child for each step: warming, drain, and every step of the
//! pause), sent as OTLP's JSON encoding to `URL/v1/traces`, which OpenTelemetry Collectors,
//! Jaeger and Tempo accept.
//!
//! Spans are made where the work is timed already and handed to an exporter thread through a
//! bounded queue: the data path never waits for the collector. A full queue drops spans and
//! counts them ([`dropped`]); a failed export drops its spans, counts them and logs a warning
//! at most once a minute. Without an endpoint nothing is made: [`enabled`] is one atomic load.
//!
//! The exporter uses the HTTP client already in the tree (no gRPC stack) and is compiled only
//! with the cargo feature `otlp` (on by default); without it `--otlp-endpoint` is refused.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

/// Spans the exporter holds at most before it drops new ones.
pub const QUEUE: usize = 8192;
/// Spans per request at most.
pub const BATCH: usize = 512;
/// How long a span waits at most before it is sent.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

static EXPORTER: OnceLock<Exporter> = OnceLock::new();
static EXPORTED: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Whether spans are exported (an endpoint was given).
pub fn enabled() -> bool {
    EXPORTER.get().is_some()
}

/// Spans sent to the collector and acknowledged.
pub fn exported() -> u64 {
    EXPORTED.load(Ordering::Relaxed)
}

/// Spans dropped: the queue was full, or the collector did not take them.
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// A span attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Attr {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
}

impl From<&str> for Attr {
    fn from(v: &str) -> Self {
        Attr::Str(v.to_string())
    }
}
impl From<String> for Attr {
    fn from(v: String) -> Self {
        Attr::Str(v)
    }
}
impl From<u64> for Attr {
    fn from(v: u64) -> Self {
        Attr::Int(v.min(i64::MAX as u64) as i64)
    }
}
impl From<usize> for Attr {
    fn from(v: usize) -> Self {
        Attr::from(v as u64)
    }
}
impl From<f64> for Attr {
    fn from(v: f64) -> Self {
        Attr::Float(v)
    }
}

/// A finished span, ready to export.
#[derive(Debug, Clone)]
pub struct Span {
    name: String,
    trace: [u8; 16],
    id: [u8; 8],
    parent: Option<[u8; 8]>,
    start: SystemTime,
    end: SystemTime,
    attrs: Vec<(&'static str, Attr)>,
    error: Option<String>,
    /// One moment on both clocks: the instants of a trace's spans become wall-clock times by
    /// the same anchor, so that a child never starts before its parent by a clock read.
    anchor: (Instant, SystemTime),
}

impl Span {
    /// The root span of a new trace, from `start` to `end`.
    pub fn root(name: impl Into<String>, start: Instant, end: Instant) -> Self {
        Self::anchored(name, start, end, (Instant::now(), SystemTime::now()))
    }

    fn anchored(
        name: impl Into<String>,
        start: Instant,
        end: Instant,
        anchor: (Instant, SystemTime),
    ) -> Self {
        Span {
            name: name.into(),
            trace: new_id(),
            id: new_id(),
            parent: None,
            start: wall_from(anchor, start),
            end: wall_from(anchor, end.max(start)),
            attrs: Vec::new(),
            error: None,
            anchor,
        }
    }

    /// A child of this span in its trace, from `start` to `end`.
    pub fn child(&self, name: impl Into<String>, start: Instant, end: Instant) -> Self {
        Span {
            trace: self.trace,
            parent: Some(self.id),
            ..Span::anchored(name, start, end, self.anchor)
        }
    }

    /// With the attribute `key`.
    pub fn attr(mut self, key: &'static str, value: impl Into<Attr>) -> Self {
        self.attrs.push((key, value.into()));
        self
    }

    /// Marked failed, with `message`.
    pub fn error(mut self, message: impl Into<String>) -> Self {
        self.error = Some(message.into());
        self
    }

    /// Hands the span to the exporter (dropped, and counted, when its queue is full).
    pub fn export(self) {
        if let Some(e) = EXPORTER.get() {
            e.send(self);
        }
    }

    /// The span in OTLP's JSON encoding (ids in hex, times in nanoseconds as strings).
    pub fn to_json(&self) -> Value {
        let nanos = |t: SystemTime| {
            t.duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
                .to_string()
        };
        let mut span = json!({
            "traceId": hex::encode(self.trace),
            "spanId": hex::encode(self.id),
            "name": self.name,
            "kind": 1,
            "startTimeUnixNano": nanos(self.start),
            "endTimeUnixNano": nanos(self.end),
            "attributes": attributes(self.attrs.iter().map(|(k, v)| (*k, v))),
            "status": match &self.error {
                Some(m) => json!({"code": 2, "message": m}),
                None => json!({"code": 1}),
            },
        });
        if let Some(p) = self.parent {
            span["parentSpanId"] = json!(hex::encode(p));
        }
        span
    }
}

fn attributes<'a>(attrs: impl Iterator<Item = (&'a str, &'a Attr)>) -> Vec<Value> {
    attrs
        .map(|(k, v)| {
            let value = match v {
                Attr::Str(s) => json!({"stringValue": s}),
                Attr::Int(i) => json!({"intValue": i.to_string()}),
                Attr::Float(f) => json!({"doubleValue": f}),
            };
            json!({"key": k, "value": value})
        })
        .collect()
}

/// `t` on the wall clock, by `anchor`: the same moment on both clocks.
fn wall_from((now, wall_now): (Instant, SystemTime), t: Instant) -> SystemTime {
    if t <= now {
        wall_now - (now - t)
    } else {
        wall_now + (t - now)
    }
}

/// A random id, never all zeros (which OTLP reads as none).
fn new_id<const N: usize>() -> [u8; N] {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(1);
    let mut out = [0u8; N];
    for chunk in out.chunks_mut(8) {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        let v = h.finish() | 1;
        chunk.copy_from_slice(&v.to_le_bytes()[..chunk.len()]);
    }
    out
}

/// What the exporter thread is told.
#[cfg_attr(not(feature = "otlp"), allow(dead_code))]
enum Msg {
    Span(Box<Span>),
    Flush(std::sync::mpsc::Sender<()>),
}

struct Exporter {
    tx: std::sync::mpsc::SyncSender<Msg>,
}

impl Exporter {
    fn send(&self, span: Span) {
        if self.tx.try_send(Msg::Span(Box::new(span))).is_err() {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Checks an `--otlp-endpoint`: an `http://` base URL (the collector's OTLP/HTTP port, usually
/// 4318); spans go to `URL/v1/traces`, or to `URL` itself when it already ends so.
pub fn traces_url(endpoint: &str) -> Result<String, String> {
    let e = endpoint.trim();
    if e.starts_with("https://") {
        return Err(format!(
            "--otlp-endpoint {endpoint:?}: https is not supported; send to a collector on \
             http:// (an OpenTelemetry Collector next to the host, which forwards over TLS)"
        ));
    }
    let rest = e.strip_prefix("http://").ok_or_else(|| {
        format!("--otlp-endpoint {endpoint:?}: give an http:// URL, e.g. http://127.0.0.1:4318")
    })?;
    let e = e.trim_end_matches('/');
    if rest.is_empty() || rest.starts_with('/') {
        return Err(format!(
            "--otlp-endpoint {endpoint:?}: the URL names no host"
        ));
    }
    Ok(if e.ends_with("/v1/traces") {
        e.to_string()
    } else {
        format!("{e}/v1/traces")
    })
}

/// Starts exporting spans to `endpoint` ([`traces_url`]) as service `baton`, instance
/// `host_id` of `cluster`. Once per process.
#[cfg(feature = "otlp")]
pub fn start(endpoint: &str, host_id: &str, cluster: &str) -> Result<(), String> {
    let url = traces_url(endpoint)?;
    let resource = json!({
        "attributes": attributes(
            [
                ("service.name", &Attr::from("baton")),
                ("service.version", &Attr::from(env!("CARGO_PKG_VERSION"))),
                ("service.instance.id", &Attr::from(host_id)),
                ("baton.cluster", &Attr::from(cluster)),
            ]
            .into_iter()
        ),
    });
    let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
    EXPORTER
        .set(Exporter { tx })
        .map_err(|_| "the OTLP exporter is already running".to_string())?;
    std::thread::Builder::new()
        .name("otlp-export".into())
        .spawn(move || export_loop(&url, &resource, rx))
        .map_err(|e| format!("starting the OTLP exporter: {e}"))?;
    tracing::info!(url = %traces_url(endpoint)?, "exporting traces over OTLP/HTTP");
    Ok(())
}

/// Without the `otlp` feature: refuses.
#[cfg(not(feature = "otlp"))]
pub fn start(endpoint: &str, _host_id: &str, _cluster: &str) -> Result<(), String> {
    traces_url(endpoint)?;
    Err("this baton was built without trace export (cargo feature `otlp`)".into())
}

/// Sends the spans made so far and waits (up to `timeout`) until the collector answered.
pub fn flush(timeout: Duration) {
    if let Some(e) = EXPORTER.get() {
        let (tx, rx) = std::sync::mpsc::channel();
        if e.tx.send(Msg::Flush(tx)).is_ok() {
            let _ = rx.recv_timeout(timeout);
        }
    }
}

#[cfg(feature = "otlp")]
fn export_loop(url: &str, resource: &Value, rx: std::sync::mpsc::Receiver<Msg>) {
    use std::sync::mpsc::RecvTimeoutError;
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("OTLP exporter: {e}");
            return;
        }
    };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default();
    let mut spans: Vec<Span> = Vec::new();
    let mut oldest: Option<Instant> = None;
    let mut warned: Option<Instant> = None;
    loop {
        let wait = oldest.map_or(FLUSH_EVERY, |t| FLUSH_EVERY.saturating_sub(t.elapsed()));
        let mut done: Option<std::sync::mpsc::Sender<()>> = None;
        let mut closed = false;
        match rx.recv_timeout(wait) {
            Ok(Msg::Span(s)) => {
                oldest.get_or_insert_with(Instant::now);
                spans.push(*s);
            }
            Ok(Msg::Flush(tx)) => done = Some(tx),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => closed = true,
        }
        let due = oldest.is_some_and(|t| t.elapsed() >= FLUSH_EVERY);
        if !spans.is_empty() && (due || spans.len() >= BATCH || done.is_some() || closed) {
            for chunk in spans.chunks(BATCH) {
                let body = json!({"resourceSpans": [{
                    "resource": resource,
                    "scopeSpans": [{
                        "scope": {"name": "baton", "version": env!("CARGO_PKG_VERSION")},
                        "spans": chunk.iter().map(Span::to_json).collect::<Vec<_>>(),
                    }],
                }]});
                let sent = rt.block_on(async {
                    let r = client.post(url).json(&body).send().await?;
                    r.error_for_status()
                });
                match sent {
                    Ok(_) => {
                        EXPORTED.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    }
                    Err(e) => {
                        DROPPED.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                        if warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                            warned = Some(Instant::now());
                            tracing::warn!(
                                %url, dropped = dropped(),
                                "OTLP export failed: {e}; spans are dropped until it answers"
                            );
                        }
                    }
                }
            }
            spans.clear();
            oldest = None;
        }
        if let Some(tx) = done {
            let _ = tx.send(());
        }
        if closed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_checked_and_end_in_v1_traces() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://c:4318/v1/traces/").unwrap(),
            "http://c:4318/v1/traces"
        );
        assert!(traces_url("https://c:4318").unwrap_err().contains("https"));
        assert!(traces_url("c:4318").unwrap_err().contains("http://"));
        assert!(traces_url("http://").unwrap_err().contains("no host"));
    }

    #[test]
    fn spans_encode_as_otlp_json_with_their_parent_and_attributes() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(5);
        let root = Span::root("move", t0, t1).attr("partition", "wc-0");
        let child = root
            .child("move.answered", t0, t0 + Duration::from_millis(2))
            .attr("records", 7u64)
            .error("late");
        let (r, c) = (root.to_json(), child.to_json());
        assert_eq!(r["traceId"], c["traceId"]);
        assert_eq!(r["traceId"].as_str().unwrap().len(), 32);
        assert_eq!(c["parentSpanId"], r["spanId"]);
        assert!(r.get("parentSpanId").is_none());
        assert_ne!(r["spanId"], c["spanId"]);
        let ns = |v: &Value| v.as_str().unwrap().parse::<u64>().unwrap();
        assert_eq!(
            ns(&r["endTimeUnixNano"]) - ns(&r["startTimeUnixNano"]),
            5_000_000
        );
        assert_eq!(
            r["attributes"][0],
            json!({"key": "partition", "value": {"stringValue": "wc-0"}})
        );
        assert_eq!(
            c["attributes"][0],
            json!({"key": "records", "value": {"intValue": "7"}})
        );
        assert_eq!(c["status"], json!({"code": 2, "message": "late"}));
        assert_eq!(r["status"], json!({"code": 1}));
    }
}
