//! The two forms of the stream: a table (a header, then one line per event, time of day in UTC)
//! or one JSON object per line (`-o json`, every field of `Record`).
use anyhow::Result;

use super::{args::Format, event::Record};
use crate::cli::write_stdout;

pub struct Output {
    format: Format,
    header_written: bool,
}

impl Output {
    pub fn new(format: Format) -> Self {
        Self { format, header_written: false }
    }

    /// `Ok(false)` once stdout's reader has gone.
    pub fn write(&mut self, record: &Record) -> Result<bool> {
        let mut text = String::new();
        match self.format {
            Format::Json => {
                text = serde_json::to_string(record)?;
                text.push('\n');
            }
            Format::Table => {
                if !self.header_written {
                    text = line(["TIME", "POD", "DIR", "PEER", "PROTO", "PORTS", "VERDICT", "REASON", "POLICY"]);
                    self.header_written = true;
                }
                text += &table_line(record);
            }
        }
        Ok(write_stdout(&text)?)
    }
}

fn table_line(r: &Record) -> String {
    // "2026-11-28T01:12:49.123456789Z" → "01:12:49.123456"
    let time = r.time.get(11..26).unwrap_or(&r.time);
    let ports = match (r.src_port, r.dst_port) {
        (Some(src), Some(dst)) => format!("{src}→{dst}"),
        _ => "-".into(),
    };
    let or_dash = |value: &Option<String>| value.clone().unwrap_or_else(|| "-".into());
    line([
        time,
        &or_dash(&r.pod),
        r.direction.unwrap_or("-"),
        &or_dash(&r.peer),
        &or_dash(&r.protocol),
        &ports,
        r.verdict,
        r.reason.unwrap_or("-"),
        &or_dash(&r.policy),
    ])
}

fn line(columns: [&str; 9]) -> String {
    const WIDTHS: [usize; 8] = [15, 30, 7, 30, 6, 13, 7, 22];
    let mut text = String::new();
    for (column, width) in columns.iter().zip(WIDTHS) {
        text += &format!("{column:<width$} ");
    }
    text += columns[8];
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_line_has_every_column() {
        let record = Record {
            time: "2026-11-28T01:12:49.123456789Z".into(),
            kind: "policy",
            verdict: "denied",
            reason: Some("policy-denied"),
            pod: Some("y/b".into()),
            pod_ip: None,
            direction: Some("ingress"),
            peer: Some("x/a".into()),
            peer_ip: None,
            protocol: Some("tcp".into()),
            src_ip: None,
            src_port: Some(40000),
            dst_ip: None,
            dst_port: Some(80),
            policy: None,
            policy_slot: None,
            ifindex: 7,
            len: 60,
        };
        let line = table_line(&record);
        let columns: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            columns,
            ["01:12:49.123456", "y/b", "ingress", "x/a", "tcp", "40000→80", "denied", "policy-denied", "-"]
        );
    }
}
