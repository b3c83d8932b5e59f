//! Host-side stub: cni-plugin's build script depends on this package so that cargo rebuilds the
//! plugin when the programs change. The programs themselves are the `ebpf-cni` binary target,
//! built for `bpfel-unknown-none` by aya-build.
#![no_std]
