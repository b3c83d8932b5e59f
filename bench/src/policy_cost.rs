//! The per-packet cost behind the policy section's round trips, in the kernel, free of the
//! machine's noise: `from_pod` on an ACK of an established client → server connection
//! (`BPF_PROG_TEST_RUN`, a million runs, whose mean the kernel reports; the median of 5). On a
//! node with policies the connection was opened for real first, so its packets find their
//! cached verdicts in `POLICY_FLOWS`; `from_pod` delivers into the server itself, so the time
//! holds both checks, the client's egress and the server's ingress. And `from_pod` on a SYN:
//! what a new connection costs it, both checks judged by the rules.
use std::net::{Ipv4Addr, SocketAddrV4};

use anyhow::{Context, Result, ensure};
use ebpf_cni_tests::{
    frames::{ethernet, ipv4, tcp, with_checksums},
    prog_run, run_in,
    traffic::{tcp_connect, tcp_listener},
};

use crate::{service_set::CONN_PORT, stats::Samples, topology::Pair};

/// The client's source port of the measured connection.
const CLIENT_PORT: u16 = 40_001;
const REPEAT: u32 = 1_000_000;
const TIMINGS: usize = 5;
const TC_ACT_REDIRECT: u32 = 7;
const TCP_ACK: u8 = 0x10;
const TCP_SYN: u8 = 0x02;
const SYN_REPEAT: u32 = 1_000;

/// `from_pod`'s mean time (ns) for an ACK from the client to the server of `pair`'s node.
pub fn from_pod_ack(pair: &Pair) -> Result<f64> {
    let tb = pair.node().context("a CNI path has a node")?;
    let server: Ipv4Addr = pair.server_ip.parse()?;
    let (client, pod_mac, host_mac, host_veth) = client_side(pair)?;
    let listener = tcp_listener(&pair.server_ns, SocketAddrV4::new(server, CONN_PORT))?;
    let _connection = tcp_connect(&pair.client_ns, CLIENT_PORT, SocketAddrV4::new(server, CONN_PORT))?;
    let _accepted = listener.accept()?;
    let frame = with_checksums(
        [ethernet(host_mac, pod_mac, 0x0800), ipv4(client, server, 6, &tcp(CLIENT_PORT, CONN_PORT, TCP_ACK))].concat(),
    );
    let mut samples = Samples::default();
    for _ in 0..TIMINGS {
        let (verdict, mean) = prog_run::time(tb, "from_pod", &host_veth, frame.clone(), REPEAT)?;
        ensure!(verdict == TC_ACT_REDIRECT, "from_pod did not deliver the ACK (verdict {verdict})");
        samples.push(mean.as_secs_f64() * 1e9);
    }
    Ok(samples.median())
}

/// `from_pod`'s mean time (ns) for a SYN from the client to the server of `pair`'s node: what
/// each new connection costs it (on a node with policies, both checks judge it by the rules
/// and its flow is remembered). Runs of a thousand, so that the entries each run writes stay
/// within the client's budget (`POLICY_NEW_ENTRIES_PER_SECOND`) as a real client's do.
pub fn from_pod_syn(pair: &Pair) -> Result<f64> {
    let tb = pair.node().context("a CNI path has a node")?;
    let server: Ipv4Addr = pair.server_ip.parse()?;
    let (client, pod_mac, host_mac, host_veth) = client_side(pair)?;
    let frame = with_checksums(
        [ethernet(host_mac, pod_mac, 0x0800), ipv4(client, server, 6, &tcp(CLIENT_PORT + 1, CONN_PORT, TCP_SYN))]
            .concat(),
    );
    let mut samples = Samples::default();
    for _ in 0..TIMINGS {
        let (verdict, mean) = prog_run::time(tb, "from_pod", &host_veth, frame.clone(), SYN_REPEAT)?;
        ensure!(verdict == TC_ACT_REDIRECT, "from_pod did not deliver the SYN (verdict {verdict})");
        samples.push(mean.as_secs_f64() * 1e9);
        // The budget refills meanwhile (a thousand entries take 61 ms).
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Ok(samples.median())
}

/// The client pod's address and MAC, and its host veth's MAC and name (the node's end of the
/// pod's eth0, found by the peer index `ip` prints as `eth0@ifN`).
fn client_side(pair: &Pair) -> Result<(Ipv4Addr, [u8; 6], [u8; 6], String)> {
    let tb = pair.node().context("a CNI path has a node")?;
    let pod = text(run_in(&pair.client_ns, "ip", &["-o", "link", "show", "dev", "eth0"])?.stdout)?;
    let peer = pod.split_once("@if").and_then(|(_, rest)| rest.split(':').next()).context("no peer index")?;
    let pod_mac = mac_in(&pod)?;
    let links = text(run_in(&tb.node.name, "ip", &["-o", "link", "show"])?.stdout)?;
    let host = links.lines().find(|l| l.starts_with(&format!("{peer}: "))).context("no host veth")?;
    let name = host.split(": ").nth(1).and_then(|n| n.split('@').next()).context("no host veth name")?;
    Ok((crate::policy::client_ip(pair)?, pod_mac, mac_in(host)?, name.to_string()))
}

fn text(bytes: Vec<u8>) -> Result<String> {
    Ok(String::from_utf8(bytes)?)
}

/// The address after `link/ether` in a line of `ip -o link`.
fn mac_in(line: &str) -> Result<[u8; 6]> {
    let mac = line.split_whitespace().skip_while(|w| *w != "link/ether").nth(1).context("no link/ether")?;
    let bytes: Vec<u8> = mac.split(':').map(|b| u8::from_str_radix(b, 16)).collect::<Result<_, _>>()?;
    bytes.try_into().map_err(|_| anyhow::anyhow!("a MAC of the wrong length: {mac}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_mac_is_read_from_ip_link() {
        let line = "7: veth1a2b@if2: <BROADCAST,UP> mtu 1500 qdisc noqueue\\    link/ether 0a:1b:2c:3d:4e:5f brd ff:ff:ff:ff:ff:ff";
        assert_eq!(super::mac_in(line).unwrap(), [0x0a, 0x1b, 0x2c, 0x3d, 0x4e, 0x5f]);
    }
}
