//! `ebpf-cni install`: puts this binary into the node's CNI bin dir and writes the node's
//! conflist from its pod CIDR. Both files are written aside and renamed into place, so a
//! runtime reading them at that moment sees the old file or the new one, never half of one;
//! a conflist that would not change is left alone (kubelet reacts to every write).
use std::{
    fs::{self, File},
    io::Write as _,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use ipnetwork::Ipv4Network;
use serde_json::{Value, json};

use crate::{cni::config::NetConf, kube};

/// The conflist's name: `10-` sorts it before most others, as kubelet uses the first one.
pub const CONFLIST: &str = "10-ebpf-cni.conflist";

#[derive(Args)]
pub struct Install {
    /// The host's root: `/` on a node, `/host` in the DaemonSet, any directory to try it out.
    #[arg(long, default_value = "/")]
    root: PathBuf,
    /// The node's pod CIDR. Default: `spec.podCIDR` of node `--node`, read from the API server.
    #[arg(long)]
    pod_cidr: Option<Ipv4Network>,
    /// The node whose pod CIDR to read (the DaemonSet passes spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    node: Option<String>,
    #[command(flatten)]
    source: kube::Source,
    /// The pod addresses of all nodes (`clusterCIDR`). Default: the node's pod CIDR.
    #[arg(long)]
    cluster_cidr: Option<Ipv4Network>,
    /// Masquerade traffic from pods to outside the cluster CIDR (`ipMasq`).
    #[arg(long)]
    masquerade: bool,
    /// The network name, as pins and IP reservations are filed under.
    #[arg(long, default_value = "ebpf-cni")]
    network: String,
    /// The binary to install. Default: the running one.
    #[arg(long)]
    binary: Option<PathBuf>,
}

pub fn run(args: Install) -> Result<()> {
    let pod_cidr = match (args.pod_cidr, &args.node) {
        (Some(cidr), _) => cidr,
        (None, Some(node)) => args
            .source
            .node(node)?
            .pod_cidr_v4()
            .with_context(|| format!("node {node} has no IPv4 spec.podCIDR yet (is --allocate-node-cidrs on?)"))?,
        (None, None) => bail!("give --pod-cidr, or --node to read it from the API server"),
    };
    let conflist = conflist(&args, pod_cidr)?;
    let source = match &args.binary {
        Some(path) => path.clone(),
        None => std::env::current_exe().context("finding the running binary")?,
    };
    let bin = args.root.join("opt/cni/bin/ebpf-cni");
    let conf = args.root.join("etc/cni/net.d").join(CONFLIST);
    let bytes = fs::read(&source).with_context(|| format!("reading {}", source.display()))?;
    replace(&bin, &bytes, 0o755)?;
    println!("installed {}", bin.display());
    let text = serde_json::to_string_pretty(&conflist)? + "\n";
    if fs::read_to_string(&conf).is_ok_and(|old| old == text) {
        println!("{} is up to date", conf.display());
    } else {
        replace(&conf, text.as_bytes(), 0o644)?;
        println!("wrote {} (pods get addresses from {pod_cidr})", conf.display());
    }
    Ok(())
}

/// The node's conflist, checked with the plugin's own parser before anything is written.
fn conflist(args: &Install, pod_cidr: Ipv4Network) -> Result<Value> {
    let subnet = Ipv4Network::new(pod_cidr.network(), pod_cidr.prefix())?;
    let mut plugin = json!({
        "type": "ebpf-cni",
        "ipMasq": args.masquerade,
        "ipam": { "type": "host-local", "ranges": [[{ "subnet": subnet.to_string() }]], "routes": [{ "dst": "0.0.0.0/0" }] },
    });
    if let Some(cidr) = args.cluster_cidr {
        plugin["clusterCIDR"] = json!(cidr.to_string());
    }
    // Runtimes of today speak 1.0.0 at most and want the answer in the version they asked for.
    let list = json!({ "cniVersion": "1.0.0", "name": args.network, "plugins": [plugin] });
    let mut check = list["plugins"][0].clone();
    check["cniVersion"] = list["cniVersion"].clone();
    check["name"] = list["name"].clone();
    NetConf::parse(check.to_string().as_bytes()).map_err(|e| anyhow::anyhow!("the conflist would be refused: {e}"))?;
    Ok(list)
}

/// Writes `bytes` beside `path`, flushes them to disk, then renames over `path`.
fn replace(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let dir = path.parent().context("no parent directory")?;
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = path.file_name().context("no file name")?.to_string_lossy();
    let aside = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let write = || -> Result<()> {
        let mut file = File::create(&aside)?;
        file.write_all(bytes)?;
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.sync_all()?;
        fs::rename(&aside, path)?;
        File::open(dir)?.sync_all()?;
        Ok(())
    };
    write().inspect_err(|_| drop(fs::remove_file(&aside))).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_leaves_no_temporary_file() {
        let dir = std::env::temp_dir().join(format!("ecni-install-unit-{}", std::process::id()));
        let target = dir.join("a/b/file");
        replace(&target, b"one", 0o644).unwrap();
        replace(&target, b"two", 0o755).unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"two");
        assert_eq!(fs::metadata(&target).unwrap().permissions().mode() & 0o777, 0o755);
        assert_eq!(fs::read_dir(target.parent().unwrap()).unwrap().count(), 1);
        fs::remove_dir_all(dir).unwrap();
    }
}
