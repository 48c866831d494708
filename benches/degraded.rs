//! `cargo bench --bench degraded`: the fault-tolerant all_reduce (docs/design.md §6.2) of 16 MiB of f32
//! per device on a 4x4 torus, fault-free against 1, 2 and 4 failed devices.
//!
//! Three figures per case, each also as a ratio to the fault-free case of the same run:
//! - measured: the median wall time of device threads meeting in the fabric as the runner's
//!   do (the failed devices run nothing). On this machine that is shared-memory work, so it
//!   mostly shows the cost of reading fewer operands, not the network's;
//! - max link bytes: the busiest directed link of the planned schedule (`--link-stats`);
//! - modelled time: the schedule on a network of 25 GB/s links — phase after phase, each
//!   as long as its busiest link — the figure a real torus would show.
//!
//! The fault-free case is planned by the same planner with nothing degraded (the
//! dimension-by-dimension ring all-reduce), so the ratios compare like with like.

mod common;

use std::collections::BTreeMap;

use common::{median, time_collective};

use meshc_runtime::comm::degraded::{plan, Schedule, Topo};
use meshc_runtime::comm::fabric::Fabric;
use meshc_runtime::format::degradation::Degradation;
use meshc_runtime::format::mesh::{Mesh, Topology};
use meshc_runtime::format::program::{Collective, CollectiveOp, Reduce};

const LINK_BYTES_PER_S: f64 = 25e9;

/// Seconds the schedule takes when every phase lasts as long as its busiest link.
fn modelled(s: &Schedule) -> f64 {
    s.phases
        .iter()
        .map(|ph| {
            let mut links: BTreeMap<(usize, usize), usize> = BTreeMap::new();
            for t in &ph.transfers {
                for w in t.route.windows(2) {
                    *links.entry((w[0], w[1])).or_default() += t.range.len() * 4;
                }
            }
            links.values().copied().max().unwrap_or(0) as f64 / LINK_BYTES_PER_S
        })
        .sum()
}

/// The healthy devices run the all_reduce `warmup + iters` times back to back; the first
/// healthy device's wall time of each of the last `iters` calls.
fn per_call(topo: &Topo, numel: usize, warmup: usize, iters: usize) -> Vec<f64> {
    let mesh = &topo.mesh;
    let mut f = Fabric::new(mesh);
    f.degrade(topo.clone()).unwrap();
    let c = Collective {
        op: CollectiveOp::AllReduce { reduce: Reduce::Sum },
        id: 0,
        groups: vec![(0..mesh.devices()).collect()],
        dtype: "f32".into(),
        shape: vec![numel],
    };
    let healthy: Vec<usize> = (0..mesh.devices()).filter(|&d| topo.healthy(d)).collect();
    let want: f32 = healthy.iter().map(|&d| ((numel - 1) % 1000 + d) as f32).sum();
    time_collective(&f, &c, &healthy, true, (warmup, iters), |d, last| assert_eq!(last, want, "device {d}"))
}

fn main() {
    let mesh = Mesh { shape: vec![4, 4], axes: vec!["x".into(), "y".into()], topology: Topology::Torus };
    let numel = 4 << 20;
    // (1,1); then (2,2) too; then the 2x2 block (1,1), (1,2), (2,1), (2,2).
    let cases: [(&str, Vec<usize>); 4] = [
        ("fault-free", vec![]),
        ("1 failed: (1,1)", vec![5]),
        ("2 failed: (1,1), (2,2)", vec![5, 10]),
        ("4 failed: (1,1), (1,2), (2,1), (2,2)", vec![5, 6, 9, 10]),
    ];
    println!("\n## all_reduce of 16 MiB f32 per device on a 4x4 torus, degraded (median of 21)");
    println!(
        "Measured on a shared, noisy 2-core machine: read the ratios (each against the fault-free row of this run)."
    );
    println!("| devices | measured ms | ratio | max link bytes | ratio | modelled ms @25 GB/s | ratio |");
    println!("|---|---|---|---|---|---|---|");
    let mut base = None;
    for (name, nodes) in cases {
        let topo = Topo::new(&mesh, &Degradation { nodes, ..Default::default() }, false).unwrap();
        let schedule = plan(&topo, numel).unwrap();
        let max = schedule.link_bytes(4).values().copied().max().unwrap_or(0);
        let model = modelled(&schedule);
        let t = median(per_call(&topo, numel, 3, 21));
        let (t0, max0, model0) = *base.get_or_insert((t, max, model));
        println!(
            "| {name} | {:.2} | {:.2} | {max} | {:.2} | {:.3} | {:.2} |",
            t * 1e3,
            t / t0,
            max as f64 / max0 as f64,
            model * 1e3,
            model / model0
        );
    }
}
