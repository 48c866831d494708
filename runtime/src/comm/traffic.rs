//! The link model of the mesh: its directed links (between neighbours along each axis, plus
//! wrap-around links on a torus), the route a message takes over them, and the bytes each
//! collective puts on each link (`traffic`). The fabric (`crate::comm::fabric`) counts its
//! collectives by it at run time; the compiler's attribution and `meshc explain` predict
//! with it. Also here: what a collective's description means (`result_shape`, `group_of`).
//!
//! # The schedules
//! The model is the traffic of the schedule a real network of these links would run;
//! every message is forwarded hop by hop along its dimension-ordered route (axis 0 first; on
//! a torus the shorter way round, ties forward) and counted on every link of it.
//! - large all_reduce, reduce_scatter and all_gather: rings. A group that spans whole mesh
//!   axes (a sub-mesh) is processed dimension by dimension, ascending axis: the members that
//!   differ only along the axis form a ring. A ring along a torus axis follows the
//!   coordinates (0, 1, .., n-1, back to 0 over the wrap link); along a mesh axis it is
//!   embedded as 0, 2, 4, .., 5, 3, 1 so that no ring edge is longer than two hops and each
//!   link carries one edge. Any other group is one ring in rank order. all_reduce is a ring
//!   reduce-scatter along each dimension then a ring all-gather back in reverse order;
//!   ring position p keeps chunk p (the data split as evenly as possible), so over a
//!   reduce-scatter the edge out of p carries everything but chunk p, and over an
//!   all-gather the edge into p everything but chunk p: 2(n-1)/n of the bytes per ring edge
//!   for n members. reduce_scatter is the reduce-scatter half; all_gather passes each
//!   member's block around the ring (n-1 blocks per edge).
//! - small all_reduce, reduce_scatter and all_gather: a tree rooted at rank 0, made of the
//!   members' routes to it. Operands flow up (combined at every hop for reductions, else the
//!   subtree's blocks) and results flow down the reverse links (one copy where all members
//!   get the same result, else the subtree's results).
//! - all_to_all: every member sends each other member its block directly (any size).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use anyhow::{anyhow, bail, Result};

use crate::format::mesh::{Mesh, Topology};
use crate::format::program::{Collective, CollectiveOp};

/// Operands of fewer bytes take the fabric's one-rendezvous path and the tree schedule: below this size a second
/// rendezvous costs more than the second core saves. Measured for an all_reduce over 8
/// devices with each path forced in turn (medians of 500, three runs): one rendezvous
/// 12–18 µs at 16 KiB, 17–25 µs at 32 KiB, 23–32 µs at 64 KiB, 42–69 µs at 128 KiB; the
/// parallel path 17–22, 23–29, 21–28 and 30–39 µs.
pub const SMALL_BYTES: usize = 32 << 10;

/// The result shape of a collective, after checking its description against the mesh and
/// the device: f32, groups of existing devices, disjoint, one of them holding `device`,
/// axes inside the operand, splits that divide evenly.
pub fn result_shape(mesh: &Mesh, device: usize, c: &Collective) -> Result<Vec<usize>> {
    if c.dtype != "f32" {
        bail!("collective #{}: dtype {} (only f32 is supported)", c.id, c.dtype);
    }
    let mut seen = BTreeSet::new();
    for &d in c.groups.iter().flatten() {
        if d >= mesh.devices() {
            bail!("collective #{}: device {d} is not in the mesh of {} devices", c.id, mesh.devices());
        }
        if !seen.insert(d) {
            bail!("collective #{}: device {d} is in two groups", c.id);
        }
    }
    let n = group_of(c, device)?.len();
    let mut shape = c.shape.clone();
    let rank = shape.len();
    let axis_ok = |a: usize| {
        if a < rank {
            Ok(())
        } else {
            Err(anyhow!("collective #{}: axis {a} of a rank-{rank} operand", c.id))
        }
    };
    let divide = |a: usize, shape: &mut Vec<usize>| {
        if !shape[a].is_multiple_of(n) {
            bail!("collective #{}: dim {a} of {:?} does not divide over {n} members", c.id, c.shape);
        }
        shape[a] /= n;
        Ok(())
    };
    match c.op {
        CollectiveOp::AllReduce { .. } => {}
        CollectiveOp::AllGather { axis } => {
            axis_ok(axis)?;
            shape[axis] *= n;
        }
        CollectiveOp::ReduceScatter { axis, .. } => {
            axis_ok(axis)?;
            divide(axis, &mut shape)?;
        }
        CollectiveOp::AllToAll { split_axis, concat_axis } => {
            axis_ok(split_axis)?;
            axis_ok(concat_axis)?;
            divide(split_axis, &mut shape)?;
            shape[concat_axis] *= n;
        }
    }
    if shape.iter().try_fold(4usize, |b, &d| b.checked_mul(d)).is_none() {
        bail!("collective #{}: result {shape:?} is too large", c.id);
    }
    Ok(shape)
}

/// The group of `c` that holds `device`, in rank order.
pub fn group_of(c: &Collective, device: usize) -> Result<&[usize]> {
    c.groups
        .iter()
        .find(|g| g.contains(&device))
        .map(Vec::as_slice)
        .ok_or_else(|| anyhow!("collective #{}: device {device} is in none of its groups", c.id))
}

/// The directed links of the mesh and dimension-ordered routes over them.
pub(crate) struct Links {
    pub(crate) mesh: Mesh,
    /// (from, to) device pairs, sorted.
    pub(crate) list: Vec<(usize, usize)>,
    pub(crate) index: HashMap<(usize, usize), usize>,
}

impl Links {
    pub(crate) fn new(mesh: &Mesh) -> Links {
        let mut set = BTreeSet::new();
        for d in 0..mesh.devices() {
            for a in 0..mesh.shape.len() {
                set.extend(mesh.neighbours(d, a).into_iter().map(|n| (d, n)));
            }
        }
        let list: Vec<(usize, usize)> = set.into_iter().collect();
        let index = list.iter().enumerate().map(|(i, &l)| (l, i)).collect();
        Links { mesh: mesh.clone(), list, index }
    }

    /// The links of the dimension-ordered route from `from` to `to`.
    fn route(&self, from: usize, to: usize) -> Vec<usize> {
        let mut cur = self.mesh.coords(from);
        let dst = self.mesh.coords(to);
        let mut links = Vec::new();
        for (a, &s) in self.mesh.shape.iter().enumerate() {
            while cur[a] != dst[a] {
                let next = match self.mesh.topology {
                    Topology::Mesh if dst[a] > cur[a] => cur[a] + 1,
                    Topology::Mesh => cur[a] - 1,
                    Topology::Torus if (dst[a] + s - cur[a]) % s <= s / 2 => (cur[a] + 1) % s,
                    Topology::Torus => (cur[a] + s - 1) % s,
                };
                let here = self.mesh.device(&cur);
                cur[a] = next;
                links.push(self.index[&(here, self.mesh.device(&cur))]);
            }
        }
        links
    }
}

/// The modelled traffic of one execution of a collective: bytes per link.
pub(crate) struct Model<'a> {
    links: &'a Links,
    bytes: Vec<u64>,
}

/// The part of `len` elements that chunk `i` of `n` (as even as possible) holds.
fn chunk_len(len: usize, n: usize, i: usize) -> usize {
    let at = |i: usize| (len as u128 * i as u128 / n as u128) as usize;
    at(i + 1) - at(i)
}

impl Model<'_> {
    fn send(&mut self, from: usize, to: usize, bytes: u64) {
        for l in self.links.route(from, to) {
            self.bytes[l] += bytes;
        }
    }

    /// The rings of a bandwidth-optimal schedule, phase by phase, as ranks in ring order.
    fn phases(&self, group: &[usize]) -> Vec<Vec<Vec<usize>>> {
        let mesh = &self.links.mesh;
        let coords: Vec<Vec<usize>> = group.iter().map(|&d| mesh.coords(d)).collect();
        let axes: Vec<usize> = (0..mesh.shape.len()).filter(|&a| coords.iter().any(|c| c[a] != coords[0][a])).collect();
        if axes.iter().map(|&a| mesh.shape[a]).product::<usize>() != group.len() {
            return vec![vec![(0..group.len()).collect()]];
        }
        axes.iter()
            .map(|&a| {
                let mut rings: BTreeMap<Vec<usize>, Vec<usize>> = BTreeMap::new();
                let order = mesh.topology.ring_order(mesh.shape[a]);
                for (r, c) in coords.iter().enumerate() {
                    let mut key = c.clone();
                    key[a] = 0;
                    rings.entry(key).or_insert_with(|| vec![usize::MAX; order.len()])
                        [order.iter().position(|&x| x == c[a]).expect("coordinate on the axis")] = r;
                }
                rings.into_values().collect()
            })
            .collect()
    }

    /// A ring reduce-scatter (`gather` false) or all-gather over each ring of a phase:
    /// `len[rank]` elements held before (reduce-scatter) or after (all-gather) it.
    fn ring_pass(&mut self, group: &[usize], rings: &[Vec<usize>], len: &[usize], gather: bool) {
        for ring in rings {
            let m = ring.len();
            for p in 0..m {
                let (from, to) = (ring[p], ring[(p + 1) % m]);
                let total = len[ring[0]];
                let skip = chunk_len(total, m, if gather { (p + 1) % m } else { p });
                self.send(group[from], group[to], 4 * (total - skip) as u64);
            }
        }
    }

    fn ring_schedule(&mut self, op: &CollectiveOp, group: &[usize], numel: usize) {
        let phases = self.phases(group);
        match *op {
            CollectiveOp::AllGather { .. } => {
                let mut block = numel;
                for rings in &phases {
                    for ring in rings {
                        let m = ring.len();
                        for p in 0..m {
                            self.send(group[ring[p]], group[ring[(p + 1) % m]], 4 * ((m - 1) * block) as u64);
                        }
                    }
                    block *= rings[0].len();
                }
            }
            CollectiveOp::AllReduce { .. } | CollectiveOp::ReduceScatter { .. } => {
                let mut len = vec![numel; group.len()];
                let mut before = Vec::new();
                for rings in &phases {
                    self.ring_pass(group, rings, &len, false);
                    before.push(len.clone());
                    for ring in rings {
                        for (p, &r) in ring.iter().enumerate() {
                            len[r] = chunk_len(len[r], ring.len(), p);
                        }
                    }
                }
                if matches!(op, CollectiveOp::AllReduce { .. }) {
                    for (rings, len) in phases.iter().zip(before).rev() {
                        self.ring_pass(group, rings, &len, true);
                    }
                }
            }
            CollectiveOp::AllToAll { .. } => unreachable!("all_to_all is always direct"),
        }
    }

    /// Up the tree of routes to rank 0 and back down (see the module doc).
    fn tree_schedule(&mut self, op: &CollectiveOp, group: &[usize], numel: usize, result_numel: usize) {
        let n = group.len();
        let mut below: BTreeMap<usize, u64> = BTreeMap::new();
        for &d in &group[1..] {
            for l in self.links.route(d, group[0]) {
                *below.entry(l).or_default() += 1;
            }
        }
        let (combine, broadcast) = match op {
            CollectiveOp::AllReduce { .. } => (true, true),
            CollectiveOp::AllGather { .. } => (false, true),
            CollectiveOp::ReduceScatter { .. } => (true, false),
            CollectiveOp::AllToAll { .. } => unreachable!("all_to_all is always direct"),
        };
        debug_assert!(n > 1 || below.is_empty());
        for (l, k) in below {
            let (from, to) = self.links.list[l];
            self.bytes[l] += 4 * if combine { numel as u64 } else { k * numel as u64 };
            let back = self.links.index[&(to, from)];
            self.bytes[back] += 4 * if broadcast { result_numel as u64 } else { k * result_numel as u64 };
        }
    }

    /// The bytes per link (by index into `Links::list`) of one execution of `op` over
    /// `group`: the plain schedule of the module doc.
    pub(crate) fn schedule(
        links: &Links,
        op: &CollectiveOp,
        group: &[usize],
        numel: usize,
        result_numel: usize,
    ) -> Vec<(usize, u64)> {
        let mut m = Model { links, bytes: vec![0; links.list.len()] };
        let n = group.len();
        if let CollectiveOp::AllToAll { .. } = op {
            for (r, &from) in group.iter().enumerate() {
                for (s, &to) in group.iter().enumerate() {
                    if r != s {
                        m.send(from, to, 4 * (numel / n) as u64);
                    }
                }
            }
        } else if small(numel) {
            m.tree_schedule(op, group, numel, result_numel);
        } else {
            m.ring_schedule(op, group, numel);
        }
        m.bytes.iter().enumerate().filter(|(_, &b)| b > 0).map(|(l, &b)| (l, b)).collect()
    }
}

/// The bytes one execution of `c` (every group of it) puts on each directed link of `mesh`,
/// as (from device, to device, bytes), by the same plain schedules the fabric's counters
/// record on a healthy mesh: what the compiler's attribution and `meshc explain` predict.
pub fn traffic(mesh: &Mesh, c: &Collective) -> Result<Vec<(usize, usize, u64)>> {
    let links = Links::new(mesh);
    let mut bytes = vec![0u64; links.list.len()];
    // The schedule depends on shapes only, counted in 4-byte elements as the fabric carries
    // them: a collective of another dtype (which the compiler refuses) is priced alike.
    let c = &Collective { dtype: "f32".into(), ..c.clone() };
    for group in &c.groups {
        let result = result_shape(mesh, group[0], c)?;
        let (numel, result_numel) = (c.shape.iter().product(), result.iter().product());
        for (l, b) in Model::schedule(&links, &c.op, group, numel, result_numel) {
            bytes[l] += b;
        }
    }
    Ok(links.list.iter().zip(bytes).filter(|(_, b)| *b > 0).map(|(&(f, t), b)| (f, t, b)).collect())
}

/// The directed links (from, to) of the dimension-ordered route a message from `from` to
/// `to` takes over `mesh`.
pub fn route(mesh: &Mesh, from: usize, to: usize) -> Vec<(usize, usize)> {
    let links = Links::new(mesh);
    links.route(from, to).into_iter().map(|l| links.list[l]).collect()
}

/// Whether an operand of `numel` f32 is small (`SMALL_BYTES`).
pub(crate) fn small(numel: usize) -> bool {
    numel.saturating_mul(4) < SMALL_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::program::Reduce;

    fn coll(op: CollectiveOp, groups: Vec<Vec<usize>>, shape: &[usize]) -> Collective {
        Collective { op, id: 7, groups, dtype: "f32".into(), shape: shape.to_vec() }
    }

    #[test]
    fn descriptions_are_checked() {
        let m = Mesh::numbered(&[2, 2], Topology::Mesh);
        let c = |op, groups, shape: &[usize]| result_shape(&m, 0, &coll(op, groups, shape)).unwrap_err().to_string();
        let ar = CollectiveOp::AllReduce { reduce: Reduce::Sum };
        assert_eq!(c(ar.clone(), vec![vec![0, 4]], &[2]), "collective #7: device 4 is not in the mesh of 4 devices");
        assert_eq!(c(ar.clone(), vec![vec![0, 1], vec![1, 2]], &[2]), "collective #7: device 1 is in two groups");
        assert_eq!(c(ar, vec![vec![1, 2]], &[2]), "collective #7: device 0 is in none of its groups");
        let rs = CollectiveOp::ReduceScatter { axis: 0, reduce: Reduce::Sum };
        assert_eq!(c(rs, vec![vec![0, 1, 2]], &[4]), "collective #7: dim 0 of [4] does not divide over 3 members");
        assert_eq!(
            c(CollectiveOp::AllGather { axis: 1 }, vec![vec![0, 1]], &[4]),
            "collective #7: axis 1 of a rank-1 operand"
        );
    }
}
