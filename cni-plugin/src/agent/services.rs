//! With the node file's `kubeProxyReplacement`, the agent watches Services and EndpointSlices
//! and keeps the Service model (`services/`) in step, handing each batch's differences to the
//! sink. Nothing is handed on before both first lists came (as kube-proxy waits for both its
//! caches): a Service listed before its endpoints would otherwise be told "no endpoint" first.
use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{
        Arc,
        mpsc::{Receiver, RecvTimeoutError, Sender, channel},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use serde_json::json;

use super::{service_maps::MapSink, service_stats::ServiceStats};
use crate::{
    bpf::Pins,
    kube::{Feed, Update},
    services::{DEFAULT_MAX_BACKENDS, LogSink, Model, Node, ServiceSink},
};

/// Boxed: an object is large, a node's addresses are not.
pub enum Input {
    Services(Box<Update<Service>>),
    Slices(Box<Update<EndpointSlice>>),
    /// This node's addresses, where NodePorts are served.
    NodeAddrs(Vec<IpAddr>),
}

/// How long the input must be quiet before the debug dump is written again: writing it costs
/// milliseconds at 10,000 Services, which a burst should not wait for.
const QUIET: Duration = Duration::from_millis(100);

/// Adds the two watches to `feed` and starts the model's thread; its input.
/// `pins`: the primary network's, whose socket LB maps the Services go into (none: logged only).
pub fn start(
    feed: &mut Feed,
    own: &str,
    dump: Option<PathBuf>,
    pins: Option<Pins>,
    stats: Arc<ServiceStats>,
) -> Sender<Input> {
    let (tx, rx) = channel();
    feed.watch(tx.clone(), |update| Input::Services(Box::new(update)));
    feed.watch(tx.clone(), |update| Input::Slices(Box::new(update)));
    let node = Node { name: own.to_string(), addrs: Vec::new() };
    std::thread::spawn(move || {
        let mut sink: Box<dyn ServiceSink> = match pins {
            Some(pins) => Box::new(MapSink::new(pins)),
            None => Box::new(LogSink::default()),
        };
        stats.started();
        run(&rx, Model::new(node, DEFAULT_MAX_BACKENDS), sink.as_mut(), dump, &stats)
    });
    tx
}

fn run(
    input: &Receiver<Input>,
    mut model: Model,
    sink: &mut dyn ServiceSink,
    dump: Option<PathBuf>,
    stats: &ServiceStats,
) {
    let (mut services_listed, mut slices_listed) = (false, false);
    let mut first_list: Option<Instant> = None;
    let mut synced = false;
    let mut dump_due = false;
    loop {
        let first = match input.recv_timeout(QUIET) {
            Ok(first) => first,
            Err(RecvTimeoutError::Timeout) => {
                if synced {
                    sink.idle();
                }
                if let Some(path) = dump.as_deref().filter(|_| std::mem::take(&mut dump_due)) {
                    write_dump(path, &model, synced);
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let taken = Instant::now();
        for update in std::iter::once(first).chain(input.try_iter()) {
            let listed = match update {
                Input::Services(update) => {
                    let m = &mut model;
                    let listed = update.apply_to(
                        "services",
                        m,
                        Model::list_services,
                        Model::apply_service,
                        Model::delete_service,
                    );
                    services_listed |= listed;
                    listed
                }
                Input::Slices(update) => {
                    let m = &mut model;
                    let listed = update.apply_to(
                        "endpointslices",
                        m,
                        Model::list_slices,
                        Model::apply_slice,
                        Model::delete_slice,
                    );
                    slices_listed |= listed;
                    listed
                }
                Input::NodeAddrs(addrs) => {
                    model.set_node_addrs(addrs);
                    false
                }
            };
            if listed {
                first_list.get_or_insert_with(Instant::now);
            }
        }
        if !(services_listed && slices_listed) {
            continue;
        }
        let changed = model.flush(sink);
        dump_due = true;
        stats.model(&model.stats);
        if synced {
            stats.synced(taken.elapsed(), changed.len());
        } else {
            synced = true;
            let took = first_list.map(|t| t.elapsed()).unwrap_or_default();
            stats.first_sync(took);
            log::info!("services: first sync, {} frontends, {took:?} after the first list", changed.len());
        }
    }
}

/// `--services-dump`: the model's frontends and counts as JSON, written aside and renamed into
/// place, for tests and debugging until `ebpf-cni inspect services` reads the datapath.
fn write_dump(path: &Path, model: &Model, synced: bool) {
    let frontends: Vec<_> =
        model.served().into_iter().map(|(frontend, entry)| json!({"frontend": frontend, "entry": entry})).collect();
    let dump = json!({ "synced": synced, "stats": model.stats, "frontends": frontends });
    let aside = path.with_extension("tmp");
    let written = std::fs::write(&aside, dump.to_string()).and_then(|()| std::fs::rename(&aside, path));
    if let Err(e) = written {
        log::warn!("writing {}: {e}", path.display());
    }
}
