//! Helper processes of a benchmark (servers), killed by their PID when dropped.
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result, bail};
use ebpf_cni_tests::cgroup::TestCgroup;

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
    output_confined(netns, None, cpu, program, args)
}

/// [`output_in`], the process started in `cgroup` when given (a client the socket LB translates).
pub fn output_confined(
    netns: &str,
    cgroup: Option<&TestCgroup>,
    cpu: Option<usize>,
    program: &str,
    args: &[&str],
) -> Result<String> {
    let mut command = Command::new("nsenter");
    command.arg(format!("--net=/run/netns/{netns}"));
    if let Some(cpu) = cpu {
        command.args(["taskset", "-c", &cpu.to_string()]);
    }
    command.arg(program).args(args);
    if let Some(cgroup) = cgroup {
        cgroup.confine(&mut command)?;
    }
    let out = command.output().with_context(|| format!("spawning {program} in {netns}"))?;
    if !out.status.success() {
        bail!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}
