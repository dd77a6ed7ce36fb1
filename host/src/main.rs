//! The `baton` binary: `baton run` is a host; the other subcommands are clients of a host's
//! HTTP API (`--url`, `--token`).

mod cli;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use baton::config::{FileConfig, KafkaSettings, parse_kafka_config, parse_key_value, parse_size};
use baton::transport::kafka::KafkaConfig;
use baton::{Baton, HostConfig};

/// jemalloc, for Rust and (unprefixed) for RocksDB and librdkafka: the partition loop allocates
/// and frees many small buffers per record (keys, values, messages) across threads, where
/// glibc's allocator spent a fifth of the host's CPU. mimalloc was as fast, but its per-thread
/// pages kept the 64-partition memory test's RSS over its bound.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read when it starts (`MALLOC_CONF` in the environment still overrides
/// them): freed pages go back to the system within about 100 ms, from a background thread, not
/// from the threads that free them. A host at millions of keys frees a few hundred MB a second
/// (fetched records, blocks read by compactions, memtables flushed), and freed pages stay
/// resident for about half the decay time: its default of 10 s kept 90-110 MiB of them, 1 s
/// still about 100 MiB with four busy partitions, over the `--state-memory` bound; at 300 ms
/// four partitions of 12.5M keys peaked 6 MiB over the bound plus 256 MiB.
#[allow(unsafe_code)] // a symbol jemalloc looks up by name: nothing else sets its defaults
#[unsafe(export_name = "malloc_conf")]
static MALLOC_CONF: MallocConf =
    MallocConf(c"background_thread:true,dirty_decay_ms:100,muzzy_decay_ms:0".as_ptr());

/// A C string jemalloc reads: a `const char *`.
#[repr(transparent)]
struct MallocConf(*const std::ffi::c_char);

// SAFETY: it points to a string literal, never written.
#[allow(unsafe_code)]
unsafe impl Sync for MallocConf {}

/// `baton --version`: the host's version and the contracts it serves
/// (`baton::runtime::WIT_VERSIONS`; a test keeps them equal).
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (contracts baton:processor@0.2.0, baton:processor@0.1.0)"
);

#[derive(Parser)]
#[command(
    name = "baton",
    version = LONG_VERSION,
    about = "A host for stateful stream processors written as WebAssembly components"
)]
struct Cli {
    #[command(flatten)]
    conn: cli::Connection,
    /// How log lines are written to stderr: `text`, for people, or `json`, one object per line
    /// (timestamp, level, target, fields, spans) for log collectors.
    #[arg(
        long,
        env = "BATON_LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs a host: the API and dashboard, and every pipeline's partitions.
    Run(Box<RunArgs>),
    /// Runs a component over records from a file, locally: no broker, no host process.
    /// Prints the guest's logs, its outputs and dead letters (with the trap's backtrace and the
    /// record), then the final state, as JSON lines; exits non-zero when the state differs
    /// from --expect.
    TestPlugin(TestPluginArgs),
    /// Creates a processor's project: source, build setup, a sample input with the state it
    /// must leave, and a test script.
    New {
        /// The language: rust, js, python, c or go.
        #[arg(long, default_value = "rust")]
        lang: String,
        /// baton's guest-sdk directory: the Rust SDK, with those of the other languages in
        /// `js/`, `python/`, `c/` and `go/`, and the WIT beside it in `../wit` [default: the
        /// guest-sdk this baton was built from].
        #[arg(long)]
        sdk: Option<PathBuf>,
        /// The new directory; its name is the processor's.
        name: PathBuf,
    },
    /// Builds the processor in DIR (default: here) and prints its component's path, size and
    /// contract version, tab-separated.
    Build {
        /// The project.
        #[arg(default_value = ".")]
        dir: PathBuf,
    },
    /// Makes a core WebAssembly module (C or Go, built for wasm32-wasip1) into a processor
    /// component: embeds the contract's WIT (world `processor`) and adapts WASI preview 1
    /// imports. Prints the component's path, size and contract version, tab-separated.
    Componentize {
        /// The core module.
        core: PathBuf,
        /// The component to write.
        #[arg(short, long)]
        output: PathBuf,
        /// A WIT directory to use instead of the contract this baton was built with.
        #[arg(long)]
        wit: Option<PathBuf>,
    },
    /// Writes the contract's WIT files (baton:processor@0.2.0) into DIR, for bindings
    /// generators.
    Wit {
        /// Where to write them.
        dir: PathBuf,
    },
    /// Client commands: calls to a host's HTTP API.
    #[command(flatten)]
    Client(cli::Call),
}

#[derive(clap::Args)]
struct TestPluginArgs {
    /// The component (.wasm).
    component: PathBuf,
    /// Input records, one JSON object per line: {"key", "value", "key_base64"?,
    /// "value_base64"?, "timestamp", "headers"?, "slot"?}; without a slot, murmur2 of the key.
    #[arg(long)]
    input: PathBuf,
    /// Expected final state, one {"store", "slot", "key", "value_base64"} per line.
    #[arg(long)]
    expect: Option<PathBuf>,
    /// A config entry for `init`, key=value (repeatable).
    #[arg(long = "config", value_parser = parse_key_value)]
    config: Vec<(String, String)>,
    /// Slots of the input [default: 1].
    #[arg(long, default_value_t = 1)]
    slots: u32,
    /// A store the processor opens (repeatable); the stores named in --expect are opened too.
    #[arg(long = "store")]
    stores: Vec<String>,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Config file (TOML); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where the log, state and modules live [default: ./baton-data].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address of the API and dashboard [default: 127.0.0.1:8080]; port 0 picks a free one.
    #[arg(long)]
    http: Option<SocketAddr>,
    /// RocksDB memory shared by all partitions, e.g. 512MiB [default: 512MiB].
    #[arg(long)]
    state_memory: Option<String>,
    /// Disk the state of this host's partitions and replicas may take, e.g. 50GiB [default:
    /// no bound]: a warming replica or a standby that would break it is refused, with the reason.
    #[arg(long)]
    state_disk: Option<String>,
    /// Most records per committed batch [default: 8192].
    #[arg(long)]
    max_batch: Option<usize>,
    /// Most records per guest call [default: 512].
    #[arg(long)]
    max_call: Option<usize>,
    /// Kafka bootstrap servers, e.g. 127.0.0.1:9092; without it baton runs on the embedded log.
    #[arg(long)]
    kafka: Option<String>,
    /// Cluster name: the control log is `<cluster>.control` [default: baton].
    #[arg(long)]
    cluster: Option<String>,
    /// This host's id in the cluster [default: one made up on first start and kept in the data
    /// dir's `host-id`].
    #[arg(long)]
    host_id: Option<String>,
    /// The base URL other hosts and clients reach this host's API at [default: the address of
    /// --http].
    #[arg(long)]
    advertise: Option<String>,
    /// How long a host may go without a heartbeat before the cluster counts it gone, e.g. 10s
    /// or 6000ms [default: 10s]; Kafka's group session timeout (the broker allows 6s to 300s by
    /// default).
    #[arg(long)]
    session_timeout: Option<String>,
    /// On SIGTERM, how long this host may take to move its partitions to the live hosts, warm
    /// and at batch boundaries, before it stops the rest and gives them away cold [default:
    /// 60s].
    #[arg(long)]
    handoff_timeout: Option<String>,
    /// A librdkafka setting for every client, key=value, or @FILE, a properties file of them
    /// (repeatable). Settings baton sets itself (group.id, transactional.id, isolation.level,
    /// ...) are refused.
    #[arg(long = "kafka-config", value_parser = parse_kafka_config)]
    kafka_config: Vec<KafkaSettings>,
    /// Replication factor of the topics baton creates [default: the broker's
    /// default.replication.factor].
    #[arg(long)]
    replication_factor: Option<u16>,
    /// min.insync.replicas of baton's own topics (changelogs, control log, modules, dead
    /// letters) [default: min(2, replication factor)].
    #[arg(long)]
    min_insync_replicas: Option<u16>,
    /// Export traces (spans of batches, commits and each step of a move) over OTLP/HTTP to
    /// this collector, e.g. http://127.0.0.1:4318 (spans go to URL/v1/traces).
    #[arg(long, env = "BATON_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// Where partitions are checkpointed: a directory, or s3://BUCKET/PREFIX (configured by
    /// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT, AWS_ALLOW_HTTP)
    /// [default: DATA_DIR/checkpoints]. With a store all hosts share, a host that takes a
    /// partition over restores it from its newest checkpoint, then the changelog's tail.
    #[arg(long, env = "BATON_CHECKPOINTS")]
    checkpoints: Option<String>,
    /// Checkpoints kept per partition; older ones and the files only they hold are deleted
    /// [default: 3].
    #[arg(long)]
    checkpoint_retain: Option<usize>,
}

/// The format of log lines (`--log-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BATON_LOG")
                .unwrap_or_else(|_| "info,wasmtime=warn,cranelift_codegen=warn".into()),
        )
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().with_current_span(false).init(),
    }
    let call = match cli.command {
        // `--token` (or BATON_TOKEN) is what the host requires of mutating calls.
        Command::Run(args) => return run(*args, cli.conn.token),
        Command::TestPlugin(args) => return test_plugin(args),
        Command::New { lang, sdk, name } => {
            let sdk = sdk.unwrap_or_else(baton::scaffold::default_sdk);
            let files =
                baton::scaffold::new_project(&lang, &name, &sdk).map_err(anyhow::Error::msg)?;
            for f in files {
                println!("{}", f.display());
            }
            return Ok(());
        }
        Command::Wit { dir } => {
            baton::componentize::write_wit(&dir)
                .with_context(|| format!("writing the WIT into {}", dir.display()))?;
            return Ok(());
        }
        Command::Componentize { core, output, wit } => {
            let bytes = std::fs::read(&core).with_context(|| core.display().to_string())?;
            let component = baton::componentize::componentize(&bytes, wit.as_deref())
                .map_err(|e| anyhow::anyhow!("{}: {e}", core.display()))?;
            std::fs::write(&output, &component).with_context(|| output.display().to_string())?;
            return describe(&output);
        }
        Command::Build { dir } => {
            let wasm = baton::scaffold::build(&dir).map_err(anyhow::Error::msg)?;
            return describe(&wasm);
        }
        Command::Client(call) => call,
    };
    cli::run(cli.conn, call)
}

/// Prints a component's path, size and contract version, tab-separated, after compiling it into
/// the cache `baton test-plugin` reads (so that a large component compiles once).
fn describe(wasm: &std::path::Path) -> anyhow::Result<()> {
    let bytes = std::fs::read(wasm)?;
    let tmp = tempfile::tempdir()?;
    let cache = baton::local::compiled_cache().unwrap_or_else(|| tmp.path().to_path_buf());
    let runtime = baton::runtime::Runtime::new(cache)?;
    let module = runtime
        .load(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: {e}", wasm.display()))?;
    println!(
        "{}\t{} bytes\t{}",
        wasm.display(),
        bytes.len(),
        module.wit()
    );
    Ok(())
}

fn test_plugin(args: TestPluginArgs) -> anyhow::Result<()> {
    use baton::local;
    use std::io::Write as _;
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
    };
    let component = std::fs::read(&args.component)
        .with_context(|| format!("reading {}", args.component.display()))?;
    let input = local::parse_input(&read(&args.input)?).map_err(anyhow::Error::msg)?;
    let expect = match &args.expect {
        Some(p) => Some(local::parse_state(&read(p)?).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let mut stores = args.stores.clone();
    for e in expect.iter().flatten() {
        if !stores.contains(&e.store) {
            stores.push(e.store.clone());
        }
    }
    let spec = local::LocalRun {
        component,
        config: args.config,
        slots: args.slots,
        stores,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let outcome = local::run(&spec, &input, &mut |v| {
        let _ = writeln!(out, "{v}");
    })?;
    for e in &outcome.state {
        writeln!(out, "{}", serde_json::json!({ "state": e }))?;
    }
    out.flush()?;
    eprintln!(
        "{} records, {} failed, {} state entries",
        input.len(),
        outcome.failed,
        outcome.state.len()
    );
    if let Some(want) = expect {
        let diff = local::diff(&outcome.state, &want);
        if !diff.is_empty() {
            for d in &diff {
                eprintln!("{d}");
            }
            anyhow::bail!("the state differs from --expect in {} entries", diff.len());
        }
        eprintln!("the state matches --expect");
    }
    Ok(())
}

fn run(args: RunArgs, token: Option<String>) -> anyhow::Result<()> {
    let file = match &args.config {
        Some(p) => FileConfig::load(p).map_err(anyhow::Error::msg)?,
        None => FileConfig::default(),
    };
    let data_dir = args
        .data_dir
        .or(file.data_dir)
        .unwrap_or_else(|| PathBuf::from("baton-data"));
    let http = args
        .http
        .or(file.http)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)));
    let mut config = HostConfig::new(&data_dir);
    if let Some(d) = args.state_disk.or(file.state_disk) {
        config.state_disk =
            Some(parse_size(&d).map_err(|e| anyhow::anyhow!("--state-disk: {e}"))? as u64);
    }
    if let Some(m) = args.state_memory.or(file.state_memory) {
        config.state_memory = parse_size(&m).map_err(|e| anyhow::anyhow!("--state-memory: {e}"))?;
    }
    if let Some(n) = args.max_batch.or(file.max_batch) {
        anyhow::ensure!(n > 0, "--max-batch must be at least 1");
        config.task.max_batch = n;
    }
    if let Some(n) = args.max_call.or(file.max_call) {
        anyhow::ensure!(n > 0, "--max-call must be at least 1");
        config.task.max_call = n;
    }
    if let Some(t) = token.or(file.token) {
        anyhow::ensure!(!t.trim().is_empty(), "--token must not be empty");
        config.token = Some(t);
    }
    if let Some(c) = args.cluster.or(file.cluster) {
        config.cluster = c;
    }
    if let Some(id) = args.host_id.or(file.host_id) {
        baton::cluster::check_host_id(&id).map_err(|e| anyhow::anyhow!("--host-id: {e}"))?;
        config.host_id = Some(id);
    }
    if let Some(a) = args.advertise.or(file.advertise) {
        anyhow::ensure!(
            a.starts_with("http://") || a.starts_with("https://"),
            "--advertise {a:?}: give a base URL, e.g. http://10.0.0.5:8080"
        );
        config.advertise = Some(a.trim_end_matches('/').to_string());
    }
    if let Some(t) = args.handoff_timeout.or(file.handoff_timeout) {
        config.handoff_timeout = baton::config::parse_duration(&t)
            .map_err(|e| anyhow::anyhow!("--handoff-timeout: {e}"))?;
    }
    if let Some(t) = args.session_timeout.or(file.session_timeout) {
        config.session_timeout = baton::config::parse_duration(&t)
            .map_err(|e| anyhow::anyhow!("--session-timeout: {e}"))?;
    }
    if let Some(bootstrap) = args.kafka.or(file.kafka) {
        let mut settings: Vec<(String, String)> = file.kafka_config.into_iter().collect();
        settings.extend(args.kafka_config.into_iter().flat_map(|s| s.0));
        let kafka = KafkaConfig {
            bootstrap,
            settings,
            replication_factor: args.replication_factor.or(file.replication_factor),
            min_insync_replicas: args.min_insync_replicas.or(file.min_insync_replicas),
            input_stall: None,
            commit_hang: None,
        };
        kafka.check_settings()?;
        config.kafka = Some(kafka);
    } else {
        anyhow::ensure!(args.kafka_config.is_empty(), "--kafka-config needs --kafka");
        anyhow::ensure!(
            args.replication_factor.is_none() && args.min_insync_replicas.is_none(),
            "--replication-factor and --min-insync-replicas need --kafka"
        );
    }
    if let Some(c) = args.checkpoints.or(file.checkpoints) {
        anyhow::ensure!(!c.trim().is_empty(), "--checkpoints must not be empty");
        config.checkpoints = Some(c);
    }
    if let Some(n) = args.checkpoint_retain.or(file.checkpoint_retain) {
        anyhow::ensure!(n > 0, "--checkpoint-retain must be at least 1");
        config.checkpoint_retain = n;
    }
    let otlp = args.otlp_endpoint.or(file.otlp_endpoint);
    if let Some(e) = &otlp {
        baton::otlp::traces_url(e).map_err(anyhow::Error::msg)?;
    }
    let cluster = config.cluster.clone();
    let baton =
        Baton::open(config).with_context(|| format!("opening data dir {}", data_dir.display()))?;
    // One host per process here, so the heap jemalloc counts is this host's alone: its block
    // cache may give way to the rest of it (not in a process of several hosts, such as tests).
    baton::state::fit_cache_to_heap_in_background(baton.state_env());
    if let Some(e) = &otlp {
        baton::otlp::start(e, baton.host_id(), &cluster).map_err(anyhow::Error::msg)?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .build()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(http)
            .await
            .with_context(|| format!("binding {http}"))?;
        let addr = listener.local_addr()?;
        std::fs::write(data_dir.join("baton.addr"), addr.to_string())?;
        baton.set_address(&format!("http://{addr}"));
        tracing::info!("baton listening on http://{addr}");
        // On a signal the API keeps serving while the partitions move away: their new owners
        // call this host to drain them.
        let leaving = baton.clone();
        axum::serve(listener, baton::http::router(baton.clone()))
            .with_graceful_shutdown(async move {
                shutdown_signal().await;
                let _ = tokio::task::spawn_blocking(move || leaving.move_away()).await;
            })
            .await?;
        anyhow::Ok(())
    })?;
    baton.shutdown();
    // The last spans (the moves of the hand-off) reach the collector before the exit.
    baton::otlp::flush(std::time::Duration::from_secs(5));
    Ok(())
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
    tracing::info!("shutting down at the next batch boundary");
}
