//! Where each device's block of each input and output lies in the whole tensor, worked out
//! once when a program is loaded: a run cuts the inputs into blocks and assembles the
//! outputs from them on every call, and must not allocate to find out where they are.

use crate::format::mesh::Mesh;
use crate::format::program::{IoSpec, Meta};

/// A device's block of a tensor: where it starts in the whole tensor and its shape.
pub(super) struct Block {
    pub(super) at: Vec<usize>,
    pub(super) shape: Vec<usize>,
}

/// The blocks of one input or output.
pub(super) struct Blocks {
    /// Whether every device that holds the tensor holds all of it.
    pub(super) whole: bool,
    /// The element's bytes.
    pub(super) elem: usize,
    /// The bytes of a device's block.
    pub(super) block_bytes: usize,
    /// Zeros, one per dim: where a block starts in a buffer of its own.
    pub(super) origin: Vec<usize>,
    /// Per device: its block, or `None` when it holds none (outside the tensor's stage).
    pub(super) of: Vec<Option<Block>>,
    /// Per device: the number of its region among the tensor's distinct regions (replicas
    /// of a block share it).
    pub(super) region: Vec<Option<usize>>,
    /// The devices whose copy of their block writes it back, in device order: one per
    /// distinct region.
    pub(super) writers: Vec<usize>,
}

impl Blocks {
    /// The blocks of `spec` on `mesh`; the spec's layout fits the mesh (`validate`).
    fn new(spec: &IoSpec, mesh: &Mesh) -> Blocks {
        let mut regions = Vec::new();
        let (mut of, mut region, mut writers) = (Vec::new(), Vec::new(), Vec::new());
        for d in 0..mesh.devices() {
            let Some((r, writes)) = spec.block(mesh, d) else {
                of.push(None);
                region.push(None);
                continue;
            };
            let n = regions.iter().position(|x| *x == r).unwrap_or_else(|| {
                regions.push(r.clone());
                regions.len() - 1
            });
            region.push(Some(n));
            if writes {
                writers.push(d);
            }
            of.push(Some(Block {
                at: r.iter().map(|r| r.start).collect(),
                shape: r.iter().map(|r| r.len()).collect(),
            }));
        }
        let local = spec.mesh(mesh).local_shape(&spec.shape, &spec.layout);
        let elem = spec.elem().map_or(1, |t| t.size_bytes());
        Blocks {
            whole: local == spec.shape,
            elem,
            block_bytes: local.iter().product::<usize>() * elem,
            origin: vec![0; spec.shape.len()],
            of,
            region,
            writers,
        }
    }

    /// The blocks of every input and every output of `meta`.
    pub(super) fn of_io(meta: &Meta) -> (Vec<Blocks>, Vec<Blocks>) {
        let all = |specs: &[IoSpec]| specs.iter().map(|s| Blocks::new(s, &meta.mesh)).collect();
        (all(&meta.inputs), all(&meta.outputs))
    }

    /// The `healthy` devices holding the same region as `d`, in device order.
    pub(super) fn replicas<'a>(
        &'a self,
        d: usize,
        healthy: impl Fn(usize) -> bool + 'a,
    ) -> impl Iterator<Item = usize> + 'a {
        (0..self.region.len()).filter(move |&h| healthy(h) && self.region[h] == self.region[d])
    }

    /// The device whose copy of `d`'s block a run reads when not every device is `healthy`:
    /// `d` itself if it is, else the first healthy device holding the same region.
    pub(super) fn holder(&self, d: usize, healthy: impl Fn(usize) -> bool) -> Option<usize> {
        match healthy(d) {
            true => Some(d),
            false => self.replicas(d, healthy).next(),
        }
    }
}
