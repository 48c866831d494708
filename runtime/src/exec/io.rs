//! What crosses between the host and the devices' buffers: the inputs checked and cut into
//! each device's block, the outputs assembled from the blocks of healthy holders (under
//! hosts, the blocks other hosts hold sent to host 0 first), and resident state put on the
//! devices and read back.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;

use anyhow::{anyhow, bail, Result};
use meshc_ir::{DType, Data, Tensor, TensorType};

use crate::comm::fabric;
use crate::comm::memory::AlignedBuf;
use crate::comm::transport::{Hosts, Incoming, Outgoing, Stall};
use crate::exec::mismatch::Mismatch;
use crate::exec::resident::{Resident, Slot};
use crate::exec::runner::Loaded;
use crate::format::program::IoSpec;

impl Loaded {
    /// Checks the inputs against the metadata: each once, with its dtype and shape.
    pub fn check_inputs(&self, inputs: &HashMap<String, Tensor>) -> Result<()> {
        self.check_given(inputs, &vec![true; self.meta.inputs.len()])
    }

    /// `check_inputs` for the inputs `wanted` marks (the others are resident state).
    pub(super) fn check_given(&self, inputs: &HashMap<String, Tensor>, wanted: &[bool]) -> Result<()> {
        let known = |k: &String| self.meta.inputs.iter().zip(wanted).any(|(s, w)| *w && &s.name == k);
        if let Some(extra) = inputs.keys().find(|k| !known(k)) {
            let names = self.meta.inputs.iter().zip(wanted).filter(|(_, w)| **w).map(|(s, _)| s.name.as_str());
            return Err(Mismatch::unknown(extra, names, false).into());
        }
        for (spec, _) in self.meta.inputs.iter().zip(wanted).filter(|(_, w)| **w) {
            self.check_input(spec, inputs.get(&spec.name).map(Tensor::ty))?;
        }
        Ok(())
    }

    /// Checks that input `spec` is given (`given`: its type) with its dtype and shape.
    pub fn check_input(&self, spec: &IoSpec, given: Option<TensorType>) -> Result<()> {
        let want = spec.ty().ok_or_else(|| anyhow!("input '{}' has unknown dtype {}", spec.name, spec.dtype))?;
        let name = spec.name.clone();
        // With symbolic dims, the sizes are checked when the call binds them.
        let fits = |got: &TensorType| match self.meta.symbolic {
            Some(_) => got.dtype == want.dtype && got.rank() == want.rank(),
            None => *got == want,
        };
        match given {
            None => Err(Mismatch::MissingInput { name, want }.into()),
            Some(got) if !fits(&got) => Err(Mismatch::WrongInput { name, got, want }.into()),
            Some(_) => Ok(()),
        }
    }

    /// Under hosts: the device whose copy of `d`'s block of output `o` host 0 reads: `d`
    /// when it is healthy and on host 0, else the first healthy device with the same block
    /// on host 0, else the first healthy one anywhere (its host sends that copy).
    fn source(&self, hosts: &Hosts, o: usize, d: usize, healthy: impl Fn(usize) -> bool) -> Option<usize> {
        let blocks = &self.outputs[o];
        blocks.replicas(d, &healthy).find(|&h| hosts.host_of(h) == 0).or_else(|| blocks.replicas(d, &healthy).next())
    }

    /// Under hosts, the blocks host 0 reads (`source`) of the outputs `wanted` marks that
    /// other hosts hold go to host 0, one copy per block; host 0 gets them back by (output,
    /// device), the others nothing. `left(d, o)`: where device d's block of output o is.
    pub(super) fn gather_outputs(
        &self,
        hosts: &Hosts,
        wanted: &dyn Fn(usize) -> bool,
        left: &dyn Fn(usize, usize) -> Option<*const u8>,
        healthy: impl Fn(usize) -> bool,
    ) -> Result<HashMap<(usize, usize), Vec<u8>>> {
        let me = hosts.me();
        let mut sends = Vec::new();
        let mut blocks = Vec::new();
        for (i, output) in self.outputs.iter().enumerate().filter(|&(i, _)| wanted(i)) {
            let len = output.block_bytes;
            let sources: BTreeSet<usize> =
                output.writers.iter().filter_map(|&d| self.source(hosts, i, d, &healthy)).collect();
            for d in sources {
                let (host, tag) = (hosts.host_of(d), hosts.output_tag(i, d));
                if me != 0 && host == me {
                    let Some(at) = left(d, i) else {
                        bail!("output '{}': device {d} did not run", self.meta.outputs[i].name)
                    };
                    // SAFETY: the buffer holds the device's block of the output; its job is done.
                    let bytes = unsafe { std::slice::from_raw_parts(at, len) };
                    sends.push(Outgoing { to: 0, tag, bytes });
                } else if me == 0 && host != 0 {
                    blocks.push(((i, d), host, tag, vec![0u8; len]));
                }
            }
        }
        let mut recvs: Vec<Incoming> =
            blocks.iter_mut().map(|(_, from, tag, b)| Incoming { from: *from, tag: *tag, bytes: b }).collect();
        let timeout = self.exchange.timeout();
        match hosts.exchange(&sends, &mut recvs, timeout, &|| false) {
            Ok(()) => Ok(blocks.into_iter().map(|(at, _, _, b)| (at, b)).collect()),
            Err(Stall::Timeout(pending)) => {
                bail!("gathering the outputs on host 0: {}", hosts.stalled(pending, &sends, &recvs, timeout))
            }
            Err(Stall::Stopped) => bail!("gathering the outputs on host 0: stopped"),
            Err(Stall::Failed(m)) => bail!("gathering the outputs on host 0: {m}"),
        }
    }

    /// Copies `device`'s block of input `i` (`bytes`: the whole tensor's little-endian
    /// bytes) into `dst`, the device's buffer of it.
    pub(super) fn cut_block(&self, i: usize, device: usize, bytes: &[u8], dst: &mut [u8]) {
        let blocks = &self.inputs[i];
        // A device outside the input's stage holds none of it.
        let Some(block) = &blocks.of[device] else { return };
        self.host_copies.fetch_add(1, Ordering::Relaxed);
        if blocks.whole {
            // At smaller sizes than the upper bounds, a prefix (`sizes::check`).
            return dst[..bytes.len()].copy_from_slice(bytes);
        }
        let (spec, e) = (&self.meta.inputs[i], blocks.elem);
        fabric::for_each_run(&spec.shape, &block.at, &block.shape, &blocks.origin, &block.shape, |s, o, n| {
            dst[o * e..(o + n) * e].copy_from_slice(&bytes[s * e..(s + n) * e])
        });
    }

    /// `cut_block` of a prefix of input `i`: `bytes` hold its first `have` positions along
    /// `axis` (a tensor of its shape but for `have` there), of which the first `len` go to
    /// the front of that axis in device `d`'s block (`dst`); the rest of `dst` is left as
    /// it is.
    pub fn cut_prefix(
        &self,
        i: usize,
        d: usize,
        (axis, have, len): (usize, usize, usize),
        bytes: &[u8],
        dst: &mut [u8],
    ) {
        let blocks = &self.inputs[i];
        let Some(block) = &blocks.of[d] else { return };
        self.host_copies.fetch_add(1, Ordering::Relaxed);
        let mut whole = self.meta.inputs[i].shape.clone();
        whole[axis] = have;
        let mut extent = block.shape.clone();
        extent[axis] = len.saturating_sub(block.at[axis]).min(block.shape[axis]);
        let e = blocks.elem;
        fabric::for_each_run(&whole, &block.at, &block.shape, &blocks.origin, &extent, |s, o, n| {
            dst[o * e..(o + n) * e].copy_from_slice(&bytes[s * e..(s + n) * e])
        });
    }

    /// Zeroes positions `from..to` along `axis` of input `i` where they fall in device `d`'s
    /// block (`dst`), and leaves the rest of it as it is.
    pub fn zero_positions(&self, i: usize, d: usize, axis: usize, (from, to): (usize, usize), dst: &mut [u8]) {
        let blocks = &self.inputs[i];
        let Some(block) = &blocks.of[d] else { return };
        let (at, size) = (block.at[axis], block.shape[axis]);
        let local = |p: usize| p.clamp(at, at + size) - at;
        let (lo, hi) = (local(from), local(to));
        if lo >= hi {
            return;
        }
        let mut start = blocks.origin.clone();
        start[axis] = lo;
        let mut extent = block.shape.clone();
        extent[axis] = hi - lo;
        let e = blocks.elem;
        fabric::for_each_run(&block.shape, &start, &block.shape, &start, &extent, |_, o, n| {
            dst[o * e..(o + n) * e].fill(0)
        });
    }

    /// Output `o` as a whole tensor's little-endian bytes from the devices' blocks
    /// (`block(d)`: device d's), each block read from a healthy device that holds it; under
    /// hosts, from the copy host 0 reads (`source`). An output no device splits is its
    /// holder's block itself; the others are put together in `buf`.
    pub(super) fn assemble<'b>(
        &self,
        o: usize,
        block: &dyn Fn(usize) -> &'b [u8],
        buf: &'b mut Vec<u8>,
    ) -> Result<&'b [u8]> {
        let (spec, blocks) = (&self.meta.outputs[o], &self.outputs[o]);
        let healthy = |d: usize| self.healthy(d);
        // The block from a healthy device that holds it, if any (under hosts, the copy
        // host 0 reads).
        let holder = |d: usize| match &self.hosts {
            Some(hosts) => self.source(hosts, o, d, healthy),
            None => blocks.holder(d, healthy),
        };
        if blocks.whole {
            let first = blocks.writers.first().copied().unwrap_or(0);
            self.host_copies.fetch_add(1, Ordering::Relaxed);
            return Ok(block(holder(first).ok_or_else(|| anyhow!("every device is degraded"))?));
        }
        let dtype = spec.elem().ok_or_else(|| anyhow!("output '{}' has unknown dtype", spec.name))?;
        // Blocks that only degraded devices held (their data-parallel shards were
        // dropped) read as NaN, or zero for other dtypes.
        buf.clear();
        buf.resize(dtype.size_bytes() * spec.shape.iter().product::<usize>(), 0);
        if dtype == DType::F32 {
            buf.chunks_exact_mut(4).for_each(|c| c.copy_from_slice(&f32::NAN.to_le_bytes()));
        }
        let e = blocks.elem;
        for &d in &blocks.writers {
            let Some(h) = holder(d) else { continue };
            let Some(b) = &blocks.of[d] else { continue };
            self.host_copies.fetch_add(1, Ordering::Relaxed);
            let src = block(h);
            fabric::for_each_run(&b.shape, &blocks.origin, &spec.shape, &b.at, &b.shape, |s, o, n| {
                buf[o * e..(o + n) * e].copy_from_slice(&src[s * e..(s + n) * e])
            });
        }
        Ok(buf)
    }
}

/// The little-endian bytes of `t`'s elements, borrowed: on a little-endian host a tensor's
/// elements in memory are those bytes (bool is one byte, 0 or 1).
pub fn le_bytes(t: &Tensor) -> &[u8] {
    const _: () = assert!(cfg!(target_endian = "little"), "the runner reads tensors as little-endian bytes");
    fn bytes<T>(v: &[T]) -> &[u8] {
        // SAFETY: any initialised element type viewed as bytes, over its exact extent.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
    }
    match &t.data {
        Data::F32(v) => bytes(v),
        Data::I32(v) => bytes(v),
        Data::I64(v) => bytes(v),
        Data::Bool(v) => bytes(v),
        Data::F16(v) => bytes(v),
        Data::BF16(v) => bytes(v),
        Data::I8(v) => bytes(v),
        Data::U8(v) => bytes(v),
        Data::I16(v) => bytes(v),
        Data::U16(v) => bytes(v),
        Data::U32(v) => bytes(v),
        Data::U64(v) => bytes(v),
    }
}

/// Resident state (`crate::exec::resident`): onto the devices and back.
impl Loaded {
    /// Puts `state` (the inputs named `names`, each with an output `next_of(S)`) on the
    /// devices: each device's block of each tensor is cut once, here. Under hosts
    /// (`set_transport`) every host is given the whole tensors and keeps only its own
    /// devices' blocks: the others' run there (an empty slot stands for each here).
    pub fn upload(
        &self,
        state: &BTreeMap<String, Tensor>,
        names: &[String],
        next_of: impl Fn(&str) -> String,
    ) -> Result<Resident> {
        let tensors = names
            .iter()
            .map(|n| state.get(n).map(le_bytes).ok_or_else(|| anyhow!("the state has no tensor '{n}'")))
            .collect::<Result<Vec<_>>>()?;
        self.upload_with(names, next_of, |k, i, d, dst| self.cut_block(i, d, tensors[k], dst))
    }

    /// `upload`, where `fill(k, i, d, dst)` writes device `d`'s block of the `k`th state
    /// tensor (input `i`) into `dst`, which holds zeros: a caller that has only part of a
    /// tensor (a prefill's first positions of a cache) writes that, and the zeros are
    /// fresh pages, never touched for the rest.
    pub fn upload_with(
        &self,
        names: &[String],
        next_of: impl Fn(&str) -> String,
        fill: impl Fn(usize, usize, usize, &mut [u8]),
    ) -> Result<Resident> {
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
        let mut slots = Vec::new();
        let here = |d: usize| self.hosts.as_ref().is_none_or(|h| h.is_local(d));
        for (d, p) in self.programs.iter().enumerate() {
            let mut mine = Vec::new();
            for (k, &(i, _)) in pairs.iter().enumerate() {
                // Another host's device never runs here: its slot is read by nobody.
                let len = if here(d) { p.buffers[p.inputs[i]].bytes } else { 0 };
                let mut cur = AlignedBuf::zeroed(len)?;
                if here(d) {
                    fill(k, i, d, cur.as_mut_slice());
                }
                mine.push(Slot { bufs: [cur, AlignedBuf::zeroed(len)?], cur: 0 });
            }
            slots.push(mine);
        }
        Ok(Resident { pairs, slots })
    }

    /// `fill(k, i, d, dst)` on each of this host's devices' current block of each state
    /// tensor of `resident` (as `upload_with` calls it), which holds what the last run
    /// left there rather than zeros: a caller that knows what that is rewrites the state
    /// in buffers whose pages are resident already.
    pub fn rewrite(&self, resident: &mut Resident, fill: impl Fn(usize, usize, usize, &mut [u8])) {
        let here = |d: usize| self.hosts.as_ref().is_none_or(|h| h.is_local(d));
        for (d, slots) in resident.slots.iter_mut().enumerate().filter(|&(d, _)| here(d)) {
            for (k, slot) in slots.iter_mut().enumerate() {
                fill(k, resident.pairs[k].0, d, slot.current_mut());
            }
        }
    }

    /// Whether a run writes some of `resident`'s next.S over S itself: where the buffer
    /// plan gave them the same bytes on a device, the runner points both at S's slot
    /// (`crate::exec::streams`), so a run that fails part-way leaves that S half written.
    pub fn writes_state_in_place(&self, resident: &Resident) -> bool {
        self.programs.iter().any(|p| {
            resident.pairs.iter().any(|&(i, o)| {
                let (ib, ob) = (p.inputs[i], p.outputs[o]);
                ib != ob && p.buffers[ib].storage == p.buffers[ob].storage
            })
        })
    }

    /// The state tensors as whole tensors (by input name), gathered from the devices'
    /// blocks: what a checkpoint writes. Under hosts (`set_transport`) every host must call
    /// it at the same point, as it calls a run: the blocks host 0 reads from other hosts
    /// cross in one exchange, as a run's outputs do. Host 0 returns the whole tensors; the
    /// others return an empty map.
    pub fn download(&self, resident: &Resident) -> Result<BTreeMap<String, Tensor>> {
        // The pair (its index in `resident`) whose next.S is output o.
        let pair = |o: usize| resident.pairs.iter().position(|&(_, n)| n == o);
        let remote = match &self.hosts {
            Some(hosts) => {
                let left = |d: usize, o: usize| {
                    let k = pair(o)?;
                    hosts.is_local(d).then(|| resident.slots[d][k].current().as_ptr())
                };
                self.gather_outputs(hosts, &|o| pair(o).is_some(), &left, |d| self.healthy(d))?
            }
            None => HashMap::new(),
        };
        let mut out = BTreeMap::new();
        if self.host() != 0 {
            return Ok(out);
        }
        for (k, &(i, o)) in resident.pairs.iter().enumerate() {
            let spec = &self.meta.outputs[o];
            let ty = spec.ty().ok_or_else(|| anyhow!("output '{}' has unknown dtype", spec.name))?;
            let mut buf = Vec::new();
            let block = |d: usize| match remote.get(&(o, d)) {
                Some(b) => b.as_slice(),
                None => resident.slots[d][k].current(),
            };
            let bytes = self.assemble(o, &block, &mut buf)?;
            out.insert(self.meta.inputs[i].name.clone(), Tensor::from_le_bytes(&ty, bytes));
        }
        Ok(out)
    }
}
