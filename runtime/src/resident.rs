//! State kept on the devices between runs: a training step's state tensors (every input S
//! with an output `next.S`: params and optimizer state) live in per-device buffers that
//! the runs read and write in place. `Loaded::upload` cuts each device's block out of the
//! host tensors once; every run then points the device's input buffer of S at the block
//! (no copy, no re-slicing), lets the step write `next.S` into a second buffer, and swaps
//! the two; only `Loaded::download` (a checkpoint) gathers the blocks into whole tensors.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};
use meshc_ir::Tensor;

use crate::memory::AlignedBuf;
use crate::runner::Loaded;

/// One device's block of one state tensor: the step reads `bufs[cur]` and writes the other.
pub(crate) struct Slot {
    pub(crate) bufs: [AlignedBuf; 2],
    pub(crate) cur: usize,
}

impl Slot {
    /// The buffer the next run reads, and the one it writes.
    pub(crate) fn ptrs(&mut self) -> (*mut u8, *mut u8) {
        let [a, b] = &mut self.bufs;
        let (a, b) = (a.as_mut_slice().as_mut_ptr(), b.as_mut_slice().as_mut_ptr());
        if self.cur == 0 {
            (a, b)
        } else {
            (b, a)
        }
    }

    /// After a run that left the new block at `out`: it becomes the current one. The step
    /// normally wrote it into the other buffer (a swap); where it ended elsewhere (a
    /// collective's shared result, or S passed through unchanged) it is copied there.
    pub(crate) fn settle(&mut self, out: *const u8) {
        let (cur, next) = self.ptrs();
        if std::ptr::eq(out, cur) {
            return;
        }
        if !std::ptr::eq(out, next) {
            let len = self.bufs[0].as_slice().len();
            // SAFETY: `out` is the run's output buffer of this block, `len` bytes, apart
            // from both of ours; the run is over, so nothing writes it.
            let src = unsafe { std::slice::from_raw_parts(out, len) };
            self.bufs[1 - self.cur].as_mut_slice().copy_from_slice(src);
        }
        self.cur = 1 - self.cur;
    }

    pub(crate) fn current(&self) -> &[u8] {
        self.bufs[self.cur].as_slice()
    }
}

/// The state of a training run resident on the devices of a `Loaded` (`Loaded::upload`).
pub struct Resident {
    /// Per state tensor: the index of its input S and of its output `next.S` in the metadata.
    pub(crate) pairs: Vec<(usize, usize)>,
    /// Per device, per state tensor.
    pub(crate) slots: Vec<Vec<Slot>>,
}

impl Resident {
    /// Whether input `i` of the program is state held here.
    pub(crate) fn holds_input(&self, i: usize) -> bool {
        self.pairs.iter().any(|&(s, _)| s == i)
    }

    /// Whether output `o` of the program is state held here.
    pub(crate) fn holds_output(&self, o: usize) -> bool {
        self.pairs.iter().any(|&(_, n)| n == o)
    }
}

impl Loaded {
    /// Puts `state` (the inputs named `names`, each with an output `next_of(S)`) on the
    /// devices: each device's block of each tensor is cut once, here.
    pub fn upload(
        &self,
        state: &BTreeMap<String, Tensor>,
        names: &[String],
        next_of: impl Fn(&str) -> String,
    ) -> Result<Resident> {
        if self.host() != 0 || !self.meta.hosts.is_empty() {
            bail!("training runs over several hosts are not supported");
        }
        let mesh = &self.meta.mesh;
        let mut pairs = Vec::new();
        for n in names {
            let i = self.meta.inputs.iter().position(|s| &s.name == n).ok_or_else(|| anyhow!("no input '{n}'"))?;
            let next = next_of(n);
            let o =
                self.meta.outputs.iter().position(|s| s.name == next).ok_or_else(|| anyhow!("no output '{next}'"))?;
            let (si, so) = (&self.meta.inputs[i], &self.meta.outputs[o]);
            // The step must leave every device the block of next.S that it reads of S.
            let same = (0..mesh.devices()).all(|d| si.block(mesh, d).map(|b| b.0) == so.block(mesh, d).map(|b| b.0));
            if si.dtype != so.dtype || si.shape != so.shape || !same {
                bail!("state '{n}' leaves the step laid out unlike it enters it (a meshc bug)");
            }
            pairs.push((i, o));
        }
        let tensors = names
            .iter()
            .map(|n| state.get(n).map(|t| (t, t.to_le_bytes())).ok_or_else(|| anyhow!("the state has no tensor '{n}'")))
            .collect::<Result<Vec<_>>>()?;
        let mut slots = Vec::new();
        for (d, p) in self.programs.iter().enumerate() {
            let mut mine = Vec::new();
            for (&(i, _), (t, bytes)) in pairs.iter().zip(&tensors) {
                let len = p.buffers[p.inputs[i]].bytes;
                let mut cur = AlignedBuf::zeroed(len)?;
                self.cut_block(i, d, t, cur.as_mut_slice(), Some(bytes));
                mine.push(Slot { bufs: [cur, AlignedBuf::zeroed(len)?], cur: 0 });
            }
            slots.push(mine);
        }
        Ok(Resident { pairs, slots })
    }

    /// The state tensors as whole tensors (by input name), gathered from the devices'
    /// blocks: what a checkpoint writes.
    pub fn download(&self, resident: &Resident) -> Result<BTreeMap<String, Tensor>> {
        let mut out = BTreeMap::new();
        for (k, &(i, o)) in resident.pairs.iter().enumerate() {
            let spec = &self.meta.outputs[o];
            let t = self.assemble(spec, &|d| resident.slots[d][k].current())?;
            out.insert(self.meta.inputs[i].name.clone(), t);
        }
        Ok(out)
    }
}
