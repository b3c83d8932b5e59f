//! What the node holds after a GC, compared with what the runtime believes: exactly one of each
//! per valid attachment, nothing more.
use anyhow::Result;

use crate::Testbed;

/// Everything that does not match `valid` attachments (empty when the node is exact):
/// host veths, IP files, routes to pods, endpoint entries, `from_pod` filters.
pub fn mismatches(tb: &Testbed, valid: usize) -> Result<Vec<String>> {
    let counts = [
        ("host veths", tb.host_veths()?.len()),
        ("IP files", tb.ip_files().len()),
        ("routes to pods", tb.pod_routes()?.len()),
        ("ENDPOINTS entries", tb.map_len("ENDPOINTS")?),
        ("from_pod filters", tb.from_pod_filters()?.len()),
    ];
    Ok(counts
        .into_iter()
        .filter(|(_, n)| *n != valid)
        .map(|(what, n)| format!("{n} {what} for {valid} valid attachments"))
        .collect())
}

/// Namespaces of this run (`<run id>-…`) still in /run/netns.
pub fn namespaces_left(run_id: &str) -> Vec<String> {
    let prefix = format!("{run_id}-");
    std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// Every pin below the network's directory, as paths relative to it.
pub fn pins(tb: &Testbed) -> Vec<String> {
    fn walk(dir: &std::path::Path, base: &std::path::Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, base, out);
            } else {
                out.push(path.strip_prefix(base).unwrap_or(&path).display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(&tb.pin_dir(), &tb.pin_dir(), &mut out);
    out.sort();
    out
}
