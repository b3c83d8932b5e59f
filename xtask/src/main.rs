//! `cargo xtask <task>`: everything a developer or CI runs, each task installing what it needs.
mod cargo_output;
mod cmd;
mod demo;
mod libcni_runtime;
mod setup;
mod upgrade_base;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "ebpf-cni developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the toolchain pieces and system packages (idempotent; fast when present).
    Setup,
    /// Build the plugin with its embedded eBPF object.
    Build {
        #[arg(long)]
        release: bool,
    },
    /// Run every test, the privileged namespace/eBPF ones included (needs root), then the
    /// benchmarks in smoke mode (every figure produced, seconds per section).
    Test,
    /// Three pods on two throwaway nodes: ADD, ping, masquerade, iperf3, inspect, bpftool,
    /// CHECK, STATUS, GC, DEL, nothing left.
    Demo {
        /// Keep the cluster up after the inspection until Enter is pressed, and print the
        /// inspect and bpftool commands to run meanwhile.
        #[arg(long)]
        hold: bool,
    },
    /// Build the earlier releases the upgrade tests start from (once; cached under
    /// `target/upgrade-base/`) and print the variables that point the tests at them.
    UpgradeBases,
    /// Benchmarks against the reference bridge plugin (arguments go to the bench binary).
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// An error is one line, its causes joined by ": ", not anyhow's Debug form: that form lists
/// the causes on lines of their own and appends a backtrace whenever RUST_BACKTRACE is set, as it
/// is in many shells and CI images.
fn main() -> ExitCode {
    match run(Cli::parse().task) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(task: Task) -> Result<()> {
    match task {
        Task::Setup => setup::run(),
        Task::Build { release } => {
            setup::run()?;
            cmd::build_plugin(release).map(drop)
        }
        Task::Test => {
            setup::run()?;
            let plugin = cmd::build_plugin(false)?;
            let bases = upgrade_base::build_all()?;
            let libcni = libcni_runtime::build()?;
            cmd::cargo(&["fmt", "--all", "--", "--check"])?;
            let env = [("EBPF_CNI_BIN", plugin.as_os_str())];
            let mut test_env = vec![env[0], ("EBPF_CNI_LIBCNI_RUNTIME", libcni.as_os_str())];
            test_env.extend(bases.iter().map(|(name, path)| (*name, path.as_os_str())));
            eprintln!("running every test…");
            cmd::cargo_with_env(&["test", "--no-fail-fast"], &test_env)?;
            eprintln!("running the benchmarks in smoke mode…");
            cmd::cargo_with_env(&["run", "--quiet", "--package", "bench", "--", "--smoke"], &env)
        }
        Task::UpgradeBases => {
            for (name, path) in upgrade_base::build_all()? {
                println!("{name}={}", path.display());
            }
            Ok(())
        }
        Task::Demo { hold } => {
            demo::require_root()?;
            setup::run()?;
            demo::run(cmd::build_plugin(true)?, hold)
        }
        Task::Bench { args } => {
            setup::run()?;
            let plugin = cmd::build_plugin(true)?;
            eprintln!("running the benchmarks…");
            let mut full = vec!["run", "--quiet", "--release", "--package", "bench", "--"];
            full.extend(args.iter().map(String::as_str));
            cmd::cargo_with_env(&full, &[("EBPF_CNI_BIN", plugin.as_os_str())])
        }
    }
}
