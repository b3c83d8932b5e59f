//! Builds the TC programs in `ebpf/` for the BPF target (with BTF) and leaves the object in
//! OUT_DIR, where `include_bytes_aligned!` embeds it into the plugin binary.
fn main() -> anyhow::Result<()> {
    let package = aya_build::Package {
        name: "ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::default())
}
