//! A steady-state `Session::run_into` allocates nothing on the heap (docs/embedding.md,
//! "Buffers"): a global allocator (common/counting.rs) counts every allocation of the
//! process, on every thread (the caller's, device threads, the kernel pool's workers), while
//! a session runs the committed artifact testdata/meshc_run/small.mshc (y = relu(x·w), one
//! device) many times, from one thread and from two sharing the session. Every call's
//! output is checked, so a call that did nothing cannot pass. The binary runs without
//! libtest's harness (`harness = false` in Cargo.toml), whose threads would allocate in the
//! counted window.

use std::sync::Barrier;

use meshc_runtime::api::{Model, Session, TensorView, TensorViewMut};

#[path = "common/counting.rs"]
mod counting;
use counting::allocations;

/// The param of testdata/meshc_run/graph.txt.
const W: [[f32; 4]; 3] = [[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 0.0, 2.0], [-2.0, 1.0, 1.0, 0.0]];

/// relu(x·w), by hand. Inputs are small integers, so every product and sum is exact in f32
/// whatever order the kernel adds in.
fn expected(x: &[f32; 6]) -> [f32; 8] {
    let mut y = [0f32; 8];
    for r in 0..2 {
        for c in 0..4 {
            y[r * 4 + c] = (0..3).map(|k| x[r * 3 + k] * W[k][c]).sum::<f32>().max(0.0);
        }
    }
    y
}

/// `calls` calls of `run_into`, each on inputs of its own, into a buffer cleared to NaN
/// first, its output checked.
fn call(session: &Session, calls: usize, seed: usize) {
    let (mut x, mut y) = ([0f32; 6], [0f32; 8]);
    for k in 0..calls {
        for (i, v) in x.iter_mut().enumerate() {
            *v = ((seed + k * 7 + i * 3) % 11) as f32 - 5.0;
        }
        y.fill(f32::NAN);
        let inputs = [("x", TensorView::new(&x, &[2, 3]).unwrap())];
        let mut out = [("y", TensorViewMut::new(&mut y, &[2, 4]).unwrap())];
        session.run_into(&inputs, &mut out).unwrap();
        assert_eq!(y, expected(&x), "call {k} on x = {x:?}");
    }
}

/// The allocations the whole process makes while `f` runs.
fn counted(f: impl FnOnce()) -> u64 {
    let before = allocations();
    f();
    allocations() - before
}

fn main() {
    let model = Model::open(concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/meshc_run/small.mshc")).unwrap();
    let session = Session::new(&model).unwrap();

    // The count is real: returning owned tensors allocates.
    let x = [1f32; 6];
    let owned = counted(|| drop(session.run(&[("x", TensorView::new(&x, &[2, 3]).unwrap())]).unwrap()));
    assert!(owned > 0, "run counted no allocation: the counting allocator is not in use");

    // One thread: two calls to warm up, then none allocates.
    call(&session, 2, 0);
    let allocs = counted(|| call(&session, 1000, 0));
    assert_eq!(allocs, 0, "1000 calls of run_into after warming up allocated {allocs} times");

    // Two threads sharing the session, their calls queued on the runner: the threads are
    // started and warmed up before the count starts, and it ends once both are done.
    let ready = Barrier::new(3);
    std::thread::scope(|s| {
        for t in 0..2 {
            let (session, ready) = (&session, &ready);
            s.spawn(move || {
                call(session, 2, t);
                ready.wait();
                ready.wait();
                call(session, 500, t);
                ready.wait();
            });
        }
        ready.wait();
        let allocs = counted(|| {
            ready.wait();
            ready.wait();
        });
        assert_eq!(allocs, 0, "2 threads x 500 calls of run_into allocated {allocs} times");
    });
    println!("run_into: 0 heap allocations a call (1000 calls on one thread, 2 x 500 on two)");
}
