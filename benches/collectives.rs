//! `cargo bench --bench collectives`: all_reduce (sum) over 8 devices — device threads on
//! this machine's cores, meeting in the fabric exactly as the runner's do — on a 1-D torus
//! of 8 and over both axes of a 2×4 mesh. For 16 MiB of f32 per device: the median time per
//! all_reduce and the bus bandwidth 2(n-1)/n·bytes/time, with the members reading the
//! fabric's one result buffer (as the runner does) and, for comparison, each receiving its
//! own copy. For 4 bytes: the median latency over many back-to-back all_reduces. Also the
//! same 4-byte all_reduce as a whole run (waking the runner's parked device threads,
//! rendezvous, results) through the runner, and a sweep of sizes across the switch between the small- and large-operand
//! algorithms. Figures are medians of device 0's per-call wall times, measured in this one run.
//! `MESHC_ISA=avx2|portable` forces the reductions' code path (`format::isa`).

mod common;

use std::collections::HashMap;
use std::time::Instant;

use common::{all_reduce, median, runner_program, time_collective};

use meshc_ir::Tensor;
use meshc_runtime::comm::fabric::Fabric;
use meshc_runtime::comm::traffic::SMALL_BYTES;
use meshc_runtime::exec::runner::Loaded;
use meshc_runtime::format::mesh::{Mesh, Topology};
use meshc_runtime::format::program::Collective;

/// Every device runs the collective `warmup + iters` times back to back; device 0's wall
/// time of each of the last `iters` calls.
fn per_call(mesh: &Mesh, c: &Collective, share: bool, warmup: usize, iters: usize) -> Vec<f64> {
    let devices: Vec<usize> = (0..mesh.devices()).collect();
    time_collective(&Fabric::new(mesh), c, &devices, share, (warmup, iters), |_, x| {
        std::hint::black_box(x);
    })
}

fn main() {
    common::isa_from_env();
    let torus8 = Mesh { shape: vec![8], axes: vec!["x".into()], topology: Topology::Torus };
    let mesh24 = Mesh { shape: vec![2, 4], axes: vec!["data".into(), "model".into()], topology: Topology::Mesh };
    let meshes = [("1-D torus of 8", &torus8), ("2x4 mesh, both axes", &mesh24)];
    let n = 8.0;

    let numel = 4 << 20;
    let bytes = (numel * 4) as f64;
    println!("\n## all_reduce of 16 MiB f32 per device, 8 devices (median of 15)");
    println!("| mesh | result | median ms | bus GB/s |");
    println!("|---|---|---|---|");
    for (name, m) in meshes {
        let c = all_reduce(m.groups(&(0..m.shape.len()).collect::<Vec<_>>()), numel);
        for (share, how) in [(true, "one shared buffer"), (false, "a copy per member")] {
            let t = median(per_call(m, &c, share, 2, 15));
            println!("| {name} | {how} | {:.2} | {:.2} |", t * 1e3, 2.0 * (n - 1.0) / n * bytes / t / 1e9);
        }
    }

    println!("\n## all_reduce of 4 bytes, 8 devices (median of 5000 back-to-back)");
    println!("| mesh | median µs | p90 µs |");
    println!("|---|---|---|");
    for (name, m) in meshes {
        let c = all_reduce(m.groups(&(0..m.shape.len()).collect::<Vec<_>>()), 1);
        let mut t = per_call(m, &c, true, 200, 5000);
        t.sort_by(f64::total_cmp);
        println!("| {name} | {:.1} | {:.1} |", t[t.len() / 2] * 1e6, t[t.len() * 9 / 10] * 1e6);
    }

    // Either side of `SMALL_BYTES`, where the one-rendezvous path (one member computes
    // every result) hands over to the parallel one (two rendezvous): the time should not
    // jump there.
    println!("\n## all_reduce of growing sizes on the 1-D torus of 8 (median of 500)");
    println!("| bytes per device | path | median µs |");
    println!("|---|---|---|");
    for bytes in [1 << 10, 4 << 10, SMALL_BYTES / 2, SMALL_BYTES - 4, SMALL_BYTES, 4 * SMALL_BYTES, 16 * SMALL_BYTES] {
        let c = all_reduce(vec![(0..8).collect()], bytes / 4);
        let path = if bytes < SMALL_BYTES { "one rendezvous" } else { "parallel" };
        println!("| {bytes} | {path} | {:.1} |", median(per_call(&torus8, &c, true, 50, 500)) * 1e6);
    }

    let (meta, programs) = runner_program(&torus8, 1);
    let l = Loaded::in_memory(meta, programs, Box::new(()), &[]).unwrap();
    let x = HashMap::from([("x".to_string(), Tensor::f32(vec![1], vec![1.0]))]);
    let t = median(
        (0..500)
            .map(|_| {
                let s = Instant::now();
                assert_eq!(l.run(&x).unwrap()["y"].as_f32().unwrap(), &[8.0]);
                s.elapsed().as_secs_f64()
            })
            .collect(),
    );
    println!("\nwhole runner run of a 4-byte all_reduce program on 8 devices: median {:.1} µs", t * 1e6);
}
