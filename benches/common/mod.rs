//! Helpers shared by the bench binaries (each includes this file as `mod common`): medians,
//! the process's CPU time, timing a collective on device threads that meet in the fabric
//! exactly as the runner's do, the testdata graphs, and a transformer block of any size.

#![allow(dead_code)] // each bench uses its own subset

pub mod encoder;
pub mod mlp;
pub mod ort;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use meshc_ir::{DType, Data, Graph, Tensor, TensorType};
use meshc_runtime::comm::fabric::{Delivery, Fabric};
use meshc_runtime::exec::runner::AlignedBuf;
use meshc_runtime::format::mesh::Mesh;
use meshc_runtime::format::program::{
    Buffer, Collective, CollectiveOp, Exec, IoSpec, Meta, Program, Reduce, Step, Storage, ALIGN,
};

/// The kernels' ISA: `MESHC_ISA` when set (as `meshc run` reads it, so that the meshc
/// processes a bench starts agree), else the best the CPU has; printed, so every figure
/// says which path it measured.
pub fn isa_from_env() {
    use meshc_runtime::api::{force_isa, Isa};
    let isa = match std::env::var("MESHC_ISA") {
        Ok(name) => {
            let isa = Isa::parse(&name).unwrap_or_else(|e| panic!("MESHC_ISA: {e}"));
            force_isa(isa).unwrap_or_else(|e| panic!("MESHC_ISA={name}: {e}"));
            format!("{} (MESHC_ISA)", isa.name())
        }
        Err(_) => format!("{} (the best this CPU has; MESHC_ISA=avx2|portable forces another)", Isa::detected().name()),
    };
    println!("runtime kernels: {isa}");
}

pub fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// CPU time of the whole process so far: the sum over its threads of the nanoseconds each
/// spent on a CPU (`/proc/self/task/*/schedstat`, first field). Device threads persist
/// across runs, so differences of this sum measure a run; 0 where /proc is missing.
pub fn cpu_seconds() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0.0 };
    let ns: u64 = tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
}

/// Each of `devices` runs the f32 collective `c` over `f` `warmup + iters` times back to
/// back, element i of its operand being `i % 1000 + device`; `check(device, x)` sees the last
/// element of every result. Returns the first device's wall time of each of the last
/// `iters` calls.
pub fn time_collective(
    f: &Fabric,
    c: &Collective,
    devices: &[usize],
    share: bool,
    (warmup, iters): (usize, usize),
    check: impl Fn(usize, f32) + Sync,
) -> Vec<f64> {
    let numel: usize = c.shape.iter().product();
    let check = &check;
    std::thread::scope(|s| {
        let threads: Vec<_> = devices
            .iter()
            .map(|&d| {
                s.spawn(move || {
                    let mut operand = AlignedBuf::zeroed(numel * 4).unwrap();
                    for (i, x) in operand.as_mut_slice().chunks_exact_mut(4).enumerate() {
                        x.copy_from_slice(&((i % 1000 + d) as f32).to_le_bytes());
                    }
                    let mut result = AlignedBuf::zeroed(numel * 4).unwrap();
                    let mut times = Vec::new();
                    for i in 0..warmup + iters {
                        let t = Instant::now();
                        // SAFETY: both buffers live, apart, through the call.
                        let delivery = unsafe {
                            f.collective_raw(
                                d,
                                c,
                                operand.as_slice().as_ptr() as *const f32,
                                result.as_mut_slice().as_mut_ptr() as *mut f32,
                                share,
                                None,
                            )
                        }
                        .unwrap();
                        if i >= warmup {
                            times.push(t.elapsed().as_secs_f64());
                        }
                        let last = match delivery {
                            // SAFETY: valid until the next call.
                            Delivery::Shared(p) => unsafe { *p.add(numel - 1) },
                            Delivery::Written => {
                                f32::from_le_bytes(result.as_slice()[numel * 4 - 4..].try_into().unwrap())
                            }
                        };
                        check(d, last);
                    }
                    times
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).next().unwrap_or_default()
    })
}

/// Every `testdata/<name>/graph.json`, sorted.
pub fn testdata_graphs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir("testdata")
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path().join("graph.json")))
        .filter(|p| p.exists())
        .collect();
    v.sort();
    v
}

/// The testdata transformer block's text at another size: the same ops and dim names, params
/// drawn from seeded normals.
pub fn transformer(b: usize, s: usize, d: usize, heads: usize, f: usize, vocab: usize) -> String {
    let hd = d / heads;
    let std = |n: usize| 1.0 / (n as f64).sqrt();
    format!(
        "graph transformer_{b}x{s}x{d} {{
  input ids: i32[{b},{s}] dims(batch, seq)
  input mask: f32[{b},1,1,{s}] dims(batch, _, _, seq)
  param emb: f32[{vocab},{d}] dims(vocab, embed) = init normal{{seed = 1, std = 0.5}}
  param pos: f32[{s},{d}] dims(seq, embed) = init normal{{seed = 2, std = 0.5}}
  param ln1_g: f32[{d}] dims(embed) = init ones
  param ln1_b: f32[{d}] dims(embed) = init zeros
  param wq: f32[{d},{d}] dims(embed, qkv) = init normal{{seed = 3, std = {sd}}}
  param bq: f32[{d}] dims(qkv) = init zeros
  param wk: f32[{d},{d}] dims(embed, qkv) = init normal{{seed = 4, std = {sd}}}
  param bk: f32[{d}] dims(qkv) = init zeros
  param wv: f32[{d},{d}] dims(embed, qkv) = init normal{{seed = 5, std = {sd}}}
  param bv: f32[{d}] dims(qkv) = init zeros
  param scale: f32[] = value {scale}
  param wo: f32[{d},{d}] dims(qkv, embed) = init normal{{seed = 6, std = {sd}}}
  param bo: f32[{d}] dims(embed) = init zeros
  param ln2_g: f32[{d}] dims(embed) = init ones
  param ln2_b: f32[{d}] dims(embed) = init zeros
  param w_ff1: f32[{d},{f}] dims(embed, hidden) = init normal{{seed = 7, std = {sd}}}
  param b_ff1: f32[{f}] dims(hidden) = init zeros
  param w_ff2: f32[{f},{d}] dims(hidden, embed) = init normal{{seed = 8, std = {sf}}}
  param b_ff2: f32[{d}] dims(embed) = init zeros
  tok = gather(emb, ids) {{axis = 0}}
  x0 = add(tok, pos)
  h = layer_norm(x0, ln1_g, ln1_b) {{axis = -1, eps = 1e-12}}
  q = matmul(h, wq)
  q_b = add(q, bq)
  q_r: ? dims(batch, seq, heads, head_dim) = reshape(q_b) {{shape = [{b}, {s}, {heads}, {hd}]}}
  q_h = transpose(q_r) {{perm = [0, 2, 1, 3]}}
  k = matmul(h, wk)
  k_b = add(k, bk)
  k_r: ? dims(batch, seq, heads, head_dim) = reshape(k_b) {{shape = [{b}, {s}, {heads}, {hd}]}}
  k_h = transpose(k_r) {{perm = [0, 2, 1, 3]}}
  v = matmul(h, wv)
  v_b = add(v, bv)
  v_r: ? dims(batch, seq, heads, head_dim) = reshape(v_b) {{shape = [{b}, {s}, {heads}, {hd}]}}
  v_h = transpose(v_r) {{perm = [0, 2, 1, 3]}}
  k_t = transpose(k_h) {{perm = [0, 1, 3, 2]}}
  scores = matmul(q_h, k_t)
  scaled = mul(scores, scale)
  masked = add(scaled, mask)
  probs = softmax(masked) {{axis = -1}}
  ctx = matmul(probs, v_h)
  ctx_t = transpose(ctx) {{perm = [0, 2, 1, 3]}}
  ctx_r: ? dims(batch, seq, qkv) = reshape(ctx_t) {{shape = [{b}, {s}, -1]}}
  o = matmul(ctx_r, wo)
  o_b = add(o, bo)
  res1 = add(h, o_b)
  h2 = layer_norm(res1, ln2_g, ln2_b)
  f1: ? dims(batch, seq, hidden) = matmul(h2, w_ff1)
  f1_b = add(f1, b_ff1)
  f1_a = gelu(f1_b)
  f2 = matmul(f1_a, w_ff2)
  f2_b = add(f2, b_ff2)
  y: ? dims(batch, seq, embed) = add(h2, f2_b)
  output y
}}",
        sd = std(d),
        sf = std(f),
        scale = 1.0 / (hd as f64).sqrt(),
    )
}

/// Inputs for `transformer`: token ids spread over the vocabulary, a mask that hides one
/// position in seven.
pub fn transformer_inputs(g: &Graph) -> HashMap<String, Tensor> {
    let ty = |n: &str| g.inputs.iter().find(|i| i.name == n).unwrap().ty.clone();
    let (ids, mask) = (ty("ids"), ty("mask"));
    let vocab = g.params.iter().find(|p| p.name == "emb").unwrap().ty.shape[0];
    let ids_v: Vec<i32> = (0..ids.numel()).map(|i| ((i * 7919) % vocab) as i32).collect();
    let mask_v: Vec<f32> = (0..mask.numel()).map(|i| if i % 7 == 6 { -1e9 } else { 0.0 }).collect();
    HashMap::from([
        ("ids".to_string(), Tensor::new(ids.shape, Data::I32(ids_v))),
        ("mask".to_string(), Tensor::new(mask.shape, Data::F32(mask_v))),
    ])
}

/// A sum all_reduce of `numel` f32 over each of `groups`.
pub fn all_reduce(groups: Vec<Vec<usize>>, numel: usize) -> Collective {
    Collective {
        op: CollectiveOp::AllReduce { reduce: Reduce::Sum },
        id: 0,
        groups,
        dtype: "f32".into(),
        shape: vec![numel],
    }
}

/// A one-step program per device: the all_reduce of its input into its output.
pub fn runner_program(mesh: &Mesh, numel: usize) -> (Meta, Vec<Program>) {
    let ty = TensorType::new(DType::F32, vec![numel]);
    let bytes = numel * 4;
    let at = (bytes).div_ceil(ALIGN) * ALIGN;
    let meta = Meta {
        graph: "all_reduce".into(),
        target: "x86-64".into(),
        features: vec![],
        mesh: mesh.clone(),
        flops: 0,
        inputs: vec![IoSpec::with_layout("x", &ty, vec![None])],
        outputs: vec![IoSpec::with_layout("y", &ty, vec![None])],
        degraded: Default::default(),
        model_axes: Vec::new(),
        hosts: Vec::new(),
        symbolic: None,
    };
    let c = all_reduce(vec![(0..mesh.devices()).collect()], numel);
    let programs = (0..mesh.devices())
        .map(|device| Program {
            device,
            arena_bytes: 2 * at,
            buffers: vec![
                Buffer { name: "x".into(), bytes, storage: Storage::Arena { offset: 0 }, mask: None },
                Buffer { name: "y".into(), bytes, storage: Storage::Arena { offset: at }, mask: None },
            ],
            kernels: vec![],
            steps: vec![Step {
                node: "y".into(),
                exec: Exec::Collective(c.clone()),
                buffers: vec![1, 0],
                why: None,
                scaling: None,
            }],
            inputs: vec![0],
            outputs: vec![1],
            streams: Default::default(),
        })
        .collect();
    (meta, programs)
}
