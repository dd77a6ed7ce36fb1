//! `baton` client subcommands: each is one or two calls to a host's HTTP API.

use std::io::BufRead as _;
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

/// Where the API is.
#[derive(Args, Clone)]
pub struct Connection {
    /// The host's API (client commands).
    #[arg(
        long,
        env = "BATON_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub url: String,
    /// Bearer token: what `baton run` requires of mutating calls, and what client commands
    /// send.
    #[arg(long, env = "BATON_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
}

/// `baton modules ...`
#[derive(Subcommand)]
pub enum Modules {
    /// Uploads a component as NAME/VERSION.
    Push {
        /// The component (.wasm).
        file: PathBuf,
        /// Module name.
        #[arg(long)]
        name: String,
        /// Version label.
        #[arg(long)]
        version: String,
    },
    /// Lists module versions.
    List,
    /// Deletes a module version (refused while a pipeline runs it).
    Delete {
        /// Module name.
        name: String,
        /// Version label.
        version: String,
    },
}

/// `baton pipelines ...`
#[derive(Subcommand)]
pub enum Pipelines {
    /// Creates a pipeline from a spec file (JSON or TOML; `-` reads JSON from stdin).
    Create {
        /// The spec.
        file: PathBuf,
    },
    /// Lists pipelines.
    List,
    /// Switches a pipeline to another version of its module (also a rollback).
    Swap {
        /// The pipeline.
        pipeline: String,
        /// The version to run.
        #[arg(long)]
        version: String,
    },
    /// Changes a running pipeline's limits, config, swap policy or WASI grants from a JSON
    /// file (`-` reads stdin), e.g. `{"limits": {"cpu_ms": 500}}`.
    Update {
        /// The pipeline.
        pipeline: String,
        /// The change.
        file: PathBuf,
    },
    /// Processes dead letters again through the current version, exactly once: all of them, or
    /// one slot's range.
    Replay {
        /// The pipeline.
        pipeline: String,
        /// Only this slot's dead letters.
        #[arg(long)]
        slot: Option<u32>,
        /// First offset (with --slot).
        #[arg(long)]
        from: Option<u64>,
        /// End offset, exclusive (with --slot).
        #[arg(long)]
        to: Option<u64>,
    },
    /// Deletes a pipeline; `--purge` deletes its state too and frees the name.
    Delete {
        /// The pipeline.
        pipeline: String,
        /// Also delete its changelogs, dead letters, consumer group and local state.
        #[arg(long)]
        purge: bool,
    },
}

/// What `baton partitions` does besides showing the table.
#[derive(Subcommand)]
pub enum PartitionsAction {
    /// Moves a partition to another host while it runs: the host warms up from the changelog,
    /// then takes over at a batch boundary. Answers the move's id at once; its progress shows
    /// in the partition's `moves`.
    Move {
        /// The partition's id (see `baton partitions`).
        id: String,
        /// The host id to move it to (see `baton hosts`).
        #[arg(long)]
        to: String,
    },
    /// Takes an incremental checkpoint of a partition now, on its owner, into the host's
    /// checkpoint store (`baton run --checkpoints`); what is pending commits first.
    Checkpoint {
        /// The partition's id (see `baton partitions`).
        id: String,
    },
    /// Lists a partition's retained checkpoints, oldest first, with their offsets and files.
    Checkpoints {
        /// The partition's id (see `baton partitions`).
        id: String,
    },
    /// Splits a partition in two while it runs, on its owner: answers the split, with the
    /// halves' ids and the pause, once the halves run.
    Split {
        /// The partition's id (see `baton partitions`).
        id: String,
        /// The first slot of the right half; by default, the slot that halves the load.
        #[arg(long)]
        at: Option<u32>,
    },
    /// Merges two adjacent partitions into one while they run, on the owner of the first (the
    /// other is moved there first when it runs elsewhere).
    Merge {
        /// One partition's id.
        left: String,
        /// The other's, adjacent to it.
        right: String,
    },
    /// Lists the partitions retired by splits and merges, with their history.
    Retired,
}

/// The client subcommands.
#[derive(Subcommand)]
pub enum Call {
    /// Uploads and lists modules.
    #[command(subcommand)]
    Modules(Modules),
    /// Creates, lists and hot-swaps pipelines.
    #[command(subcommand)]
    Pipelines(Pipelines),
    /// Shows the partition table (`baton partitions`), moves a partition live
    /// (`baton partitions move ID --to HOST`), splits one (`baton partitions split ID
    /// [--at SLOT]`), or checkpoints one (`baton partitions checkpoint ID`).
    Partitions {
        /// What to do; without one, the table is shown.
        #[command(subcommand)]
        action: Option<PartitionsAction>,
    },
    /// Lists the hosts of the cluster: alive, controller, load, last heartbeat.
    Hosts,
    /// Looks up one key of a pipeline's store.
    Get {
        /// Pipeline.
        pipeline: String,
        /// Store.
        store: String,
        /// Key (UTF-8).
        key: String,
    },
    /// Produces stdin's lines (`key<TAB>value`, or `key`) to a topic.
    Produce {
        /// Topic.
        topic: String,
    },
}

struct Client {
    http: reqwest::Client,
    conn: Connection,
}

impl Client {
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let url = format!("{}{path}", self.conn.url.trim_end_matches('/'));
        let req = self.http.request(method, url);
        match &self.conn.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// Sends and returns the JSON body, or fails with the API's error message.
    async fn send(&self, req: reqwest::RequestBuilder) -> anyhow::Result<Value> {
        let r = req
            .send()
            .await
            .with_context(|| format!("cannot reach baton at {}", self.conn.url))?;
        let status = r.status();
        let text = r.text().await?;
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if !status.is_success() {
            let msg = body["error"]
                .as_str()
                .map(str::to_string)
                .unwrap_or(body.to_string());
            bail!(
                "{} {}: {msg}",
                status.as_u16(),
                status.canonical_reason().unwrap_or("")
            );
        }
        Ok(body)
    }
}

/// Runs a client command and prints its answer as JSON.
pub fn run(conn: Connection, call: Call) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = Client {
        http: reqwest::Client::new(),
        conn,
    };
    let out = rt.block_on(call_api(&client, call))?;
    print_out(&format!("{}\n", serde_json::to_string_pretty(&out)?))
}

/// Writes `text` to stdout. A reader that stopped reading (`| head`) is not an error.
pub fn print_out(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

async fn call_api(c: &Client, call: Call) -> anyhow::Result<Value> {
    use reqwest::Method;
    match call {
        Call::Modules(Modules::Push {
            file,
            name,
            version,
        }) => {
            let bytes =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            c.send(
                c.request(Method::POST, "/api/v1/modules")
                    .query(&[("name", &name), ("version", &version)])
                    .header("content-type", "application/wasm")
                    .body(bytes),
            )
            .await
        }
        Call::Modules(Modules::List) => c.send(c.request(Method::GET, "/api/v1/modules")).await,
        Call::Modules(Modules::Delete { name, version }) => {
            c.send(c.request(Method::DELETE, &format!("/api/v1/modules/{name}/{version}")))
                .await
        }
        Call::Pipelines(Pipelines::Update { pipeline, file }) => {
            let text = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())?
            } else {
                std::fs::read_to_string(&file)
                    .with_context(|| format!("reading {}", file.display()))?
            };
            let patch: Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not valid JSON", file.display()))?;
            c.send(
                c.request(Method::PATCH, &format!("/api/v1/pipelines/{pipeline}"))
                    .json(&patch),
            )
            .await
        }
        Call::Pipelines(Pipelines::Replay {
            pipeline,
            slot,
            from,
            to,
        }) => {
            c.send(
                c.request(
                    Method::POST,
                    &format!("/api/v1/pipelines/{pipeline}/dead-letters/replay"),
                )
                .json(&json!({ "slot": slot, "from": from, "to": to })),
            )
            .await
        }
        Call::Pipelines(Pipelines::Delete { pipeline, purge }) => {
            c.send(
                c.request(Method::DELETE, &format!("/api/v1/pipelines/{pipeline}"))
                    .query(&[("purge", purge)]),
            )
            .await
        }
        Call::Pipelines(Pipelines::Create { file }) => {
            let text = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())?
            } else {
                std::fs::read_to_string(&file)
                    .with_context(|| format!("reading {}", file.display()))?
            };
            let spec: Value = if file.extension().is_some_and(|e| e == "toml") {
                let t: toml::Value = toml::from_str(&text)
                    .with_context(|| format!("{} is not valid TOML", file.display()))?;
                serde_json::to_value(t)?
            } else {
                serde_json::from_str(&text)
                    .with_context(|| format!("{} is not valid JSON", file.display()))?
            };
            c.send(c.request(Method::POST, "/api/v1/pipelines").json(&spec))
                .await
        }
        Call::Pipelines(Pipelines::List) => {
            c.send(c.request(Method::GET, "/api/v1/pipelines")).await
        }
        Call::Pipelines(Pipelines::Swap { pipeline, version }) => {
            c.send(
                c.request(Method::PUT, &format!("/api/v1/pipelines/{pipeline}/module"))
                    .json(&json!({ "version": version })),
            )
            .await
        }
        Call::Partitions { action: None } => {
            c.send(c.request(Method::GET, "/api/v1/partitions")).await
        }
        Call::Partitions {
            action: Some(PartitionsAction::Move { id, to }),
        } => {
            c.send(
                c.request(
                    Method::POST,
                    &format!("/api/v1/partitions/{}/move", encode_path(&id)),
                )
                .json(&json!({ "to": to })),
            )
            .await
        }
        Call::Partitions {
            action: Some(PartitionsAction::Checkpoint { id }),
        } => {
            c.send(c.request(
                Method::POST,
                &format!("/api/v1/partitions/{}/checkpoint", encode_path(&id)),
            ))
            .await
        }
        Call::Partitions {
            action: Some(PartitionsAction::Checkpoints { id }),
        } => {
            c.send(c.request(
                Method::GET,
                &format!("/api/v1/partitions/{}/checkpoints", encode_path(&id)),
            ))
            .await
        }
        Call::Partitions {
            action: Some(PartitionsAction::Split { id, at }),
        } => {
            let body = match at {
                Some(at) => json!({ "at": at }),
                None => json!({}),
            };
            c.send(
                c.request(
                    Method::POST,
                    &format!("/api/v1/partitions/{}/split", encode_path(&id)),
                )
                .json(&body),
            )
            .await
        }
        Call::Partitions {
            action: Some(PartitionsAction::Merge { left, right }),
        } => {
            c.send(
                c.request(Method::POST, "/api/v1/partitions/merge")
                    .json(&json!({ "left": left, "right": right })),
            )
            .await
        }
        Call::Partitions {
            action: Some(PartitionsAction::Retired),
        } => {
            c.send(c.request(Method::GET, "/api/v1/partitions?retired=true"))
                .await
        }
        Call::Hosts => c.send(c.request(Method::GET, "/api/v1/hosts")).await,
        Call::Get {
            pipeline,
            store,
            key,
        } => {
            c.send(c.request(
                Method::GET,
                &format!(
                    "/api/v1/pipelines/{pipeline}/stores/{store}/keys/{}",
                    encode_path(&key)
                ),
            ))
            .await
        }
        Call::Produce { topic } => {
            let mut produced = 0usize;
            let mut batch = Vec::new();
            let stdin = std::io::stdin();
            let mut lines = stdin.lock().lines();
            loop {
                let line = lines.next().transpose()?;
                if let Some(l) = &line {
                    let (k, v) = match l.split_once('\t') {
                        Some((k, v)) => (k, Some(v)),
                        None => (l.as_str(), None),
                    };
                    batch.push(json!({ "key": k, "value": v }));
                }
                if batch.len() == 1000 || (line.is_none() && !batch.is_empty()) {
                    c.send(
                        c.request(Method::POST, &format!("/api/v1/topics/{topic}/records"))
                            .json(&batch),
                    )
                    .await?;
                    produced += batch.len();
                    batch.clear();
                }
                if line.is_none() {
                    break;
                }
            }
            Ok(json!({ "topic": topic, "produced": produced }))
        }
    }
}

/// Percent-encodes a path segment.
fn encode_path(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
