//! Element types (`DType`) and static tensor types (`TensorType`): the vocabulary every
//! other module uses to talk about what a tensor holds.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    I32,
    I64,
    Bool,
    /// IEEE half precision and bfloat16: storage types (weights at half the bytes). Data
    /// movement, `where` and `cast` take them; arithmetic takes f32 (`cast` first), as the
    /// compiled kernels compute in f32 whatever the weights are stored in.
    F16,
    BF16,
    /// 8-bit integers: storage for quantized tensors (ONNX's QuantizeLinear and friends).
    /// Data movement, `where` and `cast` take them; arithmetic takes i32 or f32 (`cast`
    /// first, which is exact), as an integer GEMM accumulates in i32.
    I8,
    U8,
    /// The other integers ONNX names, storage like the 8-bit ones: computed on as i32
    /// (16-bit) or i64 (u32, and u64 where two's complement gives its bits: `wide`).
    I16,
    U16,
    U32,
    U64,
}

impl DType {
    pub const ALL: [DType; 12] = [
        DType::F32,
        DType::I32,
        DType::I64,
        DType::Bool,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I16,
        DType::U16,
        DType::U32,
        DType::U64,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I16 => "i16",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
        }
    }

    pub fn parse(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::I64 | DType::U64 => 8,
            DType::Bool | DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
        }
    }

    /// The integers arithmetic and indexing take (the others are storage, `is_stored_int`).
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// Types arithmetic is defined on (everything but bool and the storage floats).
    pub fn is_numeric(self) -> bool {
        matches!(self, DType::F32 | DType::I32 | DType::I64)
    }

    /// i8 and u8: integers stored in a byte, computed on as i32 or f32.
    pub fn is_byte(self) -> bool {
        matches!(self, DType::I8 | DType::U8)
    }

    /// The storage integers: every integer type but i32 and i64.
    pub fn is_stored_int(self) -> bool {
        self.wide() != self
    }

    /// The integer type a storage integer is computed in: i32 holds every 8- and 16-bit
    /// value, i64 every u32; a u64 in i64 keeps its bits, so the ops that wrap (add, sub,
    /// mul, and, or, xor, a left shift) give the u64's bits, and the rest need the top bit
    /// handled (the importer's `widen_ints`). Every other type is its own.
    pub fn wide(self) -> DType {
        match self {
            DType::I8 | DType::U8 | DType::I16 | DType::U16 => DType::I32,
            DType::U32 | DType::U64 => DType::I64,
            other => other,
        }
    }

    /// The range of an integer dtype's values, as f64 (exact for every one but the ends of
    /// i64's and u64's).
    pub fn int_range(self) -> Option<(f64, f64)> {
        match self {
            DType::I8 => Some((i8::MIN as f64, i8::MAX as f64)),
            DType::U8 => Some((0.0, u8::MAX as f64)),
            DType::I16 => Some((i16::MIN as f64, i16::MAX as f64)),
            DType::U16 => Some((0.0, u16::MAX as f64)),
            DType::U32 => Some((0.0, u32::MAX as f64)),
            DType::U64 => Some((0.0, u64::MAX as f64)),
            DType::I32 => Some((i32::MIN as f64, i32::MAX as f64)),
            DType::I64 => Some((i64::MIN as f64, i64::MAX as f64)),
            DType::F32 | DType::Bool | DType::F16 | DType::BF16 => None,
        }
    }

    /// f16 and bf16: floats stored in 2 bytes, computed on as f32.
    pub fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Dtype plus a static shape; `[]` is a scalar.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorType {
    pub fn new(dtype: DType, shape: Vec<usize>) -> Self {
        TensorType { dtype, shape }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn size_bytes(&self) -> usize {
        self.numel() * self.dtype.size_bytes()
    }

    /// The byte size, or `None` when it overflows or exceeds `budget::CEILING`. The
    /// verifier checks every tensor with this, so `numel`/`size_bytes` cannot overflow later.
    pub fn checked_size_bytes(&self) -> Option<usize> {
        let bytes = self.shape.iter().try_fold(self.dtype.size_bytes(), |n, &d| n.checked_mul(d));
        bytes.filter(|&n| n <= crate::budget::CEILING)
    }
}

/// Shapes print as `[512,1024]`, the way the text format writes them.
pub struct ShapeDisplay<'a>(pub &'a [usize]);

impl fmt::Display for ShapeDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, ShapeDisplay(&self.shape))
    }
}
