//! A caller's memory seen as a tensor, without a copy: a dtype, a shape, and the bytes of
//! its elements, row-major (C order), little-endian as the host stores them.

use meshc_ir::{DType, Tensor, TensorType};

use crate::api::error::Error;

/// An element type meshc tensors have: f32, i32, i64, bool, f16 and bf16 (`half`).
pub trait Element: Copy + sealed::Sealed {
    const DTYPE: DType;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}
element!(f32 => F32, i32 => I32, i64 => I64, bool => Bool, half::f16 => F16, half::bf16 => BF16);

/// The bytes of a slice of elements.
fn bytes_of<T: Element>(v: &[T]) -> &[u8] {
    // SAFETY: every `Element` is plain data with no padding; the extent is the slice's.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// Checks that `len` bytes hold `shape`'s elements of `dtype`.
fn fits(dtype: DType, shape: &[usize], len: usize) -> Result<(), Error> {
    let want = shape.iter().try_fold(dtype.size_bytes(), |n, &d| n.checked_mul(d));
    if want != Some(len) {
        let ty = TensorType::new(dtype, shape.to_vec());
        return Err(Error::View(format!("{len} bytes of data for a {ty} tensor ({} bytes)", ty.size_bytes())));
    }
    Ok(())
}

/// A caller's memory as a tensor: `B` is `&[u8]` for an input (`TensorView`), `&mut [u8]`
/// for a buffer a run writes into (`TensorViewMut`).
#[derive(Clone, Copy, Debug)]
pub struct View<'a, B> {
    pub(crate) dtype: DType,
    pub(crate) shape: &'a [usize],
    pub(crate) bytes: B,
}

/// A borrowed input tensor.
pub type TensorView<'a> = View<'a, &'a [u8]>;

/// A borrowed output buffer a run writes into.
pub type TensorViewMut<'a> = View<'a, &'a mut [u8]>;

impl<B> View<'_, B> {
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn shape(&self) -> &[usize] {
        self.shape
    }

    pub(crate) fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, self.shape.to_vec())
    }
}

impl<'a> TensorView<'a> {
    /// `data` as a tensor of `shape`, which must have exactly `data.len()` elements.
    pub fn new<T: Element>(data: &'a [T], shape: &'a [usize]) -> Result<TensorView<'a>, Error> {
        TensorView::from_bytes(T::DTYPE, shape, bytes_of(data))
    }

    /// Raw little-endian bytes as a tensor of `dtype` and `shape` (a bool is one byte, 0 or
    /// 1: any other byte is refused, since kernels may rely on it).
    pub fn from_bytes(dtype: DType, shape: &'a [usize], bytes: &'a [u8]) -> Result<TensorView<'a>, Error> {
        fits(dtype, shape, bytes.len())?;
        if dtype == DType::Bool && bytes.iter().any(|&b| b > 1) {
            return Err(Error::View("a bool tensor holds a byte other than 0 or 1".into()));
        }
        Ok(TensorView { dtype, shape, bytes })
    }

    /// The tensor, copied.
    pub fn to_tensor(&self) -> Tensor {
        Tensor::from_le_bytes(&self.ty(), self.bytes)
    }

    /// A host tensor, borrowed.
    pub fn of(t: &'a Tensor) -> TensorView<'a> {
        TensorView { dtype: t.dtype(), shape: &t.shape, bytes: crate::exec::io::le_bytes(t) }
    }
}

impl<'a> TensorViewMut<'a> {
    /// `data` as a tensor of `shape`, which must have exactly `data.len()` elements.
    pub fn new<T: Element>(data: &'a mut [T], shape: &'a [usize]) -> Result<TensorViewMut<'a>, Error> {
        // SAFETY: as `bytes_of`; every byte pattern the run writes is a valid element of the
        // output's dtype, which `Session::run_into` checks is `T`'s (a bool is written 0 or 1).
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(data)) };
        TensorViewMut::from_bytes(T::DTYPE, shape, bytes)
    }

    /// Raw bytes to hold a tensor of `dtype` and `shape`, little-endian.
    pub fn from_bytes(dtype: DType, shape: &'a [usize], bytes: &'a mut [u8]) -> Result<TensorViewMut<'a>, Error> {
        fits(dtype, shape, bytes.len())?;
        Ok(TensorViewMut { dtype, shape, bytes })
    }
}
