//! `meshc._meshc`, the extension module of the meshc Python package: `load(path)` gives a
//! `Model` over `meshc_runtime::api` (one `Session`), called with numpy arrays. Inputs that
//! are C-contiguous with the model's dtype are read where they are; others are copied into
//! a contiguous array first (`numpy.ascontiguousarray`); a wrong dtype or shape is refused
//! with the runner's one line. Outputs are fresh numpy arrays the run writes into directly.
//! The GIL is released while the run goes on, so other Python threads keep running, and
//! several threads may call one model (their calls are queued on its runner).

use meshc_ir::DType;
use meshc_runtime::api::{Error, Session, TensorInfo, TensorView, TensorViewMut};
use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

create_exception!(_meshc, MeshcError, PyException, "A meshc error: its message is the one line meshc prints.");
create_exception!(
    _meshc,
    MismatchError,
    MeshcError,
    "A tensor that does not fit the graph: wrong name, dtype or shape, or a missing input."
);

fn py_err(e: Error) -> PyErr {
    match e {
        Error::Mismatch(_) => MismatchError::new_err(e.to_string()),
        _ => MeshcError::new_err(e.to_string()),
    }
}

/// numpy's name of a dtype (bf16: ml_dtypes' `bfloat16`).
fn numpy_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::Bool => "bool",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
    }
}

/// The meshc dtype of a numpy dtype, by name (`bfloat16` is ml_dtypes').
fn dtype_of(name: &str) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| numpy_name(d) == name)
}

/// A loaded artifact, ready to call.
#[pyclass(frozen, module = "meshc")]
struct Model {
    session: Session,
    inputs: Vec<TensorInfo>,
    outputs: Vec<TensorInfo>,
}

/// A buffer crossing into the run with the GIL released: numpy memory kept alive by the
/// arrays the caller's frame holds.
struct Raw(*mut u8, usize);

// SAFETY: the arrays stay referenced by the calling frame for the whole run.
unsafe impl Send for Raw {}

fn describe(py: Python<'_>, t: &[TensorInfo]) -> PyResult<Vec<Py<PyAny>>> {
    t.iter()
        .map(|t| {
            let shape = PyTuple::new(py, &t.shape)?;
            Ok((t.name.as_str(), numpy_name(t.dtype), shape, t.layout_text.as_str())
                .into_pyobject(py)?
                .into_any()
                .unbind())
        })
        .collect()
}

impl Model {
    /// The run: `inputs` by name, outputs as new numpy arrays.
    fn call<'py>(&self, py: Python<'py>, inputs: &Bound<'py, PyDict>) -> PyResult<Bound<'py, PyDict>> {
        let np = py.import("numpy")?;
        // The arrays as the run reads them: contiguous copies where needed, kept alive here.
        let mut held: Vec<(String, Bound<'py, PyUntypedArray>)> = Vec::new();
        for (k, v) in inputs.iter() {
            let name: String = k.extract()?;
            let arr = match v.downcast::<PyUntypedArray>() {
                Ok(a) if a.is_c_contiguous() => a.clone(),
                _ => np.call_method1("ascontiguousarray", (v,))?.downcast_into::<PyUntypedArray>()?,
            };
            held.push((name, arr));
        }
        let mut shapes: Vec<Vec<usize>> = Vec::new();
        let mut raw_in = Vec::new();
        for (name, a) in &held {
            let dname = a.dtype().str()?.to_string();
            let dtype = dtype_of(&dname).ok_or_else(|| {
                MismatchError::new_err(format!("input '{name}' is a numpy {dname} array, which meshc does not take"))
            })?;
            shapes.push(a.shape().to_vec());
            // SAFETY: a C-contiguous array's data pointer covers its nbytes.
            let ptr = unsafe { (*a.as_array_ptr()).data.cast::<u8>() };
            raw_in.push((name.as_str(), dtype, Raw(ptr, a.len() * a.dtype().itemsize())));
        }
        let out = PyDict::new(py);
        let mut raw_out = Vec::new();
        for o in &self.outputs {
            let arr = np.call_method1("empty", (PyTuple::new(py, &o.shape)?, output_dtype(py, o.dtype)?))?;
            let a = arr.downcast::<PyUntypedArray>()?;
            // SAFETY: a fresh C-contiguous array of the output's bytes.
            let ptr = unsafe { (*a.as_array_ptr()).data.cast::<u8>() };
            raw_out.push(Raw(ptr, a.len() * a.dtype().itemsize()));
            out.set_item(&o.name, &arr)?;
        }
        let session = &self.session;
        let outputs = &self.outputs;
        py.detach(move || {
            let views = (raw_in.iter().zip(&shapes))
                .map(|((n, d, Raw(p, len)), s)| {
                    let bytes: &[u8] = if *len == 0 { &[] } else { unsafe { std::slice::from_raw_parts(*p, *len) } };
                    TensorView::from_bytes(*d, s, bytes).map(|v| (*n, v))
                })
                .collect::<Result<Vec<_>, Error>>()?;
            let mut dst = (outputs.iter().zip(&raw_out))
                .map(|(o, Raw(p, len))| {
                    let bytes: &mut [u8] =
                        if *len == 0 { &mut [] } else { unsafe { std::slice::from_raw_parts_mut(*p, *len) } };
                    TensorViewMut::from_bytes(o.dtype, &o.shape, bytes).map(|v| (o.name.as_str(), v))
                })
                .collect::<Result<Vec<_>, Error>>()?;
            session.run_into(&views, &mut dst)
        })
        .map_err(py_err)?;
        Ok(out)
    }
}

/// The numpy dtype of an output: bf16 as ml_dtypes' bfloat16 where installed, else its bits
/// as uint16.
fn output_dtype(py: Python<'_>, d: DType) -> PyResult<Bound<'_, PyAny>> {
    if d == DType::BF16 {
        return match py.import("ml_dtypes") {
            Ok(m) => m.getattr("bfloat16"),
            Err(_) => Ok(pyo3::types::PyString::new(py, "uint16").into_any()),
        };
    }
    Ok(pyo3::types::PyString::new(py, numpy_name(d)).into_any())
}

#[pymethods]
impl Model {
    /// The inputs: (name, dtype, shape, layout over the mesh) each.
    #[getter]
    fn inputs(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        describe(py, &self.inputs)
    }

    /// The outputs, as `inputs`.
    #[getter]
    fn outputs(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        describe(py, &self.outputs)
    }

    /// `model.run({"x": array})`: every output by name.
    fn run<'py>(&self, py: Python<'py>, inputs: &Bound<'py, PyDict>) -> PyResult<Bound<'py, PyDict>> {
        self.call(py, inputs)
    }

    /// `model(x=array)`: as `run`.
    #[pyo3(signature = (**inputs))]
    fn __call__<'py>(&self, py: Python<'py>, inputs: Option<&Bound<'py, PyDict>>) -> PyResult<Bound<'py, PyDict>> {
        self.call(py, &inputs.cloned().unwrap_or_else(|| PyDict::new(py)))
    }

    fn __repr__(&self) -> String {
        let names = |t: &[TensorInfo]| t.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ");
        format!("meshc.Model(inputs: {}; outputs: {})", names(&self.inputs), names(&self.outputs))
    }
}

/// `meshc.load(path)`: opens the artifact (every checksum verified) and makes it ready to call.
#[pyfunction]
fn load(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Model> {
    py.detach(|| {
        let model = meshc_runtime::api::Model::open(&path)?;
        let session = Session::new(&model)?;
        Ok(Model { session, inputs: model.inputs().to_vec(), outputs: model.outputs().to_vec() })
    })
    .map_err(py_err)
}

#[pymodule]
fn _meshc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add("MeshcError", m.py().get_type::<MeshcError>())?;
    m.add("MismatchError", m.py().get_type::<MismatchError>())?;
    Ok(())
}
