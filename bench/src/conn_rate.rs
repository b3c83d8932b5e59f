//! TCP connections per second, one after another from a client namespace to a server: connect,
//! read the server's one byte until it closes, close. The server closes first, so TIME_WAIT
//! sits on its side and the client never runs out of ports.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddrV4, TcpListener, TcpStream},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use ebpf_cni_tests::{
    cgroup::TestCgroup,
    traffic::{in_netns, tcp_listener},
};

/// The server listens on `listen`; the client dials `dial` (the same address, or a Service's)
/// from a thread of the bench.
pub fn per_second(
    client_ns: &str,
    server_ns: &str,
    listen: SocketAddrV4,
    dial: SocketAddrV4,
    seconds: u32,
) -> Result<f64> {
    let duration = Duration::from_secs(seconds.into());
    serving(client_ns, server_ns, listen, dial, None, || in_netns(client_ns, move || connect_loop(dial, duration)))
}

/// [`per_second`] with the client a process of its own (the bench run again with
/// `--conn-client`), started in `cgroup` when given: the socket LB translates only what its
/// cgroup's processes connect. `seconds` 0: one connection, to check that one goes through.
/// With `cpu`, the client and the server both run on that CPU.
pub fn per_second_in_process(
    client_ns: &str,
    cgroup: Option<&TestCgroup>,
    server_ns: &str,
    listen: SocketAddrV4,
    dial: SocketAddrV4,
    seconds: u32,
    cpu: Option<usize>,
) -> Result<f64> {
    // Woken through the server's own address: the bench itself is in no cgroup the socket LB
    // translates for, so it could not reach the server through a ClusterIP.
    serving(client_ns, server_ns, listen, listen, cpu, || {
        let mut command = match cpu {
            Some(cpu) => {
                let mut taskset = Command::new("taskset");
                taskset.args(["-c", &cpu.to_string(), "nsenter"]);
                taskset
            }
            None => Command::new("nsenter"),
        };
        command.arg(format!("--net=/run/netns/{client_ns}")).arg(std::env::current_exe()?);
        command.args(["--conn-client", &dial.to_string(), "--seconds", &seconds.to_string()]);
        if let Some(cgroup) = cgroup {
            cgroup.confine(&mut command)?;
        }
        let out = command.output().context("starting the connection client")?;
        if !out.status.success() {
            bail!("connections to {dial}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        String::from_utf8(out.stdout)?.trim().parse().context("the connection client's rate")
    })
}

/// What `bench --conn-client DIAL --seconds N` runs: the client's loop; prints the rate.
pub fn client(dial: SocketAddrV4, seconds: u32) -> Result<()> {
    println!("{}", connect_loop(dial, Duration::from_secs(seconds.into()))?);
    Ok(())
}

/// Connections one at a time for `duration` (at least one); connections per second.
fn connect_loop(dial: SocketAddrV4, duration: Duration) -> Result<f64> {
    let started = Instant::now();
    let mut connections = 0u64;
    while connections == 0 || started.elapsed() < duration {
        // A timeout only matters when nothing answers: a path that cannot connect says so.
        let mut stream = TcpStream::connect_timeout(&dial.into(), Duration::from_secs(2))
            .with_context(|| format!("connecting to {dial}"))?;
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply).context("reading the server's byte")?;
        connections += 1;
    }
    Ok(connections as f64 / started.elapsed().as_secs_f64())
}

/// Runs `client` against a server on `listen` in `server_ns` (a thread on `cpu`, when given);
/// one connection to `wake` from `client_ns` afterwards ends the server.
fn serving(
    client_ns: &str,
    server_ns: &str,
    listen: SocketAddrV4,
    wake: SocketAddrV4,
    cpu: Option<usize>,
    client: impl FnOnce() -> Result<f64>,
) -> Result<f64> {
    crate::cpu::wait_idle()?;
    let listener = tcp_listener(server_ns, listen)?;
    let stop = Arc::new(AtomicBool::new(false));
    let serving = answer_each(listener, cpu, stop.clone());
    let rate = client();
    // One more connection wakes the server so that it sees `stop`.
    stop.store(true, Ordering::Relaxed);
    let woken = in_netns(client_ns, move || Ok(TcpStream::connect_timeout(&wake.into(), Duration::from_secs(1))));
    if matches!(woken, Ok(Ok(_))) {
        let _ = serving.join();
    }
    rate
}

/// The connection rate's server: a thread (on `cpu`, when given) that answers each connection
/// on `listener` with one byte, until a connection finds `stop` set.
pub fn answer_each(listener: TcpListener, cpu: Option<usize>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        if let Some(cpu) = cpu {
            pin_this_thread(cpu);
        }
        for stream in listener.incoming() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            if let Ok(mut stream) = stream {
                let _ = stream.write_all(b"x");
            }
        }
    })
}

/// Runs the calling thread on `cpu` alone, if the machine has it.
pub fn pin_this_thread(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    if set.set(cpu).is_ok() {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}
