//! `cargo bench --bench hosts --features mpi` (Open MPI installed: `make mpi-deps`):
//! all_reduce (sum) of 4 bytes and of 16 MiB f32 per device over 8 devices, as device
//! threads of one process (1×8), and spread over simulated hosts on this machine
//! (`tools/mpirun-hosts`, loopback TCP between hosts) as 2 hosts × 4 devices and 4 × 2:
//! the hierarchical collective of `fabric` (each host meets over its fabric, leaders cross
//! over MPI). The cross-host part alone is the same all_reduce with one device per host
//! (leaders only). The anchor, measured in the same run: flat MPI, `MPI_Allreduce` over 8
//! ranks of one device each. Figures are medians of the first local device's wall time per
//! call on rank 0; bus bandwidth is 2(n-1)/n·bytes/time with n = 8 devices.
//!
//! Then the MLP of the mesh bench (x[512,1024]·W1 → ReLU → ·W2, batch over `data`, hidden
//! over `model` of the 2×4 mesh) run whole by the runner: 8 device threads in one process,
//! and 2 hosts (the `data` axis) × 4 devices. Its collectives (the all-reduce after the
//! row-split matmul) stay inside a host; what crosses is the half of `y` host 1 holds,
//! gathered on rank 0: that cross-host part is reported in bytes (the runner's
//! `--link-stats` count) and time (one 1 MiB message between the two leaders alone).
//!
//! The binary is both the driver (started by cargo) and the ranks (started by mpirun, told
//! what to time by `MESHC_BENCH_*` variables).

mod common;

use std::process::Command;
use std::sync::Arc;

use common::mlp::{build, input, B, D, H, SPEC_2X4};
use common::{all_reduce, median, runner_program, time_collective};
use meshc_runtime::comm::fabric::Fabric;
use meshc_runtime::comm::transport::{Hosts, Incoming, Outgoing, Transport};
use meshc_runtime::format::mesh::{Mesh, Topology};

/// (label, bytes per device, warm-up calls, timed calls).
const SIZES: [(&str, usize, usize, usize); 2] = [("4 B", 4, 200, 2000), ("16 MiB", 16 << 20, 2, 15)];
const DEVICES: usize = 8;
/// Timed runs of the MLP, after one warm-up run.
const MLP_RUNS: usize = 10;

/// The mesh bench's 2×4 spec with each index of `data` one host.
fn mlp_spec_hosts() -> String {
    SPEC_2X4.replacen(r#""rules""#, r#""hosts": {"axis": "data"}, "rules""#, 1)
}

fn line(devices: usize) -> Mesh {
    Mesh { shape: vec![devices], axes: vec!["x".into()], topology: Topology::Torus }
}

fn main() {
    match std::env::var("MESHC_BENCH_MODE") {
        Ok(mode) => rank(&mode),
        Err(_) => drive(),
    }
}

/// Times each size in one configuration on `hosts` ranks; rank 0's medians in seconds.
fn launch(mode: &str, hosts: usize, per_host: usize) -> Vec<f64> {
    rank0_lines(mode, hosts, per_host).iter().filter_map(|l| l.strip_prefix("median ")?.parse().ok()).collect()
}

/// What the ranks printed (rank 0 unless said otherwise), running `mode` on `hosts` ranks of `per_host` devices.
fn rank0_lines(mode: &str, hosts: usize, per_host: usize) -> Vec<String> {
    let out = Command::new("tools/mpirun-hosts")
        .arg(hosts.to_string())
        .arg(std::env::current_exe().unwrap())
        .env("MESHC_BENCH_MODE", mode)
        .env("MESHC_BENCH_PER_HOST", per_host.to_string())
        .output()
        .expect("tools/mpirun-hosts runs (Open MPI installed? make mpi-deps)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{mode} on {hosts} hosts: {}", String::from_utf8_lossy(&out.stderr));
    stdout.lines().map(str::to_string).collect()
}

fn drive() {
    let n = DEVICES as f64;
    let busbw = |bytes: usize, t: f64| 2.0 * (n - 1.0) / n * bytes as f64 / t / 1e9;
    let mesh = line(DEVICES);
    let here: Vec<f64> = SIZES
        .iter()
        .map(|&(_, bytes, warmup, iters)| {
            let c = all_reduce(vec![(0..DEVICES).collect()], bytes / 4);
            let all: Vec<usize> = (0..DEVICES).collect();
            median(time_collective(&Fabric::new(&mesh), &c, &all, true, (warmup, iters), |_, x| {
                std::hint::black_box(x);
            }))
        })
        .collect();
    let rows = [
        ("1x8 in-process", here),
        ("2x4 hosts (MPI between 2 leaders)", launch("hosts", 2, 4)),
        ("4x2 hosts (MPI between 4 leaders)", launch("hosts", 4, 2)),
        ("cross-host part alone: 2x1 (leaders only)", launch("hosts", 2, 1)),
        ("cross-host part alone: 4x1 (leaders only)", launch("hosts", 4, 1)),
        ("anchor: flat MPI_Allreduce over 8 ranks", launch("flat", 8, 1)),
    ];
    println!("\n## all_reduce over 8 devices, hosts simulated on this machine (loopback TCP)");
    println!("| configuration | 4 B median µs | 16 MiB median ms | 16 MiB bus GB/s (n = 8) |");
    println!("|---|---|---|---|");
    for (name, t) in &rows {
        println!("| {name} | {:.1} | {:.2} | {:.2} |", t[0] * 1e6, t[1] * 1e3, busbw(SIZES[1].1, t[1]));
    }
    let (flat, two) = (rows[5].1[1], rows[1].1[1]);
    println!("\n2x4 hosts vs flat MPI over 8 ranks, 16 MiB: {:.2}x the bus bandwidth", flat / two);
    mlp();
}

/// The MLP on 8 device threads of one process, then on 2 hosts × 4 devices.
fn mlp() {
    let flops = 4.0 * (B * D * H) as f64;
    let loaded = build(Some(SPEC_2X4)).load().unwrap();
    let (here, y) = time_mlp(|x| loaded.run(x).unwrap());
    let lines = rank0_lines("mlp", 2, 4);
    let field = |key: &str| -> String {
        lines.iter().find_map(|l| l.strip_prefix(key)).unwrap_or_else(|| panic!("rank 0 printed no '{key}'")).into()
    };
    let hosts: f64 = field("median ").parse().unwrap();
    assert_eq!(field("digest "), digest(&y).to_string(), "2 hosts computed another y than one process");
    let cross: f64 =
        rank0_lines("exchange", 2, 1).iter().find_map(|l| l.strip_prefix("median ")?.parse().ok()).unwrap();
    println!("\n## MLP [{B},{D}]·[{D},{H}] → relu → ·[{H},{D}] on the 2x4 mesh, median of {MLP_RUNS}");
    println!("| configuration | median ms | GFLOP/s |");
    println!("|---|---|---|");
    println!("| 1x8 in-process | {:.2} | {:.1} |", here * 1e3, flops / here / 1e9);
    println!("| 2x4 hosts | {:.2} | {:.1} |", hosts * 1e3, flops / hosts / 1e9);
    println!(
        "cross-host part: {} (one {} KiB exchange between the leaders alone: {:.2} ms); y equals the 1-process run bit for bit",
        field("cross ").trim(),
        Y_HALF_BYTES >> 10,
        cross * 1e3
    );
}

/// Bytes of the half of `y` that host 1 holds.
const Y_HALF_BYTES: usize = B / 2 * D * 4;

/// Median seconds of `MLP_RUNS` runs after a warm-up, and the last run's `y`.
fn time_mlp(
    run: impl Fn(
        &std::collections::HashMap<String, meshc_ir::Tensor>,
    ) -> std::collections::BTreeMap<String, meshc_ir::Tensor>,
) -> (f64, Option<meshc_ir::Tensor>) {
    let x = input();
    let mut y = run(&x);
    let times = (0..MLP_RUNS)
        .map(|_| {
            let t = std::time::Instant::now();
            y = run(&x);
            t.elapsed().as_secs_f64()
        })
        .collect();
    (median(times), y.remove("y"))
}

/// A fingerprint of `y`'s bits (rank 0's outputs against the one-process run's).
fn digest(y: &Option<meshc_ir::Tensor>) -> u64 {
    let bits = y.as_ref().and_then(|y| y.as_f32()).expect("y is f32").iter().map(|v| v.to_bits());
    bits.fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

/// One rank: `mode` "hosts" times meshc's all_reduce with this host's devices as threads,
/// "flat" times MPI_Allreduce itself; rank 0 prints a `median SECONDS` line per size.
fn rank(mode: &str) {
    let (mpi, transport) = meshc_runtime::comm::mpi::init().unwrap();
    let transport: Arc<dyn Transport> = Arc::new(transport);
    let (me, hosts) = (transport.rank(), transport.size());
    let per: usize = std::env::var("MESHC_BENCH_PER_HOST").unwrap().parse().unwrap();
    match mode {
        "mlp" => mlp_rank(transport),
        "exchange" => exchange_rank(&*transport),
        _ => collective_rank(&mpi, mode, transport, me, hosts, per),
    }
    drop(mpi);
}

/// The MLP of 2 hosts × 4 devices, this rank's host; rank 0 prints the median and the
/// digest of `y`, rank 1 the bytes its host sent.
fn mlp_rank(transport: Arc<dyn Transport>) {
    let mut loaded = build(Some(&mlp_spec_hosts())).load().unwrap();
    loaded.set_transport(transport).unwrap();
    let (t, y) = time_mlp(|x| loaded.run(x).unwrap());
    if loaded.host() == 0 {
        println!("median {t}\ndigest {}", digest(&y));
    } else {
        // Host 1's own count (`--link-stats`): the bytes it sent host 0 in the last run.
        println!("cross {}", loaded.host_stats().unwrap_or_default().trim());
    }
}

/// Host 1 sends host 0 the half of `y` it holds, as one message between the two leaders.
fn exchange_rank(transport: &dyn Transport) {
    let mut buf = vec![0u8; Y_HALF_BYTES];
    let times = (0..1 + MLP_RUNS)
        .map(|_| {
            let t = std::time::Instant::now();
            let timeout = std::time::Duration::from_secs(30);
            let done = if transport.rank() == 0 {
                let mut recvs = [Incoming { from: 1, tag: 1, bytes: &mut buf }];
                transport.exchange(&[], &mut recvs, timeout, &|| false)
            } else {
                transport.exchange(&[Outgoing { to: 0, tag: 1, bytes: &buf }], &mut [], timeout, &|| false)
            };
            done.unwrap();
            t.elapsed().as_secs_f64()
        })
        .skip(1)
        .collect();
    if transport.rank() == 0 {
        println!("median {}", median(times));
    }
}

fn collective_rank(
    mpi: &ferrompi::Mpi,
    mode: &str,
    transport: Arc<dyn Transport>,
    me: usize,
    hosts: usize,
    per: usize,
) {
    for &(_, bytes, warmup, iters) in &SIZES {
        let numel = bytes / 4;
        let times = if mode == "flat" {
            let world = mpi.world();
            let send = vec![1f32; numel];
            let mut recv = vec![0f32; numel];
            (0..warmup + iters)
                .map(|_| {
                    let t = std::time::Instant::now();
                    world.allreduce(&send, &mut recv, ferrompi::ReduceOp::Sum).unwrap();
                    t.elapsed().as_secs_f64()
                })
                .skip(warmup)
                .collect()
        } else {
            let mesh = line(hosts * per);
            let (mut meta, programs) = runner_program(&mesh, numel);
            meta.hosts = (0..hosts).map(|h| (h * per..(h + 1) * per).collect()).collect();
            let mut fabric = Fabric::new(&mesh);
            fabric.set_hosts(Arc::new(Hosts::new(&meta, &programs, transport.clone()).unwrap()));
            let c = all_reduce(vec![(0..hosts * per).collect()], numel);
            let local = meta.hosts[me].clone();
            time_collective(&fabric, &c, &local, true, (warmup, iters), |_, x| {
                std::hint::black_box(x);
            })
        };
        if me == 0 {
            println!("median {}", median(times));
        }
    }
}
