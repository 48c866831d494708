//! The MLP of the mesh bench: x[512,1024]·W1[1024,4096] → ReLU → ·W2[4096,1024],
//! on one device or a 2×4 mesh (batch over `data`, hidden over `model`, Megatron-style),
//! compiled in memory; the models bench runs it beside XLA too.

use std::collections::HashMap;

use meshc::compile::{Compiled, Options};
use meshc::driver;
use meshc::layout;
use meshc::pipeline::Dumps;
use meshc_ir::{params, text, verify, Data, Tensor};

pub const B: usize = 512;
pub const D: usize = 1024;
pub const H: usize = 4096;

pub const GRAPH: &str = "graph mlp_bench {
  input x: f32[512,1024] dims(batch, embed)
  param w1: f32[1024,4096] dims(embed, hidden) = init normal{seed = 1, std = 0.02}
  param w2: f32[4096,1024] dims(hidden, embed) = init normal{seed = 2, std = 0.02}
  h = matmul(x, w1)
  a = relu(h)
  y = matmul(a, w2)
  output y
}";

pub const SPEC_2X4: &str = r#"{"format": "meshc-layout/1",
  "mesh": {"shape": [2, 4], "axes": ["data", "model"], "topology": "torus"},
  "rules": {"batch": "data", "hidden": "model"}}"#;

/// The same MLP on two devices (hidden over `model`, batch whole): the 2×4 mesh's work on
/// as many devices as this machine has cores, the baseline of its 8 threads on 2 cores.
pub const SPEC_1X2: &str = r#"{"format": "meshc-layout/1",
  "mesh": {"shape": [1, 2], "axes": ["data", "model"], "topology": "torus"},
  "rules": {"batch": "data", "hidden": "model"}}"#;

pub fn build(spec: Option<&str>) -> Compiled {
    build_with(spec, &Options::default())
}

/// `build` with these options.
pub fn build_with(spec: Option<&str>, opts: &Options) -> Compiled {
    let g = text::parse(GRAPH).expect("bench graph parses");
    let info = verify::verify(&g).expect("bench graph verifies");
    let values = params::load_all(&g, std::path::Path::new(".")).expect("init params");
    let spec = spec.map(|s| layout::parse(s, "bench-spec").expect("bench spec parses"));
    driver::Job::new(&g, &info, &values, opts).spec(spec.as_ref()).build(&Dumps::default()).expect("compiles")
}

pub fn input() -> HashMap<String, Tensor> {
    let v = (0..B * D).map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0).collect();
    HashMap::from([("x".to_string(), Tensor::new(vec![B, D], Data::F32(v)))])
}
