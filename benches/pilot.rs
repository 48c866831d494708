//! `cargo bench --bench pilot`: the pilot pass on the trained classifier of
//! testdata/pilot_mlp (tools/train_pilot_mlp.py). For keep fractions 0.5, 0.3 and 0.2:
//! FLOPs skipped, the run time of the pruned artifact against the unpruned one (best of
//! alternating runs in the same process, so machine noise hits both alike), and held-out
//! accuracy against the unpruned model's. Both matmul paths are measured: the default
//! (library GEMM) and the generated kernel.
//!
//! One run on the development machine (2 cores, shared with other builds; speed-ups
//! against the best unpruned time of the table):
//!
//! ```text
//! keep  FLOPs skipped  library: pruned/unpruned ms, speed-up  cranelift: speed-up  accuracy
//! 0.5   49.8%          0.667 / 0.869  1.24x                   1.80x                88.67% (+0.00)
//! 0.3   68.5%          0.485 / 0.862  1.71x                   2.79x                88.62% (-0.05)
//! 0.2   79.4%          0.390 / 0.828  2.12x                   4.10x                88.48% (-0.20)
//! ```
//!
//! The library path gains less than the FLOPs at keep 0.5: what is not a matmul (the bias
//! and ReLU over the whole hidden layer, zeroing the pruned columns, a thread fork per
//! masked matmul) stays, and short column runs run the GEMM below its best efficiency.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use meshc::compile::{Compiled, Gemm, Options};
use meshc::driver;
use meshc::passes::pilot::{Config, Select, Simplify, DEFAULT_BLOCK};
use meshc::pipeline::Dumps;
use meshc_ir::{Data, Tensor};
use meshc_runtime::exec::runner::Loaded;

const DIR: &str = "testdata/pilot_mlp";

struct Model {
    loaded: Loaded,
    flops: u64,
    skipped: u64,
}

fn load(c: Compiled) -> Model {
    let flops = c.meta.flops;
    let skipped =
        c.programs.iter().flat_map(|p| &p.buffers).filter_map(|b| b.mask.as_ref()).map(|m| m.flops_skipped).sum();
    Model { loaded: c.load().unwrap(), flops, skipped }
}

impl Model {
    fn run(&self, x: &Tensor) -> Tensor {
        let inputs = HashMap::from([("x".to_string(), x.clone())]);
        self.loaded.run(&inputs).unwrap().remove("y").unwrap()
    }
}

fn rows(t: &Tensor, start: usize, n: usize) -> Tensor {
    let cols = t.shape[1];
    let v = &t.as_f32().unwrap()[start * cols..(start + n) * cols];
    Tensor::f32(vec![n, cols], v.to_vec())
}

fn accuracy(m: &Model, batches: &[Tensor], labels: &[i32]) -> f64 {
    let mut right = 0;
    for (b, x) in batches.iter().enumerate() {
        let y = m.run(x);
        let classes = y.shape[1];
        for (r, row) in y.as_f32().unwrap().chunks(classes).enumerate() {
            let best = (0..classes).max_by(|&i, &j| row[i].total_cmp(&row[j])).unwrap();
            right += usize::from(best as i32 == labels[b * x.shape[0] + r]);
        }
    }
    100.0 * right as f64 / labels.len() as f64
}

/// The best of `n` alternating runs of `a` and `b` on `x` (on a machine shared with other
/// jobs the minimum is the most repeatable figure; alternating exposes both to the same
/// load).
fn race(a: &Model, b: &Model, x: &Tensor, n: usize) -> (f64, f64) {
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    a.run(x);
    b.run(x);
    for _ in 0..n {
        for (m, t) in [(a, &mut ta), (b, &mut tb)] {
            let s = Instant::now();
            m.run(x);
            t.push(s.elapsed().as_secs_f64());
        }
    }
    let best = |t: &[f64]| t.iter().copied().fold(f64::INFINITY, f64::min);
    (best(&ta), best(&tb))
}

fn main() {
    let path = Path::new(DIR).join("classifier.json");
    let (g, info) = meshc_ir::load::load(&path).unwrap();
    let params = meshc_ir::params::load_all(&g, Path::new(DIR)).unwrap();
    let pilot_x = Tensor::read_npy(&Path::new(DIR).join("pilot/x.npy")).unwrap();
    let held = Tensor::read_npy(&Path::new(DIR).join("heldout/x.npy")).unwrap();
    let labels = match Tensor::read_npy(&Path::new(DIR).join("heldout/labels.npy")).unwrap().data {
        Data::I32(v) => v,
        d => panic!("labels are {:?}", d.dtype()),
    };
    let batch = info.types["x"].shape[0];
    let batches: Vec<Tensor> = (0..held.shape[0] / batch).map(|b| rows(&held, b * batch, batch)).collect();
    let build = |gemm: Gemm, keep: Option<f64>| {
        let cfg = keep.map(|f| Config {
            runs: vec![HashMap::from([("x".to_string(), pilot_x.clone())])],
            simplify: Simplify::Bits(7),
            block: DEFAULT_BLOCK,
            select: Select::Keep(f),
        });
        let opts = Options { gemm, ..Options::default() };
        load(driver::Job::new(&g, &info, &params, &opts).pilot(cfg.as_ref()).build(&Dumps::default()).unwrap())
    };
    println!(
        "pilot pass on {DIR}: batch {batch}, {} held-out rows, blocks of {DEFAULT_BLOCK}, simplify bits:7",
        labels.len()
    );
    println!("(best of 200 alternating runs; the machine is shared, ratios are from one run)");
    for (name, gemm) in [("library", Gemm::Library), ("cranelift", Gemm::Cranelift)] {
        let base = build(gemm, None);
        let base_acc = accuracy(&base, &batches, &labels);
        println!("\n{name} matmul: unpruned held-out accuracy {base_acc:.2}%, {} FLOPs per run", base.flops);
        println!("  keep   FLOPs skipped    pruned ms  unpruned ms  speed-up (vs best unpruned)  accuracy  (change)");
        let rows: Vec<(f64, Model, f64, f64, f64)> = [0.5, 0.3, 0.2]
            .into_iter()
            .map(|keep| {
                let m = build(gemm, Some(keep));
                let acc = accuracy(&m, &batches, &labels);
                let (tp, tu) = race(&m, &base, &batches[0], 200);
                (keep, m, acc, tp, tu)
            })
            .collect();
        // The unpruned run's best over the whole table: a row whose unpruned runs all met
        // a busy machine would otherwise overstate its speed-up.
        let best = rows.iter().map(|r| r.4).fold(f64::INFINITY, f64::min);
        for (keep, m, acc, tp, tu) in rows {
            println!(
                "  {keep:<4}  {:>12} {:>4.1}%  {:>9.3}  {:>11.3}  {:>7.2}x ({:>5.2}x)            {acc:>7.2}%  ({:+.2})",
                m.skipped,
                100.0 * m.skipped as f64 / m.flops as f64,
                tp * 1e3,
                tu * 1e3,
                tu / tp,
                best / tp,
                acc - base_acc
            );
        }
    }
}
