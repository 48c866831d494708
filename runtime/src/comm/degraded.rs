//! Fault-tolerant all-reduce over a mesh/torus with degraded nodes and links (docs/design.md
//! §6.2): the topology model (`Topo`, what failed as `crate::format::degradation` describes
//! it resolved per node and dimension), the planner that turns it
//! into an explicit schedule (`plan` for the whole mesh, `plan_group` for any group, with
//! routes through healthy non-members), an executor of that schedule on per-device vectors
//! that counts bytes per directed link (`execute`). The fabric (`crate::comm::fabric`) runs
//! collectives over these schedules; the compiler's `degrade` module checks a spec's
//! degradation against the lowered programs and leaves degraded devices out.
//!
//! # Topology model
//! A node is degraded along a dimension when it failed (fully degraded), when one of its
//! links along that dimension failed (the node at each end, that dimension only), when it is
//! named degraded along it, or when all its neighbours along it are degraded along it
//! (applied until nothing changes). A node degraded along every dimension that has links is
//! fully degraded. A link along dimension d is healthy when neither end is degraded along d;
//! only healthy links carry data. Nodes that are not fully degraded are healthy: each
//! contributes once and receives the result. `strict` treats partially degraded nodes as
//! fully degraded (the precaution of docs/design.md §6.2).
//!
//! # The plan (seed terms)
//! The reduction runs level by level over a shrinking network of positions, each holding a
//! partial sum of some elements. At level 0 the positions are the healthy nodes and hold the
//! whole vector. At each level:
//! - the dimension: among the remaining ones, those that have a critical group (a group along
//!   the dimension none of whose positions is degraded along it) come first, then the fewest
//!   positions degraded along it, then the lowest axis;
//! - forwarding phase: the positions of forwarding groups (groups with a position degraded
//!   along the dimension) form sub-networks — connected sets of them (at level 0 over healthy
//!   links, later as neighbouring positions). A member next to a critical group heads a
//!   sub-network of its own and the others join the nearest head's (docs/design.md §6.2, sub-networks
//!   of different sizes); each sub-network reduces internally onto its head over a
//!   spanning tree, and the head splits the internal vector over its receivers in critical
//!   groups, one chunk each, added there. Every contribution thus reaches exactly one receiver
//!   per element (the seed's figures 6 and 7 send the whole internal vector to several
//!   receivers, which would double count), and forwarding spreads over every critical
//!   neighbour instead of one link.
//! - critical phase: each critical group reduce-scatters along a ring (on a torus in
//!   coordinate order, on a mesh as 0, 2, 4, .., 5, 3, 1 so no ring edge spans more than two
//!   hops). Ring position i ends with chunk i + 1 of the group's sum: for that chunk it is the
//!   group's representative, and the next level runs once per chunk over those
//!   representatives (the bandwidth-optimal dimension-by-dimension all-reduce when nothing
//!   is degraded).
//!
//! A level with no dimension left holds the sum in its one position. A level where no
//! remaining dimension has a critical group makes all its positions one sub-network that
//! reduces chunk j onto position j (a spanning tree per chunk). The broadcast back is the
//! reduction reversed: every transfer, last first, copies the final data back the way it
//! came, so every healthy node ends with the sum.
//!
//! Every transfer goes hop by hop over healthy links (torus wrap links included), along the
//! route that is shortest once each link is weighted by the bytes already planned over it, so
//! that forwarding spreads over the network rather than piling onto the links next to the
//! degraded region. A healthy node that no healthy route connects to the others is an error
//! naming its coordinates.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::{AddAssign, Range};

use crate::format::degradation::Degradation;
use crate::format::mesh::{Mesh, Topology};
use anyhow::{bail, Result};
use petgraph::graphmap::DiGraphMap;
use petgraph::visit::{Bfs, VisitMap};
use petgraph::Direction;

/// The mesh with its degradation resolved per node and dimension.
#[derive(Clone, Debug)]
pub struct Topo {
    pub mesh: Mesh,
    /// `degraded[device][dim]`.
    degraded: Vec<Vec<bool>>,
}

impl Topo {
    pub fn new(mesh: &Mesh, deg: &Degradation, strict: bool) -> Result<Topo> {
        let n = mesh.devices();
        let dims = mesh.shape.len();
        let mut degraded = vec![vec![false; dims]; n];
        for &d in &deg.nodes {
            if d >= n {
                bail!("degraded device {d} is not in the {:?} mesh", mesh.shape);
            }
            degraded[d] = vec![true; dims];
        }
        for &(d, a) in &deg.along {
            if d >= n || a >= dims {
                bail!("device {d} degraded along dimension {a}: not in the {:?} mesh", mesh.shape);
            }
            degraded[d][a] = true;
        }
        let topo0 = Topo { mesh: mesh.clone(), degraded: degraded.clone() };
        for &(u, v) in &deg.links {
            let Some(a) = (u < n && v < n).then(|| topo0.link_dim(u, v)).flatten() else {
                bail!("degraded link {u}-{v}: the devices are not neighbours in the {:?} mesh", mesh.shape);
            };
            degraded[u][a] = true;
            degraded[v][a] = true;
        }
        let mut topo = Topo { mesh: mesh.clone(), degraded };
        // A node whose neighbours along a dimension are all degraded along it cannot use it.
        loop {
            let mut changed = false;
            for d in 0..n {
                for a in 0..dims {
                    let nb = topo.neighbours(d, a);
                    if !topo.degraded[d][a] && !nb.is_empty() && nb.iter().all(|&m| topo.degraded[m][a]) {
                        topo.degraded[d][a] = true;
                        changed = true;
                    }
                }
            }
            if !changed {
                break;
            }
        }
        let linked: Vec<usize> = (0..dims).filter(|&a| mesh.shape[a] > 1).collect();
        for row in &mut topo.degraded {
            let any = linked.iter().any(|&a| row[a]);
            if linked.iter().all(|&a| row[a]) && !linked.is_empty() || strict && any {
                row.iter_mut().for_each(|x| *x = true);
            }
        }
        Ok(topo)
    }

    /// Refuses a degradation that leaves no device healthy. Degrading the neighbours of a
    /// device along every axis degrades it too, so a spec can get there without naming every
    /// device: the compiler refuses it as the fabric does.
    pub fn require_healthy(&self) -> Result<()> {
        if !(0..self.mesh.devices()).any(|d| self.healthy(d)) {
            bail!("every device of the {:?} mesh is degraded", self.mesh.shape);
        }
        Ok(())
    }

    /// The neighbours of `d` along dimension `a` (one each way; on an axis of two, one).
    pub fn neighbours(&self, d: usize, a: usize) -> Vec<usize> {
        self.mesh.neighbours(d, a)
    }

    /// The dimension of the link between `u` and `v`, if they are neighbours.
    fn link_dim(&self, u: usize, v: usize) -> Option<usize> {
        (0..self.mesh.shape.len()).find(|&a| self.neighbours(u, a).contains(&v))
    }

    pub fn degraded_along(&self, d: usize, a: usize) -> bool {
        self.degraded[d][a]
    }

    pub fn healthy(&self, d: usize) -> bool {
        !self.degraded[d].iter().all(|&x| x) || self.degraded[d].is_empty()
    }

    /// Whether the link u–v exists and may carry data.
    pub fn link_ok(&self, u: usize, v: usize) -> bool {
        self.link_dim(u, v).is_some_and(|a| !self.degraded[u][a] && !self.degraded[v][a])
    }

    /// The healthy links as a graph: every device a node (a failed one without edges),
    /// both directions of each healthy link an edge.
    fn links(&self) -> DiGraphMap<usize, ()> {
        let mut g = DiGraphMap::new();
        for d in 0..self.mesh.devices() {
            g.add_node(d);
            for (m, _) in self.healthy_links(d) {
                g.add_edge(d, m, ());
            }
        }
        g
    }

    /// The healthy links out of `d`, with their dimension.
    fn healthy_links(&self, d: usize) -> Vec<(usize, usize)> {
        (0..self.mesh.shape.len())
            .filter(|&a| !self.degraded[d][a])
            .flat_map(|a| self.neighbours(d, a).into_iter().map(move |m| (m, a)))
            .filter(|&(m, a)| !self.degraded[m][a])
            .collect()
    }
}

/// What a transfer does with the data at its destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Adds it into the destination's vector (the local reduction).
    Add,
    /// Overwrites the destination's elements with it (the data is final for those elements).
    Copy,
}

/// Elements `range` of `from`'s vector, sent hop by hop along `route` (devices, `from` first,
/// `to` last, consecutive ones joined by a healthy link).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transfer {
    pub from: usize,
    pub to: usize,
    pub range: Range<usize>,
    pub route: Vec<usize>,
    pub kind: Kind,
}

/// Transfers that run at the same time: each reads its source as it was when the phase began.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Phase {
    pub what: String,
    pub transfers: Vec<Transfer>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Elements per vector.
    pub len: usize,
    /// The healthy devices: each contributes its vector once and ends with the sum.
    pub members: Vec<usize>,
    pub phases: Vec<Phase>,
    /// The first `reduced` phases reduce; the rest broadcast the result back.
    pub reduced: usize,
}

fn overlap(a: &Range<usize>, b: &Range<usize>) -> Option<Range<usize>> {
    let r = a.start.max(b.start)..a.end.min(b.end);
    (!r.is_empty()).then_some(r)
}

/// Sorts `set` and merges the ranges that touch.
fn normalise(set: &mut Vec<Range<usize>>) {
    set.sort_by_key(|r| r.start);
    let mut out: Vec<Range<usize>> = Vec::with_capacity(set.len());
    for r in set.drain(..) {
        match out.last_mut() {
            Some(l) if r.start <= l.end => l.end = l.end.max(r.end),
            _ => out.push(r),
        }
    }
    *set = out;
}

/// `range` split into `k` nearly equal contiguous chunks.
fn chunks(range: Range<usize>, k: usize) -> Vec<Range<usize>> {
    let (s, n) = (range.start, range.len());
    (0..k).map(|j| s + n * j / k..s + n * (j + 1) / k).collect()
}

struct Planner<'a> {
    topo: &'a Topo,
    len: usize,
    /// Elements planned per directed link so far.
    load: BTreeMap<(usize, usize), usize>,
    phases: Vec<Phase>,
}

impl Planner<'_> {
    /// The healthy route from `a` to `b` that is shortest when each hop costs one plus the
    /// vectors already planned over its link. Among equally short routes, each hop back
    /// from `b` goes to the predecessor nearest `a`, then the lowest-numbered: a fixed rule,
    /// so the same degradation always gives the same schedule.
    fn route(&self, a: usize, b: usize) -> Vec<usize> {
        let links = self.topo.links();
        let len = self.len.max(1) as u64;
        let cost = |u: usize, v: usize| 1000 + 1000 * *self.load.get(&(u, v)).unwrap_or(&0) as u64 / len;
        let dist = petgraph::algo::dijkstra(&links, a, None, |(u, v, _)| cost(u, v));
        let mut path = vec![b];
        while let Some(&v) = path.last().filter(|&&v| v != a) {
            let on_route = |&u: &usize| dist.get(&u).is_some_and(|&d| d + cost(u, v) == dist[&v]);
            let u = (links.neighbors_directed(v, Direction::Incoming).filter(on_route))
                .min_by_key(|&u| (dist[&u], u))
                .expect("callers route between devices of one healthy component");
            path.push(u);
        }
        path.reverse();
        path
    }

    /// Plans a transfer into phase `phase` (created as needed) and counts its load.
    fn transfer(&mut self, phase: usize, what: &str, from: usize, to: usize, range: Range<usize>, kind: Kind) {
        if range.is_empty() || from == to {
            return;
        }
        let route = self.route(from, to);
        for w in route.windows(2) {
            *self.load.entry((w[0], w[1])).or_default() += range.len();
        }
        while self.phases.len() <= phase {
            self.phases.push(Phase { what: String::new(), transfers: Vec::new() });
        }
        if self.phases[phase].what.is_empty() {
            self.phases[phase].what = what.to_string();
        }
        self.phases[phase].transfers.push(Transfer { from, to, range, route, kind });
    }

    /// Chunk `range` of every member of `members` reduced onto `root` over a spanning tree:
    /// BFS over `adjacent`, members it cannot reach hung below the nearest member reached.
    /// Phases start at `phase`; returns the number of phases used.
    fn tree_reduce(
        &mut self,
        phase: usize,
        what: &str,
        members: &[usize],
        adjacent: &dyn Fn(usize, usize) -> bool,
        root: usize,
        range: Range<usize>,
    ) -> usize {
        let mut tree = DiGraphMap::<usize, ()>::new();
        for &u in members {
            tree.add_node(u);
            for &v in members.iter().filter(|&&v| adjacent(u, v)) {
                tree.add_edge(u, v, ());
            }
        }
        let mut depth = BTreeMap::from([(root, 0usize)]);
        let mut parent = BTreeMap::new();
        let mut bfs = Bfs::new(&tree, root);
        loop {
            // A node's children are the neighbours it discovers: those not yet reached when
            // the search takes it, in member order.
            while let Some(u) = bfs.next(&tree) {
                for v in tree.neighbors(u) {
                    if !depth.contains_key(&v) {
                        depth.insert(v, depth[&u] + 1);
                        parent.insert(v, u);
                    }
                }
            }
            // Positions of later levels need not neighbour each other: hang the nearest
            // unreached member below the reached member closest to it, and search on from it.
            let best = members
                .iter()
                .filter(|v| !depth.contains_key(v))
                .flat_map(|&v| depth.keys().map(move |&u| (u, v)))
                .min_by_key(|&(u, v)| (self.route(u, v).len(), u, v));
            let Some((u, v)) = best else { break };
            depth.insert(v, depth[&u] + 1);
            parent.insert(v, u);
            bfs.discovered.visit(v);
            bfs.stack.push_back(v);
        }
        let deepest = depth.values().copied().max().unwrap_or(0);
        for (&v, &p) in &parent {
            self.transfer(phase + deepest - depth[&v], what, v, p, range.clone(), Kind::Add);
        }
        deepest
    }
}

/// A position of a level: its coordinates over the remaining dimensions (the others zero)
/// and the node that holds its partial sum.
type Positions = BTreeMap<Vec<usize>, usize>;

/// The members that no healthy route (through any healthy node, member or not) connects to
/// the connected set of healthy nodes holding the most members (among equals, the one with
/// the lowest-numbered device).
fn unreachable(topo: &Topo, members: &[usize]) -> Vec<usize> {
    // Links are symmetric, so the strongly connected components are the connected ones.
    let sets: Vec<Vec<usize>> = petgraph::algo::kosaraju_scc(&topo.links())
        .into_iter()
        .filter(|set| set.iter().all(|&d| topo.healthy(d)))
        .collect();
    let held = |set: &Vec<usize>| set.iter().filter(|d| members.contains(d)).count();
    let main = sets.iter().max_by_key(|set| (held(set), Reverse(set.iter().min().copied())));
    members.iter().copied().filter(|d| !main.is_some_and(|set| set.contains(d))).collect()
}

/// Whether a collective over `group` must be planned around the degradation: a member is
/// degraded, or degraded along an axis the group spans (a link it would use failed).
pub fn touches(topo: &Topo, group: &[usize]) -> bool {
    let coords: Vec<Vec<usize>> = group.iter().map(|&d| topo.mesh.coords(d)).collect();
    let spans = |a: usize| coords.iter().any(|c| c[a] != coords[0][a]);
    group.iter().any(|&d| !topo.healthy(d) || (0..topo.mesh.shape.len()).any(|a| spans(a) && topo.degraded_along(d, a)))
}

/// The all-reduce of a `len`-element vector over every healthy device of `topo`.
pub fn plan(topo: &Topo, len: usize) -> Result<Schedule> {
    plan_group(topo, &(0..topo.mesh.devices()).collect::<Vec<_>>(), len)
}

/// The bytes per directed link of the point-to-point `transfers` (from, to, bytes) among
/// healthy devices, each routed around the degradation over the route that is shortest
/// given the load planned so far, as the reductions' transfers are: how an all_gather or
/// all_to_all whose plain schedule crosses a failed link moves its blocks. Fails when a
/// device cannot reach the others.
pub fn route_transfers(topo: &Topo, transfers: &[(usize, usize, usize)]) -> Result<BTreeMap<(usize, usize), u64>> {
    let mut ends: Vec<usize> = transfers.iter().flat_map(|&(u, v, _)| [u, v]).collect();
    ends.sort();
    ends.dedup();
    let lost = unreachable(topo, &ends);
    if !lost.is_empty() {
        let names: Vec<String> = lost.iter().map(|&d| topo.mesh.coords_string(d)).collect();
        bail!("healthy device {} cannot reach the others over healthy links", names.join(", "));
    }
    let len = transfers.iter().map(|t| t.2).max().unwrap_or(0);
    let mut p = Planner { topo, len, load: BTreeMap::new(), phases: Vec::new() };
    for &(from, to, bytes) in transfers {
        p.transfer(0, "", from, to, 0..bytes, Kind::Copy);
    }
    Ok(p.load.into_iter().map(|(l, b)| (l, b as u64)).collect())
}

/// The all-reduce of a `len`-element vector over the healthy devices of `group` (devices of
/// `topo`'s mesh). Routes may pass through healthy devices outside the group. A group that
/// spans whole mesh axes (a sub-mesh, as lowering makes them) is reduced dimension by
/// dimension over those axes as the module doc describes; any other group is one
/// sub-network (chunk j reduced onto member j over spanning trees).
pub fn plan_group(topo: &Topo, group: &[usize], len: usize) -> Result<Schedule> {
    let mesh = &topo.mesh;
    let whole = group.len() == mesh.devices();
    let mut members: Vec<usize> = group.iter().copied().filter(|&d| d < mesh.devices() && topo.healthy(d)).collect();
    members.sort();
    members.dedup();
    if members.is_empty() {
        if whole {
            bail!("every device of the {:?} mesh is degraded", mesh.shape);
        }
        bail!("every device of the group is degraded");
    }
    let lost = unreachable(topo, &members);
    if !lost.is_empty() {
        let names: Vec<String> = lost.iter().map(|&d| mesh.coords_string(d)).collect();
        bail!("healthy device {} cannot reach the others over healthy links", names.join(", "));
    }
    let mut p = Planner { topo, len, load: BTreeMap::new(), phases: Vec::new() };
    let coords: Vec<Vec<usize>> = group.iter().map(|&d| mesh.coords(d)).collect();
    let axes: Vec<usize> = if whole {
        (0..mesh.shape.len()).collect()
    } else {
        (0..mesh.shape.len()).filter(|&a| coords.iter().any(|c| c[a] != coords[0][a])).collect()
    };
    let distinct: BTreeSet<&Vec<usize>> = coords.iter().collect();
    if distinct.len() == group.len() && axes.iter().map(|&a| mesh.shape[a]).product::<usize>() == group.len() {
        // Positions are keyed by their coordinates along the group's axes (the others zero).
        let key = |d: usize| {
            let mut c = mesh.coords(d);
            (0..c.len()).filter(|a| !axes.contains(a)).for_each(|a| c[a] = 0);
            c
        };
        let pos: Positions = members.iter().map(|&d| (key(d), d)).collect();
        p.level(0..len, &pos, &axes, true, 0);
    } else {
        let adjacent = |u: usize, v: usize| topo.link_ok(u, v);
        for (part, &root) in chunks(0..len, members.len()).into_iter().zip(&members) {
            p.tree_reduce(0, "reduce (not a sub-mesh)", &members, &adjacent, root, part);
        }
    }
    // Broadcast back: the reduction reversed, copying final data the way it came.
    let reduce: Vec<Phase> = p.phases.into_iter().filter(|ph| !ph.transfers.is_empty()).collect();
    let reduced = reduce.len();
    let mut phases = reduce.clone();
    for ph in reduce.iter().rev() {
        let transfers = ph
            .transfers
            .iter()
            .map(|t| Transfer {
                from: t.to,
                to: t.from,
                range: t.range.clone(),
                route: t.route.iter().rev().copied().collect(),
                kind: Kind::Copy,
            })
            .collect();
        phases.push(Phase { what: format!("broadcast back ({})", ph.what), transfers });
    }
    Ok(Schedule { len, members, phases, reduced })
}

impl Planner<'_> {
    /// Reduces elements `range` of the positions `pos` over the dimensions `remaining`, from
    /// phase `start` on. Level 0 is the physical network (positions are healthy nodes).
    fn level(&mut self, range: Range<usize>, pos: &Positions, remaining: &[usize], level0: bool, start: usize) {
        if range.is_empty() {
            return;
        }
        let topo = self.topo;
        let mesh = &topo.mesh;
        // Degraded along `a`: at level 0 the node's own state, later the position's absence
        // (its group was a forwarding group: its data went to a critical group).
        let deg = |c: &[usize], a: usize| match pos.get(c) {
            None => true,
            Some(&d) => level0 && topo.degraded_along(d, a),
        };
        let groups = |a: usize| -> Vec<Vec<Vec<usize>>> {
            let mut g: BTreeMap<Vec<usize>, Vec<Vec<usize>>> = BTreeMap::new();
            for c in all_coords(&mesh.shape, remaining) {
                let mut key = c.clone();
                key[a] = 0;
                g.entry(key).or_default().push(c);
            }
            g.into_values().collect()
        };
        let critical = |g: &[Vec<usize>], a: usize| g.iter().all(|c| !deg(c, a));
        let choice = remaining
            .iter()
            .map(|&a| {
                let gs = groups(a);
                let degraded = gs.iter().flatten().filter(|c| deg(c, a)).count();
                (!gs.iter().any(|g| critical(g, a)), degraded, a)
            })
            .min();
        let adjacent = adjacency(topo, pos, level0);
        let a = match choice {
            // Every dimension reduced: the one position left holds the sum of `range`.
            None => return,
            Some((true, _, _)) => {
                // No critical group anywhere: one sub-network, chunk j reduced onto position j.
                let nodes: Vec<usize> = pos.values().copied().collect();
                for (part, &root) in chunks(range, nodes.len()).into_iter().zip(&nodes) {
                    self.tree_reduce(start, "reduce (no critical group)", &nodes, &adjacent, root, part);
                }
                return;
            }
            Some((false, _, a)) => a,
        };
        let (crit, fwd): (Vec<_>, Vec<_>) = groups(a).into_iter().partition(|g| critical(g, a));
        let fwd_nodes: BTreeSet<usize> = fwd.iter().flatten().filter_map(|c| pos.get(c).copied()).collect();
        let crit_nodes: BTreeSet<usize> = crit.iter().flatten().map(|c| pos[c]).collect();
        // Forwarding phase: the sub-networks of forwarding groups, one chunk per receiver.
        let mut seen = BTreeSet::new();
        let mut depth = 0;
        let mut forwards = Vec::new();
        for &s in &fwd_nodes {
            if !seen.insert(s) {
                continue;
            }
            let mut sub = vec![s];
            let mut i = 0;
            while i < sub.len() {
                let u = sub[i];
                sub.extend(fwd_nodes.iter().copied().filter(|&v| adjacent(u, v) && seen.insert(v)).collect::<Vec<_>>());
                i += 1;
            }
            sub.sort();
            // Members next to a critical group (gateways) each head a sub-network of their own
            // (docs/design.md §6.2: sub-networks of different sizes); the others join the
            // nearest gateway's. Without any, the whole sub-network heads for the nearest
            // critical position.
            let receivers =
                |s: usize| -> Vec<usize> { crit_nodes.iter().copied().filter(|&r| adjacent(s, r)).collect() };
            let mut head: BTreeMap<usize, usize> = BTreeMap::new();
            let mut queue: VecDeque<usize> = sub.iter().copied().filter(|&g| !receivers(g).is_empty()).collect();
            for &g in &queue {
                head.insert(g, g);
            }
            let heads: Vec<(usize, Vec<usize>)> = if queue.is_empty() {
                let nearest = sub
                    .iter()
                    .flat_map(|&s| crit_nodes.iter().map(move |&r| (s, r)))
                    .min_by_key(|&(s, r)| (self.route(s, r).len(), s, r))
                    .expect("a level with a critical group has critical positions");
                head = sub.iter().map(|&v| (v, nearest.0)).collect();
                vec![(nearest.0, vec![nearest.1])]
            } else {
                while let Some(u) = queue.pop_front() {
                    for &v in &sub {
                        if !head.contains_key(&v) && adjacent(u, v) {
                            head.insert(v, head[&u]);
                            queue.push_back(v);
                        }
                    }
                }
                head.iter().filter(|(g, h)| g == h).map(|(&g, _)| (g, receivers(g))).collect()
            };
            for (g, rs) in heads {
                let members: Vec<usize> = sub.iter().copied().filter(|v| head[v] == g).collect();
                let d = self.tree_reduce(start, "forwarding: internal reduce", &members, &adjacent, g, range.clone());
                depth = depth.max(d);
                // The internal vector split over the receivers: each element reaches one.
                for (r, part) in rs.iter().zip(chunks(range.clone(), rs.len())) {
                    forwards.push((g, *r, part));
                }
            }
        }
        // Every internal reduce is done by phase `start + depth`: the forwards follow.
        for (s, r, part) in forwards {
            self.transfer(
                start + depth,
                &format!("forwarding along dim {a}: to critical groups"),
                s,
                r,
                part,
                Kind::Add,
            );
        }
        // Critical phase: a ring reduce-scatter in each critical group; ring position i ends
        // with chunk i + 1 and represents its group for that chunk at the next level.
        let ring = start + depth + 1;
        let m = mesh.shape[a];
        let order = mesh.topology.ring_order(m);
        let parts = chunks(range, m);
        let what = format!("critical along dim {a}: ring reduce-scatter");
        for g in &crit {
            let nodes: Vec<usize> = order.iter().map(|&i| pos[&g[i]]).collect();
            for step in 0..m - 1 {
                for i in 0..m {
                    let c = (i + m - step) % m;
                    self.transfer(ring + step, &what, nodes[i], nodes[(i + 1) % m], parts[c].clone(), Kind::Add);
                }
            }
        }
        let rest: Vec<usize> = remaining.iter().copied().filter(|&x| x != a).collect();
        for (i, &at) in order.iter().enumerate() {
            let next: Positions = crit
                .iter()
                .map(|g| {
                    let mut key = g[0].clone();
                    key[a] = 0;
                    (key, pos[&g[at]])
                })
                .collect();
            self.level(parts[(i + 1) % m].clone(), &next, &rest, false, ring + m - 1);
        }
    }
}

/// Whether two positions neighbour each other: at level 0 over a healthy link; later as
/// neighbouring positions (their groups' representatives reach each other by routes).
fn adjacency<'a>(topo: &'a Topo, pos: &Positions, level0: bool) -> impl Fn(usize, usize) -> bool + 'a {
    let coords: BTreeMap<usize, Vec<usize>> = pos.iter().map(|(c, &d)| (d, c.clone())).collect();
    move |u, v| {
        if level0 {
            return topo.link_ok(u, v);
        }
        let (cu, cv) = (&coords[&u], &coords[&v]);
        let diff: Vec<usize> = (0..cu.len()).filter(|&i| cu[i] != cv[i]).collect();
        diff.len() == 1 && {
            let a = diff[0];
            let s = topo.mesh.shape[a];
            let (x, y) = (cu[a], cv[a]);
            x.abs_diff(y) == 1 || topo.mesh.topology == Topology::Torus && x.abs_diff(y) == s - 1
        }
    }
}

/// Every coordinate vector over `dims` of `shape` (the other coordinates zero), row-major.
fn all_coords(shape: &[usize], dims: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![vec![0; shape.len()]];
    for &a in dims {
        out = out
            .into_iter()
            .flat_map(|c| {
                (0..shape[a]).map(move |x| {
                    let mut c = c.clone();
                    c[a] = x;
                    c
                })
            })
            .collect();
    }
    out
}

impl Schedule {
    /// Bytes each directed link carries when the elements are `elem_bytes` wide.
    pub fn link_bytes(&self, elem_bytes: usize) -> BTreeMap<(usize, usize), u64> {
        let mut bytes = BTreeMap::new();
        for t in self.phases.iter().flat_map(|ph| &ph.transfers) {
            for w in t.route.windows(2) {
                *bytes.entry((w[0], w[1])).or_default() += (t.range.len() * elem_bytes) as u64;
            }
        }
        bytes
    }

    /// Bytes each directed link carries when the plan serves a reduce-scatter: every
    /// reduction phase, then of the broadcast back only the elements on their way to a member
    /// that keeps them (`keeps`: member → element ranges).
    pub fn scatter_link_bytes(
        &self,
        elem_bytes: usize,
        keeps: &BTreeMap<usize, Vec<Range<usize>>>,
    ) -> BTreeMap<(usize, usize), u64> {
        let mut bytes = BTreeMap::new();
        let mut count = |route: &[usize], n: usize| {
            for w in route.windows(2) {
                *bytes.entry((w[0], w[1])).or_default() += (n * elem_bytes) as u64;
            }
        };
        for t in self.phases[..self.reduced].iter().flat_map(|ph| &ph.transfers) {
            count(&t.route, t.range.len());
        }
        // Last transfer first: what a device must receive is what it keeps plus what it
        // passes on later.
        let mut need: BTreeMap<usize, Vec<Range<usize>>> = keeps.clone();
        for t in self.phases[self.reduced..].iter().rev().flat_map(|ph| ph.transfers.iter().rev()) {
            let carried: Vec<Range<usize>> = need
                .get(&t.to)
                .map(|set| set.iter().filter_map(|r| overlap(r, &t.range)).collect())
                .unwrap_or_default();
            let n: usize = carried.iter().map(Range::len).sum();
            if n > 0 {
                count(&t.route, n);
                let set = need.entry(t.from).or_default();
                set.extend(carried);
                normalise(set);
            }
        }
        bytes
    }

    /// One line per phase and per transfer, devices as coordinates: the schedule as people
    /// read it (and as the tests pin it).
    pub fn describe(&self, mesh: &Mesh) -> String {
        let c = |d: usize| mesh.coords_string(d);
        let mut s = String::new();
        for (i, ph) in self.phases.iter().enumerate() {
            s.push_str(&format!("phase {i}: {}\n", ph.what));
            for t in &ph.transfers {
                let route: Vec<String> = t.route.iter().map(|&d| c(d)).collect();
                let kind = match t.kind {
                    Kind::Add => "add",
                    Kind::Copy => "copy",
                };
                s.push_str(&format!("  {kind} [{}..{}) {}\n", t.range.start, t.range.end, route.join(" > ")));
            }
        }
        s
    }
}

/// Runs `schedule` on `data` (one vector per device; those of unhealthy devices are left as
/// they are) and returns the bytes each directed link carried. Fails, before changing any
/// data, if a route does not join its ends or uses a link that is missing or not healthy.
pub fn execute<T: Copy + AddAssign>(
    topo: &Topo,
    schedule: &Schedule,
    data: &mut [Vec<T>],
) -> Result<BTreeMap<(usize, usize), u64>> {
    let m = &topo.mesh;
    for t in schedule.phases.iter().flat_map(|ph| &ph.transfers) {
        if t.route.first() != Some(&t.from) || t.route.last() != Some(&t.to) {
            bail!("transfer {} -> {}: its route does not join them", m.coords_string(t.from), m.coords_string(t.to));
        }
        if let Some(w) = t.route.windows(2).find(|w| !topo.link_ok(w[0], w[1])) {
            bail!("route uses the unusable link {}-{}", m.coords_string(w[0]), m.coords_string(w[1]));
        }
    }
    for ph in &schedule.phases {
        let msgs: Vec<Vec<T>> = ph.transfers.iter().map(|t| data[t.from][t.range.clone()].to_vec()).collect();
        for (t, msg) in ph.transfers.iter().zip(msgs) {
            let dst = &mut data[t.to][t.range.clone()];
            match t.kind {
                Kind::Add => dst.iter_mut().zip(&msg).for_each(|(d, &x)| *d += x),
                Kind::Copy => dst.copy_from_slice(&msg),
            }
        }
    }
    Ok(schedule.link_bytes(size_of::<T>()))
}
