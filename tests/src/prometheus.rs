//! Reading the Prometheus text format with the reference parser, not one of ours:
//! `prometheus_client.parser` (Python), installed from PyPI when missing.
use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    process::{Command, Stdio},
    sync::Mutex,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

/// The parser's package, pinned: its idea of the format is what the tests hold us to.
pub const PROMETHEUS_CLIENT: &str = "prometheus_client==0.26.0";

/// Each family as the parser sees it. A counter's family name has no `_total`; its samples do.
/// A family without `# TYPE` is `unknown`, one without `# HELP` has an empty `help`.
#[derive(Debug)]
pub struct Family {
    pub name: String,
    pub kind: String,
    pub help: String,
    pub samples: Vec<Sample>,
}

#[derive(Debug)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Dumps what the parser read as JSON, for the Rust side.
const DUMP: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
json.dump([{"name": f.name, "type": f.type, "help": f.documentation,
            "samples": [{"name": s.name, "labels": s.labels, "value": s.value} for s in f.samples]}
           for f in text_string_to_metric_families(sys.stdin.read())], sys.stdout)
"#;

/// Installs the parser unless `python3` already imports it (once per process: tests running in
/// parallel must not run pip side by side).
pub fn ensure_parser() -> Result<()> {
    static CHECKED: Mutex<bool> = Mutex::new(false);
    let mut checked = CHECKED.lock().unwrap_or_else(|e| e.into_inner());
    if *checked || importable()? {
        *checked = true;
        return Ok(());
    }
    eprintln!("installing {PROMETHEUS_CLIENT} (the Prometheus text-format parser the metrics tests use)");
    let pip = |extra: &[&str]| {
        Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", PROMETHEUS_CLIENT])
            .args(extra)
            .env("PIP_ROOT_USER_ACTION", "ignore")
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
            .output()
            .context("running python3 -m pip")
    };
    let mut out = pip(&[])?;
    // Debian's own python3 refuses pip installs outside a venv (PEP 668); this package is a
    // test tool with no dependencies, so it goes in all the same.
    if !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("externally-managed") {
        out = pip(&["--break-system-packages"])?;
    }
    if !out.status.success() || !importable()? {
        bail!("installing {PROMETHEUS_CLIENT} with pip failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    *checked = true;
    Ok(())
}

fn importable() -> Result<bool> {
    let status = Command::new("python3")
        .args(["-c", "import prometheus_client"])
        .stderr(Stdio::null())
        .status()
        .context("running python3 (needed to parse metrics)")?;
    Ok(status.success())
}

/// The families of `text`; an error when the parser rejects it.
pub fn parse(text: &str) -> Result<Vec<Family>> {
    ensure_parser()?;
    let mut child = Command::new("python3")
        .args(["-c", DUMP])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running python3")?;
    child.stdin.take().context("stdin")?.write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("the Prometheus parser rejected the text: {}\n{text}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let dump: Value = serde_json::from_slice(&out.stdout).context("the parser's dump")?;
    let text = |v: &Value| v.as_str().map(str::to_string).context("not a string");
    dump.as_array()
        .context("not a list")?
        .iter()
        .map(|f| {
            let samples = f["samples"].as_array().context("samples")?;
            Ok(Family {
                name: text(&f["name"])?,
                kind: text(&f["type"])?,
                help: text(&f["help"])?,
                samples: samples
                    .iter()
                    .map(|s| {
                        let labels = s["labels"].as_object().context("labels")?;
                        Ok(Sample {
                            name: text(&s["name"])?,
                            labels: labels.iter().map(|(k, v)| Ok((k.clone(), text(v)?))).collect::<Result<_>>()?,
                            value: s["value"].as_f64().context("value")?,
                        })
                    })
                    .collect::<Result<_>>()?,
            })
        })
        .collect()
}

/// The value of the sample `name` whose labels include `labels`, if there is exactly one.
pub fn value(families: &[Family], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = families
        .iter()
        .flat_map(|f| &f.samples)
        .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)));
    let first = found.next()?;
    found.next().is_none().then_some(first.value)
}

/// One HTTP/1.1 GET of `path` from `at` in `netns`: the status line, the headers, the body.
pub fn http_get(netns: &str, at: SocketAddr, path: &str) -> Result<(String, String, String)> {
    let mut stream =
        crate::traffic::in_netns(netns, move || Ok(TcpStream::connect_timeout(&at, Duration::from_secs(2))?))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {at}\r\nAccept: text/plain\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    Ok((status.to_string(), headers.to_string(), body.to_string()))
}
