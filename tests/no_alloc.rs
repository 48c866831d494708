//! A steady-state `Session::run_into` allocates nothing on the heap for the graphs people
//! run, on one device and on a mesh (docs/embedding.md, "Buffers"): library GEMMs with
//! epilogues, fused attention, convolutions, inputs and outputs split over devices, every
//! kind of collective, send/recv between pipeline stages, several streams. Each case is
//! compiled by the real `meshc`, then called through the embedding API while a global
//! allocator (runtime/tests/common/counting.rs) counts every allocation of the process on
//! every thread. Every call's outputs are compared with those of a `Session::run` (into
//! buffers filled with NaN first), so a call that did nothing cannot pass. The binary runs
//! without libtest's harness, whose threads would allocate in the counted window.

use meshc_ir::DType;
use meshc_runtime::api::{Model, Session, TensorView, TensorViewMut};

#[path = "all/common/mod.rs"]
mod common;

#[path = "../runtime/tests/common/counting.rs"]
mod counting;
use counting::allocations;

/// (name, arguments of `meshc compile` after the graph). Not here: products the `gemm` crate
/// serves (f16/bf16 or pruned weights, operands stored transposed, two run-time operands
/// past the small-M kernel's rows), which allocate its packing buffers (docs/embedding.md).
const CASES: &[(&str, &[&str])] = &[
    ("mlp", &["testdata/mlp/graph.json"]),
    ("transformer", &["testdata/transformer/graph.json"]),
    ("onnx encoder", &["testdata/onnx/encoder/model.onnx", "--dim", "batch=2", "--dim", "seq=5"]),
    ("cnn", &["testdata/cnn/graph.json"]),
    ("mlp dp-2", &["testdata/mlp/graph.json", "--layout", "testdata/mlp/layouts/dp-2.json"]),
    ("mlp pipeline-2", &["testdata/mlp/graph.json", "--layout", "testdata/mlp/layouts/pipeline-2.json"]),
    ("mlp cube-2x2x2", &["testdata/mlp/graph.json", "--layout", "testdata/mlp/layouts/cube-2x2x2.json"]),
    ("transformer mp-4", &["testdata/transformer/graph.json", "--layout", "testdata/transformer/layouts/mp-4.json"]),
    (
        "transformer torus-2x4",
        &["testdata/transformer/graph.json", "--layout", "testdata/transformer/layouts/torus-2x4.json"],
    ),
    (
        "transformer stages-4x2",
        &["testdata/transformer/graph.json", "--layout", "testdata/transformer/layouts/stages-4x2.json"],
    ),
    ("cnn dp-mp-2x2", &["testdata/cnn/graph.json", "--layout", "testdata/cnn/layouts/dp-mp-2x2.json"]),
];

/// Calls between the warm-up and the end of the count.
const CALLS: u64 = 20;
/// The most calls warming a case up may take.
const WARM_UP: usize = 50;

/// A tensor's bytes with its name, dtype and shape.
struct Buf {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

fn main() {
    // Removed when dropped, on a failed assertion too.
    let dir = common::scratch("no-alloc");
    for (k, (name, args)) in CASES.iter().enumerate() {
        let art = dir.join(format!("{k}.mshc"));
        let c = common::meshc(&[&["compile"], *args, &["-o", art.to_str().unwrap()]].concat());
        assert_eq!(c.status, Some(0), "{name}: {}", c.stderr);
        let model = Model::open(&art).unwrap();
        let session = Session::new(&model).unwrap();
        let inputs: Vec<Buf> = (model.inputs().iter())
            .map(|i| {
                let n: usize = i.shape.iter().product();
                let bytes = match i.dtype {
                    DType::F32 => (0..n).flat_map(|k| ((k % 13) as f32 * 0.1 - 0.6).to_le_bytes()).collect(),
                    // Ids and masks: zeros are in range for any table.
                    d => vec![0u8; n * d.size_bytes()],
                };
                Buf { name: i.name.clone(), dtype: i.dtype, shape: i.shape.clone(), bytes }
            })
            .collect();
        let views: Vec<(&str, TensorView)> = inputs
            .iter()
            .map(|b| (b.name.as_str(), TensorView::from_bytes(b.dtype, &b.shape, &b.bytes).unwrap()))
            .collect();
        let want = session.run(&views).unwrap();
        let mut outputs: Vec<Buf> = (model.outputs().iter())
            .map(|o| {
                let len = o.shape.iter().product::<usize>() * o.dtype.size_bytes();
                Buf { name: o.name.clone(), dtype: o.dtype, shape: o.shape.clone(), bytes: vec![0; len] }
            })
            .collect();
        // The views live across the calls, so that the count sees the runner alone.
        let mut into: Vec<(&str, TensorViewMut)> = (outputs.iter_mut())
            .map(|b| (b.name.as_str(), TensorViewMut::from_bytes(b.dtype, &b.shape, &mut b.bytes).unwrap()))
            .collect();
        let call = |into: &mut [(&str, TensorViewMut)]| session.run_into(&views, into).unwrap();
        // Warm until a call allocates nothing: a pool thread that took no part in a call
        // yet allocates its kernels' scratch (kept between calls) the first time it does,
        // which under load can be a few calls in.
        for _ in 0..WARM_UP {
            let before = allocations();
            call(&mut into);
            if allocations() == before {
                break;
            }
        }
        let before = allocations();
        (0..CALLS).for_each(|_| call(&mut into));
        let allocs = allocations() - before;
        drop(into);
        assert_eq!(allocs, 0, "{name}: {CALLS} calls of run_into after warming up allocated {allocs} times");
        // Every output is written by a call: fill them with NaNs (all bits set), call once
        // more, compare.
        outputs.iter_mut().for_each(|b| b.bytes.fill(0xff));
        let mut into: Vec<(&str, TensorViewMut)> = (outputs.iter_mut())
            .map(|b| (b.name.as_str(), TensorViewMut::from_bytes(b.dtype, &b.shape, &mut b.bytes).unwrap()))
            .collect();
        call(&mut into);
        drop(into);
        for b in &outputs {
            assert_eq!(b.bytes, meshc_runtime::exec::io::le_bytes(&want[&b.name]), "{name}: output {}", b.name);
        }
        println!("{name}: 0 heap allocations a call of run_into ({} devices)", model.mesh().devices());
    }
}
