//! `ebpf-cni agent` running on (not `--once`) in a test node's namespace, with the node's own
//! bpffs root, its stderr in a file; killed, by its PID, when dropped (also when the test panics).
use std::{
    fs::File,
    path::PathBuf,
    process::{Child, Command},
};

use anyhow::{Context as _, Result};

use crate::Testbed;

pub struct RunningAgent {
    pub child: Child,
    log: PathBuf,
}

impl RunningAgent {
    /// Starts the agent as Kubernetes node `node_name` on `tb`, with more `args`.
    pub fn start(tb: &Testbed, node_name: &str, args: &[&str]) -> Result<Self> {
        let log = tb.data_dir().with_file_name("agent.log");
        // The policy names file goes beside the node's data, never to the machine's /run (an
        // agent built before the flag existed, as an upgrade test runs, writes none).
        let mut own = Vec::new();
        if !args.contains(&"--policy-names") && takes_flag(&tb.plugin.binary, "--policy-names") {
            own = vec![
                "--policy-names".to_string(),
                tb.data_dir().with_file_name("policy-names.json").display().to_string(),
            ];
        }
        // nsenter execs the agent in place: the PID is the agent's.
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", tb.node.name))
            .arg(&tb.plugin.binary)
            .args(["agent", "--node", node_name])
            .arg("--bpffs-root")
            .arg(tb.bpffs_root())
            .args(own)
            .args(args)
            .stderr(File::create(&log).context("creating the agent's log")?)
            .spawn()
            .context("starting the agent")?;
        Ok(Self { child, log })
    }

    /// What the agent wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `ebpf-cni agent` of `binary` takes `flag`.
pub fn takes_flag(binary: &std::path::Path, flag: &str) -> bool {
    let help = Command::new(binary).args(["agent", "--help"]).output();
    help.is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains(flag))
}
