//! The settling thread: the sockets the socket LB sent to removed backends are settled here,
//! after the batch's map writes, not on the writer's thread. A settle walks every network
//! namespace's sockets and, for connected UDP, `/proc`: its cost grows with the node's
//! processes and sockets, and no map write, for this Service or any other, should wait for it.
use std::sync::mpsc::{Sender, channel};

use crate::bpf::{
    Pins,
    services::{Removal, Settled, Settler},
};

/// Starts the thread; what it is sent is settled in order, batches that queued meanwhile
/// in one walk.
pub fn start(pins: Pins) -> Sender<Vec<Removal>> {
    let (tx, rx) = channel::<Vec<Removal>>();
    let spawned = std::thread::Builder::new().name("settle".into()).spawn(move || {
        while let Ok(first) = rx.recv() {
            let removals: Vec<Removal> = first.into_iter().chain(rx.try_iter().flatten()).collect();
            // Opened each time: a datapath loaded again has new maps at the same pins.
            match Settler::open(&pins).and_then(|mut settler| settler.settle(&removals)) {
                Ok(settled) if settled == Settled::default() => {}
                Ok(settled) => log::info!("services: sockets on removed backends settled: {settled:?}"),
                Err(e) => log::warn!("services: cannot settle the sockets on removed backends: {e:#}"),
            }
        }
    });
    if let Err(e) = spawned {
        log::error!("services: cannot start the settling thread ({e}): sockets on removed backends stay");
    }
    tx
}
