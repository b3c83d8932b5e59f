//! Which addresses each attachment holds: `attachments/<digest>` in the network's IPAM
//! directory, named by the digest of (container ID, ifname) as the attachment's other names
//! are (`attachment.rs`), holding `<containerID>\r\n<ifname>` and then one address a line.
//! DEL reads it to find the attachment's reservations and endpoints with a few lookups, where
//! host-local's layout alone makes it read every reservation of the node.
//!
//! A hint, checked: an address is released only while its reservation still names the
//! attachment. Without a record (an earlier build's ADD, a second DEL) DEL reads every
//! reservation, as before. Readers of host-local's layout pass over it: its name is not an
//! address, and its content, three lines or more, names no holder.
use std::{fs, io::ErrorKind, net::IpAddr, path::PathBuf};

use super::store::{Holder, LINE_BREAK, Store};
use crate::{
    attachment::Attachment,
    cni::{CniResult, Context, ErrorCode},
};

const RECORDS: &str = "attachments";

impl Store {
    fn record_path(&self, id: &str, ifname: &str) -> PathBuf {
        self.dir.join(RECORDS).join(Attachment::new(id.trim(), ifname).hex())
    }

    /// Adds `ips` to the attachment's record: an ADD retried without a DEL between keeps
    /// what the first one recorded. Whole or absent (written aside, then renamed).
    pub fn record(&self, id: &str, ifname: &str, ips: &[IpAddr]) -> CniResult<()> {
        let mut all = self.recorded(id, ifname).unwrap_or_default();
        all.extend(ips.iter().filter(|ip| !all.contains(ip)).collect::<Vec<_>>());
        let mut content = format!("{}{LINE_BREAK}{ifname}", id.trim());
        for ip in &all {
            content.push_str(LINE_BREAK);
            content.push_str(&ip.to_string());
        }
        let path = self.record_path(id, ifname);
        fs::create_dir_all(self.dir.join(RECORDS)).cni(ErrorCode::IO, "cannot create the attachments' records")?;
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let aside = self.write_aside(&format!("record-{name}"), &content)?;
        fs::rename(&aside, &path).cni(ErrorCode::IO, "cannot record the attachment's addresses")
    }

    /// The addresses recorded for the attachment; None without a record (or with one that does
    /// not parse, or names another attachment): then only a walk of the reservations knows.
    pub fn recorded(&self, id: &str, ifname: &str) -> Option<Vec<IpAddr>> {
        let content = fs::read(self.record_path(id, ifname)).ok()?;
        if !Holder::parse(&content).is(id, ifname) {
            return None;
        }
        let text = std::str::from_utf8(&content).ok()?;
        text.lines().skip(2).map(|line| line.trim().parse().ok()).collect()
    }

    /// Removes the attachment's record, if any.
    pub fn forget(&self, id: &str, ifname: &str) -> CniResult<()> {
        match self.retire(&self.record_path(id, ifname)) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(e).cni(ErrorCode::IO, "cannot remove a record"),
            _ => Ok(()),
        }
    }

    /// GC: removes the records of the attachments `stale` picks, and records naming none.
    /// Returns how many.
    pub fn remove_records_where(&self, stale: impl Fn(&Holder) -> bool) -> CniResult<usize> {
        let entries = match fs::read_dir(self.dir.join(RECORDS)) {
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(0),
            entries => entries.cni(ErrorCode::IO, "cannot list the attachments' records")?,
        };
        let mut removed = 0;
        for entry in entries.filter_map(Result::ok) {
            let Ok(content) = fs::read(entry.path()) else { continue };
            let holder = Holder::parse(&content);
            if holder.is_torn() || stale(&holder) {
                fs::remove_file(entry.path()).cni(ErrorCode::IO, "cannot remove a record")?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}
