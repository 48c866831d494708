//! The synthetic encoder the checkpoint and model benches share: the testdata transformer
//! block's layer (layer norm, multi-head attention with a mask, GELU FFN, residuals)
//! repeated, its params seeded and written as `.safetensors`, as checkpoints are shipped.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// A directory removed when dropped, unless the environment variable named by its second
/// field is set (to profile a step by hand on the generated files).
pub struct Scratch(pub PathBuf, pub &'static str);
impl Drop for Scratch {
    fn drop(&mut self) {
        if std::env::var_os(self.1).is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The params of layer `l`: name, shape.
pub fn layer_params(l: usize, d: usize, f: usize) -> Vec<(String, Vec<usize>)> {
    let mut v = Vec::new();
    for (n, shape) in [
        ("ln1_g", vec![d]),
        ("ln1_b", vec![d]),
        ("wq", vec![d, d]),
        ("bq", vec![d]),
        ("wk", vec![d, d]),
        ("bk", vec![d]),
        ("wv", vec![d, d]),
        ("bv", vec![d]),
        ("wo", vec![d, d]),
        ("bo", vec![d]),
        ("ln2_g", vec![d]),
        ("ln2_b", vec![d]),
        ("w_ff1", vec![d, f]),
        ("b_ff1", vec![f]),
        ("w_ff2", vec![f, d]),
        ("b_ff2", vec![d]),
    ] {
        v.push((format!("l{l}_{n}"), shape));
    }
    v
}

/// The encoder's text for inputs of `b` sequences of `s` tokens: `layers` copies of the testdata transformer block's layer (layer
/// norm, 16-head attention with a mask, GELU FFN, residuals), params read from `file`.
/// With `half`, the matmul weights are declared bf16 and cast to f32 where they are used.
pub fn encoder(
    layers: usize,
    d: usize,
    heads: usize,
    f: usize,
    (b, s): (usize, usize),
    file: &str,
    half: bool,
) -> String {
    let (h, hd) = (heads, d / heads);
    let mut t = format!(
        "graph encoder_{layers}x{d} {{\n  input x: f32[{b},{s},{d}]\n  input mask: f32[{b},1,1,{s}]\n  param scale: f32[] = value {}\n",
        1.0 / (hd as f64).sqrt()
    );
    for l in 0..layers {
        for (n, shape) in layer_params(l, d, f) {
            let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
            let dtype = if half && is_matmul_weight(&n) { "bf16" } else { "f32" };
            t += &format!("  param {n}: {dtype}[{}] = file(\"{file}\", key = \"{n}\")\n", dims.join(","));
        }
    }
    let mut x = "x".to_string();
    for l in 0..layers {
        let name = |n: &str| format!("l{l}_{n}");
        let p = |n: &str| if half && is_matmul_weight(n) { format!("l{l}_{n}_f") } else { name(n) };
        if half {
            for w in MATMUL_WEIGHTS {
                t += &format!("  {} = cast({}) {{to = \"f32\"}}\n", p(w), name(w));
            }
        }
        t += &format!(
            "  {h_} = layer_norm({x}, {g1}, {b1}) {{axis = -1, eps = 1e-12}}
  {q} = matmul({h_}, {wq})
  {qb} = add({q}, {bq})
  {qr} = reshape({qb}) {{shape = [{b}, {s}, {h}, {hd}]}}
  {qh} = transpose({qr}) {{perm = [0, 2, 1, 3]}}
  {k} = matmul({h_}, {wk})
  {kb} = add({k}, {bk})
  {kr} = reshape({kb}) {{shape = [{b}, {s}, {h}, {hd}]}}
  {kt} = transpose({kr}) {{perm = [0, 2, 3, 1]}}
  {v} = matmul({h_}, {wv})
  {vb} = add({v}, {bv})
  {vr} = reshape({vb}) {{shape = [{b}, {s}, {h}, {hd}]}}
  {vh} = transpose({vr}) {{perm = [0, 2, 1, 3]}}
  {sc} = matmul({qh}, {kt})
  {ss} = mul({sc}, scale)
  {sm} = add({ss}, mask)
  {pr} = softmax({sm}) {{axis = -1}}
  {cx} = matmul({pr}, {vh})
  {ct} = transpose({cx}) {{perm = [0, 2, 1, 3]}}
  {cr} = reshape({ct}) {{shape = [{b}, {s}, {d}]}}
  {o} = matmul({cr}, {wo})
  {ob} = add({o}, {bo})
  {r1} = add({h_}, {ob})
  {h2} = layer_norm({r1}, {g2}, {b2}) {{axis = -1, eps = 1e-12}}
  {f1} = matmul({h2}, {w1})
  {f1b} = add({f1}, {bf1})
  {f1a} = gelu({f1b})
  {f2} = matmul({f1a}, {w2})
  {f2b} = add({f2}, {bf2})
  {y} = add({h2}, {f2b})
",
            h_ = p("h"),
            g1 = p("ln1_g"),
            b1 = p("ln1_b"),
            q = p("q"),
            wq = p("wq"),
            qb = p("q_b"),
            bq = p("bq"),
            qr = p("q_r"),
            qh = p("q_h"),
            k = p("k"),
            wk = p("wk"),
            kb = p("k_b"),
            bk = p("bk"),
            kr = p("k_r"),
            kt = p("k_t"),
            v = p("v"),
            wv = p("wv"),
            vb = p("v_b"),
            bv = p("bv"),
            vr = p("v_r"),
            vh = p("v_h"),
            sc = p("scores"),
            ss = p("scaled"),
            sm = p("masked"),
            pr = p("probs"),
            cx = p("ctx"),
            ct = p("ctx_t"),
            cr = p("ctx_r"),
            o = p("o"),
            wo = p("wo"),
            ob = p("o_b"),
            bo = p("bo"),
            r1 = p("res1"),
            h2 = p("h2"),
            g2 = p("ln2_g"),
            b2 = p("ln2_b"),
            f1 = p("f1"),
            w1 = p("w_ff1"),
            f1b = p("f1_b"),
            bf1 = p("b_ff1"),
            f1a = p("f1_a"),
            f2 = p("f2"),
            w2 = p("w_ff2"),
            f2b = p("f2_b"),
            bf2 = p("b_ff2"),
            y = p("y"),
        );
        x = p("y");
    }
    t + &format!("  output {x}\n}}\n")
}

/// The params of a layer that a matmul reads as its weight (the ones a bf16 checkpoint
/// holds in bf16).
pub const MATMUL_WEIGHTS: [&str; 6] = ["wq", "wk", "wv", "wo", "w_ff1", "w_ff2"];

pub fn is_matmul_weight(name: &str) -> bool {
    MATMUL_WEIGHTS.iter().any(|w| name.ends_with(w))
}

/// Seeded values in [-0.05, 0.05) (xorshift: fast enough to write a gigabyte in a second),
/// as little-endian f32 bytes; layer norm gains near 1.
pub fn values(name: &str, n: usize, seed: &mut u64) -> Vec<u8> {
    let gain = name.ends_with("_g");
    let mut out = Vec::with_capacity(n * 4);
    for _ in 0..n {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let x = ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1;
        out.extend_from_slice(&(if gain { 1.0 + x } else { x }).to_le_bytes());
    }
    out
}

/// Writes `tensors` (name, shape) as a `.safetensors` file, data made by `values`.
/// With `half`, the matmul weights are stored as bf16 (the same values, rounded).
pub fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>)], seed: &mut u64, half: bool) {
    let bf16 = |n: &str| half && is_matmul_weight(n);
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for (n, shape) in tensors {
        let len = shape.iter().product::<usize>() * if bf16(n) { 2 } else { 4 };
        let dtype = if bf16(n) { "BF16" } else { "F32" };
        header.insert(n.clone(), serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [off, off + len]}));
        off += len;
    }
    let mut h = serde_json::to_vec(&header).unwrap();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&h).unwrap();
    for (n, shape) in tensors {
        let v = values(n, shape.iter().product(), seed);
        if bf16(n) {
            let wide = v.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64);
            let t = meshc_ir::Tensor::new(vec![v.len() / 4], meshc_ir::Data::from_f64(meshc_ir::DType::BF16, wide));
            f.write_all(&t.to_le_bytes()).unwrap();
        } else {
            f.write_all(&v).unwrap();
        }
    }
    f.flush().unwrap();
}
