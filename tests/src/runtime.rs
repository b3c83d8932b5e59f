//! The runtime's side of the CNI protocol, as libcni plays it for containerd, CRI-O and podman:
//! a network list (conflist) run plugin by plugin, each ADD result handed to the next plugin as
//! `prevResult`, the final result cached for CHECK and DEL, DEL in reverse order, GC with the
//! list of valid attachments, STATUS, and `runtimeConfig` filled from the capabilities each
//! plugin declares. No runtime on this machine sends GC or STATUS (libcni < 1.2): this one does.
use std::{collections::HashMap, path::PathBuf, sync::Mutex};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::{CniOutput, Testbed, plugin::exec_binary};

/// Spec versions in order, to compare them.
const ORDER: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

fn at_least(version: &str, wanted: &str) -> bool {
    let rank = |v: &str| ORDER.iter().position(|o| *o == v);
    rank(version) >= rank(wanted)
}

/// A conflist after version negotiation.
#[derive(Clone, Debug)]
pub struct NetworkList {
    pub name: String,
    pub cni_version: String,
    pub plugins: Vec<Value>,
    pub disable_check: bool,
    pub disable_gc: bool,
}

/// One attachment as the runtime knows it.
#[derive(Clone, Debug, Default)]
pub struct Sandbox {
    pub container_id: String,
    pub ifname: String,
    /// Empty for a DEL after the sandbox is gone (containerd does this).
    pub netns: String,
    pub cni_args: String,
    /// Capability arguments (`portMappings`, `bandwidth`, `ips`, `mac`…); each plugin gets those
    /// it declares in `capabilities`.
    pub capability_args: serde_json::Map<String, Value>,
}

pub struct Runtime {
    node_netns: String,
    cni_path: Vec<PathBuf>,
    /// Cached ADD results by (container ID, ifname), as libcni keeps them on disk.
    cache: Mutex<HashMap<(String, String), Value>>,
    /// `EBPF_CNI_NODE_CONF` for the plugins: the node file, as a node's runtime would give it.
    node_conf: Option<String>,
}

impl Runtime {
    /// Runs plugins in the testbed's node namespace; CNI_PATH is the plugin under test's
    /// directory, then the reference plugins from Debian.
    pub fn for_testbed(tb: &Testbed) -> Self {
        Self {
            node_netns: tb.node.name.clone(),
            cni_path: vec![tb.plugin.dir(), PathBuf::from("/usr/lib/cni")],
            cache: Mutex::new(HashMap::new()),
            node_conf: None,
        }
    }

    /// Plugins read the node file at `path` (ebpf-cni's trust boundary, `node.json`).
    pub fn use_node_conf(&mut self, path: &std::path::Path) {
        self.node_conf = Some(path.display().to_string());
    }

    /// Searches `dir` for plugins too (before the others), e.g. a fake IPAM plugin of a test.
    pub fn search_first(&mut self, dir: PathBuf) {
        self.cni_path.insert(0, dir);
    }

    fn binary(&self, plugin_type: &str) -> Result<PathBuf> {
        self.cni_path
            .iter()
            .map(|dir| dir.join(plugin_type))
            .find(|p| p.is_file())
            .with_context(|| format!("plugin {plugin_type} not in CNI_PATH"))
    }

    fn cni_path_env(&self) -> String {
        std::env::join_paths(&self.cni_path).expect("no separator in paths").to_string_lossy().into_owned()
    }

    /// Reads a conflist; with `cniVersions`, picks the newest version every plugin speaks.
    pub fn load(&self, conflist: &Value) -> Result<NetworkList> {
        let plugins = conflist["plugins"].as_array().context("conflist without plugins")?.clone();
        let cni_version = match conflist.get("cniVersions").and_then(Value::as_array) {
            Some(offered) => {
                let mut common: Vec<&str> = offered.iter().filter_map(Value::as_str).collect();
                for plugin in &plugins {
                    let spoken = self.versions_of(plugin["type"].as_str().context("plugin without type")?)?;
                    common.retain(|v| spoken.iter().any(|s| s == v));
                }
                common
                    .into_iter()
                    .max_by_key(|v| ORDER.iter().position(|o| o == v))
                    .context("no common version")?
                    .to_string()
            }
            None => conflist["cniVersion"].as_str().context("conflist without cniVersion")?.to_string(),
        };
        Ok(NetworkList {
            name: conflist["name"].as_str().context("conflist without name")?.to_string(),
            cni_version,
            plugins,
            disable_check: conflist["disableCheck"].as_bool().unwrap_or(false),
            disable_gc: conflist["disableGC"].as_bool().unwrap_or(false),
        })
    }

    /// VERSION of a plugin: the versions it lists.
    pub fn versions_of(&self, plugin_type: &str) -> Result<Vec<String>> {
        let out = exec_binary(
            &self.binary(plugin_type)?,
            &self.node_netns,
            &[("CNI_COMMAND", "VERSION")],
            r#"{"cniVersion":"0.4.0"}"#,
        )?;
        let listed = out.json()["supportedVersions"].as_array().cloned().unwrap_or_default();
        Ok(listed.iter().filter_map(Value::as_str).map(str::to_string).collect())
    }

    /// One verb for one plugin of the list: its configuration gets the list's name and
    /// version, its share of the capability arguments, and `extra` top-level fields.
    pub fn invoke(
        &self,
        list: &NetworkList,
        plugin: &Value,
        command: &str,
        sandbox: Option<&Sandbox>,
        extra: &[(&str, Value)],
    ) -> Result<CniOutput> {
        let mut conf = plugin.clone();
        conf["name"] = json!(list.name);
        conf["cniVersion"] = json!(list.cni_version);
        if let (Some(sb), Some(caps)) = (sandbox, plugin.get("capabilities").and_then(Value::as_object)) {
            let runtime_config: serde_json::Map<String, Value> = caps
                .iter()
                .filter(|(_, on)| on.as_bool() == Some(true))
                .filter_map(|(cap, _)| Some((cap.clone(), sb.capability_args.get(cap)?.clone())))
                .collect();
            if !runtime_config.is_empty() {
                conf["runtimeConfig"] = Value::Object(runtime_config);
            }
        }
        for (key, value) in extra {
            conf[*key] = value.clone();
        }
        let path = self.cni_path_env();
        let mut env = vec![("CNI_COMMAND", command), ("CNI_PATH", path.as_str())];
        if let Some(node_conf) = &self.node_conf {
            env.push(("EBPF_CNI_NODE_CONF", node_conf.as_str()));
        }
        if let Some(sb) = sandbox {
            env.extend([
                ("CNI_CONTAINERID", sb.container_id.as_str()),
                ("CNI_IFNAME", sb.ifname.as_str()),
                ("CNI_NETNS", sb.netns.as_str()),
                ("CNI_ARGS", sb.cni_args.as_str()),
            ]);
        }
        let plugin_type = plugin["type"].as_str().context("plugin without type")?;
        exec_binary(&self.binary(plugin_type)?, &self.node_netns, &env, &conf.to_string())
    }

    /// ADD through the chain; a failure runs DEL on the whole chain, as runtimes do.
    pub fn add(&self, list: &NetworkList, sb: &Sandbox) -> Result<Value> {
        let mut prev: Option<Value> = None;
        for plugin in &list.plugins {
            let extra: Vec<(&str, Value)> = prev.iter().map(|p| ("prevResult", p.clone())).collect();
            let out = self.invoke(list, plugin, "ADD", Some(sb), &extra)?;
            if !out.success {
                let _ = self.del(list, sb);
                bail!("ADD of {} failed: {} {}", plugin["type"], out.stdout, out.stderr);
            }
            prev = Some(serde_json::from_str(&out.stdout).context("ADD result is not JSON")?);
        }
        let result = prev.context("empty chain")?;
        self.cache.lock().expect("cache").insert(key(sb), result.clone());
        Ok(result)
    }

    /// CHECK through the chain with the cached result (skipped when the list disables it or
    /// its version predates CHECK).
    pub fn check(&self, list: &NetworkList, sb: &Sandbox) -> Result<()> {
        if list.disable_check || !at_least(&list.cni_version, "0.4.0") {
            return Ok(());
        }
        let cached = self.cached(sb).context("CHECK without a cached result")?;
        for plugin in &list.plugins {
            let out = self.invoke(list, plugin, "CHECK", Some(sb), &[("prevResult", cached.clone())])?;
            if !out.success {
                bail!("CHECK of {} failed: {}", plugin["type"], out.stdout);
            }
        }
        Ok(())
    }

    /// DEL through the chain in reverse, with the cached result when there is one.
    pub fn del(&self, list: &NetworkList, sb: &Sandbox) -> Result<()> {
        let cached = self.cached(sb).filter(|_| at_least(&list.cni_version, "0.4.0"));
        for plugin in list.plugins.iter().rev() {
            let extra: Vec<(&str, Value)> = cached.iter().map(|c| ("prevResult", c.clone())).collect();
            let out = self.invoke(list, plugin, "DEL", Some(sb), &extra)?;
            if !out.success {
                bail!("DEL of {} failed: {} {}", plugin["type"], out.stdout, out.stderr);
            }
        }
        self.cache.lock().expect("cache").remove(&key(sb));
        Ok(())
    }

    /// GC with the attachments still in use (skipped before 1.1.0 or with `disableGC`).
    pub fn gc(&self, list: &NetworkList, valid: &[&Sandbox]) -> Result<Vec<CniOutput>> {
        if list.disable_gc || !at_least(&list.cni_version, "1.1.0") {
            return Ok(Vec::new());
        }
        let attachments: Vec<Value> =
            valid.iter().map(|sb| json!({ "containerID": sb.container_id, "ifname": sb.ifname })).collect();
        let mut outputs = Vec::new();
        for plugin in &list.plugins {
            let out = self.invoke(list, plugin, "GC", None, &[("cni.dev/valid-attachments", json!(attachments))])?;
            if !out.success {
                bail!("GC of {} failed: {}", plugin["type"], out.stdout);
            }
            outputs.push(out);
        }
        Ok(outputs)
    }

    /// STATUS of every plugin (skipped before 1.1.0).
    pub fn status(&self, list: &NetworkList) -> Result<()> {
        if !at_least(&list.cni_version, "1.1.0") {
            return Ok(());
        }
        for plugin in &list.plugins {
            let out = self.invoke(list, plugin, "STATUS", None, &[])?;
            if !out.success {
                bail!("STATUS of {} failed: {}", plugin["type"], out.stdout);
            }
        }
        Ok(())
    }

    pub fn cached(&self, sb: &Sandbox) -> Option<Value> {
        self.cache.lock().expect("cache").get(&key(sb)).cloned()
    }
}

fn key(sb: &Sandbox) -> (String, String) {
    (sb.container_id.clone(), sb.ifname.clone())
}
