//! State kept on the devices between runs: a training step's state tensors (every input S
//! with an output `next.S`: params and optimizer state, a decoder's caches) live in
//! per-device buffers that the runs read and write in place. `Loaded::upload` cuts each
//! device's block out of the host tensors once; every run then points the device's input
//! buffer of S at the block (no copy, no re-slicing), lets the step write `next.S` into a
//! second buffer, and swaps the two, except where the buffer plan gave next.S the bytes
//! of S: then the step writes next.S over S and nothing is swapped
//! (`Loaded::writes_state_in_place`). Only `Loaded::download` (a checkpoint) gathers the
//! blocks into whole tensors. Over hosts each process holds the blocks of its own devices
//! only (another host's device has empty slots here, which nothing reads), and `download`
//! gathers the others' on host 0.

use crate::comm::memory::AlignedBuf;

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

    pub(crate) fn current_mut(&mut self) -> &mut [u8] {
        self.bufs[self.cur].as_mut_slice()
    }
}

/// The state of a training run or a decoder resident on the devices of a `Loaded`
/// (`Loaded::upload`).
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
