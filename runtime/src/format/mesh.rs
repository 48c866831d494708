//! The device mesh and tensor layouts over it: device numbering and coordinates, the groups
//! of devices along mesh axes (the `groups` of a collective), and which slice of a tensor
//! each device holds. Shared by the layout passes, the compiler and the runner, so that all
//! three agree on who holds what.
//!
//! Devices are numbered row-major over the mesh shape (the last axis varies fastest). A
//! tensor dimension split over a mesh axis of size n is cut into n equal blocks; the device
//! whose coordinate along that axis is c holds block c.
//!
//! A dimension may also be split over a sub-axis: the factor `size` of an axis of size n
//! that follows the factor `pre` of it (Shardy's `axis:(pre)size`), so that one axis's
//! factors can sit on two tensor dims, as GSPMD's tile assignments allow (8 devices over
//! 4 heads x 2 halves of head_dim: `model:(1)4` and `model:(4)2`). Along it the device at
//! axis coordinate c has the coordinate (c / (n / (pre * size))) % size. A layout entry
//! names either a whole axis (its index) or a sub-axis (`Mesh::part`), so `Layout` stays a
//! list of numbers everywhere, the artifact included.

use std::ops::Range;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Topology {
    /// Links between neighbours along each axis, no wrap-around.
    Mesh,
    /// As `Mesh`, plus a link from the last device of each axis back to the first.
    Torus,
}

impl Topology {
    /// The order of coordinates 0..n along an axis in which consecutive ones (and the last
    /// and the first) are at most two hops apart, each link used once per direction: around
    /// a torus axis in coordinate order, on a mesh axis 0, 2, 4, .., 5, 3, 1. The fabric's
    /// rings and the fault-tolerant planner's critical groups both go this way.
    pub fn ring_order(self, n: usize) -> Vec<usize> {
        match self {
            Topology::Torus => (0..n).collect(),
            Topology::Mesh => (0..n).step_by(2).chain((1..n).step_by(2).rev()).collect(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Topology::Mesh => "mesh",
            Topology::Torus => "torus",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mesh {
    pub shape: Vec<usize>,
    pub axes: Vec<String>,
    pub topology: Topology,
}

/// A tensor's layout: for each of its dimensions, the mesh axis (or sub-axis, `Mesh::part`)
/// it is split over, or `None` (replicated along every mesh axis no dimension uses).
pub type Layout = Vec<Option<usize>>;

/// Layout entries from here on name sub-axes: `PART + (axis << 32) + (pre << 16) + size`
/// (a mesh has at most 4096 devices, so `pre` and `size` fit in 16 bits).
const PART: usize = 1 << 48;

impl Mesh {
    /// The one-device mesh of a graph compiled without a layout spec.
    pub fn single() -> Mesh {
        Mesh { shape: vec![1], axes: vec!["device".into()], topology: Topology::Mesh }
    }

    /// A mesh of `shape` whose axes are named a0, a1, …: for tests and benches that need
    /// a mesh without a layout spec.
    pub fn numbered(shape: &[usize], topology: Topology) -> Mesh {
        Mesh { shape: shape.to_vec(), axes: (0..shape.len()).map(|i| format!("a{i}")).collect(), topology }
    }

    pub fn devices(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn axis(&self, name: &str) -> Option<usize> {
        self.axes.iter().position(|a| a == name)
    }

    pub fn coords(&self, device: usize) -> Vec<usize> {
        let mut c = vec![0; self.shape.len()];
        let mut d = device;
        for (i, &n) in self.shape.iter().enumerate().rev() {
            c[i] = d % n;
            d /= n;
        }
        c
    }

    pub fn device(&self, coords: &[usize]) -> usize {
        coords.iter().zip(&self.shape).fold(0, |d, (&c, &n)| d * n + c)
    }

    /// The groups of devices that differ only in their coordinates along `axes`, each in rank
    /// order (row-major over `axes`, in the order given); groups are ordered by their first
    /// device. With `axes` empty, every device is its own group.
    pub fn groups(&self, axes: &[usize]) -> Vec<Vec<usize>> {
        let size: usize = axes.iter().map(|&a| self.shards(a)).product();
        let mut groups = Vec::new();
        for d in 0..self.devices() {
            if axes.iter().any(|&a| self.coord(d, a) != 0) {
                continue;
            }
            let c = self.coords(d);
            let group = (0..size)
                .map(|mut r| {
                    let mut cc = c.clone();
                    for &a in axes.iter().rev() {
                        let (x, _, s) = self.split(a);
                        cc[x] += (r % s) * self.stride(a);
                        r /= s;
                    }
                    self.device(&cc)
                })
                .collect();
            groups.push(group);
        }
        groups
    }

    /// The layout entry of sub-axis `axis:(pre)size` (the whole axis when it is all of it).
    /// The caller checks that `pre * size` divides the axis's size.
    pub fn part(&self, axis: usize, pre: usize, size: usize) -> usize {
        if pre == 1 && Some(&size) == self.shape.get(axis) {
            axis
        } else {
            PART + (axis << 32) + (pre << 16) + size
        }
    }

    /// `(axis, pre, size)` of layout entry `a`: a whole axis is `(a, 1, its size)`.
    pub fn split(&self, a: usize) -> (usize, usize, usize) {
        if a < PART {
            (a, 1, self.shape.get(a).copied().unwrap_or(1))
        } else {
            let r = a - PART;
            (r >> 32, (r >> 16) & 0xffff, r & 0xffff)
        }
    }

    /// Whether `a` names an axis of this mesh or a sub-axis of one whose factors divide it.
    pub fn valid(&self, a: usize) -> bool {
        let (x, pre, size) = self.split(a);
        x < self.shape.len() && pre >= 1 && size >= 1 && self.shape[x].is_multiple_of(pre * size)
    }

    /// Into how many blocks entry `a` cuts a dimension.
    pub fn shards(&self, a: usize) -> usize {
        self.split(a).2
    }

    /// The axis coordinates one step of sub-axis `a` spans (1 for a whole axis).
    fn stride(&self, a: usize) -> usize {
        let (x, pre, size) = self.split(a);
        self.shape[x] / (pre * size)
    }

    /// The coordinate of `device` along entry `a`: the index of the block it holds.
    pub fn coord(&self, device: usize, a: usize) -> usize {
        let (x, _, size) = self.split(a);
        (self.coords(device)[x] / self.stride(a)) % size
    }

    /// Whether entries `a` and `b` share a factor of one axis (a layout may not use both).
    pub fn overlaps(&self, a: usize, b: usize) -> bool {
        let ((x, _, sa), (y, _, sb)) = (self.split(a), self.split(b));
        let (ta, tb) = (self.stride(a), self.stride(b));
        a == b || (x == y && ta.max(tb) < (ta * sa).min(tb * sb))
    }

    /// Whether `layout` lays out a tensor of `shape`: one entry per dim, each valid, no two
    /// overlapping, every split dim divisible by its number of blocks.
    pub fn fits(&self, shape: &[usize], layout: &[Option<usize>]) -> bool {
        let entries: Vec<usize> = layout.iter().flatten().copied().collect();
        layout.len() == shape.len()
            && entries.iter().all(|&a| self.valid(a))
            && shape.iter().zip(layout).all(|(&n, a)| a.is_none_or(|a| n.is_multiple_of(self.shards(a))))
            && entries.iter().enumerate().all(|(i, &a)| entries[..i].iter().all(|&b| !self.overlaps(a, b)))
    }

    /// The neighbours of `device` along axis `a`, ascending: one each way, plus the
    /// wrap-around on a torus (on an axis of two the wrap-around would join the same two
    /// devices again, so there is just the one).
    pub fn neighbours(&self, device: usize, a: usize) -> Vec<usize> {
        let (s, c) = (self.shape[a], self.coords(device));
        let mut along = Vec::new();
        if c[a] + 1 < s {
            along.push(c[a] + 1);
        }
        if c[a] > 0 {
            along.push(c[a] - 1);
        }
        if self.topology == Topology::Torus && s > 2 {
            along.extend([(c[a] + 1) % s, (c[a] + s - 1) % s]);
        }
        let mut out: Vec<usize> = along
            .into_iter()
            .map(|x| {
                let mut n = c.clone();
                n[a] = x;
                self.device(&n)
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// "(1,2)": a device as people name it.
    pub fn coords_string(&self, device: usize) -> String {
        let c: Vec<String> = self.coords(device).iter().map(usize::to_string).collect();
        format!("({})", c.join(","))
    }

    /// "device 3 (0,3)": how errors and traces name a device.
    pub fn device_label(&self, device: usize) -> String {
        format!("device {device} {}", self.coords_string(device))
    }

    /// `model`, or `model:(1)4` for a sub-axis: a layout entry as people read it.
    pub fn entry_name(&self, a: usize) -> String {
        let (x, pre, size) = self.split(a);
        let axis = self.axes.get(x).cloned().unwrap_or_else(|| format!("axis {x}"));
        if a < PART {
            axis
        } else {
            format!("{axis}:({pre}){size}")
        }
    }

    /// `[data, -]`: a layout as people read it.
    /// An axis the mesh does not have (a damaged artifact) shows as its number.
    pub fn layout_string(&self, layout: &[Option<usize>]) -> String {
        let dims: Vec<String> = layout.iter().map(|a| a.map_or("-".to_string(), |a| self.entry_name(a))).collect();
        format!("[{}]", dims.join(", "))
    }

    /// The shape of the block each device holds.
    pub fn local_shape(&self, shape: &[usize], layout: &[Option<usize>]) -> Vec<usize> {
        shape.iter().zip(layout).map(|(&n, a)| a.map_or(n, |a| n / self.shards(a))).collect()
    }

    /// The index ranges of the block `device` holds, per tensor dimension.
    pub fn region(&self, shape: &[usize], layout: &[Option<usize>], device: usize) -> Vec<Range<usize>> {
        shape
            .iter()
            .zip(layout)
            .map(|(&n, a)| match *a {
                None => 0..n,
                Some(a) => {
                    let (b, c) = (n / self.shards(a), self.coord(device, a));
                    c * b..(c + 1) * b
                }
            })
            .collect()
    }

    /// Whether `device` is the one copy of its block that writes it back (the block's
    /// replicas differ only along axes the layout leaves unused; the one at coordinate 0
    /// along all of them writes).
    pub fn writes_back(&self, layout: &[Option<usize>], device: usize) -> bool {
        let mut rest = self.coords(device);
        for &a in layout.iter().flatten() {
            rest[self.split(a).0] -= self.coord(device, a) * self.stride(a);
        }
        rest.iter().all(|&c| c == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinates_are_row_major() {
        let m = Mesh::numbered(&[2, 4], Topology::Mesh);
        assert_eq!(m.coords(5), vec![1, 1]);
        for d in 0..8 {
            assert_eq!(m.device(&m.coords(d)), d);
        }
    }

    #[test]
    fn groups_along_axes() {
        let m = Mesh::numbered(&[2, 4], Topology::Mesh);
        assert_eq!(m.groups(&[1]), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        assert_eq!(m.groups(&[0]), vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]);
        assert_eq!(m.groups(&[0, 1]), vec![(0..8).collect::<Vec<_>>()]);
        assert_eq!(m.groups(&[1, 0]), vec![vec![0, 4, 1, 5, 2, 6, 3, 7]]);
        assert_eq!(m.groups(&[]), (0..8).map(|d| vec![d]).collect::<Vec<_>>());
    }

    #[test]
    fn regions_tile_the_tensor_once() {
        let m = Mesh::numbered(&[2, 2, 2], Topology::Mesh);
        let layout = vec![Some(2), None, Some(0)];
        let shape = [4, 3, 6];
        let mut seen = vec![0; 4 * 3 * 6];
        for d in 0..8 {
            let r = m.region(&shape, &layout, d);
            assert_eq!(r.iter().map(|r| r.len()).collect::<Vec<_>>(), m.local_shape(&shape, &layout));
            if !m.writes_back(&layout, d) {
                continue;
            }
            for i in r[0].clone() {
                for j in r[1].clone() {
                    for k in r[2].clone() {
                        seen[(i * 3 + j) * 6 + k] += 1;
                    }
                }
            }
        }
        assert!(seen.iter().all(|&n| n == 1));
    }

    #[test]
    fn sub_axes_split_one_axis_over_two_dims() {
        let m = Mesh::numbered(&[2, 8], Topology::Mesh);
        let (hi, lo) = (m.part(1, 1, 4), m.part(1, 4, 2));
        assert_eq!(m.part(1, 1, 8), 1, "all of an axis is the axis");
        assert_eq!(m.split(hi), (1, 1, 4));
        assert_eq!(m.layout_string(&[None, Some(hi), Some(lo)]), "[-, a1:(1)4, a1:(4)2]");
        // Device 13 is (1, 5): block 5 / 2 = 2 of the major part, 5 % 2 = 1 of the minor.
        assert_eq!((m.coord(13, hi), m.coord(13, lo)), (2, 1));
        assert_eq!(m.groups(&[lo])[..2], [vec![0, 1], vec![2, 3]]);
        assert_eq!(m.groups(&[hi])[..2], [vec![0, 2, 4, 6], vec![1, 3, 5, 7]]);
        assert!(!m.overlaps(hi, lo) && m.overlaps(hi, 1) && m.overlaps(lo, m.part(1, 2, 4)) && !m.overlaps(hi, 0));
        assert!(m.fits(&[2, 4, 8], &[Some(0), Some(hi), Some(lo)]));
        assert!(!m.fits(&[2, 4, 8], &[None, Some(hi), Some(1)]), "overlapping");
        assert!(!m.fits(&[2, 2, 8], &[None, Some(hi), Some(lo)]), "4 does not divide 2");
        assert!(!m.valid(m.part(1, 3, 2)) && !m.valid(m.part(2, 1, 2)));
        // The blocks of [-, hi, lo] over [2, 4, 8] tile it once; the data axis replicates.
        let (shape, layout) = ([2, 4, 8], vec![None, Some(hi), Some(lo)]);
        let mut seen = vec![0; 64];
        for d in (0..16).filter(|&d| m.writes_back(&layout, d)) {
            let r = m.region(&shape, &layout, d);
            for i in r[0].clone() {
                for j in r[1].clone() {
                    for k in r[2].clone() {
                        seen[(i * 4 + j) * 8 + k] += 1;
                    }
                }
            }
        }
        assert!(seen.iter().all(|&n| n == 1));
    }
}
