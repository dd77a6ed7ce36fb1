//! Keeps the "must not touch" column of the module table in `docs/ARCHITECTURE.md` true: each
//! row names a module and what it must not reference, and every source file of that module is
//! read for a reference to it (a `use` line or a path in the code). The table is the rule: a
//! row added or changed there is checked here without a change to this file.

use std::path::{Path, PathBuf};

/// The references each word of the column stands for: a crate of the stack or a module of the
/// host, matched as a path prefix (`wasmtime::`, `crate::http`).
fn references(word: &str) -> Option<&'static [&'static str]> {
    Some(match word {
        "wasm" => &["wasmtime", "crate::runtime"],
        "wasmtime" => &["wasmtime"],
        "state" => &["crate::state", "rocksdb"],
        "RocksDB" => &["rocksdb", "crate::state"],
        "HTTP" | "HTTP types" => &["crate::http", "axum"],
        "transport" => &["crate::transport"],
        "the control log" => &["crate::control::log"],
        "app" => &["crate::app"],
        _ => return None,
    })
}

/// The source files of `module` (`partition` is `partition/*.rs` and `partition.rs` or
/// `partition/mod.rs`; `partition::kafka` is one file).
fn files(src: &Path, module: &str) -> Vec<PathBuf> {
    let rel = module.replace("::", "/");
    let mut out = Vec::new();
    let file = src.join(format!("{rel}.rs"));
    if file.is_file() {
        out.push(file);
    }
    let dir = src.join(&rel);
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The table's rows: (modules of the first cell, words of the last).
fn rows(architecture: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let table = architecture
        .split("## Host modules")
        .nth(1)
        .expect("a `## Host modules` section in docs/ARCHITECTURE.md");
    table
        .lines()
        .skip_while(|l| !l.starts_with("| module |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            let modules = cells[0]
                .split(',')
                .map(|m| m.trim().trim_matches('`').to_string())
                .collect();
            let last = cells.last().copied().unwrap_or_default();
            let words = if last == "—" {
                Vec::new()
            } else {
                last.split(',').map(|w| w.trim().to_string()).collect()
            };
            (modules, words)
        })
        .collect()
}

/// Whether `line` (code, not a comment) refers to `path`: the path followed by `::`, `;`,
/// `}` or `,` (`crate::state::PartitionDb`, `use rocksdb;`), not a longer name.
fn refers(line: &str, path: &str) -> bool {
    let code = line.split("//").next().unwrap_or_default();
    code.match_indices(path).any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let after = code[i + path.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
            && matches!(after, Some(':' | ';' | '}' | ',' | ' ' | ')') | None)
    })
}

#[test]
fn no_module_touches_what_the_architecture_table_forbids() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let doc = std::fs::read_to_string(root.join("../docs/ARCHITECTURE.md"))
        .expect("docs/ARCHITECTURE.md");
    let rows = rows(&doc);
    assert!(rows.len() >= 10, "the module table has {} rows", rows.len());
    let mut checked = 0;
    let mut broken = Vec::new();
    for (modules, words) in &rows {
        for word in words {
            let paths = references(word)
                .unwrap_or_else(|| panic!("`{word}` in the table names nothing this test knows"));
            for module in modules {
                let fs = files(&src, module);
                assert!(
                    !fs.is_empty(),
                    "the table names `{module}`, which has no source"
                );
                for f in fs {
                    let text = std::fs::read_to_string(&f).unwrap();
                    checked += 1;
                    for (n, line) in text.lines().enumerate() {
                        if line.trim_start().starts_with("//") {
                            continue;
                        }
                        for p in paths {
                            if refers(line, p) {
                                broken.push(format!(
                                    "{}:{}: `{module}` must not touch {word} ({p}): {}",
                                    f.strip_prefix(root).unwrap_or(&f).display(),
                                    n + 1,
                                    line.trim()
                                ));
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 0);
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn a_reference_is_a_path_not_a_longer_name() {
    assert!(refers("use crate::http::model::Role;", "crate::http"));
    assert!(refers("    let x = rocksdb::DB::open(&o, p);", "rocksdb"));
    assert!(refers("use crate::state;", "crate::state"));
    assert!(!refers("use crate::statement::X;", "crate::state"));
    assert!(!refers(
        "use crate::partition::report::Role; // not crate::http::model",
        "crate::http"
    ));
    assert!(!refers("let my_rocksdb::x = 1;", "rocksdb"));
    assert!(!refers("use librocksdb_sys;", "rocksdb"));
}

/// The `.rs` files under `dir`, recursively.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(sources(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

#[test]
fn only_app_implements_the_host() {
    // `Baton` is wiring: the parts below it take narrow handles, not `&Baton`.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = sources(&src);
    assert!(files.len() > 20, "{} source files", files.len());
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with(src.join("app")))
        .filter(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .any(|l| l.trim_start().starts_with("impl Baton"))
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "`impl Baton` outside app: {offenders:?}"
    );
}
