//! Helpers of baton's integration tests: plugin paths, a host in-process or as a child process,
//! an HTTP client, and waiting on conditions with deadlines.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

pub mod nemesis;

/// The path of a plugin's component: `plugins/NAME`, a Rust crate or a Python module (NAME
/// starts with `python-`) built by this crate's build script, or a JavaScript, C or Go project
/// (`js-`, `c-`, `go-`) built by `baton build`.
pub fn plugin(name: &str) -> PathBuf {
    if name.starts_with("python-") {
        return Path::new(env!("BATON_PYTHON_PLUGIN_DIR")).join(format!("{name}.wasm"));
    }
    if ["js-", "c-", "go-"].iter().any(|p| name.starts_with(p)) {
        return built_plugin(name);
    }
    Path::new(env!("BATON_PLUGIN_DIR")).join(format!("{}.wasm", name.replace('-', "_")))
}

/// A JavaScript, C or Go plugin (`plugins/<name>`), built by `baton build` the first time a test
/// process asks for it (the build itself is skipped when the component is newer than its
/// sources): these need the `baton` binary, which the tests' build script cannot run.
fn built_plugin(name: &str) -> PathBuf {
    type Once = Arc<std::sync::OnceLock<PathBuf>>;
    static BUILT: std::sync::Mutex<BTreeMap<String, Once>> = std::sync::Mutex::new(BTreeMap::new());
    let once = BUILT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(name.to_string())
        .or_default()
        .clone();
    once.get_or_init(|| build_plugin(name)).clone()
}

/// Runs `cmd` with `stdin` on its standard input; returns (success, stdout as JSON or null,
/// stderr): how the tests call the `baton` CLI.
pub fn run_cli(cmd: &mut Command, stdin: &str) -> Result<(bool, Value, String)> {
    use std::io::Write as _;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(stdin.as_bytes())?;
    let out = child.wait_with_output()?;
    Ok((
        out.status.success(),
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn build_plugin(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins")
        .join(name);
    let out = std::process::Command::new(baton_bin())
        .arg("build")
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| panic!("running baton build for {name}: {e}"));
    assert!(
        out.status.success(),
        "baton build {}: {}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let path = PathBuf::from(
        String::from_utf8_lossy(&out.stdout)
            .split('\t')
            .next()
            .unwrap_or_default()
            .trim(),
    );
    assert!(
        path.exists(),
        "baton build {name} printed {}",
        path.display()
    );
    path
}

/// A record timestamp for tests whose records go through Kafka: a day ago, rounded down to the
/// hour (so that windows align as with a constant), the same for the whole test process.
/// Records with timestamps older than the broker's retention (7 days) are deleted as soon as
/// their segment rolls, which it does at once for such timestamps: a fixed date in the past
/// makes a test's input or output vanish at a time that depends on the broker's retention check.
pub fn recent_base() -> i64 {
    static BASE: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| (baton::control::now_ms() - 86_400_000) / 3_600_000 * 3_600_000)
}

/// The bytes of a plugin's component.
pub fn plugin_bytes(name: &str) -> Vec<u8> {
    std::fs::read(plugin(name)).unwrap_or_else(|e| panic!("{}: {e}", plugin(name).display()))
}

/// Waits until every count of `store` in `pipeline` is the expected one.
pub async fn wait_counts(
    api: &Api,
    pipeline: &str,
    store: &str,
    expected: &BTreeMap<String, i64>,
    timeout: Duration,
) -> Result<()> {
    wait_for(&format!("the counts of {pipeline}"), timeout, || async {
        for (key, n) in expected {
            if api.counter(pipeline, store, key).await? != Some(*n) {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await
}

/// Waits until `f` returns `Some`, polling every 20 ms, failing after `timeout` with `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match f().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}; last error: {last_err:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// (id, owner, epoch) of every partition, as one host shows the partition table.
pub async fn partition_table(api: &Api) -> Result<Vec<(String, String, u64)>> {
    Ok(api
        .partitions()
        .await?
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap_or_default().to_string(),
                p["owner"].as_str().unwrap_or_default().to_string(),
                p["epoch"].as_u64().unwrap_or(0),
            )
        })
        .collect())
}

/// Every owner each partition was shown with at each epoch, over a whole test: a partition
/// shown with two owners at one epoch, by any host at any time, fails the test. Shared by
/// reference, so that what each poll of a wait sees is kept.
#[derive(Debug, Default)]
pub struct Owners(std::sync::Mutex<BTreeMap<(String, u64), String>>);

impl Owners {
    /// Adds `views` (partition tables) to what was seen; panics on a second owner.
    pub fn record(&self, views: &[Vec<(String, String, u64)>]) {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for view in views {
            for (id, owner, epoch) in view {
                let before = seen
                    .entry((id.clone(), *epoch))
                    .or_insert_with(|| owner.clone());
                assert_eq!(before, owner, "{id} at epoch {epoch} shown with two owners");
            }
        }
    }

    /// Reads the partition table of every host in `apis` and records it.
    pub async fn check(&self, apis: &[Api]) -> Result<()> {
        let mut views = Vec::with_capacity(apis.len());
        for api in apis {
            views.push(partition_table(api).await?);
        }
        self.record(&views);
        Ok(())
    }
}

/// The count of `key` in store `counts` of pipeline `wc`, asked of one host: it reads the
/// slots it owns and asks the owners of the others.
pub async fn count_at(api: &Api, key: &str) -> Result<Option<i64>> {
    api.counter("wc", "counts", key).await
}

/// Asserts every count of store `counts` of `pipeline` against `expected`, asked of `api`.
pub async fn assert_counts(
    api: &Api,
    pipeline: &str,
    expected: &BTreeMap<String, i64>,
) -> Result<()> {
    for (key, n) in expected {
        assert_eq!(
            api.counter(pipeline, "counts", key).await?,
            Some(*n),
            "count of {key} in {pipeline}"
        );
    }
    Ok(())
}

/// A client of one host's HTTP API.
#[derive(Clone)]
pub struct Api {
    /// `http://127.0.0.1:PORT`
    pub base: String,
    http: reqwest::Client,
}

/// A status and JSON body.
#[derive(Debug)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Parsed body (Null when empty or not JSON).
    pub body: Value,
    /// The host that ran a call that runs on the controller (`x-baton-handled-by`).
    pub handled_by: Option<String>,
}

impl Reply {
    /// The `error` message of an error reply.
    pub fn error(&self) -> String {
        self.body["error"].as_str().unwrap_or_default().to_string()
    }
}

impl Api {
    /// A client of `base`.
    pub fn new(base: impl Into<String>) -> Self {
        Api {
            base: base.into(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("client"),
        }
    }

    async fn reply(r: reqwest::Response) -> Result<Reply> {
        let status = r.status().as_u16();
        let handled_by = r
            .headers()
            .get("x-baton-handled-by")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = r.text().await?;
        Ok(Reply {
            status,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
            handled_by,
        })
    }

    /// A client of `base` that sends `Authorization: Bearer <token>` with every request.
    pub fn with_token(base: impl Into<String>, token: &str) -> Self {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {token}").parse().expect("a header value"),
        );
        Api {
            base: base.into(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .default_headers(headers)
                .build()
                .expect("client"),
        }
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// GET a path.
    pub async fn get(&self, path: &str) -> Result<Reply> {
        Self::reply(self.http.get(format!("{}{path}", self.base)).send().await?).await
    }

    /// POST JSON.
    pub async fn post_json(&self, path: &str, body: &Value) -> Result<Reply> {
        self.send_with_token(reqwest::Method::POST, path, Some(body), None)
            .await
    }

    /// A request with a bearer token (`None`: without).
    pub async fn send_with_token(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        token: Option<&str>,
    ) -> Result<Reply> {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.json(b);
        }
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        Self::reply(req.send().await?).await
    }

    /// GET a text body (e.g. /metrics).
    pub async fn get_text(&self, path: &str) -> Result<(u16, String)> {
        let r = self.http.get(format!("{}{path}", self.base)).send().await?;
        Ok((r.status().as_u16(), r.text().await?))
    }

    /// PUT JSON.
    pub async fn put_json(&self, path: &str, body: &Value) -> Result<Reply> {
        self.send_with_token(reqwest::Method::PUT, path, Some(body), None)
            .await
    }

    /// POST raw bytes.
    pub async fn post_bytes(&self, path: &str, body: Vec<u8>, content_type: &str) -> Result<Reply> {
        Self::reply(
            self.http
                .post(format!("{}{path}", self.base))
                .header("content-type", content_type)
                .body(body)
                .send()
                .await?,
        )
        .await
    }

    /// Uploads a plugin as `name`/`version`; panics unless it is accepted.
    pub async fn upload_plugin(
        &self,
        plugin_name: &str,
        name: &str,
        version: &str,
    ) -> Result<Value> {
        let r = self
            .post_bytes(
                &format!("/api/v1/modules?name={name}&version={version}"),
                plugin_bytes(plugin_name),
                "application/wasm",
            )
            .await?;
        if r.status != 201 {
            bail!("upload of {plugin_name}: {} {}", r.status, r.body);
        }
        Ok(r.body)
    }

    /// Uploads raw component bytes as `name`/`version`; fails unless they are accepted.
    pub async fn upload_bytes(&self, bytes: Vec<u8>, name: &str, version: &str) -> Result<Value> {
        let r = self
            .post_bytes(
                &format!("/api/v1/modules?name={name}&version={version}"),
                bytes,
                "application/wasm",
            )
            .await?;
        if r.status != 201 {
            bail!("upload of {name} {version}: {} {}", r.status, r.body);
        }
        Ok(r.body)
    }

    /// Creates a pipeline; fails unless it is created.
    pub async fn create_pipeline(&self, spec: Value) -> Result<Value> {
        let r = self.post_json("/api/v1/pipelines", &spec).await?;
        if r.status != 201 {
            bail!("create pipeline: {} {}", r.status, r.body);
        }
        Ok(r.body)
    }

    /// Produces `(key, value)` records; returns `(slot, offset)` per record.
    pub async fn produce(
        &self,
        topic: &str,
        records: &[(String, Option<String>)],
    ) -> Result<Vec<(u32, u64)>> {
        let body: Vec<Value> = records
            .iter()
            .map(|(k, v)| json!({"key": k, "value": v}))
            .collect();
        let r = self
            .post_json(
                &format!("/api/v1/topics/{topic}/records"),
                &Value::Array(body),
            )
            .await?;
        if r.status != 200 {
            bail!("produce: {} {}", r.status, r.body);
        }
        let arr = r.body.as_array().context("produce reply is not an array")?;
        Ok(arr
            .iter()
            .map(|v| {
                (
                    v["slot"].as_u64().unwrap_or(0) as u32,
                    v["offset"].as_u64().unwrap_or(0),
                )
            })
            .collect())
    }

    /// Records dead-lettered by every partition of the host since it started.
    pub async fn dead_letters(&self) -> Result<u64> {
        Ok(self
            .partitions()
            .await?
            .iter()
            .map(|p| p["dead_letters"].as_u64().unwrap_or(0))
            .sum())
    }

    /// The partition table.
    pub async fn partitions(&self) -> Result<Vec<Value>> {
        let r = self.get("/api/v1/partitions").await?;
        Ok(r.body.as_array().cloned().unwrap_or_default())
    }

    /// Partition `id`'s row of the partition table, as this host shows it.
    pub async fn partition(&self, id: &str) -> Result<Value> {
        self.partitions()
            .await?
            .into_iter()
            .find(|p| p["id"] == id)
            .ok_or_else(|| anyhow::anyhow!("no partition {id}"))
    }

    /// Waits until every partition of `pipeline` has processed all of its input (lag 0), the
    /// total processed offset reaches `at_least`, and the pipeline is quiescent: the same
    /// offsets and record counts twice, 300 ms apart, so that a late duplicate is not missed by
    /// the counts checked next. Fails early if a partition failed.
    pub async fn wait_caught_up(
        &self,
        pipeline: &str,
        at_least: u64,
        timeout: Duration,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let first = self.caught_up_snapshot(pipeline, at_least, left).await?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            let left = deadline.saturating_duration_since(Instant::now());
            let second = self.caught_up_snapshot(pipeline, at_least, left).await?;
            if first == second {
                return Ok(());
            }
        }
    }

    /// Once caught up: each partition's offsets and records.
    async fn caught_up_snapshot(
        &self,
        pipeline: &str,
        at_least: u64,
        timeout: Duration,
    ) -> Result<Vec<Value>> {
        // What the partitions last showed, for the error of a timeout.
        let last = std::sync::Mutex::new(Value::Null);
        let waited = wait_for(
            &format!("pipeline {pipeline} to process {at_least} records"),
            timeout,
            || async {
                let parts = self.partitions().await?;
                let mine: Vec<_> = parts.iter().filter(|p| p["pipeline"] == pipeline).collect();
                *last.lock().unwrap() = json!(mine);
                if mine.is_empty() {
                    return Ok(None);
                }
                if let Some(f) = mine.iter().find(|p| p["state"] == "failed") {
                    bail!("partition {} failed: {}", f["id"], f["error"]);
                }
                let mut done = 0;
                for p in &mine {
                    for o in p["offsets"].as_array().into_iter().flatten() {
                        let (off, end) = (
                            o["offset"].as_u64().unwrap_or(0),
                            o["end"].as_u64().unwrap_or(0),
                        );
                        if off < end {
                            return Ok(None);
                        }
                        done += off;
                    }
                }
                let snapshot = mine
                    .iter()
                    .map(|p| json!([p["id"], p["offsets"], p["records"], p["dead_letters"]]))
                    .collect();
                Ok((done >= at_least).then_some(snapshot))
            },
        )
        .await;
        let last = last.into_inner().unwrap();
        waited.with_context(|| format!("the partitions last showed: {last}"))
    }

    /// The lookup answer for `key` in `store`, or `None` when the key is missing (404). A 503
    /// (a partition restoring or moving) is asked again, for up to 30 s.
    pub async fn lookup(&self, pipeline: &str, store: &str, key: &str) -> Result<Option<Value>> {
        let path = format!("/api/v1/pipelines/{pipeline}/stores/{store}/keys/{key}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = self.get(&path).await?;
            match r.status {
                404 => return Ok(None),
                200 => return Ok(Some(r.body)),
                503 if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                s => bail!("lookup {key}: {s} {}", r.body),
            }
        }
    }

    /// The counter of `key` in `store`, or `None` when the key is missing (404); a 503 is
    /// asked again as by [`Api::lookup`].
    pub async fn counter(&self, pipeline: &str, store: &str, key: &str) -> Result<Option<i64>> {
        match self.lookup(pipeline, store, key).await? {
            None => Ok(None),
            Some(body) => Ok(Some(
                body["value_i64"].as_i64().context("value_i64 missing")?,
            )),
        }
    }

    /// Every record of `topic` (all slots) as (slot, offset, key, value, headers).
    pub async fn read_topic(&self, topic: &str, slots: u32) -> Result<Vec<TopicRecord>> {
        let mut out = Vec::new();
        for slot in 0..slots {
            let mut offset = 0;
            loop {
                let r = self
                    .get(&format!(
                        "/api/v1/topics/{topic}/records?slot={slot}&offset={offset}&limit=10000"
                    ))
                    .await?;
                if r.status != 200 {
                    bail!("read {topic}/{slot}: {} {}", r.status, r.body);
                }
                let recs = r.body["records"].as_array().cloned().unwrap_or_default();
                if recs.is_empty() {
                    break;
                }
                for rec in &recs {
                    let mut headers = BTreeMap::new();
                    for h in rec["headers"].as_array().into_iter().flatten() {
                        headers.insert(
                            h["key"].as_str().unwrap_or_default().to_string(),
                            h["value"].as_str().unwrap_or_default().to_string(),
                        );
                    }
                    out.push(TopicRecord {
                        slot,
                        offset: rec["offset"].as_u64().unwrap_or(0),
                        key: rec["key"].as_str().map(str::to_string),
                        value: rec["value"].as_str().map(str::to_string),
                        headers,
                    });
                }
                offset = r.body["next_offset"]
                    .as_u64()
                    .unwrap_or(offset + recs.len() as u64);
            }
        }
        Ok(out)
    }
}

/// A record read back from a topic.
#[derive(Debug, Clone)]
pub struct TopicRecord {
    /// Slot.
    pub slot: u32,
    /// Offset.
    pub offset: u64,
    /// Key as text.
    pub key: Option<String>,
    /// Value as text.
    pub value: Option<String>,
    /// Headers as text.
    pub headers: BTreeMap<String, String>,
}

/// A host running in this process with its HTTP server on 127.0.0.1.
pub struct InProcess {
    /// The host.
    pub baton: Arc<baton::Baton>,
    /// Its API.
    pub api: Api,
    server: tokio::task::JoinHandle<()>,
}

impl InProcess {
    /// Opens a host on `dir` (embedded log) and serves its API on a free loopback port.
    pub async fn start(dir: &Path) -> Result<Self> {
        Self::start_with(dir, None).await
    }

    /// Opens a host on `dir`, on Kafka when `kafka` names a bootstrap server.
    pub async fn start_with(dir: &Path, kafka: Option<&str>) -> Result<Self> {
        Self::start_configured(dir, kafka, |_| {}).await
    }

    /// Like [`InProcess::start_with`], with a last word on the host's config.
    pub async fn start_configured(
        dir: &Path,
        kafka: Option<&str>,
        configure: impl FnOnce(&mut baton::HostConfig),
    ) -> Result<Self> {
        // BATON_TEST_LOG=info shows the in-process host's log.
        if let Ok(filter) = std::env::var("BATON_TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_test_writer()
                .try_init();
        }
        let mut cfg = baton::HostConfig::new(dir);
        cfg.state_memory = 64 << 20;
        cfg.kafka = kafka.map(|b| baton::transport::kafka::KafkaConfig::new(b.to_string()));
        // Hosts of different tests share the broker, not a cluster.
        cfg.cluster = cluster_name(dir);
        configure(&mut cfg);
        let baton = tokio::task::spawn_blocking(move || baton::Baton::open(cfg)).await??;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        baton.set_address(&format!("http://{addr}"));
        let router = baton::http::router(baton.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(InProcess {
            baton,
            api: Api::new(format!("http://{addr}")),
            server,
        })
    }

    /// Stops the server and the host (partitions stop at a batch boundary).
    pub async fn stop(self) -> Result<()> {
        self.server.abort();
        let _ = self.server.await;
        let baton = self.baton;
        tokio::task::spawn_blocking(move || {
            baton.shutdown();
            drop(baton);
        })
        .await?;
        Ok(())
    }
}

/// The `baton` binary of this build (`BATON_BIN` overrides).
pub fn baton_bin() -> PathBuf {
    if let Ok(p) = std::env::var("BATON_BIN") {
        return p.into();
    }
    // The test binary lives in <target>/<profile>/deps; the baton binary in <target>/<profile>.
    let exe = std::env::current_exe().expect("current exe");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("profile dir")
        .join("baton");
    assert!(
        bin.exists(),
        "{} is missing: build it first (cargo build --release -p baton)",
        bin.display()
    );
    bin
}

/// A `baton run` child process.
pub struct ChildHost {
    child: Child,
    /// Its API.
    pub api: Api,
}

impl ChildHost {
    /// Starts `baton run` on `dir` with a free port and extra flags; returns once it answers.
    pub async fn start(dir: &Path, extra: &[&str]) -> Result<Self> {
        Self::start_in(dir, &cluster_name(dir), extra).await
    }

    /// Like [`ChildHost::start`], in the cluster `cluster`.
    pub async fn start_in(dir: &Path, cluster: &str, extra: &[&str]) -> Result<Self> {
        Self::start_sized(dir, cluster, "64MiB", extra).await
    }

    /// Like [`ChildHost::start_in`], with `--state-memory state_memory`.
    pub async fn start_sized(
        dir: &Path,
        cluster: &str,
        state_memory: &str,
        extra: &[&str],
    ) -> Result<Self> {
        Self::start_with(dir, cluster, state_memory, extra, &[]).await
    }

    /// Like [`ChildHost::start_sized`], with environment variables `env` set for the process
    /// (holds and faults of `baton::steps::STEPS_ENV`, say).
    pub async fn start_with(
        dir: &Path,
        cluster: &str,
        state_memory: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self> {
        let addr_file = dir.join("baton.addr");
        let _ = std::fs::remove_file(&addr_file);
        std::fs::create_dir_all(dir)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("baton.log"))?;
        let child = Command::new(baton_bin())
            .args([
                "run",
                "--http",
                "127.0.0.1:0",
                "--state-memory",
                state_memory,
                "--data-dir",
            ])
            .arg(dir)
            .args(["--cluster", cluster])
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("spawning baton")?;
        let mut host = ChildHost {
            child,
            api: Api::new("http://127.0.0.1:1"),
        };
        let addr = wait_for(
            "baton to write its address",
            Duration::from_secs(60),
            || {
                let f = addr_file.clone();
                let exited = host.child.try_wait().ok().flatten();
                async move {
                    if let Some(status) = exited {
                        bail!("baton exited with {status}");
                    }
                    Ok(std::fs::read_to_string(&f).ok().filter(|s| !s.is_empty()))
                }
            },
        )
        .await
        .with_context(|| {
            format!(
                "log: {}",
                std::fs::read_to_string(dir.join("baton.log")).unwrap_or_default()
            )
        })?;
        host.api = Api::new(format!("http://{addr}"));
        let api = host.api.clone();
        wait_for("baton to answer /healthz", Duration::from_secs(30), || {
            let api = api.clone();
            async move {
                Ok(api
                    .get("/healthz")
                    .await
                    .ok()
                    .filter(|r| r.status == 200)
                    .map(|_| ()))
            }
        })
        .await?;
        Ok(host)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `kill -9`.
    pub fn kill9(mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// Sends signal `sig` (as `kill` takes it: `-STOP`, `-CONT`) to the process.
    pub fn signal(&self, sig: &str) -> Result<()> {
        let pid = self.child.id().to_string();
        let status = Command::new("kill").args([sig, &pid]).status()?;
        if !status.success() {
            bail!("kill {sig} {pid}: {status}");
        }
        Ok(())
    }

    /// SIGTERM and wait for a clean exit.
    pub fn terminate(mut self) -> Result<()> {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status()?;
        let status = self.child.wait()?;
        if !status.success() {
            bail!("baton exited with {status}");
        }
        Ok(())
    }
}

impl Drop for ChildHost {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A deterministic stream of word keys with a skewed distribution, for word-count tests.
pub fn words(n: usize, vocabulary: usize, seed: u64) -> Vec<String> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Square the uniform draw to skew towards small ids (some words are hot).
            let u = (x % 1_000_000) as f64 / 1_000_000.0;
            format!("w{}", ((u * u) * vocabulary as f64) as usize)
        })
        .collect()
}

/// A record per key of `keys`, each with the value `x`, for `Baton::produce`.
pub fn keyed_records(keys: &[String]) -> Vec<baton::http::model::ProduceRecord> {
    keys.iter()
        .map(|k| baton::http::model::ProduceRecord {
            key: Some(k.clone().into_bytes()),
            value: Some(b"x".to_vec()),
            headers: vec![],
            timestamp: None,
        })
        .collect()
}

/// Counts of each key.
pub fn count<'a>(keys: impl IntoIterator<Item = &'a str>) -> BTreeMap<String, i64> {
    let mut m = BTreeMap::new();
    for k in keys {
        *m.entry(k.to_string()).or_insert(0) += 1;
    }
    m
}

/// The broker of the test run (`BATON_KAFKA`, default 127.0.0.1:9092).
pub fn kafka_bootstrap() -> String {
    std::env::var("BATON_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

fn kafka_rw() -> &'static tokio::sync::RwLock<()> {
    static LOCK: std::sync::OnceLock<tokio::sync::RwLock<()>> = std::sync::OnceLock::new();
    LOCK.get_or_init(|| tokio::sync::RwLock::new(()))
}

/// The shared broker to this test alone: for the test that restarts the broker, and for those
/// with several hosts, kills or a rate to measure, which must not share two cores with another
/// such test.
pub async fn kafka_lock() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    kafka_rw().write().await
}

/// The shared broker with other light tests (one host, no kill, no rate measured): never while
/// a [`kafka_lock`] test runs (the broker may restart), but beside each other.
pub async fn kafka_shared() -> tokio::sync::RwLockReadGuard<'static, ()> {
    kafka_rw().read().await
}

/// A name no earlier run used on the same broker.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{}", std::process::id(), nanos % 1_000_000_000)
}

/// An in-process host on Kafka, `id` in `cluster`, with the tests' 6 s session.
pub async fn member(dir: &Path, cluster: &str, id: &str) -> Result<InProcess> {
    let (cluster, id) = (cluster.to_string(), id.to_string());
    InProcess::start_configured(dir, Some(&kafka_bootstrap()), move |c| {
        c.cluster = cluster;
        c.host_id = Some(id);
        c.session_timeout = Duration::from_secs(6);
    })
    .await
}

/// A `baton run` process on Kafka, host `id` of `cluster`, with the tests' 6 s session: the
/// process counterpart of [`member`].
pub async fn child_member(dir: &Path, cluster: &str, id: &str) -> Result<ChildHost> {
    child_member_with(dir, cluster, id, &[]).await
}

/// [`child_member`] with environment variables `env` set for the process.
pub async fn child_member_with(
    dir: &Path,
    cluster: &str,
    id: &str,
    env: &[(&str, &str)],
) -> Result<ChildHost> {
    child_member_on(dir, cluster, id, &kafka_bootstrap(), &[], env).await
}

/// A `baton` process on `dir`, member `id` of `cluster` on the brokers at `bootstrap`, with a
/// session timeout of 6 s, `--state-memory 64MiB`, the flags `extra` and the environment
/// variables `env`.
pub async fn child_member_on(
    dir: &Path,
    cluster: &str,
    id: &str,
    bootstrap: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Result<ChildHost> {
    let mut flags = vec![
        "--kafka",
        bootstrap,
        "--host-id",
        id,
        "--session-timeout",
        "6s",
    ];
    flags.extend_from_slice(extra);
    ChildHost::start_with(dir, cluster, "64MiB", &flags, env).await
}

/// Like [`child_member`], with holds and faults set by `baton::steps::STEPS_ENV` to `steps`;
/// each hold reached is a line `STEP KEY` of the file `dir/steps.reached`.
pub async fn child_member_held(
    dir: &Path,
    cluster: &str,
    id: &str,
    steps: &str,
) -> Result<ChildHost> {
    let reached = dir.join("steps.reached");
    let reached = reached.to_string_lossy();
    let env = [
        (baton::steps::STEPS_ENV, steps),
        (baton::steps::STEPS_LOG_ENV, &reached),
    ];
    child_member_with(dir, cluster, id, &env).await
}

/// Waits (up to `timeout`) until the host started by [`child_member_held`] on `dir` reached
/// the hold of `step` for `key`.
pub async fn wait_held(dir: &Path, step: &str, key: &str, timeout: Duration) -> Result<()> {
    let file = dir.join("steps.reached");
    let line = format!("{step} {key}");
    wait_for(&format!("the host held at {line}"), timeout, || {
        let found = std::fs::read_to_string(&file)
            .map(|s| s.lines().any(|l| l == line))
            .unwrap_or(false);
        async move { Ok(found.then_some(())) }
    })
    .await
}

/// Waits (up to 30 s) until `api` lists a host for which `matches` holds; `what` names it.
pub async fn wait_host(api: &Api, what: &str, matches: impl Fn(&Value) -> bool) -> Result<()> {
    wait_for(what, Duration::from_secs(30), || async {
        let hosts = api.get("/api/v1/hosts").await?.body;
        let found = hosts.as_array().into_iter().flatten().any(&matches);
        Ok(found.then_some(()))
    })
    .await
}

/// Waits (up to 60 s) until `api` shows `n` live hosts.
pub async fn wait_alive(api: &Api, n: usize) -> Result<()> {
    wait_for(
        &format!("{n} live hosts"),
        Duration::from_secs(60),
        || async {
            let r = api.get("/api/v1/hosts").await?;
            let alive = r
                .body
                .as_array()
                .into_iter()
                .flatten()
                .filter(|h| h["alive"] == true)
                .count();
            Ok((alive == n).then_some(()))
        },
    )
    .await
}

/// A producer of test input on Kafka: idempotent, patient across broker restarts, and placing
/// each record in slot murmur2(key) mod slots like any Kafka client with the default
/// partitioner of the Java client.
pub struct TestProducer {
    producer: rdkafka::producer::FutureProducer,
}

impl TestProducer {
    /// A producer for the test broker.
    pub fn new() -> Result<Self> {
        let producer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", kafka_bootstrap())
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", "300000")
            .set("linger.ms", "5")
            .create()?;
        Ok(TestProducer { producer })
    }

    /// Sends records and waits for every acknowledgement.
    pub async fn send(&self, topic: &str, slots: u32, records: &[(String, String)]) -> Result<()> {
        self.send_placed(topic, Some(slots), records).await
    }

    /// Sends records placed by librdkafka's own default partitioner (`consistent_random`: CRC32
    /// of the key), as Python, Go, C and .NET clients place them.
    pub async fn send_librdkafka_default(
        &self,
        topic: &str,
        records: &[(String, String)],
    ) -> Result<()> {
        self.send_placed(topic, None, records).await
    }

    /// Sends `(key, value, timestamp)` records placed by murmur2 like [`TestProducer::send`].
    pub async fn send_timed(
        &self,
        topic: &str,
        slots: u32,
        records: &[(String, String, i64)],
    ) -> Result<()> {
        let timed: Vec<_> = records
            .iter()
            .map(|(k, v, t)| ((k.clone(), v.clone()), Some(*t)))
            .collect();
        self.send_records(topic, Some(slots), &timed).await
    }

    async fn send_placed(
        &self,
        topic: &str,
        murmur2_slots: Option<u32>,
        records: &[(String, String)],
    ) -> Result<()> {
        let untimed: Vec<_> = records.iter().map(|kv| (kv.clone(), None)).collect();
        self.send_records(topic, murmur2_slots, &untimed).await
    }

    async fn send_records(
        &self,
        topic: &str,
        murmur2_slots: Option<u32>,
        records: &[((String, String), Option<i64>)],
    ) -> Result<()> {
        use rdkafka::producer::FutureRecord;
        let mut futures = Vec::with_capacity(records.len());
        for ((k, v), timestamp) in records {
            let mut rec = FutureRecord::to(topic)
                .key(k.as_bytes())
                .payload(v.as_bytes());
            if let Some(t) = timestamp {
                rec = rec.timestamp(*t);
            }
            if let Some(slots) = murmur2_slots {
                rec = rec.partition(baton::transport::partitioner::partition_for_key(
                    k.as_bytes(),
                    slots,
                ) as i32);
            }
            // Enqueue now (send_result), wait for the acknowledgements after.
            loop {
                match self.producer.send_result(rec) {
                    Ok(f) => break futures.push(f),
                    Err((
                        rdkafka::error::KafkaError::MessageProduction(
                            rdkafka::types::RDKafkaErrorCode::QueueFull,
                        ),
                        back,
                    )) => {
                        rec = back;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err((e, _)) => bail!("producing to {topic}: {e}"),
                }
            }
        }
        for f in futures {
            f.await?
                .map_err(|(e, _)| anyhow::anyhow!("producing to {topic}: {e}"))?;
        }
        Ok(())
    }
}

/// Every committed record of `topic` on the test broker as (key, value), read with
/// isolation.level=read_committed.
pub fn read_committed(topic: &str, partitions: u32) -> Result<Vec<(String, String)>> {
    let text = |b: Option<Vec<u8>>| String::from_utf8_lossy(&b.unwrap_or_default()).into_owned();
    Ok(read_committed_raw(topic, partitions)?
        .into_iter()
        .map(|(_, k, v)| (text(k), text(v)))
        .collect())
}

/// Every committed record of `topic` on the test broker as (partition, key, value) bytes, read
/// with isolation.level=read_committed.
pub fn read_committed_raw(topic: &str, partitions: u32) -> Result<Vec<RawRecord>> {
    use baton::transport::Transport;
    let t = baton::transport::kafka::KafkaTransport::connect(
        baton::transport::kafka::KafkaConfig::new(kafka_bootstrap()),
    )?;
    let mut out = Vec::new();
    for p in 0..partitions {
        let end = t.end_offset(topic, p)?;
        let mut offset = 0;
        while offset < end {
            let recs = t.read(topic, p, offset, 10_000)?;
            let Some(last) = recs.last() else { break };
            offset = last.offset + 1;
            out.extend(recs.into_iter().map(|r| (p, r.record.key, r.record.value)));
        }
    }
    Ok(out)
}

/// The end offsets of partitions `0..partitions` of `topic` on the test broker (for committed
/// reads).
pub fn end_offsets(topic: &str, partitions: u32) -> Result<Vec<u64>> {
    use baton::transport::Transport;
    let t = baton::transport::kafka::KafkaTransport::connect(
        baton::transport::kafka::KafkaConfig::new(kafka_bootstrap()),
    )?;
    (0..partitions)
        .map(|p| Ok(t.end_offset(topic, p)?))
        .collect()
}

/// A record as [`read_committed_raw`] gives it: partition, key, value.
pub type RawRecord = (u32, Option<Vec<u8>>, Option<Vec<u8>>);

/// Runs `scripts/kafka ARG` (start, stop) of this checkout.
pub fn kafka_script(arg: &str) -> Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/kafka");
    let status = Command::new("bash").arg(script).arg(arg).status()?;
    if !status.success() {
        bail!("scripts/kafka {arg} failed: {status}");
    }
    Ok(())
}

/// The committed offsets of `group` for each partition of `topic` (0 where none).
pub fn group_offsets(group: &str, topic: &str, partitions: u32) -> Result<Vec<u64>> {
    Ok(
        group_offsets_on(&kafka_bootstrap(), group, topic, partitions)?
            .into_iter()
            .map(Option::unwrap_or_default)
            .collect(),
    )
}

/// The cluster name of a test host: derived from its data dir, so that a restarted host on the
/// same dir rejoins its cluster and hosts of other tests never see it.
pub fn cluster_name(dir: &Path) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    dir.hash(&mut h);
    format!("test-{:016x}", h.finish())
}

/// `bytes` (a component) with a custom section appended: the same code under another sha256, a
/// new version for hot-swap tests whose counts must stay exact.
pub fn with_custom_section(mut bytes: Vec<u8>, name: &str, payload: &[u8]) -> Vec<u8> {
    fn leb(out: &mut Vec<u8>, mut n: usize) {
        loop {
            let b = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }
    let mut body = Vec::new();
    leb(&mut body, name.len());
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(payload);
    bytes.push(0);
    leb(&mut bytes, body.len());
    bytes.extend_from_slice(&body);
    bytes
}

/// The SCRAM user of [`OwnBroker::start_secured`].
pub const SCRAM_USER: &str = "baton";
/// Its password.
pub const SCRAM_PASSWORD: &str = "baton-secret-0f3c";

/// A broker of a test's own, beside the shared one: its own port, data dir and settings (e.g. a
/// short `offsets.retention.minutes`). Stopped and deleted when dropped.
pub struct OwnBroker {
    run: tempfile::TempDir,
    port: u16,
    controller_port: u16,
    sasl_ssl_port: Option<u16>,
}

impl OwnBroker {
    /// Starts a broker on 127.0.0.1:`port` (its controller on `port + 1`) with `extra` lines in
    /// its server.properties; returns once it answers.
    pub fn start(port: u16, extra: &[&str]) -> Result<Self> {
        let broker = OwnBroker {
            run: tempfile::tempdir()?,
            port,
            controller_port: port + 1,
            sasl_ssl_port: None,
        };
        broker.script("start", extra)?;
        Ok(broker)
    }

    /// Like [`OwnBroker::start`], with a SASL_SSL listener on `port + 2` as `scripts/kafka`
    /// makes it (`KAFKA_SASL_SSL_PORT`): TLS with a keytool certificate for 127.0.0.1 and
    /// SCRAM-SHA-512 with the user [`SCRAM_USER`] and the password [`SCRAM_PASSWORD`].
    pub fn start_secured(port: u16) -> Result<Self> {
        let broker = OwnBroker {
            run: tempfile::tempdir()?,
            port,
            controller_port: port + 1,
            sasl_ssl_port: Some(port + 2),
        };
        broker.script("start", &[])?;
        Ok(broker)
    }

    /// `127.0.0.1:PORT` of the SASL_SSL listener.
    pub fn secured_bootstrap(&self) -> Option<String> {
        self.sasl_ssl_port.map(|p| format!("127.0.0.1:{p}"))
    }

    /// The certificate clients trust for the SASL_SSL listener (PEM).
    pub fn ca_pem(&self) -> PathBuf {
        self.run.path().join("tls/ca.pem")
    }

    /// `127.0.0.1:PORT`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn script(&self, arg: &str, extra: &[&str]) -> Result<()> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/kafka");
        let status = Command::new("bash")
            .arg(script)
            .arg(arg)
            .env("KAFKA_RUN", self.run.path())
            .env("KAFKA_PORT", self.port.to_string())
            .env("KAFKA_CONTROLLER_PORT", self.controller_port.to_string())
            .env("KAFKA_EXTRA_PROPS", extra.join("\n"))
            .env(
                "KAFKA_SASL_SSL_PORT",
                self.sasl_ssl_port
                    .map(|p| p.to_string())
                    .unwrap_or_default(),
            )
            .env("KAFKA_SCRAM_USER", SCRAM_USER)
            .env("KAFKA_SCRAM_PASSWORD", SCRAM_PASSWORD)
            .status()?;
        if !status.success() {
            bail!("scripts/kafka {arg} (port {}) failed: {status}", self.port);
        }
        Ok(())
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        let _ = self.script("stop", &[]);
    }
}

/// The committed offsets of `group` for each partition of `topic` on `bootstrap` (`None` where
/// the group has none).
pub fn group_offsets_on(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: u32,
) -> Result<Vec<Option<u64>>> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p as i32);
    }
    let got = consumer.committed_offsets(tpl, Duration::from_secs(30))?;
    Ok((0..partitions)
        .map(
            |p| match got.find_partition(topic, p as i32).map(|e| e.offset()) {
                Some(rdkafka::Offset::Offset(o)) if o >= 0 => Some(o as u64),
                _ => None,
            },
        )
        .collect())
}

/// The seed of a test's random choices (kill timings): `BATON_TEST_SEED` to replay a failure,
/// else new each run. Printed, so that a failing run's seed is in its output.
pub fn test_seed(test: &str) -> u64 {
    let seed = std::env::var("BATON_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("{test}: BATON_TEST_SEED={seed}");
    seed
}

/// A delay in `[min, max)` drawn from `seed` for `round`: the moment of a kill.
pub fn random_delay(seed: u64, round: u64, min: Duration, max: Duration) -> Duration {
    let mut x = seed ^ round.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for _ in 0..4 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    let span = (max - min).as_millis().max(1) as u64;
    min + Duration::from_millis(x % span)
}

/// Waits a random moment (10 to 400 ms, drawn from `seed` for `round`), then kills `host` with
/// `kill -9`, printing when and in what state, so that a failure can be replayed.
pub async fn kill9_at_random(
    host: ChildHost,
    seed: u64,
    round: u64,
    processed: u64,
    waiting: u64,
) -> Result<()> {
    let delay = random_delay(
        seed,
        round,
        Duration::from_millis(10),
        Duration::from_millis(400),
    );
    tokio::time::sleep(delay).await;
    eprintln!(
        "kill -9 #{round}: {delay:?} after {processed} records processed with {waiting} waiting \
         (seed {seed})"
    );
    host.kill9()
}

/// Helpers of the per-record benchmarks (`wasm_call`, `languages`).
pub mod bench {
    use std::sync::Arc;

    use baton::runtime::{HostCtx, Message};
    use baton::state::PartitionDb;

    /// Batch `round` of `n` word-count records over 10,000 keys, in slot 0.
    pub fn word_batch(n: usize, round: u64) -> Vec<Message> {
        (0..n)
            .map(|i| Message {
                topic: "words".into(),
                slot: 0,
                offset: round * n as u64 + i as u64,
                timestamp: 0,
                key: Some(format!("key-{:08}", (round as usize * n + i) % 10_000).into_bytes()),
                value: Some(b"x".to_vec()),
                headers: vec![],
            })
            .collect()
    }

    /// A host context over `db`, as a partition's instance gets, with `memory` bytes of guest
    /// memory.
    pub fn host_ctx(db: &Arc<PartitionDb>, memory: usize) -> HostCtx {
        HostCtx::new(
            "bench".into(),
            db.clone(),
            Arc::new(baton::runtime::WriteLimits::default()),
            memory,
            Default::default(),
        )
    }
}

/// Threads of this process named `name` (Linux keeps the first 15 bytes of a thread's name).
pub fn threads_named(name: &str) -> anyhow::Result<usize> {
    let mut n = 0;
    for task in std::fs::read_dir("/proc/self/task")? {
        // A thread that ended between the listing and the read is not counted.
        if let Ok(comm) = std::fs::read_to_string(task?.path().join("comm"))
            && comm.trim_end() == name
        {
            n += 1;
        }
    }
    Ok(n)
}

/// An embedded host on `dir` running word-count as pipeline `name` on input `{name}-in`, with
/// `slots` slots in `partitions` partitions.
pub async fn word_count_host(
    dir: &Path,
    name: &str,
    slots: u32,
    partitions: u32,
) -> Result<InProcess> {
    let host = InProcess::start(dir).await?;
    host.api
        .upload_plugin("word-count", "word-count", "1")
        .await?;
    host.api
        .create_pipeline(serde_json::json!({
            "name": name, "module": "word-count", "version": "1",
            "inputs": [format!("{name}-in")], "stores": ["counts"], "slots": slots,
            "partitions": partitions
        }))
        .await?;
    Ok(host)
}

/// An S3-compatible server of a test's own on 127.0.0.1 (moto's standalone server, installed
/// from PyPI by `scripts/setup`), with one bucket. Stopped when dropped.
pub struct S3Server {
    child: std::process::Child,
    /// Its base URL, `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// The bucket made at start.
    pub bucket: String,
}

impl S3Server {
    /// Starts the server on a free port and makes `bucket`; returns once it answers.
    pub async fn start(bucket: &str) -> Result<Self> {
        let cache = std::env::var("BATON_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|_| {
                PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/baton")
            });
        let bin = cache.join("py/bin/moto_server");
        anyhow::ensure!(
            bin.exists(),
            "{} is missing: run scripts/setup",
            bin.display()
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = tempfile::tempfile()?;
        let child = Command::new(bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("spawning moto_server")?;
        let server = S3Server {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            bucket: bucket.to_string(),
        };
        let client = reqwest::Client::new();
        let url = format!("{}/{bucket}", server.endpoint);
        wait_for(
            "the S3 server to make the bucket",
            Duration::from_secs(60),
            || {
                let (client, url) = (client.clone(), url.clone());
                async move {
                    Ok(match client.put(&url).send().await {
                        Ok(r) if r.status().is_success() => Some(()),
                        _ => None,
                    })
                }
            },
        )
        .await?;
        Ok(server)
    }

    /// The environment a `baton` host reaches it with, as the `object_store` crate reads it.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT", self.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "baton-test".into()),
            ("AWS_SECRET_ACCESS_KEY", "baton-test-secret".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// The keys of the objects under `prefix` in the bucket.
    pub async fn keys(&self, prefix: &str) -> Result<Vec<String>> {
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut url = format!(
                "{}/{}?list-type=2&prefix={prefix}",
                self.endpoint, self.bucket
            );
            if let Some(t) = &token {
                url.push_str(&format!("&continuation-token={t}"));
            }
            let body = reqwest::get(&url).await?.text().await?;
            let tag = |name: &str| -> Vec<String> {
                body.split(&format!("<{name}>"))
                    .skip(1)
                    .filter_map(|s| s.split(&format!("</{name}>")).next())
                    .map(str::to_string)
                    .collect()
            };
            keys.extend(tag("Key"));
            token = tag("NextContinuationToken").into_iter().next();
            if token.is_none() {
                return Ok(keys);
            }
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
