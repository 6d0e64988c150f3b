//! Static checks of `deploy/Dockerfile` (built on machines that can pull its base images; no
//! registry is reachable here) and of `deploy/Containerfile.local` against it (the image
//! `scripts/build-image.sh` builds here, which `tests/it/image.rs` builds and runs):
//! instructions are parsed (continuations joined, comments dropped) and checked against the
//! repository.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

/// One instruction: keyword (upper case) and the rest of the logical line.
#[derive(Debug, Clone)]
pub struct Instruction {
    pub keyword: String,
    pub args: String,
}

pub fn parse(text: &str) -> Vec<Instruction> {
    let mut out = Vec::new();
    let mut logical = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if logical.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if !logical.is_empty() && trimmed.starts_with('#') {
            continue; // a comment inside a continued instruction
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                logical.push_str(part);
                logical.push(' ');
            }
            None => {
                logical.push_str(trimmed);
                let (k, a) = logical
                    .split_once(char::is_whitespace)
                    .unwrap_or((&logical, ""));
                out.push(Instruction {
                    keyword: k.to_ascii_uppercase(),
                    args: a.trim().to_owned(),
                });
                logical.clear();
            }
        }
    }
    out
}

/// Splits a stage into its instructions: `FROM` starts a new one.
fn stages(all: &[Instruction]) -> Vec<&[Instruction]> {
    let starts: Vec<usize> = all
        .iter()
        .enumerate()
        .filter(|(_, i)| i.keyword == "FROM")
        .map(|(n, _)| n)
        .collect();
    starts
        .iter()
        .enumerate()
        .map(|(k, &s)| &all[s..starts.get(k + 1).copied().unwrap_or(all.len())])
        .collect()
}

/// The image a stage starts from (`FROM [--platform=...] IMAGE [AS NAME]`) and its name.
fn stage_base(stage: &[Instruction]) -> (&str, Option<&str>) {
    let words: Vec<&str> = stage[0]
        .args
        .split_whitespace()
        .filter(|w| !w.starts_with("--"))
        .collect();
    let name = words
        .windows(2)
        .find(|w| w[0].eq_ignore_ascii_case("AS"))
        .map(|w| w[1]);
    (words.first().copied().unwrap_or(""), name)
}

/// Whether `image` names its registry: podman and buildah resolve a short name such as
/// `rust:1.95` only through `unqualified-search-registries`, which a host may not set (and
/// which would let whichever registry answers first supply the image).
pub fn fully_qualified(image: &str) -> bool {
    match image.split_once('/') {
        Some((host, rest)) => {
            !rest.is_empty() && (host.contains('.') || host.contains(':') || host == "localhost")
        }
        None => false,
    }
}

/// Every `FROM` whose image is neither `scratch`, an earlier stage, nor fully qualified.
fn unqualified_bases(stages: &[&[Instruction]]) -> Vec<String> {
    let mut named = Vec::new();
    let mut p = Vec::new();
    for stage in stages {
        let (image, name) = stage_base(stage);
        if image != "scratch" && !named.contains(&image) && !fully_qualified(image) {
            p.push(format!(
                "FROM {image} is not a fully qualified image name (REGISTRY/REPOSITORY:TAG)"
            ));
        }
        named.extend(name);
    }
    p
}

/// `--flag=value` options at the front of COPY, and the remaining words.
fn copy_parts(args: &str) -> (Vec<(&str, &str)>, Vec<&str>) {
    let mut flags = Vec::new();
    let mut words = Vec::new();
    for w in args.split_whitespace() {
        match w.strip_prefix("--").and_then(|f| f.split_once('=')) {
            Some(kv) if words.is_empty() => flags.push(kv),
            _ => words.push(w),
        }
    }
    (flags, words)
}

fn exec_form(args: &str) -> Option<Vec<String>> {
    let v: Value = serde_json::from_str(args).ok()?;
    v.as_array()?
        .iter()
        .map(|s| s.as_str().map(str::to_owned))
        .collect()
}

/// What the image must agree with: the crate and the ports its configuration listens on.
pub struct Expect<'a> {
    pub repo: &'a Path,
    /// `[[bin]] name` in Cargo.toml.
    pub bin_name: &'a str,
    /// `package.license` in Cargo.toml.
    pub license: &'a str,
    pub ports: &'a [u16],
}

/// Everything wrong with `dockerfile` (and its ignore file); empty when fine.
pub fn problems(dockerfile: &str, dockerignore: &str, expect: &Expect) -> Vec<String> {
    let (repo, bin_name) = (expect.repo, expect.bin_name);
    let all = parse(dockerfile);
    let stages = stages(&all);
    let mut p = Vec::new();
    let (Some(first), Some(last)) = (stages.first(), stages.last()) else {
        return vec!["no FROM".into()];
    };
    if stages.len() < 2 {
        p.push("not a multi-stage build".into());
    }
    let builder_from = first[0].args.split_whitespace().collect::<Vec<_>>();
    if !builder_from
        .first()
        .is_some_and(|i| i.starts_with("docker.io/library/rust:1.95"))
    {
        p.push(format!(
            "the builder is not docker.io/library/rust:1.95: {}",
            first[0].args
        ));
    }
    let builder_name = builder_from
        .windows(2)
        .find(|w| w[0].eq_ignore_ascii_case("AS"))
        .map(|w| w[1])
        .unwrap_or("");
    p.extend(unqualified_bases(&stages));
    let builder_workdir = first
        .iter()
        .rev()
        .find(|i| i.keyword == "WORKDIR")
        .map(|i| i.args.trim_end_matches('/').to_owned())
        .unwrap_or_default();
    if !first
        .iter()
        .any(|i| i.keyword == "RUN" && i.args.contains("cargo build --release --locked"))
    {
        p.push("the builder never runs `cargo build --release --locked`".into());
    }
    if !last[0].args.starts_with("gcr.io/distroless/") {
        p.push(format!(
            "the final stage is not distroless: {}",
            last[0].args
        ));
    }
    if last.iter().any(|i| i.keyword == "RUN") {
        p.push("the final stage RUNs a command (distroless has no shell)".into());
    }

    // COPY sources: from the context they must exist and not be ignored; from the builder
    // the binary must be the crate's [[bin]] built under the builder's WORKDIR.
    let ignored: Vec<&str> = dockerignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_start_matches('/'))
        .collect();
    let mut binary_dest = None;
    for (n, stage) in stages.iter().enumerate() {
        for i in stage
            .iter()
            .filter(|i| i.keyword == "COPY" || i.keyword == "ADD")
        {
            if i.keyword == "ADD" {
                p.push(format!("ADD {}: use COPY", i.args));
            }
            let (flags, words) = copy_parts(&i.args);
            let Some((dest, sources)) = words.split_last() else {
                p.push(format!("COPY without a destination: {}", i.args));
                continue;
            };
            match flags.iter().find(|(k, _)| *k == "from") {
                None => {
                    for s in sources {
                        let rel = s.trim_start_matches("./").trim_end_matches('/');
                        if !repo.join(rel).exists() {
                            p.push(format!("COPY source {s} does not exist in the repository"));
                        }
                        let top = rel.split('/').next().unwrap_or(rel);
                        if ignored.contains(&rel) || ignored.contains(&top) {
                            p.push(format!("COPY source {s} is excluded by the .dockerignore"));
                        }
                    }
                }
                Some((_, from)) => {
                    if *from != builder_name {
                        p.push(format!("COPY --from={from}: no such stage"));
                    }
                    let want = format!("{builder_workdir}/target/release/{bin_name}");
                    if n == stages.len() - 1 {
                        if sources != [want.as_str()] {
                            p.push(format!("the final stage copies {sources:?}, not {want}"));
                        }
                        binary_dest = Some(dest.to_string());
                    }
                }
            }
        }
    }

    let user = last
        .iter()
        .rev()
        .find(|i| i.keyword == "USER")
        .map(|i| i.args.as_str());
    match user {
        None => p.push("the final stage has no USER (runs as root)".into()),
        Some(u) => {
            let uid = u.split(':').next().unwrap_or("");
            if uid == "root"
                || uid.parse::<u32>().is_ok_and(|n| n == 0)
                || uid.parse::<u32>().is_err()
            {
                p.push(format!("USER {u} is not a numeric non-root uid"));
            }
        }
    }

    let entry = last
        .iter()
        .rev()
        .find(|i| i.keyword == "ENTRYPOINT")
        .and_then(|i| exec_form(&i.args));
    match (&entry, &binary_dest) {
        (Some(e), Some(dest))
            if e.len() == 1 && &e[0] == dest && dest.ends_with(&format!("/{bin_name}")) => {}
        _ => p.push(format!(
            "ENTRYPOINT {entry:?} is not the copied binary {binary_dest:?}"
        )),
    }
    let cmd = last
        .iter()
        .rev()
        .find(|i| i.keyword == "CMD")
        .and_then(|i| exec_form(&i.args));
    if cmd.as_deref()
        != Some(&[
            "serve".into(),
            "--config".into(),
            "/etc/mrtr-gateway/gateway.toml".into(),
        ])
    {
        p.push(format!(
            "CMD is not serve --config /etc/mrtr-gateway/gateway.toml: {cmd:?}"
        ));
    }

    let exposed: Vec<u16> = last
        .iter()
        .filter(|i| i.keyword == "EXPOSE")
        .flat_map(|i| i.args.split_whitespace())
        .filter_map(|x| x.split('/').next()?.parse().ok())
        .collect();
    for port in expect.ports {
        if !exposed.contains(port) {
            p.push(format!("port {port} is not EXPOSEd"));
        }
    }

    let labels: String = last
        .iter()
        .filter(|i| i.keyword == "LABEL")
        .map(|i| i.args.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    for key in ["title", "description", "version", "licenses", "source"] {
        if !labels.contains(&format!("org.opencontainers.image.{key}=")) {
            p.push(format!("no org.opencontainers.image.{key} label"));
        }
    }
    let license = format!("org.opencontainers.image.licenses=\"{}\"", expect.license);
    if !labels.contains(&license) {
        p.push(format!(
            "the licenses label is not Cargo.toml's {}",
            expect.license
        ));
    }
    p
}

/// What a container sees of an image: the last stage's user, ports, entry point, command
/// and labels.
#[derive(Debug, Default)]
pub struct Contract {
    pub user: Option<String>,
    pub ports: Vec<u16>,
    pub entrypoint: Option<Vec<String>>,
    pub cmd: Option<Vec<String>>,
    pub labels: BTreeMap<String, String>,
}

pub fn contract(stage: &[Instruction]) -> Contract {
    let last = |k: &str| stage.iter().rev().find(|i| i.keyword == k);
    let mut ports: Vec<u16> = stage
        .iter()
        .filter(|i| i.keyword == "EXPOSE")
        .flat_map(|i| i.args.split_whitespace())
        .filter_map(|x| x.split('/').next()?.parse().ok())
        .collect();
    ports.sort_unstable();
    Contract {
        user: last("USER").map(|i| i.args.clone()),
        ports,
        entrypoint: last("ENTRYPOINT").and_then(|i| exec_form(&i.args)),
        cmd: last("CMD").and_then(|i| exec_form(&i.args)),
        labels: stage
            .iter()
            .filter(|i| i.keyword == "LABEL")
            .flat_map(|i| label_pairs(&i.args))
            .collect(),
    }
}

/// `k="v" k2=v2 ...` as written in a LABEL instruction (double quotes, `\"` inside them).
fn label_pairs(args: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = args.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let key: String = std::iter::from_fn(|| chars.next_if(|&c| c != '=')).collect();
        if key.is_empty() || chars.next() != Some('=') {
            return out;
        }
        let mut value = String::new();
        if chars.next_if_eq(&'"').is_some() {
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            value.extend(std::iter::from_fn(|| chars.next_if(|c| !c.is_whitespace())));
        }
        out.push((key.trim().to_owned(), value));
    }
}

/// Everything wrong with `deploy/Containerfile.local` (what `scripts/build-image.sh` builds
/// from the root filesystem it assembles) measured against `deploy/Dockerfile`: it must start
/// from nothing, run nothing (building then needs no container runtime), copy only the
/// assembled `rootfs/`, and give a container exactly what the Dockerfile's image gives.
pub fn local_problems(containerfile: &str, dockerfile: &str) -> Vec<String> {
    let local_all = parse(containerfile);
    let local = stages(&local_all);
    let reference_all = parse(dockerfile);
    let reference = stages(&reference_all);
    let (Some(stage), Some(reference)) = (local.last(), reference.last()) else {
        return vec!["no FROM".into()];
    };
    let mut p = Vec::new();
    if local.len() != 1 || stage_base(stage).0 != "scratch" {
        p.push("not a single stage FROM scratch".into());
    }
    for i in stage.iter() {
        match i.keyword.as_str() {
            "RUN" => p.push(format!(
                "RUN {}: the image is built without a runtime",
                i.args
            )),
            "COPY" | "ADD" if i.args != "rootfs/ /" => p.push(format!(
                "{} {}: only `COPY rootfs/ /` (the assembled root filesystem)",
                i.keyword, i.args
            )),
            _ => {}
        }
    }
    let (mine, theirs) = (contract(stage), contract(reference));
    if mine.user != theirs.user {
        p.push(format!(
            "USER {:?}, the Dockerfile's is {:?}",
            mine.user, theirs.user
        ));
    }
    if mine.ports != theirs.ports {
        p.push(format!(
            "EXPOSE {:?}, the Dockerfile's is {:?}",
            mine.ports, theirs.ports
        ));
    }
    if mine.entrypoint != theirs.entrypoint {
        p.push(format!(
            "ENTRYPOINT {:?}, the Dockerfile's is {:?}",
            mine.entrypoint, theirs.entrypoint
        ));
    }
    if mine.cmd != theirs.cmd {
        p.push(format!(
            "CMD {:?}, the Dockerfile's is {:?}",
            mine.cmd, theirs.cmd
        ));
    }
    for (k, v) in &theirs.labels {
        // The base image is the one thing the two legitimately differ in.
        if k != "org.opencontainers.image.base.name" && mine.labels.get(k) != Some(v) {
            p.push(format!(
                "label {k} is {:?}, the Dockerfile's is {v:?}",
                mine.labels.get(k)
            ));
        }
    }
    p
}
