//! Param data: turns each param's source (a `.npy`/`.safetensors` file or checkpoint index
//! relative to the graph, read through `WeightFiles`; a seeded initialiser; an inline value)
//! into a `Tensor` of its declared type, refusing any mismatch with the file and param named.

use std::collections::HashMap;
use std::path::Path;

use crate::attr::Attr;
use crate::dtype::{DType, ShapeDisplay};
use crate::error::{Error, Result};
use crate::graph::{Graph, Param, ParamData};
use crate::init;
use crate::tensor::{Data, Tensor};
use crate::weights::{View, WeightFiles};

/// Converts an inline `value` literal (a scalar or nested lists) into a tensor of the
/// param's declared type.
pub fn inline_value(p: &Param, v: &Attr) -> Result<Tensor> {
    let at = |msg: String| Error::at(p.loc, format!("param '{}': {msg}", p.name));
    let mut flat = Vec::new();
    fn walk<'a>(
        v: &'a Attr,
        shape: &[usize],
        depth: usize,
        flat: &mut Vec<&'a Attr>,
    ) -> std::result::Result<(), String> {
        match (shape.first(), v) {
            (None, Attr::List(_)) => Err(format!("value is nested deeper than the rank {depth}")),
            (None, scalar) => {
                flat.push(scalar);
                Ok(())
            }
            (Some(&n), Attr::List(items)) if items.len() == n => {
                items.iter().try_for_each(|item| walk(item, &shape[1..], depth + 1, flat))
            }
            (Some(&n), Attr::List(items)) => {
                Err(format!("value has {} entries at depth {depth}, the shape says {n}", items.len()))
            }
            (Some(_), other) => {
                Err(format!("value has a {} at depth {depth} where the shape needs a list", other.kind()))
            }
        }
    }
    walk(v, &p.ty.shape, 0, &mut flat).map_err(|e| at(format!("{e} (shape {})", ShapeDisplay(&p.ty.shape))))?;
    let bad = |a: &Attr| at(format!("value entry {a} is not a valid {}", p.ty.dtype));
    let data = match p.ty.dtype {
        // A number beyond f32's range would silently become infinite.
        DType::F32 => Data::F32(
            flat.iter()
                .map(|a| a.as_float().map(|x| x as f32).filter(|x| x.is_finite()).ok_or_else(|| bad(a)))
                .collect::<Result<_>>()?,
        ),
        DType::I32 => Data::I32(ints(&flat, bad)?),
        DType::I64 => Data::I64(ints(&flat, bad)?),
        DType::I8 => Data::I8(ints(&flat, bad)?),
        DType::U8 => Data::U8(ints(&flat, bad)?),
        DType::I16 => Data::I16(ints(&flat, bad)?),
        DType::U16 => Data::U16(ints(&flat, bad)?),
        DType::U32 => Data::U32(ints(&flat, bad)?),
        DType::U64 => Data::U64(ints(&flat, bad)?),
        DType::Bool => Data::Bool(flat.iter().map(|a| a.as_bool().ok_or_else(|| bad(a))).collect::<Result<_>>()?),
        // Rounded to the half type; a number beyond its range is refused like one beyond f32's.
        DType::F16 | DType::BF16 => {
            let v = flat.iter().map(|a| a.as_float().ok_or_else(|| bad(a))).collect::<Result<Vec<f64>>>()?;
            let data = Data::from_f64(p.ty.dtype, v);
            if let Some(i) = data.to_f64().iter().position(|x| !x.is_finite()) {
                return Err(bad(flat[i]));
            }
            data
        }
    };
    Ok(Tensor::new(p.ty.shape.clone(), data))
}

/// Integer entries, each in the range of `T` (an inline value is an i64 literal).
fn ints<T: TryFrom<i64>>(flat: &[&Attr], bad: impl Fn(&Attr) -> Error) -> Result<Vec<T>> {
    flat.iter().map(|a| a.as_int().and_then(|i| T::try_from(i).ok()).ok_or_else(|| bad(a))).collect()
}

/// The view of a file-backed param, checked against its declaration. Errors point at the
/// param (its line:col in a text graph) and name the data file as the graph spells it.
fn file_view<'a>(p: &Param, files: &'a mut WeightFiles, path: &str, key: Option<&str>) -> Result<View<'a>> {
    let fail = |msg: String| Error::at(p.loc, format!("param '{}': {msg}", p.name));
    let v = files.view(path, key).map_err(|e| {
        let file = e.file.clone().unwrap_or_else(|| path.to_string());
        fail(format!("{file}: {}", e.msg))
    })?;
    if v.ty != p.ty {
        return Err(fail(format!("{path} holds {}, the graph declares {}", v.ty, p.ty)));
    }
    // The artifact stores a file's bytes as they are, and compiled code takes a bool byte
    // as nonzero in its vector loops but as 0/1 in their scalar tails: any other byte would
    // give results that depend on where an element falls (the `.npy` reader refuses such
    // inputs alike).
    if v.ty.dtype == DType::Bool {
        let bytes = v.bytes().map_err(|e| fail(format!("{path}: {}", e.msg)))?;
        if let Some((i, b)) = bytes.iter().enumerate().find(|&(_, &b)| b > 1) {
            return Err(fail(format!("{path}: element {i} of its bool data is the byte {b}, not 0 or 1")));
        }
    }
    Ok(v)
}

/// The values of a param the graph itself gives (an inline `value`, a seeded `init`);
/// `None` for a file-backed one.
fn from_graph(p: &Param) -> Option<Result<Tensor>> {
    let fail = |msg: String| Error::at(p.loc, format!("param '{}': {msg}", p.name));
    match &p.data {
        ParamData::Value(v) => Some(inline_value(p, v)),
        ParamData::Init(i) => Some(init::materialize(i, &p.ty).map_err(|e| fail(e.msg)).and_then(|t| {
            // NaN or infinite parameters (or a mean beyond f32's range) give values no
            // graph wants; they would only show up as NaN outputs far from the cause.
            let float = matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16);
            if float && t.data.iter_f64().any(|x| !x.is_finite()) {
                let msg =
                    format!("its init gives values that are not finite {} numbers (check its parameters)", t.dtype());
                return Err(fail(msg));
            }
            Ok(t)
        })),
        ParamData::File { .. } => None,
    }
}

/// Loads one param, its files through `files`; the caller adds the graph file's name.
pub fn load_param(p: &Param, files: &mut WeightFiles) -> Result<Tensor> {
    if let ParamData::File { path, key } = &p.data {
        let v = file_view(p, files, path, key.as_deref())?;
        return Ok(Tensor::from_le_bytes(&v.ty, &v.bytes()?));
    }
    from_graph(p).expect("every other param the graph gives")
}

/// Loads every param of `g`, reading its files (relative to `base`) through `files`.
pub fn load_all_from(g: &Graph, files: &mut WeightFiles) -> Result<HashMap<String, Tensor>> {
    g.params.iter().map(|p| Ok((p.name.clone(), load_param(p, files)?))).collect()
}

/// "N NaN and M infinite values of T" when a float tensor holds values that are not finite.
pub fn non_finite(t: &Tensor) -> Option<String> {
    if !matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        return None;
    }
    let (mut nan, mut inf) = (0usize, 0usize);
    for x in t.data.iter_f64() {
        nan += x.is_nan() as usize;
        inf += x.is_infinite() as usize;
    }
    (nan + inf > 0).then(|| format!("{nan} NaN and {inf} infinite values of {}", t.data.len()))
}

/// One line per float param holding a NaN, naming it and counting its NaNs and infinities,
/// for the commands to print as warnings. A NaN weight is valid ONNX (onnxruntime runs it),
/// so it is not refused; but it is almost always a corrupt or diverged checkpoint, whose
/// outputs would turn NaN far from the cause. Infinities alone are not reported: masks
/// hold −∞ on purpose. (A param being trained must be finite: `train` refuses it.)
pub fn nan_warnings(g: &Graph, params: &Params) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for p in g.params.iter().filter(|p| matches!(p.ty.dtype, DType::F32 | DType::F16 | DType::BF16)) {
        let t = params.get(p)?;
        if t.data.iter_f64().any(f64::is_nan) {
            let what = non_finite(&t).expect("a NaN is not finite");
            out.push(format!("param '{}' holds {what}", crate::error::shorten(&p.name)));
        }
    }
    Ok(out)
}

/// Loads every param of `g`; `base` is the directory of the graph file.
pub fn load_all(g: &Graph, base: &Path) -> Result<HashMap<String, Tensor>> {
    load_all_from(g, &mut WeightFiles::new(base))
}

/// Opens the weight files of every file-backed param of `g` and checks each param against
/// its declaration from the file's header, without copying data.
pub fn open_files(g: &Graph, files: &mut WeightFiles) -> Result<()> {
    for p in &g.params {
        if let ParamData::File { path, key } = &p.data {
            file_view(p, files, path, key.as_deref())?;
        }
    }
    Ok(())
}

/// The values of a graph's params as the compiler reads them: tensors already loaded
/// (inline values, initialisers, pruned weights — anything in `loaded`), else views of
/// the open weight files, turned into a tensor only where one is needed. A weight that
/// goes into an artifact unchanged is read from its file when the artifact's weights are
/// written, instead of living as a tensor through the whole compile.
pub struct Params<'a> {
    pub loaded: std::borrow::Cow<'a, HashMap<String, Tensor>>,
    /// Opened (`open_files`) for every file-backed param not in `loaded`.
    pub files: Option<&'a WeightFiles>,
}

impl<'a> From<&'a HashMap<String, Tensor>> for Params<'a> {
    fn from(loaded: &'a HashMap<String, Tensor>) -> Self {
        Params { loaded: std::borrow::Cow::Borrowed(loaded), files: None }
    }
}

impl<'a> From<&'a Params<'a>> for Params<'a> {
    fn from(p: &'a Params<'a>) -> Self {
        Params { loaded: std::borrow::Cow::Borrowed(&*p.loaded), files: p.files }
    }
}

impl<'a> Params<'a> {
    /// The params of `g` that are not file-backed loaded, the others left to `files`
    /// (which `open_files` has opened and checked).
    pub fn lazy(g: &Graph, files: &'a WeightFiles) -> Result<Params<'a>> {
        let loaded = (g.params.iter())
            .filter_map(|p| from_graph(p).map(|t| t.map(|t| (p.name.clone(), t))))
            .collect::<Result<HashMap<_, _>>>()?;
        Ok(Params { loaded: std::borrow::Cow::Owned(loaded), files: Some(files) })
    }

    /// Where `p`'s little-endian bytes lie in its file, when it is read from a file and
    /// not loaded.
    pub fn file_view(&self, p: &Param) -> Option<View<'_>> {
        match (&p.data, self.files) {
            (ParamData::File { path, key }, Some(files)) if !self.loaded.contains_key(&p.name) => {
                files.get(path, key.as_deref()).ok()
            }
            _ => None,
        }
    }

    /// The value of `p` (an inline value is read from the graph).
    pub fn get(&self, p: &Param) -> Result<std::borrow::Cow<'_, Tensor>> {
        if let Some(t) = self.loaded.get(&p.name) {
            return Ok(std::borrow::Cow::Borrowed(t));
        }
        match (&p.data, self.files) {
            (ParamData::Value(v), _) => Ok(std::borrow::Cow::Owned(inline_value(p, v)?)),
            (ParamData::File { path, key }, Some(files)) => {
                let v = files.get(path, key.as_deref())?;
                Ok(std::borrow::Cow::Owned(Tensor::from_le_bytes(&v.ty, &v.bytes()?)))
            }
            _ => Err(Error::new(format!("no value for param '{}'", p.name))),
        }
    }

    /// Every param of `g` as a tensor (for the passes that compute on all of them).
    pub fn all(&self, g: &Graph) -> Result<std::borrow::Cow<'_, HashMap<String, Tensor>>> {
        if self.files.is_none() {
            return Ok(std::borrow::Cow::Borrowed(&*self.loaded));
        }
        let all = g.params.iter().map(|p| Ok((p.name.clone(), self.get(p)?.into_owned()))).collect::<Result<_>>()?;
        Ok(std::borrow::Cow::Owned(all))
    }
}
