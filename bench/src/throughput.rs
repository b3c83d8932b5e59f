//! The throughput figures the pod → pod sections share (same node, across nodes): TCP with 1
//! and 4 streams and their retransmits, 64-byte UDP packets received and their loss.
use crate::{
    iperf,
    report::{
        Better::{self, *},
        Figure,
    },
    topology::Path,
};

pub struct Throughput {
    tcp1: Figure,
    retr1: Figure,
    tcp4: Figure,
    retr4: Figure,
    udp: Figure,
    loss: Figure,
}

impl Throughput {
    /// `figure` makes a figure of the section; `targeted` adds the section's throughput targets.
    pub fn new(figure: impl Fn(&str, &'static str, Better) -> Figure, targeted: impl Fn(Figure) -> Figure) -> Self {
        Self {
            tcp1: targeted(figure("TCP, 1 stream (CPUs 0→1)", "Gbit/s", Higher)),
            retr1: figure("TCP retransmits, 1 stream", "per run", Lower),
            tcp4: targeted(figure("TCP, 4 streams (unpinned)", "Gbit/s", Higher)),
            retr4: figure("TCP retransmits, 4 streams", "per run", Lower),
            udp: targeted(figure("UDP 64 B received (CPUs 0→1)", "kpps", Higher)),
            loss: figure("UDP 64 B loss", "%", Lower),
        }
    }

    pub fn record(&mut self, path: Path, one: &iperf::Tcp, four: Option<&iperf::Tcp>, small: &iperf::Udp) {
        self.tcp1.record(path, one.gbits);
        self.retr1.record(path, one.retransmits as f64);
        if let Some(four) = four {
            self.tcp4.record(path, four.gbits);
            self.retr4.record(path, four.retransmits as f64);
        }
        self.udp.record(path, small.pps / 1e3);
        self.loss.record(path, small.loss_percent);
    }

    /// The figures in the tables' order; the 4-stream ones only if `with_four` (measured).
    pub fn figures(self, with_four: bool) -> Vec<Figure> {
        let mut figures = vec![self.tcp1, self.retr1];
        if with_four {
            figures.extend([self.tcp4, self.retr4]);
        }
        figures.extend([self.udp, self.loss]);
        figures
    }
}
