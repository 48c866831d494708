//! Host tensors (`Tensor`): the values the interpreter computes on and the runner reads and
//! writes, plus their file formats (`.npy` via npyz, `.safetensors` via safetensors).

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};

#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
    F16(Vec<half::f16>),
    BF16(Vec<half::bf16>),
    I8(Vec<i8>),
    U8(Vec<u8>),
    I16(Vec<i16>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
}

/// A dense, row-major tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Data,
}

impl Data {
    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::I32(_) => DType::I32,
            Data::I64(_) => DType::I64,
            Data::Bool(_) => DType::Bool,
            Data::F16(_) => DType::F16,
            Data::BF16(_) => DType::BF16,
            Data::I8(_) => DType::I8,
            Data::U8(_) => DType::U8,
            Data::I16(_) => DType::I16,
            Data::U16(_) => DType::U16,
            Data::U32(_) => DType::U32,
            Data::U64(_) => DType::U64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::Bool(v) => v.len(),
            Data::F16(v) => v.len(),
            Data::BF16(v) => v.len(),
            Data::I8(v) => v.len(),
            Data::U8(v) => v.len(),
            Data::I16(v) => v.len(),
            Data::U16(v) => v.len(),
            Data::U32(v) => v.len(),
            Data::U64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every element widened to f64 (exact for every dtype's values in practice: i64
    /// beyond 2^53 only loses precision, which no graph here relies on).
    pub fn to_f64(&self) -> Vec<f64> {
        self.iter_f64().collect()
    }

    /// `to_f64` one element at a time, for a pass over a large tensor that needs no copy.
    pub fn iter_f64(&self) -> Box<dyn Iterator<Item = f64> + '_> {
        match self {
            Data::F32(v) => Box::new(v.iter().map(|&x| x as f64)),
            Data::I32(v) => Box::new(v.iter().map(|&x| x as f64)),
            Data::I64(v) => Box::new(v.iter().map(|&x| x as f64)),
            Data::Bool(v) => Box::new(v.iter().map(|&x| x as u8 as f64)),
            Data::F16(v) => Box::new(v.iter().map(|&x| x.to_f64())),
            Data::BF16(v) => Box::new(v.iter().map(|&x| x.to_f64())),
            Data::I8(v) => Box::new(v.iter().map(|&x| x as f64)),
            Data::U8(v) => Box::new(v.iter().map(|&x| x as f64)),
            Data::I16(v) => Box::new(v.iter().map(|&x| x as f64)),
            Data::U16(v) => Box::new(v.iter().map(|&x| x as f64)),
            Data::U32(v) => Box::new(v.iter().map(|&x| x as f64)),
            Data::U64(v) => Box::new(v.iter().map(|&x| x as f64)),
        }
    }

    /// Builds data of `dtype` from f64 values, with numpy's conversion rules
    /// (truncation toward zero for ints, nonzero for bool).
    pub fn from_f64(dtype: DType, v: impl IntoIterator<Item = f64>) -> Data {
        let v = v.into_iter();
        match dtype {
            DType::F32 => Data::F32(v.map(|x| x as f32).collect()),
            DType::I32 => Data::I32(v.map(|x| x as i32).collect()),
            DType::I64 => Data::I64(v.map(|x| x as i64).collect()),
            DType::Bool => Data::Bool(v.map(|x| x != 0.0).collect()),
            // Rounded once, to nearest even, straight from f64.
            DType::F16 => Data::F16(v.map(half::f16::from_f64).collect()),
            DType::BF16 => Data::BF16(v.map(half::bf16::from_f64).collect()),
            // Through the wide type, as `cast` does: truncated, then wrapped.
            DType::I8 => Data::I8(v.map(|x| x as i32 as i8).collect()),
            DType::U8 => Data::U8(v.map(|x| x as i32 as u8).collect()),
            DType::I16 => Data::I16(v.map(|x| x as i32 as i16).collect()),
            DType::U16 => Data::U16(v.map(|x| x as i32 as u16).collect()),
            DType::U32 => Data::U32(v.map(|x| x as i64 as u32).collect()),
            DType::U64 => Data::U64(v.map(|x| x as u64).collect()),
        }
    }
}

/// The tolerance an f32 result is held to against its reference: |got - want| <= ATOL +
/// RTOL·|want| elementwise (testdata/README.md). Other dtypes must match exactly.
pub const ATOL: f64 = 1e-5;
pub const RTOL: f64 = 1e-4;

/// How a result compares with its reference, element by element.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Closeness {
    /// The largest absolute error, and where.
    pub max_abs_err: f64,
    pub worst: usize,
    /// The first element outside the tolerance, if any.
    pub first_bad: Option<usize>,
    /// Elements that are NaN on one side only (never within tolerance, and without an
    /// absolute error to report).
    pub nan_mismatches: usize,
}

/// Where an .npy file's data starts: after the 6-byte magic, 2 version bytes, and the header
/// length field (u16 in version 1, u32 in versions 2 and 3) and header.
pub(crate) fn npy_data_offset(bytes: &[u8]) -> usize {
    let le = |r: std::ops::Range<usize>| bytes.get(r).map(|b| b.iter().rev().fold(0usize, |n, &x| n << 8 | x as usize));
    match bytes.get(6) {
        Some(1) => le(8..10).map_or(usize::MAX, |n| 10 + n),
        _ => le(8..12).map_or(usize::MAX, |n| 12 + n),
    }
}

pub(crate) const NPY_MAGIC: &[u8] = b"\x93NUMPY";

/// The largest `.safetensors` header read (the format's own limit).
pub(crate) const MAX_SAFETENSORS_HEADER: u64 = 100_000_000;

/// Where the data a `.safetensors` header (its JSON) declares ends: the largest end offset.
pub(crate) fn safetensors_data_end(header: &[u8]) -> Result<u64> {
    let bad = |why: String| Error::new(format!("not a valid .safetensors file: {why}"));
    let v: serde_json::Value = serde_json::from_slice(header).map_err(|e| bad(format!("header: {e}")))?;
    let entries = v.as_object().ok_or_else(|| bad("the header is not an object".into()))?;
    let mut ends = entries.iter().filter(|(k, _)| *k != "__metadata__").map(|(k, t)| {
        t.get("data_offsets")
            .and_then(|o| o.get(1))
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| bad(format!("tensor '{}' has no data_offsets", crate::error::shorten(k))))
    });
    ends.try_fold(0, |m, e| Ok(m.max(e?)))
}

/// The largest `.npy` header read (numpy writes a few hundred bytes; a header claiming
/// gigabytes is a hostile or broken file).
pub(crate) const MAX_NPY_HEADER: usize = 1 << 20;

/// The deepest bracket nesting read in a `.npy` header (numpy's own is 2: a dict holding
/// the shape's tuple; a structured dtype's list of tuples is 3 or 4, and meshc refuses it).
const MAX_NPY_NESTING: usize = 8;

/// The deepest nesting of brackets in `text`.
fn nesting(text: &[u8]) -> usize {
    let (mut depth, mut max) = (0usize, 0);
    for c in text {
        match c {
            b'(' | b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// Reads until `buf` is full or the file ends; the number of bytes read.
fn read_up_to(f: &mut std::fs::File, buf: &mut [u8]) -> Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::new(format!("cannot read: {e}"))),
        }
    }
    Ok(got)
}

/// The type a `.npy` header declares (`bytes` holds at least the whole header), refusing
/// what meshc does not read.
pub(crate) fn npy_type(bytes: &[u8]) -> Result<TensorType> {
    // npyz allocates what the header's length field says before reading it.
    let offset = npy_data_offset(bytes);
    if offset > bytes.len().min(MAX_NPY_HEADER) {
        return Err(Error::new(if offset > MAX_NPY_HEADER && offset != usize::MAX {
            format!("the .npy header declares {offset} bytes, more than the {MAX_NPY_HEADER} meshc reads")
        } else {
            "not a valid .npy file: it ends inside its header".to_string()
        }));
    }
    // npyz's parser of the header's Python literal backtracks exponentially in its
    // nesting: numpy writes a dict holding a tuple, so anything deeper is refused here.
    let start = if bytes.get(6) == Some(&1) { 10 } else { 12 };
    let depth = nesting(&bytes[start.min(offset)..offset]);
    if depth > MAX_NPY_NESTING {
        return Err(Error::new(format!(
            "not a valid .npy file: its header nests brackets {depth} deep ; numpy writes 2"
        )));
    }
    // npyz quotes the whole header in some errors, and a syntax error in it over several
    // lines (the parser's position, the line, a caret): one line of it, shortened.
    let npy = npyz::NpyHeader::from_reader(bytes).map_err(|e| {
        let one_line = e.to_string().split_whitespace().collect::<Vec<_>>().join(" ");
        Error::new(format!("not a valid .npy file: {}", crate::error::shorten(&one_line)))
    })?;
    if npy.order() == npyz::Order::Fortran {
        return Err(Error::new("Fortran-ordered .npy arrays are not supported; save with C order"));
    }
    let descr = match npy.dtype() {
        npyz::DType::Plain(t) => t.to_string(),
        other => return Err(Error::new(format!("unsupported .npy dtype {}", other.descr()))),
    };
    let dtype = match descr.as_str() {
        "<f4" => DType::F32,
        "<i4" => DType::I32,
        "<i8" => DType::I64,
        "|b1" => DType::Bool,
        "<f2" => DType::F16,
        "|i1" => DType::I8,
        "|u1" => DType::U8,
        "<i2" => DType::I16,
        "<u2" => DType::U16,
        "<u4" => DType::U32,
        "<u8" => DType::U64,
        other => {
            // The usual cause is numpy's float64: say the fix.
            let hint = match other {
                "<f8" | ">f8" => "; save it with x.astype(np.float32)",
                _ => "",
            };
            return Err(Error::new(format!(
                "unsupported .npy dtype {other} (meshc reads float32, float16, int8, int16, int32, int64, uint8, uint16, uint32, uint64 and bool{hint})"
            )));
        }
    };
    let ty = TensorType::new(dtype, npy.shape().iter().map(|&d| d as usize).collect());
    ty.checked_size_bytes().ok_or_else(|| Error::new(format!("the .npy header declares {ty}, which is too large")))?;
    Ok(ty)
}

/// Refuses data of `have` bytes after the header where it declares `want`: too few (a
/// truncated file) or too many (bytes after the array that nobody would read).
pub(crate) fn check_npy_size(ty: &TensorType, have: u64, want: u64) -> Result<()> {
    if have < want {
        return Err(Error::new(format!(
            "file ends early: the header says {ty} ({want} bytes of data), only {have} are present"
        )));
    }
    if have > want {
        return Err(Error::new(format!(
            "{} bytes follow the data the header declares ({ty}, {want} bytes)",
            have - want
        )));
    }
    Ok(())
}

impl Tensor {
    pub fn new(shape: Vec<usize>, data: Data) -> Tensor {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Tensor { shape, data }
    }

    pub fn zeros(ty: &TensorType) -> Tensor {
        Tensor::new(ty.shape.clone(), Data::from_f64(ty.dtype, std::iter::repeat_n(0.0, ty.numel())))
    }

    pub fn f32(shape: Vec<usize>, v: Vec<f32>) -> Tensor {
        Tensor::new(shape, Data::F32(v))
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype(), self.shape.clone())
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The raw little-endian bytes of the elements (bool as one byte 0/1): the layout of
    /// weights in the artifact and of buffers at run time.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let mut out = vec![0; self.ty().size_bytes()];
        self.write_le_bytes(&mut out);
        out
    }

    /// Compares with a reference of the same type under `ATOL`/`RTOL` (NaN matches NaN);
    /// non-f32 dtypes must match exactly.
    pub fn closeness(&self, want: &Tensor) -> Closeness {
        let exact = !matches!(want.dtype(), DType::F32 | DType::F16 | DType::BF16);
        let mut c = Closeness { max_abs_err: 0.0, worst: 0, first_bad: None, nan_mismatches: 0 };
        for (i, (a, b)) in self.data.to_f64().into_iter().zip(want.data.to_f64()).enumerate() {
            let one_nan = a.is_nan() != b.is_nan();
            // Equal values (infinities included) and NaN against NaN have no error.
            let err = if a == b || (a.is_nan() && b.is_nan()) { 0.0 } else { (a - b).abs() };
            let ok = !one_nan && (err == 0.0 || !exact && err <= ATOL + RTOL * b.abs());
            if !ok && c.first_bad.is_none() {
                c.first_bad = Some(i);
            }
            if one_nan {
                c.nan_mismatches += 1;
            } else if err > c.max_abs_err {
                (c.max_abs_err, c.worst) = (err, i);
            }
        }
        c
    }

    /// Writes the bytes of `to_le_bytes` into `dst` (exactly that long) without an
    /// intermediate vector.
    pub fn write_le_bytes(&self, dst: &mut [u8]) {
        fn put<const N: usize, T: Copy>(dst: &mut [u8], v: &[T], f: impl Fn(T) -> [u8; N]) {
            for (d, &x) in dst.chunks_exact_mut(N).zip(v) {
                d.copy_from_slice(&f(x));
            }
        }
        match &self.data {
            Data::F32(v) => put(dst, v, f32::to_le_bytes),
            Data::I32(v) => put(dst, v, i32::to_le_bytes),
            Data::I64(v) => put(dst, v, i64::to_le_bytes),
            Data::Bool(v) => put(dst, v, |b: bool| [b as u8]),
            Data::F16(v) => put(dst, v, half::f16::to_le_bytes),
            Data::BF16(v) => put(dst, v, half::bf16::to_le_bytes),
            Data::I8(v) => put(dst, v, i8::to_le_bytes),
            Data::U8(v) => put(dst, v, u8::to_le_bytes),
            Data::I16(v) => put(dst, v, i16::to_le_bytes),
            Data::U16(v) => put(dst, v, u16::to_le_bytes),
            Data::U32(v) => put(dst, v, u32::to_le_bytes),
            Data::U64(v) => put(dst, v, u64::to_le_bytes),
        }
    }

    /// The inverse of `to_le_bytes`; `bytes` must hold exactly `ty.size_bytes()` bytes.
    pub fn from_le_bytes(ty: &TensorType, bytes: &[u8]) -> Tensor {
        debug_assert_eq!(bytes.len(), ty.size_bytes());
        // Each element from its own `N` little-endian bytes.
        fn each<T, const N: usize>(bytes: &[u8], from: fn([u8; N]) -> T) -> Vec<T> {
            bytes.chunks_exact(N).map(|c| from(c.try_into().expect("N bytes"))).collect()
        }
        let data = match ty.dtype {
            DType::F32 => Data::F32(each(bytes, f32::from_le_bytes)),
            DType::I32 => Data::I32(each(bytes, i32::from_le_bytes)),
            DType::I64 => Data::I64(each(bytes, i64::from_le_bytes)),
            DType::Bool => Data::Bool(bytes.iter().map(|&b| b != 0).collect()),
            DType::F16 => Data::F16(each(bytes, half::f16::from_le_bytes)),
            DType::BF16 => Data::BF16(each(bytes, half::bf16::from_le_bytes)),
            DType::I8 => Data::I8(each(bytes, i8::from_le_bytes)),
            DType::U8 => Data::U8(bytes.to_vec()),
            DType::I16 => Data::I16(each(bytes, i16::from_le_bytes)),
            DType::U16 => Data::U16(each(bytes, u16::from_le_bytes)),
            DType::U32 => Data::U32(each(bytes, u32::from_le_bytes)),
            DType::U64 => Data::U64(each(bytes, u64::from_le_bytes)),
        };
        Tensor::new(ty.shape.clone(), data)
    }

    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    /// Reads a `.npy` file: little-endian f4/f2/i1/i2/i4/i8/u1/u2/u4/u8/b1, C order. Anything else is refused
    /// with the reason, naming the file. The header is read and checked first, so that the
    /// file's size must match what it declares before the data is read.
    pub fn read_npy(path: &Path) -> Result<Tensor> {
        let file = path.display().to_string();
        let in_file = |e: Error| e.in_file(&file);
        if crate::file::is_stdio(path) {
            let bytes = crate::file::read_stdin(crate::budget::limit(), ".npy")?;
            return Tensor::from_npy_bytes(&bytes).map_err(in_file);
        }
        let (mut f, len) = crate::file::open(path, "").map_err(in_file)?;
        let mut prefix = [0u8; 12];
        let got = read_up_to(&mut f, &mut prefix).map_err(in_file)?;
        if !prefix.starts_with(NPY_MAGIC) {
            return Err(in_file(Error::new("not a valid .npy file: magic not found for NPY file")));
        }
        let offset = npy_data_offset(&prefix[..got]);
        if offset != usize::MAX && offset > MAX_NPY_HEADER {
            return Err(in_file(Error::new(format!(
                "the .npy header declares {offset} bytes, more than the {MAX_NPY_HEADER} meshc reads"
            ))));
        }
        // The header alone is read first: what it declares fixes the file's size, which
        // must match before the data is read.
        let header_len = (offset as u64).min(len);
        let mut all = crate::file::buffer(header_len, ".npy header").map_err(in_file)?;
        all.extend_from_slice(&prefix[..got]);
        let read_err = |e: std::io::Error| in_file(Error::new(format!("cannot read: {e}")));
        // A header that declares less than the prefix already read (length 0) has nothing more.
        (&mut f).take(header_len.saturating_sub(got as u64)).read_to_end(&mut all).map_err(read_err)?;
        let ty = npy_type(&all).map_err(in_file)?;
        let want = ty.checked_size_bytes().expect("checked by npy_type") as u64;
        check_npy_size(&ty, len.saturating_sub(offset as u64), want).map_err(in_file)?;
        all.try_reserve_exact(want as usize)
            .map_err(|_| in_file(Error::new(format!("cannot allocate {want} bytes for {ty}"))))?;
        (&mut f).take(want).read_to_end(&mut all).map_err(read_err)?;
        Tensor::from_npy_bytes(&all).map_err(in_file)
    }

    pub fn from_npy_bytes(bytes: &[u8]) -> Result<Tensor> {
        let ty = npy_type(bytes)?;
        let want = ty.checked_size_bytes().expect("checked by npy_type");
        check_npy_size(&ty, bytes.len().saturating_sub(npy_data_offset(bytes)) as u64, want as u64)?;
        let npy = npyz::NpyFile::new(bytes).map_err(|e| Error::new(format!("not a valid .npy file: {e}")))?;
        let corrupt = |e: std::io::Error| Error::new(format!("corrupt .npy data for {ty}: {e}"));
        let data = match ty.dtype {
            DType::F32 => Data::F32(npy.into_vec::<f32>().map_err(corrupt)?),
            DType::I32 => Data::I32(npy.into_vec::<i32>().map_err(corrupt)?),
            DType::I64 => Data::I64(npy.into_vec::<i64>().map_err(corrupt)?),
            DType::Bool => Data::Bool(npy.into_vec::<bool>().map_err(corrupt)?),
            DType::F16 => Data::F16(npy.into_vec::<half::f16>().map_err(corrupt)?),
            DType::BF16 => unreachable!("npy_type never gives bf16"),
            DType::I8 => Data::I8(npy.into_vec::<i8>().map_err(corrupt)?),
            DType::U8 => Data::U8(npy.into_vec::<u8>().map_err(corrupt)?),
            DType::I16 => Data::I16(npy.into_vec::<i16>().map_err(corrupt)?),
            DType::U16 => Data::U16(npy.into_vec::<u16>().map_err(corrupt)?),
            DType::U32 => Data::U32(npy.into_vec::<u32>().map_err(corrupt)?),
            DType::U64 => Data::U64(npy.into_vec::<u64>().map_err(corrupt)?),
        };
        let TensorType { shape, .. } = ty;
        Ok(Tensor::new(shape, data))
    }

    pub fn write_npy(&self, path: &Path) -> Result<()> {
        let file = path.display().to_string();
        std::fs::write(path, self.to_npy_bytes()).map_err(|e| Error::new(format!("cannot write: {e}")).in_file(file))
    }

    pub fn to_npy_bytes(&self) -> Vec<u8> {
        use npyz::WriterBuilder;
        let mut out = Vec::new();
        let shape: Vec<u64> = self.shape.iter().map(|&d| d as u64).collect();
        // Writing into a Vec cannot fail.
        fn write<T: npyz::AutoSerialize + Copy>(out: &mut Vec<u8>, shape: &[u64], v: &[T]) {
            let mut w =
                npyz::WriteOptions::new().default_dtype().shape(shape).writer(out).begin_nd().expect("in-memory npy");
            w.extend(v.iter().copied()).expect("in-memory npy");
            w.finish().expect("in-memory npy");
        }
        match &self.data {
            Data::F32(v) => write(&mut out, &shape, v),
            Data::I32(v) => write(&mut out, &shape, v),
            Data::I64(v) => write(&mut out, &shape, v),
            Data::Bool(v) => write(&mut out, &shape, v),
            Data::F16(v) => write(&mut out, &shape, v),
            // numpy has no bfloat16: stored widened to f32 (exactly).
            Data::BF16(v) => write(&mut out, &shape, &v.iter().map(|x| x.to_f32()).collect::<Vec<_>>()),
            Data::I8(v) => write(&mut out, &shape, v),
            Data::U8(v) => write(&mut out, &shape, v),
            Data::I16(v) => write(&mut out, &shape, v),
            Data::U16(v) => write(&mut out, &shape, v),
            Data::U32(v) => write(&mut out, &shape, v),
            Data::U64(v) => write(&mut out, &shape, v),
        }
        out
    }
}

/// The safetensors dtype of a meshc dtype (every one has one).
pub fn safetensors_dtype(d: DType) -> safetensors::Dtype {
    match d {
        DType::F32 => safetensors::Dtype::F32,
        DType::I32 => safetensors::Dtype::I32,
        DType::I64 => safetensors::Dtype::I64,
        DType::Bool => safetensors::Dtype::BOOL,
        DType::F16 => safetensors::Dtype::F16,
        DType::BF16 => safetensors::Dtype::BF16,
        DType::I8 => safetensors::Dtype::I8,
        DType::U8 => safetensors::Dtype::U8,
        DType::I16 => safetensors::Dtype::I16,
        DType::U16 => safetensors::Dtype::U16,
        DType::U32 => safetensors::Dtype::U32,
        DType::U64 => safetensors::Dtype::U64,
    }
}

/// A safetensors file holding `tensors` under their names, with `metadata` in its header.
pub fn safetensors_bytes(tensors: &[(&str, &Tensor)], metadata: Option<HashMap<String, String>>) -> Result<Vec<u8>> {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, t)| t.to_le_bytes()).collect();
    let st_err = |e: safetensors::SafeTensorError| Error::new(format!("cannot serialise the tensors: {e}"));
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, t), b)| {
            Ok((
                *n,
                safetensors::tensor::TensorView::new(safetensors_dtype(t.dtype()), t.shape.clone(), b)
                    .map_err(st_err)?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut out = safetensors::tensor::serialize(views, metadata).map_err(st_err)?;
    sort_metadata(&mut out);
    Ok(out)
}

/// Sorts the metadata of a safetensors file `serialize` wrote: it writes them in the order
/// of a `HashMap`, which differs from run to run, so that the same state gave other bytes
/// (checkpoints, training artifacts) once there was more than one entry.
fn sort_metadata(file: &mut [u8]) {
    let n = u64::from_le_bytes(file[..8].try_into().expect("8 bytes")) as usize;
    let header = &mut file[8..8 + n];
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(header) else { return };
    let Some(serde_json::Value::Object(meta)) = v.get_mut("__metadata__") else { return };
    let mut entries: Vec<(String, serde_json::Value)> = std::mem::take(meta).into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    *meta = entries.into_iter().collect();
    let sorted = serde_json::to_vec(&v).expect("JSON values serialize");
    // The same entries in another order: as long, padded alike.
    if sorted.len() <= n {
        header[..sorted.len()].copy_from_slice(&sorted);
        header[sorted.len()..].fill(b' ');
    }
}

#[cfg(test)]
mod closeness_tests {
    use super::*;

    #[test]
    fn the_same_tensors_and_metadata_give_the_same_safetensors_bytes() {
        let t = Tensor::f32(vec![2], vec![1.0, 2.0]);
        let bytes = || {
            let meta = (0..16).map(|i| (format!("key{i}"), format!("{i}"))).collect();
            safetensors_bytes(&[("t", &t)], Some(meta)).unwrap()
        };
        let first = bytes();
        assert!((0..8).all(|_| bytes() == first));
        let text = String::from_utf8_lossy(&first);
        assert!(text.contains(r#"{"key0":"0","key1":"1","key10":"10","key11":"11""#), "{text}");
    }

    #[test]
    fn nan_on_one_side_fails_and_is_counted() {
        let got = Tensor::f32(vec![3], vec![1.0, f32::NAN, f32::INFINITY]);
        let c = got.closeness(&Tensor::f32(vec![3], vec![f32::NAN, f32::NAN, f32::INFINITY]));
        assert_eq!((c.first_bad, c.nan_mismatches, c.max_abs_err), (Some(0), 1, 0.0));
        let c = got.closeness(&got.clone());
        assert_eq!((c.first_bad, c.nan_mismatches), (None, 0));
        let c = got.closeness(&Tensor::f32(vec![3], vec![1.0, f32::NAN, 1.0]));
        assert_eq!((c.first_bad, c.max_abs_err), (Some(2), f64::INFINITY));
    }
}
