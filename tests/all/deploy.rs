//! The deployment files in `deploy/`: the systemd unit passes `systemd-analyze verify` with no
//! warning and waits longer than a host's hand-off; the Kubernetes manifests decode strictly
//! into the k8s.io/api types (`deploy/kubernetes/check`, Go), with probes on /healthz and
//! /readyz, a preStop hook, a grace period longer than the hand-off, and a host config that
//! baton reads. The Containerfile needs a container engine, which the test machines lack.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use baton_tests::{baton_bin, repo_root};
use serde_json::Value;

/// A host's default `--handoff-timeout`.
const HANDOFF: Duration = Duration::from_secs(60);

#[test]
fn the_systemd_unit_verifies_and_outwaits_the_hand_off() -> anyhow::Result<()> {
    let unit = std::fs::read_to_string(repo_root().join("deploy/systemd/baton.service"))?;
    // verify checks that ExecStart's binary exists: this build's stands in for the installed one.
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("baton.service");
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/baton", &baton_bin().to_string_lossy()),
    )?;
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .context("systemd-analyze")?;
    let said = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );
    let stop = unit
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .context("no TimeoutStopSec")?;
    let stop = Duration::from_secs(stop.trim().parse()?);
    ensure!(
        stop > HANDOFF,
        "TimeoutStopSec {stop:?} does not outwait the hand-off"
    );
    ensure!(unit.contains("KillSignal=SIGTERM"), "{unit}");
    Ok(())
}

#[test]
fn the_kubernetes_manifests_decode_strictly_and_configure_a_host() -> anyhow::Result<()> {
    let check = repo_root().join("deploy/kubernetes/check");
    let out = Command::new("go")
        .args(["run", ".", "../baton.yaml"])
        .current_dir(&check)
        .output()
        .context("go (scripts/setup checks for it)")?;
    ensure!(
        out.status.success(),
        "deploy/kubernetes/check: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> = serde_json::from_slice(&out.stdout)?;
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    ensure!(kinds == ["ConfigMap", "Service", "StatefulSet"], "{docs:?}");
    let set = &docs[2];
    ensure!(
        set["liveness"] == "/healthz" && set["readiness"] == "/readyz",
        "{set}"
    );
    ensure!(set["pre_stop"] == true, "{set}");
    let grace = set["grace_seconds"].as_u64().context("no grace period")?;
    ensure!(Duration::from_secs(grace) > HANDOFF, "grace {grace} s");

    // The host config the ConfigMap carries is one baton reads.
    let toml = docs[0]["data"]["baton.toml"]
        .as_str()
        .context("no baton.toml")?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("baton.toml");
    std::fs::write(&path, toml)?;
    let config = baton::config::FileConfig::load(&path).map_err(anyhow::Error::msg)?;
    ensure!(config.kafka.is_some(), "{config:?}");
    let handoff = config.handoff_timeout.as_deref().unwrap_or("60s");
    let handoff = baton::config::parse_duration(handoff).map_err(anyhow::Error::msg)?;
    ensure!(
        Duration::from_secs(grace) > handoff,
        "grace {grace} s, hand-off {handoff:?}"
    );
    Ok(())
}
