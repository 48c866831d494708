//! ONNX element types and tensors as meshc sees them: `TensorProto.DataType` codes to
//! `DType` (refusing what meshc has no type for), and a `TensorProto` (raw bytes or typed
//! lists) to a `Tensor`, its size checked against its dims before anything is allocated.
//! Half floats are widened to f32 here and doubles rounded to it: meshc computes in f32
//! (docs/onnx.md).

use meshc_ir::budget::CEILING;
use meshc_ir::dtype::ShapeDisplay;
use meshc_ir::{DType, Data, Tensor, TensorType};

use super::proto::tensor_proto::DataType;
use super::proto::TensorProto;

type R<T> = std::result::Result<T, String>;

/// The meshc dtype of an ONNX element type code, as meshc computes on it (halves and
/// doubles as f32: torch.onnx writes double constants, such as the attention scale it
/// computes in Python floats, and Casts to double, which meshc computes in f32).
pub fn dtype(code: i32) -> R<DType> {
    match DataType::try_from(code) {
        Ok(DataType::Float | DataType::Float16 | DataType::Bfloat16 | DataType::Double) => Ok(DType::F32),
        Ok(DataType::Int32) => Ok(DType::I32),
        Ok(DataType::Int64) => Ok(DType::I64),
        Ok(DataType::Bool) => Ok(DType::Bool),
        Ok(DataType::Int8) => Ok(DType::I8),
        Ok(DataType::Uint8) => Ok(DType::U8),
        Ok(DataType::Int16) => Ok(DType::I16),
        Ok(DataType::Uint16) => Ok(DType::U16),
        Ok(DataType::Uint32) => Ok(DType::U32),
        Ok(DataType::Uint64) => Ok(DType::U64),
        Ok(other) => Err(format!(
            "element type {} is not supported (f32, f16, bf16, i32, i64, int8, int16, uint8, uint16, uint32, uint64, bool)",
            name(other)
        )),
        Err(_) => Err(format!("element type code {code} is not an ONNX type")),
    }
}

/// The dtype of a code as stored, halves kept (graph inputs keep their storage type). A
/// double has no meshc type to be stored in: an initializer of it is rounded to f32 (see
/// `dtype`), a graph input of it refused.
pub fn storage_dtype(code: i32) -> R<DType> {
    match DataType::try_from(code) {
        Ok(DataType::Float16) => Ok(DType::F16),
        Ok(DataType::Bfloat16) => Ok(DType::BF16),
        Ok(DataType::Double) => Err("element type double is not supported for an input (meshc computes in f32)".into()),
        _ => dtype(code),
    }
}

fn name(t: DataType) -> String {
    t.as_str_name().to_lowercase()
}

/// The shape of `dims`, refused when a dim is negative or the tensor would exceed meshc's
/// largest (so no size computed from it overflows).
pub fn shape(dims: &[i64], elem_bytes: usize) -> R<Vec<usize>> {
    let shape = dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("dims {dims:?} have a negative size")))
        .collect::<R<Vec<usize>>>()?;
    let bytes = shape.iter().try_fold(elem_bytes, |n, &d| n.checked_mul(d));
    match bytes {
        Some(b) if b <= CEILING => Ok(shape),
        _ => Err(format!("dims {dims:?} are larger than the {CEILING} bytes meshc accepts")),
    }
}

/// Whether `t` keeps its data in an external file (`super::external`).
pub fn is_external(t: &TensorProto) -> bool {
    t.data_location == Some(super::proto::tensor_proto::DataLocation::External as i32)
}

/// The values of `t`, in meshc's computing dtype (a Constant's: never external).
pub fn tensor(t: &TensorProto) -> R<Tensor> {
    if is_external(t) {
        return Err("its data is external, which only initializers may be".into());
    }
    tensor_from(t, t.raw_data.as_deref())
}

/// The values of `t` whose raw bytes, if any, are `raw` (its own or its external data's).
pub fn tensor_from(t: &TensorProto, raw: Option<&[u8]>) -> R<Tensor> {
    let stored = DataType::try_from(t.data_type.unwrap_or(0)).map_err(|_| "unknown element type".to_string())?;
    let dtype = dtype(stored as i32)?;
    let width = match stored {
        DataType::Double => 8,
        DataType::Float16 | DataType::Bfloat16 => 2,
        _ => dtype.size_bytes(),
    };
    let shape = shape(&t.dims, width)?;
    let n: usize = shape.iter().product();
    let held = match (raw, stored) {
        (Some(r), _) => r.len() / width + usize::from(!r.len().is_multiple_of(width)),
        (None, DataType::Float) => t.float_data.len(),
        (None, DataType::Int64) => t.int64_data.len(),
        (None, DataType::Double) => t.double_data.len(),
        (None, DataType::Uint32 | DataType::Uint64) => t.uint64_data.len(),
        (None, _) => t.int32_data.len(),
    };
    if held != n || raw.is_some_and(|r| r.len() != n * width) {
        let got = raw.map_or(format!("{held} values"), |r| format!("{} bytes", r.len()));
        let want = if raw.is_some() { format!("{} bytes", n * width) } else { format!("{n} values") };
        return Err(format!("dims {} need {want}, its data has {got}", ShapeDisplay(&shape)));
    }
    let data = match (raw, stored) {
        (Some(r), DataType::Float) => {
            Data::F32(r.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
        }
        (Some(r), DataType::Int32) => {
            Data::I32(r.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect())
        }
        (Some(r), DataType::Int64) => {
            Data::I64(r.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect())
        }
        (Some(r), DataType::Bool) => Data::Bool(r.iter().map(|&b| b != 0).collect()),
        (Some(r), _) if dtype.is_stored_int() => Tensor::from_le_bytes(&TensorType::new(dtype, vec![n]), r).data,
        (Some(r), DataType::Double) => {
            Data::F32(r.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32).collect())
        }
        (Some(r), _) => halves(stored, r.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]))),
        (None, DataType::Float) => Data::F32(t.float_data.clone()),
        (None, DataType::Int64) => Data::I64(t.int64_data.clone()),
        (None, DataType::Int32) => Data::I32(t.int32_data.clone()),
        (None, DataType::Bool) => Data::Bool(t.int32_data.iter().map(|&b| b != 0).collect()),
        // One value per `int32_data` entry; one out of the type's range is a broken file.
        (None, DataType::Int8) => Data::I8(small_ints(&t.int32_data)?),
        (None, DataType::Uint8) => Data::U8(small_ints(&t.int32_data)?),
        (None, DataType::Int16) => Data::I16(small_ints(&t.int32_data)?),
        (None, DataType::Uint16) => Data::U16(small_ints(&t.int32_data)?),
        (None, DataType::Uint32) => Data::U32(small_ints(&t.uint64_data)?),
        (None, DataType::Uint64) => Data::U64(t.uint64_data.clone()),
        (None, DataType::Double) => Data::F32(t.double_data.iter().map(|&d| d as f32).collect()),
        // Halves in `int32_data` hold their bit patterns, one per entry.
        (None, _) => halves(stored, t.int32_data.iter().map(|&b| b as u16)),
    };
    Ok(Tensor::new(shape, data))
}

/// Integers narrower than their list's (`int32_data`, `uint64_data`) one per entry, each
/// in range.
fn small_ints<T: TryFrom<W>, W: Copy + std::fmt::Display>(v: &[W]) -> R<Vec<T>> {
    v.iter()
        .map(|&x| {
            T::try_from(x).map_err(|_| format!("value {x} is out of the range of its {}", std::any::type_name::<T>()))
        })
        .collect()
}

/// Half-float bit patterns widened to f32 (exact), through the ir's half types.
fn halves(stored: DataType, bits: impl Iterator<Item = u16>) -> Data {
    let bytes: Vec<u8> = bits.flat_map(u16::to_le_bytes).collect();
    let dtype = if stored == DataType::Bfloat16 { DType::BF16 } else { DType::F16 };
    let t = Tensor::from_le_bytes(&TensorType::new(dtype, vec![bytes.len() / 2]), &bytes);
    Data::from_f64(DType::F32, t.data.to_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proto(data_type: DataType, dims: Vec<i64>) -> TensorProto {
        TensorProto { data_type: Some(data_type as i32), dims, ..Default::default() }
    }

    #[test]
    fn reads_raw_and_typed_data_and_widens_halves() {
        let mut t = proto(DataType::Float, vec![2]);
        t.raw_data = Some([1.5f32.to_le_bytes(), (-2f32).to_le_bytes()].concat());
        assert_eq!(tensor(&t).unwrap(), Tensor::f32(vec![2], vec![1.5, -2.0]));
        let mut t = proto(DataType::Int64, vec![]);
        t.int64_data = vec![7];
        assert_eq!(tensor(&t).unwrap(), Tensor::new(vec![], Data::I64(vec![7])));
        let mut t = proto(DataType::Float16, vec![1]);
        t.int32_data = vec![0x3800]; // 0.5 in f16
        assert_eq!(tensor(&t).unwrap(), Tensor::f32(vec![1], vec![0.5]));
        // Doubles are rounded to f32, from raw bytes or `double_data`.
        let mut t = proto(DataType::Double, vec![2]);
        t.raw_data = Some([0.25f64.to_le_bytes(), 0.1f64.to_le_bytes()].concat());
        assert_eq!(tensor(&t).unwrap(), Tensor::f32(vec![2], vec![0.25, 0.1]));
        t.raw_data = None;
        t.double_data = vec![-3.0];
        t.dims = vec![];
        assert_eq!(tensor(&t).unwrap(), Tensor::f32(vec![], vec![-3.0]));
        assert!(storage_dtype(DataType::Double as i32).unwrap_err().contains("input"));
        // 8-bit ints stay 8-bit, from raw bytes or one per `int32_data` entry.
        let mut t = proto(DataType::Int8, vec![3]);
        t.raw_data = Some(vec![0x80, 0x7f, 0xff]);
        assert_eq!(tensor(&t).unwrap(), Tensor::new(vec![3], Data::I8(vec![-128, 127, -1])));
        let mut t = proto(DataType::Uint8, vec![2]);
        t.int32_data = vec![0, 255];
        assert_eq!(tensor(&t).unwrap(), Tensor::new(vec![2], Data::U8(vec![0, 255])));
        // 16-bit ints one per `int32_data` entry, u32 and u64 one per `uint64_data` entry.
        let mut t = proto(DataType::Int16, vec![2]);
        t.int32_data = vec![-32768, 32767];
        assert_eq!(tensor(&t).unwrap(), Tensor::new(vec![2], Data::I16(vec![-32768, 32767])));
        let mut t = proto(DataType::Uint64, vec![2]);
        t.uint64_data = vec![u64::MAX, 7];
        assert_eq!(tensor(&t).unwrap(), Tensor::new(vec![2], Data::U64(vec![u64::MAX, 7])));
        t.raw_data = Some([u64::MAX.to_le_bytes(), 7u64.to_le_bytes()].concat());
        t.uint64_data = vec![];
        assert_eq!(tensor(&t).unwrap(), Tensor::new(vec![2], Data::U64(vec![u64::MAX, 7])));
        let mut t = proto(DataType::Uint32, vec![1]);
        t.uint64_data = vec![1 << 32];
        assert_eq!(tensor(&t).unwrap_err(), "value 4294967296 is out of the range of its u32");
    }

    #[test]
    fn refuses_data_that_disagrees_with_dims_and_unsupported_types() {
        let mut t = proto(DataType::Float, vec![2, 2]);
        t.raw_data = Some(vec![0; 12]);
        assert_eq!(tensor(&t).unwrap_err(), "dims [2,2] need 16 bytes, its data has 12 bytes");
        t.raw_data = None;
        t.float_data = vec![1.0; 3];
        assert_eq!(tensor(&t).unwrap_err(), "dims [2,2] need 4 values, its data has 3 values");
        assert!(tensor(&proto(DataType::Float, vec![-1])).unwrap_err().contains("negative"));
        assert!(tensor(&proto(DataType::Float, vec![1 << 40, 1 << 20])).unwrap_err().contains("larger than"));
        assert_eq!(
            dtype(DataType::Complex64 as i32).unwrap_err(),
            "element type complex64 is not supported (f32, f16, bf16, i32, i64, int8, int16, uint8, uint16, uint32, uint64, bool)"
        );
        let mut t = proto(DataType::Uint8, vec![2]);
        t.int32_data = vec![3, 256];
        assert_eq!(tensor(&t).unwrap_err(), "value 256 is out of the range of its u8");
        let mut t = proto(DataType::Int8, vec![1]);
        t.int32_data = vec![-129];
        assert_eq!(tensor(&t).unwrap_err(), "value -129 is out of the range of its i8");
    }
}
