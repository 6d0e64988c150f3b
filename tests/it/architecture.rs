//! The layer order, checked: the crate graph, the release binary's contents, and the imports
//! between the top-level modules of the gateway library.
//!
//! Cargo already refuses a cycle between crates; these tests also refuse a dependency that
//! runs up the order (a lower crate naming a higher one, even as a dev-dependency), a new
//! crate that has no place in the order, a fixture linked into the release binary, and a new
//! `crate::` import inside `crates/gateway` that runs up its module order.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace's crates, bottom first. A crate may depend only on crates before it.
const CRATE_ORDER: &[&str] = &[
    "mrtr-wire",
    "mrtr-gateway-core",
    "mrtr-testkit",
    "mrtr-gateway",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn manifest(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.parse()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every workspace member: package name → the names of the workspace crates it depends on
/// (normal, dev and build dependencies alike).
fn crate_graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = manifest(&repo().join("Cargo.toml"));
    let members: Vec<String> = root["workspace"]["members"]
        .as_array()
        .expect("workspace.members")
        .iter()
        .map(|m| m.as_str().unwrap().to_owned())
        .collect();
    let mut dirs = vec![repo()];
    dirs.extend(members.iter().map(|m| repo().join(m)));
    let mut graph = BTreeMap::new();
    let tables = |m: &toml::Table| {
        ["dependencies", "dev-dependencies", "build-dependencies"]
            .iter()
            .filter_map(|k| m.get(*k).and_then(toml::Value::as_table))
            .flat_map(|t| t.keys().cloned().collect::<Vec<_>>())
            .collect::<BTreeSet<_>>()
    };
    let manifests: Vec<toml::Table> = dirs
        .iter()
        .map(|d| manifest(&d.join("Cargo.toml")))
        .collect();
    let names: BTreeSet<String> = manifests
        .iter()
        .map(|m| m["package"]["name"].as_str().unwrap().to_owned())
        .collect();
    for m in &manifests {
        let name = m["package"]["name"].as_str().unwrap().to_owned();
        let deps = tables(m)
            .into_iter()
            .filter(|d| names.contains(d))
            .collect();
        graph.insert(name, deps);
    }
    graph
}

fn rank(name: &str) -> usize {
    CRATE_ORDER
        .iter()
        .position(|c| *c == name)
        .unwrap_or_else(|| {
            panic!("crate {name} has no place in CRATE_ORDER (tests/architecture.rs)")
        })
}

#[test]
fn the_crate_graph_is_the_layer_order() {
    let graph = crate_graph();
    assert_eq!(
        graph.keys().cloned().collect::<BTreeSet<_>>(),
        CRATE_ORDER.iter().map(|c| c.to_string()).collect(),
        "every workspace crate has a place in CRATE_ORDER, and every place a crate"
    );
    let mut upward = Vec::new();
    for (krate, deps) in &graph {
        for dep in deps {
            if rank(dep) >= rank(krate) {
                upward.push(format!("{krate} -> {dep}"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "dependencies that run up the layer order: {upward:?}"
    );
    // The layers are really stacked, not merely unordered: each crate above the bottom
    // depends on the one below it.
    for pair in CRATE_ORDER.windows(2) {
        assert!(
            graph[pair[1]].contains(pair[0]),
            "{} no longer depends on {}: is the order still right?",
            pair[1],
            pair[0]
        );
    }
}

/// Crate names appear in a binary's symbols (and panic locations); a crate that is linked in
/// leaves them.
fn links(binary: &str, krate: &str) -> bool {
    let bytes = std::fs::read(binary).unwrap_or_else(|e| panic!("{binary}: {e}"));
    let needle = krate.as_bytes();
    bytes.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn the_release_binary_links_no_fixture() {
    let release = env!("CARGO_BIN_EXE_mrtr-gateway");
    let demo = env!("CARGO_BIN_EXE_mrtr-gateway-demo");
    // The probe can see a linked fixture: the demo binary has one.
    assert!(
        links(demo, "mrtr_testkit"),
        "{demo} should link mrtr_testkit"
    );
    assert!(
        links(release, "mrtr_gateway"),
        "{release} should link the gateway library"
    );
    assert!(
        !links(release, "mrtr_testkit"),
        "{release} links the test fixtures (mrtr_testkit)"
    );
}

/// The top-level modules of `crates/gateway/src`, bottom first: a module may name (as
/// `crate::…`) only modules before it. This is the order the restructuring is heading for;
/// `KNOWN_UPWARD` lists the imports that still run against it.
const MODULE_ORDER: &[&str] = &[
    "clock",
    "drain",
    "error",
    "tls",
    "request_id",
    "telemetry",
    "inherited_fds",
    "setting",
    "state",
    "auth",
    "caller_scope",
    "fair_share",
    "single_use",
    "policy",
    "config",
    "metrics",
    "legacy",
    "upstream_error",
    "upstream_check",
    "sessions",
    "translate",
    "mrtr",
    "tasks",
    "discover",
    "front",
    "gateway",
    "readiness",
    "descriptor_budget",
    "admin",
    "reload",
];

/// Imports that run up `MODULE_ORDER` today (from → to). The list may only shrink: an entry
/// that is no longer true fails the test, so that removing an upward import also removes it
/// here, and a new upward import fails until it is removed or argued for here.
const KNOWN_UPWARD: &[(&str, &str)] = &[];

/// `text` without its inline `#[cfg(test)] mod name { … }` blocks (braces counted; the test
/// modules of this crate hold no unbalanced brace in a string).
fn without_test_modules(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        let header_end = after.find('\n').map_or(after.len(), |n| n + 1);
        let next = after[header_end..].trim_start();
        let inline = match (next.find('{'), next.find(';')) {
            (Some(brace), semi) => semi.is_none_or(|semi| brace < semi),
            (None, _) => false,
        };
        if !(next.starts_with("mod ") && inline) {
            out.push_str(&after[..header_end]);
            rest = &after[header_end..];
            continue;
        }
        let open = header_end + after[header_end..].find('{').unwrap();
        let mut depth = 0usize;
        let mut end = after.len();
        for (n, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + n + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// `text` without its comment lines (`//`, `///`, `//!`): a doc link to a higher module is
/// not an import.
fn without_comment_lines(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `crate::x` names in `text` (also inside `use crate::{x, y::z}`), test modules and comment
/// lines excluded.
fn crate_modules(text: &str) -> BTreeSet<String> {
    let text = without_comment_lines(&without_test_modules(text));
    let mut out = BTreeSet::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        let preceded_by_ident = rest[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        if !preceded_by_ident {
            if let Some(group) = after.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for part in group[..end].split(',') {
                    let name: String = part
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() && name != "self" {
                        out.insert(name);
                    }
                }
            } else {
                let name: String = after
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        }
        rest = after;
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Files declared as `#[cfg(test)] mod name;` (whole-file test modules), also with a
/// `#[path = "file.rs"]` between the two (relative to the declaring file's directory).
fn test_only_files(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap();
        let here = f.parent().unwrap().to_path_buf();
        let dir = if f
            .file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs")
        {
            here.clone()
        } else {
            f.with_extension("")
        };
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for (i, line) in lines.iter().enumerate() {
            if *line != "#[cfg(test)]" {
                continue;
            }
            let mut path = None;
            for next in &lines[i + 1..] {
                if let Some(p) = next
                    .strip_prefix("#[path = \"")
                    .and_then(|r| r.strip_suffix("\"]"))
                {
                    path = Some(here.join(p));
                } else if next.starts_with("#[") {
                    continue;
                } else {
                    if let Some(name) = next.strip_prefix("mod ").and_then(|r| r.strip_suffix(';'))
                    {
                        out.insert(path.unwrap_or_else(|| dir.join(format!("{name}.rs"))));
                    }
                    break;
                }
            }
        }
    }
    out
}

/// from → to, for every `crate::to` named in a module under `from` (tests excluded).
fn module_imports() -> BTreeSet<(String, String)> {
    let src = repo().join("crates/gateway/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let tests = test_only_files(&files);
    let mut edges = BTreeSet::new();
    for f in files.iter().filter(|f| !tests.contains(*f)) {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let from = first.trim_end_matches(".rs").to_owned();
        if from == "lib" {
            continue;
        }
        for to in crate_modules(&std::fs::read_to_string(f).unwrap()) {
            if to != from {
                edges.insert((from.clone(), to));
            }
        }
    }
    edges
}

fn module_rank(name: &str) -> usize {
    MODULE_ORDER.iter().position(|m| *m == name).unwrap_or_else(|| {
        panic!("module {name} of crates/gateway has no place in MODULE_ORDER (tests/architecture.rs)")
    })
}

#[test]
fn imports_inside_the_gateway_library_follow_the_module_order() {
    let edges = module_imports();
    let upward: BTreeSet<(String, String)> = edges
        .iter()
        .filter(|(from, to)| module_rank(to) >= module_rank(from))
        .cloned()
        .collect();
    let known: BTreeSet<(String, String)> = KNOWN_UPWARD
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let new: Vec<_> = upward.difference(&known).collect();
    let gone: Vec<_> = known.difference(&upward).collect();
    assert!(
        new.is_empty(),
        "imports that run up the module order (from, to): {new:?}"
    );
    assert!(
        gone.is_empty(),
        "no longer imported, remove from KNOWN_UPWARD: {gone:?}"
    );
}

#[test]
fn the_import_scanner_sees_plain_and_grouped_imports() {
    let seen = crate_modules(
        "use crate::a::B;\n/// See [`crate::doc_only`].\nuse crate::{c, d::E, self};\nfn f() { crate::g::h(); mycrate::x(); }\n#[cfg(test)]\nmod tests { use crate::z; fn t() { if true { crate::y(); } } }\nuse crate::after;\n#[cfg(test)]\nmod file_tests;\nuse crate::last;",
    );
    let want: BTreeSet<String> = ["a", "after", "c", "d", "g", "last"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(seen, want);
}
