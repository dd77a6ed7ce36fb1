//! `GET /api/v1/stream`: the dashboard's live view of the whole cluster, as Server-Sent Events.
//!
//! One [`Feed`] per host builds a snapshot at most four times a second, however many records
//! flow and however many pages watch: hosts with their load and RocksDB memory, every
//! partition (with its records/s and the last minute of them), the retired ones, pipelines,
//! modules, the balancer's decisions, and the events (guest logs, dead letters, swaps and
//! rollbacks) of every host. Each client gets a message when the snapshot changed, at most
//! [`MAX_PER_SECOND`] a second. A message carries the whole state, which replaces the last
//! one, and the events the client has not had yet: its id is `BOOT-N`, N the last event it
//! carries, so a client that reconnects with `Last-Event-ID` (or `?last_event_id=`, for a
//! page that switches to another host) gets only the events it missed.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use serde_json::{Value, json};

use super::AppState;

/// Most messages a client gets a second.
pub const MAX_PER_SECOND: u32 = 4;
/// How often the feed rebuilds its snapshot.
const TICK: Duration = Duration::from_millis(250);
/// How often the feed asks the other hosts for their events and memory.
const REMOTE_EVERY: Duration = Duration::from_secs(1);
/// Events kept for clients that reconnect.
const EVENTS_KEPT: usize = 500;
/// Points of a partition's records/s history (one a second).
const RATE_POINTS: usize = 60;
/// Balancer decisions sent.
const DECISIONS_SENT: usize = 50;
/// How soon a client whose connection broke tries again.
const RETRY: Duration = Duration::from_millis(1000);
/// A feed nobody watched for this long stops.
const IDLE_STOP: Duration = Duration::from_secs(10);

/// What the feed built last.
pub struct Built {
    /// The state, as JSON text without its events.
    state: String,
    /// The events kept, numbered by the feed, oldest first.
    events: VecDeque<(u64, Value)>,
    /// Bumped when the state or the events changed.
    version: u64,
    /// When the state was built.
    at: Instant,
}

impl Default for Built {
    fn default() -> Self {
        Built {
            state: String::new(),
            events: VecDeque::new(),
            version: 0,
            at: Instant::now(),
        }
    }
}

/// The snapshot builder shared by every client of a host.
pub struct Feed {
    boot: String,
    tx: tokio::sync::watch::Sender<Arc<Built>>,
    running: parking_lot::Mutex<bool>,
    /// The last event seq fetched per (host, pipeline): kept when the feed stops, so that a
    /// feed that starts again neither fetches nor numbers an event twice.
    after: Arc<parking_lot::Mutex<HashMap<String, u64>>>,
}

impl Feed {
    /// The feed of host `host`.
    pub fn new(host: &str) -> Self {
        // Unique per host and start, so that an id of another host or run is known as such.
        let boot = format!(
            "{host}.{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or(0)
        );
        Feed {
            boot,
            tx: tokio::sync::watch::channel(Arc::new(Built::default())).0,
            running: parking_lot::Mutex::new(false),
            after: Default::default(),
        }
    }
}

/// The query of `GET /api/v1/stream`.
#[derive(Debug, Default, serde::Deserialize)]
pub(super) struct StreamQuery {
    /// The id of the last message seen, for a client that cannot send `Last-Event-ID`.
    last_event_id: Option<String>,
}

/// The rates the feed measures per partition.
#[derive(Default)]
struct Rates {
    /// (when, records) samples of the last seconds, per partition.
    samples: HashMap<String, VecDeque<(Instant, u64)>>,
    /// A point a second, per partition.
    history: HashMap<String, VecDeque<f64>>,
    last_point: Option<Instant>,
}

impl Rates {
    /// Adds this tick's counts and answers each partition's records/s over the last second
    /// or so, with its history.
    fn observe(&mut self, rows: &[(String, u64)]) -> HashMap<String, (f64, Vec<f64>)> {
        let now = Instant::now();
        let point = self
            .last_point
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1));
        if point {
            self.last_point = Some(now);
        }
        let live: std::collections::HashSet<&str> =
            rows.iter().map(|(id, _)| id.as_str()).collect();
        self.samples.retain(|id, _| live.contains(id.as_str()));
        self.history.retain(|id, _| live.contains(id.as_str()));
        let mut out = HashMap::new();
        for (id, records) in rows {
            let s = self.samples.entry(id.clone()).or_default();
            // A partition that moved counts from 0 on its new owner.
            if s.back().is_some_and(|&(_, n)| n > *records) {
                s.clear();
            }
            s.push_back((now, *records));
            while s.len() > 2 && now.duration_since(s[1].0) >= Duration::from_millis(1000) {
                s.pop_front();
            }
            let (t0, n0) = s[0];
            let dt = now.duration_since(t0).as_secs_f64();
            let rate = if dt > 0.1 {
                (records - n0) as f64 / dt
            } else {
                0.0
            };
            let h = self.history.entry(id.clone()).or_default();
            if point || h.is_empty() {
                h.push_back(rate);
                while h.len() > RATE_POINTS {
                    h.pop_front();
                }
            }
            out.insert(id.clone(), (rate, h.iter().copied().collect()));
        }
        out
    }
}

/// What the feed knows of the other hosts.
#[derive(Default)]
struct Remote {
    /// Per host: its `/api/v1/host` answer.
    host: BTreeMap<String, Value>,
    /// The controller's balancer log.
    balancer: Vec<Value>,
    /// Events found and not yet numbered.
    pending: Vec<Value>,
    /// The last event seq fetched per event log, with `pending` in it.
    after: HashMap<String, u64>,
}

impl Feed {
    /// Starts building snapshots, unless it already does.
    fn ensure_running(self: &Arc<Self>, baton: &AppState) {
        let mut running = self.running.lock();
        if *running {
            return;
        }
        *running = true;
        let (feed, baton) = (self.clone(), baton.clone());
        tokio::spawn(async move {
            feed.run(baton).await;
        });
    }

    async fn run(self: Arc<Self>, baton: AppState) {
        let mut rates = Rates::default();
        let remote = Arc::new(parking_lot::Mutex::new(Remote::default()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // The other hosts answer in their own time: a slow one never holds a snapshot back.
        let poller = {
            let (remote, stop, baton) = (remote.clone(), stop.clone(), baton.clone());
            let mut after = self.after.lock().clone();
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let started = Instant::now();
                    let (host, balancer, found) = poll_hosts(&baton, &mut after).await;
                    {
                        // The events and how far they go, together: the feed keeps the second
                        // only with the first numbered.
                        let mut r = remote.lock();
                        r.host = host;
                        r.balancer = balancer;
                        r.pending.extend(found);
                        r.after = after.clone();
                    }
                    tokio::time::sleep(REMOTE_EVERY.saturating_sub(started.elapsed())).await;
                }
            })
        };
        // A feed that starts again goes on from what the last run built: its events, their
        // numbers and its version, so that ids clients hold stay meaningful.
        let (mut events, mut next_event, mut version) = {
            let last = self.tx.borrow();
            (
                last.events.clone(),
                last.events.back().map_or(1, |e| e.0 + 1),
                last.version,
            )
        };
        let mut idle_since: Option<Instant> = None;
        let mut last_state = String::new();
        let mut ticker = tokio::time::interval(TICK);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            if self.tx.receiver_count() == 0 {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() > IDLE_STOP {
                    let mut running = self.running.lock();
                    if self.tx.receiver_count() == 0 {
                        *running = false;
                        stop.store(true, std::sync::atomic::Ordering::Relaxed);
                        poller.abort();
                        // Events fetched since the last tick stay for the next run's clients
                        // (once a state was built for them to go with).
                        let (state, at) = {
                            let last = self.tx.borrow();
                            (last.state.clone(), last.at)
                        };
                        let mut r = remote.lock();
                        if !r.pending.is_empty() && !state.is_empty() {
                            for e in r.pending.drain(..) {
                                events.push_back((next_event, e));
                                next_event += 1;
                            }
                            while events.len() > EVENTS_KEPT {
                                events.pop_front();
                            }
                            *self.after.lock() = r.after.clone();
                            self.tx.send_replace(Arc::new(Built {
                                state,
                                events,
                                version: version + 1,
                                at,
                            }));
                        }
                        return;
                    }
                }
                continue;
            }
            idle_since = None;
            let b = baton.clone();
            let Ok(mut state) = tokio::task::spawn_blocking(move || local_state(&b)).await else {
                continue;
            };
            attach_rates(&mut state, &mut rates);
            let mut newest = events.back().map_or(0, |e| e.0);
            {
                let mut r = remote.lock();
                for e in r.pending.drain(..) {
                    events.push_back((next_event, e));
                    newest = next_event;
                    next_event += 1;
                }
                *self.after.lock() = r.after.clone();
                while events.len() > EVENTS_KEPT {
                    events.pop_front();
                }
                state["balancer"] = Value::Array(r.balancer.clone());
                if let Some(hosts) = state["hosts"].as_array_mut() {
                    for h in hosts {
                        let id = h["id"].as_str().unwrap_or_default().to_string();
                        if let Some(info) = r.host.get(&id) {
                            h["memory"] = info["state_memory"].clone();
                        }
                    }
                }
            }
            let text = state.to_string();
            let had = self.tx.borrow().events.back().map_or(0, |e| e.0);
            if text == last_state && newest == had {
                continue;
            }
            version += 1;
            last_state = text.clone();
            self.tx.send_replace(Arc::new(Built {
                state: text,
                events: events.clone(),
                version,
                at: Instant::now(),
            }));
        }
    }
}

/// This host's view of the cluster: every part of the snapshot that needs no other host.
fn local_state(baton: &AppState) -> Value {
    let mut memory = serde_json::to_value(baton.state_env().report()).unwrap_or(Value::Null);
    if let Some(m) = memory.as_object_mut() {
        m.remove("block_cache_pinned");
    }
    let mut hosts = serde_json::to_value(baton.hosts()).unwrap_or_else(|_| json!([]));
    if hosts.as_array().is_none_or(Vec::is_empty) {
        // The embedded log has no membership: this host is the cluster.
        hosts = json!([{
            "id": baton.host_id(), "address": "", "alive": true, "controller": true,
        }]);
    }
    if let Some(list) = hosts.as_array_mut() {
        for h in list {
            if h["id"] == baton.host_id() {
                h["memory"] = memory.clone();
                h["this"] = Value::Bool(true);
            }
        }
    }
    let (splits, merges) = baton.reshapes();
    json!({
        "host": baton.host_id(),
        "splits": splits,
        "merges": merges,
        "transport": baton.transport().kind(),
        "token_required": baton.config().token.is_some(),
        "hosts": hosts,
        "partitions": baton.partitions(),
        "retired": baton.retired_partitions(),
        "pipelines": baton.pipelines(),
        "modules": baton.modules(),
    })
}

/// Adds `records_per_s` and `rates` (the last minute, a point a second) to every partition.
fn attach_rates(state: &mut Value, rates: &mut Rates) {
    let Some(rows) = state["partitions"].as_array_mut() else {
        return;
    };
    let counts: Vec<(String, u64)> = rows
        .iter()
        .map(|p| {
            (
                format!(
                    "{}@{}",
                    p["id"].as_str().unwrap_or(""),
                    p["owner"].as_str().unwrap_or("")
                ),
                p["records"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let measured = rates.observe(&counts);
    for (row, (key, _)) in rows.iter_mut().zip(&counts) {
        if let Some((rate, history)) = measured.get(key) {
            row["records_per_s"] = json!((rate * 10.0).round() / 10.0);
            row["rates"] = json!(history.iter().map(|r| r.round()).collect::<Vec<_>>());
        }
    }
}

/// The name of one event log: a pipeline's on one host, from the host's start and the
/// pipeline's creation on (a host that restarts, or a pipeline made again, numbers its events
/// from 1 again).
fn log_name(host: &str, started: Option<i64>, pipeline: &str, created: i64) -> String {
    format!("{host}/{}/{pipeline}/{created}", started.unwrap_or(0))
}

/// Asks every live host (this one in-process) for its new events, and the others for their
/// memory; asks the controller for the balancer's log. `after` holds the last event seq seen
/// per event log ([`log_name`]); each event names its log as `log`.
async fn poll_hosts(
    baton: &AppState,
    after: &mut HashMap<String, u64>,
) -> (BTreeMap<String, Value>, Vec<Value>, Vec<Value>) {
    let mut host_info = BTreeMap::new();
    let balancer;
    let pipelines: Vec<(String, i64)> = baton
        .pipelines()
        .into_iter()
        .map(|p| (p.spec.name, p.created_at))
        .collect();
    let hosts = baton.hosts();
    let me = baton.host_id().to_string();
    let my_start = hosts
        .iter()
        .find(|h| h.id == me)
        .and_then(|h| h.started_at_ms);
    let mut found = Vec::new();
    // Logs of pipelines and hosts gone are forgotten.
    after.retain(|log, _| {
        hosts.iter().any(|h| log.starts_with(&format!("{}/", h.id)))
            && pipelines
                .iter()
                .any(|(p, c)| log.ends_with(&format!("/{p}/{c}")))
    });
    // This host's events.
    for (p, created) in &pipelines {
        let log = log_name(&me, my_start, p, *created);
        let since = after.get(&log).copied().unwrap_or(0);
        if let Ok(list) = baton.events(p, since, 200) {
            let list = list
                .iter()
                .map(|e| serde_json::to_value(e).unwrap_or(Value::Null))
                .collect();
            take(after, (&me, &log, p), list, &mut found);
        }
    }
    // The balancer's log lives on the controller.
    let controller = hosts.iter().find(|h| h.controller && h.alive);
    match controller {
        Some(c) if c.id != me && !c.address.is_empty() => {
            let v = get_json(&c.address, "/api/v1/balancer/log").await;
            balancer = tail(v.unwrap_or(Value::Null), DECISIONS_SENT);
        }
        _ => {
            let log = serde_json::to_value(baton.balancer_log()).unwrap_or(Value::Null);
            balancer = tail(log, DECISIONS_SENT);
        }
    }
    // The other hosts, at once.
    let others: Vec<_> = hosts
        .iter()
        .filter(|h| h.alive && h.id != me && !h.address.is_empty())
        .collect();
    let asks = others.iter().map(|h| {
        let pipelines = &pipelines;
        let after = &*after;
        async move {
            let info = get_json(&h.address, "/api/v1/host").await;
            let mut evs = Vec::new();
            for (p, created) in pipelines {
                let log = log_name(&h.id, h.started_at_ms, p, *created);
                let since = after.get(&log).copied().unwrap_or(0);
                let path = format!("/api/v1/pipelines/{p}/events?after={since}&limit=200");
                if let Some(Value::Array(list)) = get_json(&h.address, &path).await {
                    evs.push((p.clone(), log, list));
                }
            }
            (h.id.clone(), info, evs)
        }
    });
    let answers = futures_util::future::join_all(asks).await;
    for (id, info, evs) in answers {
        if let Some(info) = info {
            host_info.insert(id.clone(), info);
        }
        for (p, log, list) in evs {
            take(after, (&id, &log, &p), list, &mut found);
        }
    }
    found.sort_by_key(|e| e["at"].as_i64().unwrap_or(0));
    (host_info, balancer, found)
}

/// Adds the events `list` of log `log` (pipeline `p` on `host`) to `found`, naming where
/// they come from, and notes the last one's seq in `after`.
fn take(
    after: &mut HashMap<String, u64>,
    (host, log, p): (&str, &str, &str),
    list: Vec<Value>,
    found: &mut Vec<Value>,
) {
    for mut e in list {
        if let Some(seq) = e["seq"].as_u64() {
            after.insert(log.to_string(), seq);
        }
        e["host"] = json!(host);
        e["pipeline"] = json!(p);
        e["log"] = json!(log);
        found.push(e);
    }
}

fn tail(v: Value, n: usize) -> Vec<Value> {
    match v {
        Value::Array(mut a) => {
            let cut = a.len().saturating_sub(n);
            a.drain(..cut);
            a
        }
        _ => Vec::new(),
    }
}

/// GET `path` of the host at `address`, as JSON; `None` when it does not answer in time.
async fn get_json(address: &str, path: &str) -> Option<Value> {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    let client = CLIENT.get_or_init(reqwest::Client::new);
    let url = format!("{}{path}", address.trim_end_matches('/'));
    let resp = client
        .get(url)
        .timeout(Duration::from_millis(800))
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    resp.json().await.ok()
}

/// `GET /api/v1/stream`.
pub(super) async fn stream(
    State(baton): State<AppState>,
    axum::Extension(feed): axum::Extension<Arc<Feed>>,
    headers: HeaderMap,
    query: Result<Query<StreamQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<
    Sse<impl futures_util::Stream<Item = Result<SseEvent, std::convert::Infallible>>>,
    super::ApiError,
> {
    let Query(q) = query.map_err(|e| {
        super::ApiError::bad_request(format!("{}; use ?last_event_id=ID", e.body_text()))
    })?;
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or(q.last_event_id);
    // A client of this feed resumes after its last event; any other gets what is kept.
    let cursor = last
        .and_then(|id| {
            let (boot, n) = id.rsplit_once('-')?;
            (boot == feed.boot).then(|| n.parse::<u64>().ok())?
        })
        .unwrap_or(0);
    // Subscribed first: a feed about to stop for want of clients sees this one and goes on.
    let rx = feed.tx.subscribe();
    feed.ensure_running(&baton);
    let state = Client {
        rx,
        cursor,
        seen: 0,
        last_sent: None,
        boot: feed.boot.clone(),
    };
    let events = futures_util::stream::unfold(state, |mut c| async move {
        loop {
            // A state built over a second ago (by a feed that stopped) waits for a new one.
            let fresh = {
                let b = c.rx.borrow();
                b.version != 0 && b.at.elapsed() < Duration::from_secs(1)
            };
            if c.seen != 0 || !fresh {
                c.rx.changed().await.ok()?;
            }
            if let Some(t) = c.last_sent {
                let gap = Duration::from_secs(1) / MAX_PER_SECOND;
                let since = t.elapsed();
                if since < gap {
                    tokio::time::sleep(gap - since).await;
                }
            }
            let built = c.rx.borrow_and_update().clone();
            if built.version == c.seen {
                continue;
            }
            c.seen = built.version;
            c.last_sent = Some(Instant::now());
            let new: Vec<&Value> = built
                .events
                .iter()
                .filter(|(n, _)| *n > c.cursor)
                .map(|(_, e)| e)
                .collect();
            if let Some((n, _)) = built.events.back() {
                c.cursor = c.cursor.max(*n);
            }
            let data = format!(
                "{{\"state\":{},\"events\":{}}}",
                built.state,
                serde_json::to_string(&new).unwrap_or_else(|_| "[]".into())
            );
            let event = SseEvent::default()
                .event("snapshot")
                .retry(RETRY)
                .id(format!("{}-{}", c.boot, c.cursor))
                .data(data);
            return Some((Ok(event), c));
        }
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(10))))
}

struct Client {
    rx: tokio::sync::watch::Receiver<Arc<Built>>,
    cursor: u64,
    seen: u64,
    last_sent: Option<Instant>,
    boot: String,
}

/// `POST /api/v1/auth/check`: 204 when the bearer token is right (or none is needed); the
/// `auth` middleware answers 401 otherwise.
pub(super) async fn auth_check() -> axum::http::StatusCode {
    axum::http::StatusCode::NO_CONTENT
}

/// Lets a page served by one host of the cluster call another (the dashboard switches hosts
/// when its host dies): requests from the origin of a cluster host get CORS headers, and
/// preflights are answered here.
pub(super) async fn cors(
    State(baton): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::{HeaderValue, Method, StatusCode, header};
    use axum::response::IntoResponse;
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(|o| o.trim_end_matches('/').to_string());
    let allowed = origin.filter(|o| {
        baton
            .hosts()
            .iter()
            .any(|h| h.address.trim_end_matches('/') == o)
    });
    let Some(origin) = allowed else {
        return next.run(req).await;
    };
    let mut resp = if req.method() == Method::OPTIONS {
        StatusCode::NO_CONTENT.into_response()
    } else {
        next.run(req).await
    };
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&origin) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
    }
    h.insert(header::VARY, HeaderValue::from_static("Origin"));
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, PUT, PATCH, DELETE"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("authorization, content-type, last-event-id"),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    resp
}
