//! Seeded param initialisers. The generator is specified (docs/format.md) rather than
//! borrowed from a crate so that numpy (tools/gen_testdata.py) reproduces it exactly:
//! element k of a param draws from a counter-based splitmix64 stream keyed by the seed.

use crate::dtype::TensorType;
use crate::error::{Error, Result};
use crate::graph::Init;
use crate::tensor::{Data, Tensor};

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The k-th uniform draw in (0, 1) of stream `seed`.
pub fn uniform01(seed: u64, k: u64) -> f64 {
    let r = mix(mix(seed).wrapping_add(k.wrapping_add(1).wrapping_mul(GOLDEN)));
    ((r >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// Materialises an initialiser for a tensor of type `ty` (values computed in f64, then
/// converted to the dtype). Fails, rather than aborting, when memory cannot be had.
pub fn materialize(init: &Init, ty: &TensorType) -> Result<Tensor> {
    // Computed in f64 first: 8 bytes an element.
    let n = crate::budget::check_shape(format_args!("initialising {ty}"), &ty.shape, 8).map_err(Error::new)? as u64;
    let mut values: Vec<f64> = Vec::new();
    values
        .try_reserve_exact(n as usize)
        .map_err(|_| Error::new(format!("cannot allocate memory to initialise {ty}")))?;
    match *init {
        Init::Zeros => values.resize(n as usize, 0.0),
        Init::Ones => values.resize(n as usize, 1.0),
        Init::Uniform { seed, low, high } => values.extend((0..n).map(|k| low + (high - low) * uniform01(seed, k))),
        Init::Normal { seed, mean, std } => values.extend((0..n).map(|k| {
            let (u1, u2) = (uniform01(seed, 2 * k), uniform01(seed, 2 * k + 1));
            mean + std * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
        })),
    }
    Ok(Tensor::new(ty.shape.clone(), Data::from_f64(ty.dtype, values)))
}
