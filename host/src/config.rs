//! The `baton run` configuration: a TOML file whose every field is also a flag.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// The config file of `baton run --config FILE`. Flags given on the command line win.
#[derive(Debug, Default, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `data_dir = "/var/lib/baton"`: where the log, state and modules live.
    pub data_dir: Option<PathBuf>,
    /// `http = "127.0.0.1:8080"`: the address of the API and dashboard.
    pub http: Option<SocketAddr>,
    /// `state_memory = "512MiB"`: RocksDB memory bound shared by all partitions of the host.
    pub state_memory: Option<String>,
    /// `state_disk = "50GiB"`: disk bound of the host's state; replicas that would break it
    /// are refused.
    #[serde(default)]
    pub state_disk: Option<String>,
    /// `max_batch = 8192`: most records per committed batch.
    pub max_batch: Option<usize>,
    /// `max_call = 512`: most records per guest call.
    pub max_call: Option<usize>,
    /// `cluster = "baton"`: the cluster's name; its control log is `<cluster>.control`.
    pub cluster: Option<String>,
    /// `host_id = "b1"`: this host's id in the cluster (default: one kept in the data dir).
    pub host_id: Option<String>,
    /// `advertise = "http://10.0.0.5:8080"`: the base URL other hosts reach this host's API at
    /// (default: the address the API listens on).
    pub advertise: Option<String>,
    /// `session_timeout = "10s"`: how long a silent host stays a member of the cluster.
    pub session_timeout: Option<String>,
    /// `handoff_timeout = "60s"`: how long a stopping host may take to move its partitions away.
    #[serde(default)]
    pub handoff_timeout: Option<String>,
    /// `token = "..."`: mutating API calls need `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// `kafka = "127.0.0.1:9092"`: run on Kafka instead of the embedded log.
    pub kafka: Option<String>,
    /// `replication_factor = 3`: replication factor of the topics baton creates (default: the
    /// broker's `default.replication.factor`).
    pub replication_factor: Option<u16>,
    /// `min_insync_replicas = 2`: of baton's own topics (default: min(2, replication factor)).
    pub min_insync_replicas: Option<u16>,
    /// `kafka_config = { "compression.type" = "lz4" }`: librdkafka settings for every client.
    #[serde(default)]
    pub kafka_config: std::collections::BTreeMap<String, String>,
    /// `otlp_endpoint = "http://127.0.0.1:4318"`: export traces there over OTLP/HTTP.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// `checkpoints = "s3://bucket/baton"`: where partitions are checkpointed (default: the
    /// data dir's `checkpoints`).
    #[serde(default)]
    pub checkpoints: Option<String>,
    /// `checkpoint_retain = 3`: checkpoints kept per partition.
    #[serde(default)]
    pub checkpoint_retain: Option<usize>,
}

impl FileConfig {
    /// Reads and parses a config file; the error names the file and the problem.
    pub fn load(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("config file {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("config file {}: {e}", path.display()))
    }
}

/// Parses a `--kafka-config` argument: `key=value`, or `@FILE`, a librdkafka properties file
/// (`key=value` lines; blank lines and lines starting with `#` or `!` are skipped), as other
/// Kafka tools take.
pub fn parse_kafka_config(s: &str) -> Result<KafkaSettings, String> {
    match s.strip_prefix('@') {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("Kafka properties file `{path}`: {e}"))?;
            parse_properties(&text).map_err(|e| format!("Kafka properties file `{path}`: {e}"))
        }
        None => parse_key_value(s).map(|kv| KafkaSettings(vec![kv])),
    }
}

/// The settings of one `--kafka-config` argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaSettings(pub Vec<(String, String)>);

/// Parses the text of a properties file: `key=value` lines, blank and comment lines skipped.
pub fn parse_properties(text: &str) -> Result<KafkaSettings, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        out.push(parse_key_value(line).map_err(|e| format!("line {}: {e}", i + 1))?);
    }
    Ok(KafkaSettings(out))
}

/// Parses `key=value` (a `--kafka-config` argument).
pub fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(format!(
            "`{s}`: expected key=value, e.g. compression.type=lz4"
        )),
    }
}

/// Parses a duration such as `10s`, `6000ms` or `1m`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("`{s}`: expected a number and a unit, e.g. 10s or 6000ms"))?;
    let ms = match unit.trim() {
        "ms" => n,
        "s" => n.saturating_mul(1000),
        "m" => n.saturating_mul(60_000),
        u => return Err(format!("`{s}`: unknown unit `{u}`; use ms, s or m")),
    };
    if ms == 0 {
        return Err(format!("`{s}` must be more than zero"));
    }
    Ok(std::time::Duration::from_millis(ms))
}

/// Parses a size such as `512MiB`, `1GiB`, `64MB` or a plain number of bytes.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num
        .parse()
        .map_err(|_| format!("size `{s}`: expected a number with an optional unit like 512MiB"))?;
    let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => {
            return Err(format!(
                "size `{s}`: unknown unit `{other}`; use B, KiB, MiB or GiB"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size `{s}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_their_unit() {
        use std::time::Duration;
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("6000ms"), Ok(Duration::from_millis(6000)));
        assert_eq!(parse_duration(" 1m "), Ok(Duration::from_secs(60)));
        for bad in ["10", "s", "0s", "5h", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("100").unwrap(), 100);
        assert!(
            parse_size("12 parsecs")
                .unwrap_err()
                .contains("unknown unit")
        );
    }

    #[test]
    fn kafka_settings_come_one_by_one_or_from_a_properties_file() {
        assert_eq!(
            parse_kafka_config("compression.type=lz4").unwrap(),
            KafkaSettings(vec![("compression.type".into(), "lz4".into())])
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("client.properties");
        std::fs::write(
            &file,
            "# TLS\nsecurity.protocol = SASL_SSL\n\n! SCRAM\nsasl.mechanism=SCRAM-SHA-512\n\
             sasl.password=p=w\n",
        )
        .unwrap();
        let got = parse_kafka_config(&format!("@{}", file.display())).unwrap();
        assert_eq!(
            got.0,
            vec![
                ("security.protocol".to_string(), "SASL_SSL".to_string()),
                ("sasl.mechanism".into(), "SCRAM-SHA-512".into()),
                ("sasl.password".into(), "p=w".into()),
            ]
        );
        std::fs::write(&file, "a=1\nnot a setting\n").unwrap();
        let e = parse_kafka_config(&format!("@{}", file.display())).unwrap_err();
        assert!(e.contains("line 2") && e.contains("not a setting"), "{e}");
        let e = parse_kafka_config("@/no/such/file").unwrap_err();
        assert!(e.contains("/no/such/file"), "{e}");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let e = toml::from_str::<FileConfig>("colour = 1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("colour"), "{e}");
    }
}
