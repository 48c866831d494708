//! The device mesh and tensor layouts over it: device numbering and coordinates, the groups
//! of devices along mesh axes (the `groups` of a collective), and which slice of a tensor
//! each device holds. Shared by the layout passes, the compiler and the runner, so that all
//! three agree on who holds what.
//!
//! Devices are numbered row-major over the mesh shape (the last axis varies fastest). A
//! tensor dimension split over a mesh axis of size n is cut into n equal blocks; the device
//! whose coordinate along that axis is c holds block c.

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

/// A tensor's layout: for each of its dimensions, the mesh axis it is split over, or `None`
/// (replicated along every mesh axis no dimension uses).
pub type Layout = Vec<Option<usize>>;

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
        let mut groups = Vec::new();
        for d in 0..self.devices() {
            let c = self.coords(d);
            if axes.iter().any(|&a| c[a] != 0) {
                continue;
            }
            let size: usize = axes.iter().map(|&a| self.shape[a]).product();
            let group = (0..size)
                .map(|mut r| {
                    let mut cc = c.clone();
                    for &a in axes.iter().rev() {
                        cc[a] = r % self.shape[a];
                        r /= self.shape[a];
                    }
                    self.device(&cc)
                })
                .collect();
            groups.push(group);
        }
        groups
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

    /// `[data, -]`: a layout as people read it.
    /// An axis the mesh does not have (a damaged artifact) shows as its number.
    pub fn layout_string(&self, layout: &[Option<usize>]) -> String {
        let name = |a: usize| self.axes.get(a).cloned().unwrap_or_else(|| format!("axis {a}"));
        let dims: Vec<String> = layout.iter().map(|a| a.map_or("-".to_string(), name)).collect();
        format!("[{}]", dims.join(", "))
    }

    /// The shape of the block each device holds.
    pub fn local_shape(&self, shape: &[usize], layout: &[Option<usize>]) -> Vec<usize> {
        shape.iter().zip(layout).map(|(&n, a)| a.map_or(n, |a| n / self.shape[a])).collect()
    }

    /// The index ranges of the block `device` holds, per tensor dimension.
    pub fn region(&self, shape: &[usize], layout: &[Option<usize>], device: usize) -> Vec<Range<usize>> {
        let c = self.coords(device);
        shape
            .iter()
            .zip(layout)
            .map(|(&n, a)| match *a {
                None => 0..n,
                Some(a) => {
                    let b = n / self.shape[a];
                    c[a] * b..(c[a] + 1) * b
                }
            })
            .collect()
    }

    /// Whether `device` is the one copy of its block that writes it back (the block's
    /// replicas differ only along axes the layout leaves unused; the one at coordinate 0
    /// along all of them writes).
    pub fn writes_back(&self, layout: &[Option<usize>], device: usize) -> bool {
        let c = self.coords(device);
        (0..self.shape.len()).all(|a| layout.contains(&Some(a)) || c[a] == 0)
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
}
