//! `baton test-plugin`: a component run locally over a file of records, with no broker and no
//! host: its state against `--expect`, its outputs, timers driven by the records' timestamps,
//! and a failing record reported with the trap's backtrace and the record's line.

use std::collections::BTreeMap;
use std::process::Command;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use baton_tests::{baton_bin, plugin, words};
use serde_json::{Value, json};

/// Runs `baton test-plugin ARGS`; returns (success, stdout JSON lines, stderr).
fn test_plugin(args: &[&str]) -> anyhow::Result<(bool, Vec<Value>, String)> {
    let out = Command::new(baton_bin())
        .arg("test-plugin")
        .args(args)
        .output()?;
    let lines = String::from_utf8(out.stdout)?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<Vec<Value>, _>>()?;
    Ok((
        out.status.success(),
        lines,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

fn write_lines(path: &std::path::Path, lines: &[Value]) -> anyhow::Result<()> {
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(path, text)?;
    Ok(())
}

#[test]
fn word_count_state_matches_a_model_and_a_wrong_expectation_fails() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let keys = words(2_000, 300, 5);
    let input: Vec<Value> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| json!({"key": k, "value": "x", "timestamp": 1_000 + i}))
        .collect();
    write_lines(&dir.path().join("in.jsonl"), &input)?;
    // The model: counts per key, in the slot murmur2 puts the key in (4 slots).
    let mut counts: BTreeMap<(u32, &str), i64> = BTreeMap::new();
    for k in &keys {
        let slot = baton::partitioner::partition_for_key(k.as_bytes(), 4);
        *counts.entry((slot, k)).or_default() += 1;
    }
    let expect: Vec<Value> = counts
        .iter()
        .map(|((slot, k), n)| {
            json!({"store": "counts", "slot": slot, "key": k,
                   "value_base64": B64.encode(n.to_be_bytes())})
        })
        .collect();
    write_lines(&dir.path().join("want.jsonl"), &expect)?;
    let wc = plugin("word-count");
    let (ok, lines, err) = test_plugin(&[
        wc.to_str().unwrap(),
        "--input",
        dir.path().join("in.jsonl").to_str().unwrap(),
        "--expect",
        dir.path().join("want.jsonl").to_str().unwrap(),
        "--slots",
        "4",
    ])?;
    assert!(ok, "{err}");
    assert!(err.contains("the state matches --expect"), "{err}");
    let state: Vec<&Value> = lines.iter().filter_map(|l| l.get("state")).collect();
    assert_eq!(state.len(), counts.len());

    // One count off, one key too many: both named, and the exit status says so.
    let mut wrong = expect.clone();
    wrong[0]["value_base64"] = json!(B64.encode(1_000i64.to_be_bytes()));
    wrong.push(json!({"store": "counts", "slot": 0, "key": "nope", "value_base64": "AA=="}));
    write_lines(&dir.path().join("wrong.jsonl"), &wrong)?;
    let (ok, _, err) = test_plugin(&[
        wc.to_str().unwrap(),
        "--input",
        dir.path().join("in.jsonl").to_str().unwrap(),
        "--expect",
        dir.path().join("wrong.jsonl").to_str().unwrap(),
        "--slots",
        "4",
    ])?;
    assert!(!ok);
    assert!(
        err.contains("differs:") && err.contains("missing:") && err.contains("\"nope\""),
        "{err}"
    );

    // Bad input names its line.
    std::fs::write(
        dir.path().join("bad.jsonl"),
        "{\"key\":\"a\",\"timestamp\":1}\n{\"key\":1}\n",
    )?;
    let (ok, _, err) = test_plugin(&[
        wc.to_str().unwrap(),
        "--input",
        dir.path().join("bad.jsonl").to_str().unwrap(),
        "--store",
        "counts",
    ])?;
    assert!(!ok);
    assert!(err.contains("input line 2"), "{err}");
    Ok(())
}

#[test]
fn windows_close_on_record_time_and_a_trap_is_reported_with_its_record() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // Windows of 1 s: [0, 1000) gets a twice and b once; a record at 2500 closes it; a record
    // at 100 then is late.
    let input = [
        json!({"key": "a", "value": "x", "timestamp": 100}),
        json!({"key": "b", "value": "x", "timestamp": 400}),
        json!({"key": "a", "value": "x", "timestamp": 900}),
        json!({"key": "a", "value": "x", "timestamp": 2500}),
        json!({"key": "a", "value": "old", "timestamp": 100}),
    ];
    write_lines(&dir.path().join("in.jsonl"), &input)?;
    let (ok, lines, err) = test_plugin(&[
        plugin("windowed-count").to_str().unwrap(),
        "--input",
        dir.path().join("in.jsonl").to_str().unwrap(),
        "--store",
        "windows",
        "--config",
        "window_ms=1000",
        "--config",
        "grace_ms=0",
        "--config",
        "output=counts",
        "--config",
        "late=late",
    ])?;
    assert!(ok, "{err}");
    let outputs: Vec<(String, String, String)> = lines
        .iter()
        .filter_map(|l| l.get("output"))
        .map(|o| {
            (
                o["topic"].as_str().unwrap().to_string(),
                o["key"].as_str().unwrap().to_string(),
                o["value"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut sorted = outputs.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        vec![
            (
                "counts".into(),
                "a".into(),
                r#"{"start":0,"end":1000,"count":2}"#.into()
            ),
            (
                "counts".into(),
                "b".into(),
                r#"{"start":0,"end":1000,"count":1}"#.into()
            ),
            ("late".into(), "a".into(), "old".into()),
        ]
    );
    // The window [2000, 3000) is still open: one entry of state.
    assert_eq!(lines.iter().filter(|l| l.get("state").is_some()).count(), 1);

    // fail-on traps on the value "boom": the record is named by its line, with a backtrace,
    // and the others are counted.
    let input = [
        json!({"key": "a", "value": "x", "timestamp": 1}),
        json!({"key": "a", "value": "boom", "timestamp": 2}),
        json!({"key": "a", "value": "x", "timestamp": 3}),
    ];
    write_lines(&dir.path().join("trap.jsonl"), &input)?;
    let (ok, lines, err) = test_plugin(&[
        plugin("fail-on").to_str().unwrap(),
        "--input",
        dir.path().join("trap.jsonl").to_str().unwrap(),
        "--store",
        "counts",
        "--config",
        "value=boom",
        "--config",
        "mode=trap",
    ])?;
    assert!(ok, "{err}");
    let dead: Vec<&Value> = lines.iter().filter_map(|l| l.get("dead_letter")).collect();
    assert_eq!(dead.len(), 1, "{lines:?}");
    assert_eq!(dead[0]["kind"], "trap");
    assert_eq!(dead[0]["record"]["line"], 2);
    assert!(
        dead[0]["backtrace"]
            .as_str()
            .is_some_and(|b| b.contains("wasm")),
        "{}",
        dead[0]
    );
    let state: Vec<&Value> = lines.iter().filter_map(|l| l.get("state")).collect();
    assert_eq!(state.len(), 1);
    assert_eq!(state[0]["value_base64"], B64.encode(2i64.to_be_bytes()));
    Ok(())
}
