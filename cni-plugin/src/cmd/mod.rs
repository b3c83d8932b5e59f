//! One CNI invocation: read env and stdin, run the verb, print the result or the error.
mod add;
mod check;
mod del;
mod gc;
mod status;

use std::{
    io::{Read, Write},
    process::ExitCode,
    time::Instant,
};

use serde_json::{Value, json};

use crate::cni::{
    CniError, CniResult, ErrorCode,
    config::NetConf,
    env::{CniEnv, Command},
    node_conf::{Mismatch, NodeConf},
    version,
};

/// Runs the verb named by CNI_COMMAND. Only the result or the error JSON goes to stdout.
pub fn run() -> ExitCode {
    crate::logging::init();
    let started = Instant::now();
    let mut stdin = Vec::new();
    let read = std::io::stdin().read_to_end(&mut stdin);
    let asked_version = version::asked(&stdin);
    let outcome = match read {
        Ok(_) => dispatch(&stdin),
        Err(e) => Err(CniError::new(ErrorCode::IO, "cannot read stdin").with_details(e)),
    };
    crate::fault::report_open_fds();
    let took_ms = started.elapsed().as_secs_f64() * 1e3;
    let (out, code) = match outcome {
        Ok(out) => {
            // Reading the call's names again costs a parse: only when the line is written.
            if log::log_enabled!(log::Level::Info) {
                log::info!("{} {took_ms:.1}ms ok", Call::of(&stdin));
            }
            (out, ExitCode::SUCCESS)
        }
        Err(err) => {
            log::error!("{} {took_ms:.1}ms failed: {err}", Call::of(&stdin));
            (Some(err.to_json(&asked_version)), ExitCode::FAILURE)
        }
    };
    if let Some(out) = out {
        let mut stdout = std::io::stdout().lock();
        let _ = serde_json::to_writer(&mut stdout, &out);
        let _ = stdout.write_all(b"\n");
    }
    code
}

/// What the log line of a verb names: the verb, the attachment and the network, read leniently
/// (the line is written for calls whose input did not parse too).
struct Call {
    command: String,
    container_id: String,
    ifname: String,
    network: String,
}

impl Call {
    fn of(stdin: &[u8]) -> Self {
        let var = |key| std::env::var(key).unwrap_or_default();
        let conf: Option<Value> = serde_json::from_slice(stdin).ok();
        let network = conf.as_ref().and_then(|c| c["name"].as_str()).unwrap_or_default().to_string();
        Self { command: var("CNI_COMMAND"), container_id: var("CNI_CONTAINERID"), ifname: var("CNI_IFNAME"), network }
    }
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.command)?;
        // GC, STATUS and VERSION name no attachment.
        if !self.container_id.is_empty() {
            write!(f, " container={:?} ifname={:?}", self.container_id, self.ifname)?;
        }
        write!(f, " network={:?}", self.network)
    }
}

/// The verb's stdout JSON, if it has one (DEL prints nothing on success).
fn dispatch(stdin: &[u8]) -> CniResult<Option<Value>> {
    let env = CniEnv::from_lookup(|key| std::env::var(key).ok())?;
    if env.command == Command::Version {
        return Ok(Some(json!({ "cniVersion": version::asked(stdin), "supportedVersions": version::SUPPORTED })));
    }
    let mut conf = NetConf::parse(stdin)?;
    let overridden = match NodeConf::load_default()? {
        Some((path, node)) => {
            let mismatch = if env.command == Command::Del { Mismatch::Override } else { Mismatch::Refuse };
            // A refused configuration is an attempt the node's own log should show.
            node.confine(&path, &mut conf, mismatch).inspect_err(|_| {
                let level = conf.log_level().unwrap_or(log::LevelFilter::Error).max(log::LevelFilter::Error);
                crate::logging::configure(level, node.log_file.as_deref());
            })?
        }
        None => Vec::new(),
    };
    crate::logging::configure(conf.log_level()?, conf.log_file.as_deref());
    overridden.iter().for_each(|note| log::warn!("{note}"));
    version::allows(env.command, &conf.cni_version)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| CniError::new(ErrorCode::INTERNAL, "cannot start runtime").with_details(e))?;
    // One verb at a time per attachment (GC, STATUS and VERSION act on none).
    let _attachment = match env.command {
        Command::Add | Command::Del | Command::Check => {
            Some(crate::attachment::Attachment::new(&env.container_id, &env.ifname).lock()?)
        }
        _ => None,
    };
    runtime.block_on(async {
        match env.command {
            Command::Add => add::add(&env, &conf, stdin).await.map(|r| Some(r.to_json(&conf.cni_version))),
            Command::Del => del::del(&env, &conf, stdin).await.map(|()| None),
            Command::Check => check::check(&env, &conf, stdin).await.map(|()| None),
            Command::Gc => gc::gc(&env, &conf, stdin).await.map(|()| None),
            Command::Status => status::status(&env, &conf, stdin).map(|()| None),
            Command::Version => unreachable!("answered above"),
        }
    })
}
