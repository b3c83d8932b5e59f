//! Helper processes of a benchmark (servers), killed by their PID when dropped.
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};

pub struct Background(Child);

impl Background {
    /// `program args…` in network namespace `netns`, pinned to `cpu` when given.
    pub fn spawn_in(netns: &str, cpu: Option<usize>, program: &str, args: &[&str]) -> Result<Self> {
        let mut command = Command::new("nsenter");
        command.arg(format!("--net=/run/netns/{netns}"));
        if let Some(cpu) = cpu {
            command.args(["taskset", "-c", &cpu.to_string()]);
        }
        let child = command
            .arg(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {program} in {netns}"))?;
        Ok(Self(child))
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `program args…` in `netns` (pinned to `cpu` when given), its stdout and stderr together;
/// fails when the program does.
pub fn output_in(netns: &str, cpu: Option<usize>, program: &str, args: &[&str]) -> Result<String> {
    let mut full: Vec<String> = Vec::new();
    if let Some(cpu) = cpu {
        full.extend(["taskset".into(), "-c".into(), cpu.to_string()]);
    }
    full.push(program.into());
    full.extend(args.iter().map(|a| a.to_string()));
    let (first, rest) = full.split_first().expect("a program");
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    let out = ebpf_cni_tests::run_in(netns, first, &rest)?;
    Ok(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}
