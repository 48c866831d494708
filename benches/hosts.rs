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
//! The binary is both the driver (started by cargo) and the ranks (started by mpirun, told
//! what to time by `MESHC_BENCH_*` variables).

mod common;

use std::process::Command;
use std::sync::Arc;

use common::{all_reduce, median, runner_program, time_collective};
use meshc_runtime::fabric::Fabric;
use meshc_runtime::mesh::{Mesh, Topology};
use meshc_runtime::transport::{Hosts, Transport};

/// (label, bytes per device, warm-up calls, timed calls).
const SIZES: [(&str, usize, usize, usize); 2] = [("4 B", 4, 200, 2000), ("16 MiB", 16 << 20, 2, 15)];
const DEVICES: usize = 8;

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
    let out = Command::new("tools/mpirun-hosts")
        .arg(hosts.to_string())
        .arg(std::env::current_exe().unwrap())
        .env("MESHC_BENCH_MODE", mode)
        .env("MESHC_BENCH_PER_HOST", per_host.to_string())
        .output()
        .expect("tools/mpirun-hosts runs (Open MPI installed? make mpi-deps)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{mode} on {hosts} hosts: {}", String::from_utf8_lossy(&out.stderr));
    stdout.lines().filter_map(|l| l.strip_prefix("median ")?.parse().ok()).collect()
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
}

/// One rank: `mode` "hosts" times meshc's all_reduce with this host's devices as threads,
/// "flat" times MPI_Allreduce itself; rank 0 prints a `median SECONDS` line per size.
fn rank(mode: &str) {
    let (mpi, transport) = meshc_runtime::mpi::init().unwrap();
    let transport: Arc<dyn Transport> = Arc::new(transport);
    let (me, hosts) = (transport.rank(), transport.size());
    let per: usize = std::env::var("MESHC_BENCH_PER_HOST").unwrap().parse().unwrap();
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
    drop(mpi);
}
