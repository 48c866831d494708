//! The compile-time side of a layout spec's degradation (the run-time planner and its
//! topology model are the runtime's `degraded` module): refusing degradations that would
//! lose a model shard or break a pipeline, giving degraded devices no work in the lowered
//! programs, and the `--dump-after lower` text with each touched reduction's fault-tolerant
//! schedule.

use anyhow::{anyhow, bail, Result};
use meshc_runtime::comm::degraded::{plan_group, touches, Topo};
use meshc_runtime::format::degradation::Degradation;

use crate::passes::lower::Lowered;

/// Refuses a degradation that fails a device while a param is split over a mesh axis
/// (`split`: param, axis): the device's shard of the model would be lost, and the result
/// wrong. Only a data-parallel shard can drop out.
pub fn keep_model_shards(topo: &Topo, split: &[(&str, usize)]) -> Result<()> {
    let Some(d) = (0..topo.mesh.devices()).find(|&d| !topo.healthy(d)) else { return Ok(()) };
    let Some(&(param, a)) = split.iter().find(|&&(_, a)| topo.mesh.shards(a) > 1) else { return Ok(()) };
    bail!(
        "degraded device {} would take its shard of param '{param}' (split over mesh axis '{}') with it: only data-parallel layouts (params replicated) can lose a device",
        topo.mesh.coords_string(d),
        topo.mesh.axes[topo.mesh.split(a).0]
    )
}

/// Refuses a degradation that fails a device of a graph placed in stages (its devices pass
/// results on by send/recv, so the pipeline would break).
pub fn keep_stages(topo: &Topo) -> Result<()> {
    match (0..topo.mesh.devices()).find(|&d| !topo.healthy(d)) {
        Some(d) => bail!(
            "degraded device {} would break the pipeline: a graph placed in stages cannot lose a device (failed links are fine)",
            topo.mesh.coords_string(d)
        ),
        None => Ok(()),
    }
}

/// Gives the degraded devices of `l` no work: their programs become empty (no inputs,
/// nodes or outputs), so the artifact holds no code, weights or arena for them.
pub fn leave_out(l: &mut Lowered, deg: &Degradation) -> Result<()> {
    let topo = Topo::new(&l.mesh, deg, false)?;
    for (d, g) in l.devices.iter_mut().enumerate().filter(|(d, _)| !topo.healthy(*d)) {
        *g = meshc_ir::Graph { name: format!("{} (degraded device {d})", g.name), ..Default::default() };
    }
    Ok(())
}

/// The lowered programs as `--dump-after lower` prints them under a degradation: a
/// degraded device gets no work (its line says so, and it never runs); every healthy one
/// its program; then the fault-tolerant schedule of each reduction whose group the
/// degradation `touches` (as the fabric decides). Fails, naming the node, when a collective other
/// than a reduction needs a degraded device's block (an all_gather or all_to_all cannot
/// leave it out), or when a group cannot be planned.
pub fn dump_lowered(l: &Lowered, deg: &Degradation) -> Result<String> {
    use meshc_ir::Op;
    let topo = Topo::new(&l.mesh, deg, false)?;
    let mut s = String::new();
    for (d, g) in l.devices.iter().enumerate() {
        let c = l.mesh.coords_string(d);
        if topo.healthy(d) {
            s.push_str(&format!("# device {d} {c}\n{}", meshc_ir::text::print(g)));
        } else {
            s.push_str(&format!("# device {d} {c}: degraded, no work\n"));
        }
    }
    let Some(g) = l.devices.first() else { return Ok(s) };
    for n in &g.nodes {
        let Ok(groups) = n.groups() else { continue };
        let groups: Vec<Vec<usize>> = groups.iter().map(|g| g.iter().map(|&d| d as usize).collect()).collect();
        let touched = |g: &Vec<usize>| touches(&topo, g);
        let reduction = matches!(n.op, Op::AllReduce | Op::ReduceScatter);
        for group in groups.iter().filter(|g| touched(g)) {
            let names: Vec<String> = group.iter().map(|&d| l.mesh.coords_string(d)).collect();
            if !reduction {
                if let Some(&d) = group.iter().find(|&&d| !topo.healthy(d)) {
                    bail!(
                        "node '{}' ({}) needs the block of degraded device {}: only reductions can leave a degraded device's shard out",
                        n.name,
                        n.op.name(),
                        l.mesh.coords_string(d)
                    );
                }
                continue;
            }
            let mut numel: usize = n.shape.as_ref().map_or(1, |s| s.iter().product());
            if n.op == Op::ReduceScatter {
                numel *= group.len();
            }
            let plan = plan_group(&topo, group, numel).map_err(|e| anyhow!("node '{}': {e}", n.name))?;
            s.push_str(&format!(
                "# schedule of {} ({}, {numel} elements) over {}\n{}",
                n.name,
                n.op.name(),
                names.join(" "),
                plan.describe(&l.mesh)
            ));
        }
    }
    Ok(s)
}
