//! The `services` view: each frontend of the socket LB (`SVC_FRONTENDS`) and the backends its
//! current bank names, with its ClientIP affinity.
use anyhow::Result;
use serde::Serialize;

use super::table::Row;
use crate::bpf::{
    Pins,
    services::{ServiceView, ServiceWriter},
};

#[derive(Serialize)]
#[serde(transparent)]
pub struct ServiceRow(ServiceView);

impl Row for ServiceRow {
    const HEADERS: &'static [&'static str] = &["FRONTEND", "PROTO", "BACKENDS", "AFFINITY", "EXTERNAL", "REVISION"];
    fn cells(&self) -> Vec<String> {
        let s = &self.0;
        let frontend = std::net::SocketAddr::new(s.frontend.ip, s.frontend.port);
        let backends: Vec<String> = s.backends.iter().map(ToString::to_string).collect();
        vec![
            frontend.to_string(),
            format!("{:?}", s.frontend.protocol).to_lowercase(),
            // No backend: connects are refused at once.
            if backends.is_empty() { "(none: refused)".into() } else { backends.join(",") },
            s.affinity.map_or_else(|| "-".into(), |t| format!("ClientIP {}s", t.as_secs())),
            match (s.external, s.local) {
                (false, _) => "-".into(),
                (true, false) => "cluster".into(),
                (true, true) => "local".into(),
            },
            s.revision.to_string(),
        ]
    }
}

pub fn rows(pins: &Pins) -> Result<Vec<ServiceRow>> {
    Ok(ServiceWriter::open(pins)?.list()?.into_iter().map(ServiceRow).collect())
}
