//! `meshc._meshc`, the extension module of the meshc Python package: `load(path)` gives a
//! `Model` over `meshc_runtime::api` (one `Session`), called with numpy arrays. Inputs that
//! are C-contiguous with the model's dtype are read where they are; others are copied into
//! a contiguous array first (`numpy.ascontiguousarray`); a wrong dtype or shape is refused
//! with the runner's one line. Outputs are fresh numpy arrays the run writes into directly.
//! The GIL is released while the run goes on, so other Python threads keep running, and
//! several threads may call one model (their calls are queued on its runner).

use std::collections::BTreeMap;
use std::ffi::c_int;

use meshc::command::{compile_cmd, CodegenArgs, PilotArgs};
use meshc::pipeline::{Dumps, Instrument};
use meshc_ir::{DType, Tensor};
use meshc_runtime::api::{Error, GenerateOptions, Sampling, Session, TensorInfo, TensorView, TensorViewMut};
use meshc_runtime::tools::steps::State;
use numpy::npyffi::{npy_intp, NpyTypes, PyArray_Descr, PY_ARRAY_API};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyTuple};

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
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::I16 => "int16",
        DType::U16 => "uint16",
        DType::U32 => "uint32",
        DType::U64 => "uint64",
    }
}

/// The numpy dtype that carries a meshc dtype: bf16 as ml_dtypes' `bfloat16` where that
/// package is installed, else as `uint16` holding the bits.
fn descr_of(py: Python<'_>, d: DType) -> PyResult<Py<PyArrayDescr>> {
    let descr = match d {
        DType::F32 => numpy::dtype::<f32>(py),
        DType::I32 => numpy::dtype::<i32>(py),
        DType::I64 => numpy::dtype::<i64>(py),
        DType::Bool => numpy::dtype::<bool>(py),
        DType::F16 => numpy::dtype::<half::f16>(py),
        DType::I8 => numpy::dtype::<i8>(py),
        DType::U8 => numpy::dtype::<u8>(py),
        DType::I16 => numpy::dtype::<i16>(py),
        DType::U16 => numpy::dtype::<u16>(py),
        DType::U32 => numpy::dtype::<u32>(py),
        DType::U64 => numpy::dtype::<u64>(py),
        DType::BF16 => match py.import("ml_dtypes") {
            Ok(m) => PyArrayDescr::new(py, m.getattr("bfloat16")?)?,
            Err(_) => numpy::dtype::<u16>(py),
        },
    };
    Ok(descr.unbind())
}

/// An input or output as calls see it, prepared at load so that a call does no lookup by
/// text: its name as an interned Python string (a keyword written in code is that very
/// object, so finding an input is a pointer comparison), the numpy dtype that carries it,
/// and its shape as numpy takes it.
struct Port {
    info: TensorInfo,
    name: Py<PyString>,
    descr: Py<PyArrayDescr>,
    dims: Vec<npy_intp>,
    /// An output that is a training artifact's next state (`next.S` of a state input S),
    /// which a step keeps on the devices.
    next_state: bool,
}

impl Port {
    fn new(py: Python<'_>, info: &TensorInfo, state: &[String]) -> PyResult<Port> {
        let dims = info.shape.iter().map(|&d| d as npy_intp).collect();
        let next_state = state.iter().any(|s| meshc_ir::optim::next_name(s) == info.name);
        Ok(Port {
            name: PyString::intern(py, &info.name).unbind(),
            descr: descr_of(py, info.dtype)?,
            dims,
            next_state,
            info: info.clone(),
        })
    }
}

/// A loaded artifact, ready to call.
#[pyclass(frozen, module = "meshc")]
struct Model {
    session: Session,
    inputs: Vec<Port>,
    outputs: Vec<Port>,
    /// Every dtype meshc has with its numpy dtype, to name what an input holds.
    dtypes: Vec<(DType, Py<PyArrayDescr>)>,
    /// A training artifact's state inputs (`meshc_runtime::api::Model::state_names`).
    state: Vec<String>,
    /// The artifact's path, as errors name it.
    file: String,
}

/// `meshc.TensorInfo`, what `Model.inputs` and `Model.outputs` list: a named tuple, so that
/// `info.dims` reads as well as `name, dtype, shape, layout, dims = info`.
fn tensor_info_type(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static TYPE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let ty = TYPE.get_or_try_init(py, || {
        let fields = ["name", "dtype", "shape", "layout", "dims"];
        let kwargs = PyDict::new(py);
        kwargs.set_item("module", "meshc")?;
        let namedtuple = py.import("collections")?.getattr("namedtuple")?;
        Ok::<_, PyErr>(namedtuple.call(("TensorInfo", fields), Some(&kwargs))?.unbind())
    })?;
    Ok(ty.bind(py))
}

fn describe(py: Python<'_>, ports: &[Port]) -> PyResult<Vec<Py<PyAny>>> {
    let ty = tensor_info_type(py)?;
    ports
        .iter()
        .map(|p| {
            let t = &p.info;
            let shape = PyTuple::new(py, &t.shape)?;
            let dims = PyTuple::new(py, t.dims.iter().map(Option::as_deref))?;
            Ok(ty.call1((t.name.as_str(), numpy_name(t.dtype), shape, t.layout_text.as_str(), dims))?.unbind())
        })
        .collect()
}

/// An input of a call: which of the model's it names (or the name it was given, for the
/// runner to refuse), and the array that holds it, C-contiguous.
struct Arg<'py> {
    port: Result<usize, String>,
    array: Bound<'py, PyUntypedArray>,
}

impl Model {
    /// The arrays of `inputs` by the model's inputs they name, C-contiguous.
    fn args<'py>(&self, py: Python<'py>, inputs: Option<&Bound<'py, PyDict>>) -> PyResult<Vec<Arg<'py>>> {
        let mut args = Vec::with_capacity(self.inputs.len());
        for (k, v) in inputs.into_iter().flat_map(|d| d.iter()) {
            let port = match self.inputs.iter().position(|p| p.name.as_ptr() == k.as_ptr()) {
                Some(i) => Ok(i),
                None => {
                    let name = k.downcast::<PyString>()?.to_cow()?;
                    self.inputs.iter().position(|p| p.info.name == name).ok_or_else(|| name.into_owned())
                }
            };
            let array = match v.downcast::<PyUntypedArray>() {
                Ok(a) if a.is_c_contiguous() => a.clone(),
                _ => py.import("numpy")?.call_method1("ascontiguousarray", (v,))?.downcast_into::<PyUntypedArray>()?,
            };
            args.push(Arg { port, array });
        }
        Ok(args)
    }

    /// `args` as the run reads them, where they are.
    fn views<'a>(&'a self, args: &'a [Arg<'_>]) -> PyResult<Vec<(&'a str, TensorView<'a>)>> {
        let mut views = Vec::with_capacity(args.len());
        for arg in args {
            let name = match &arg.port {
                Ok(i) => self.inputs[*i].info.name.as_str(),
                Err(name) => name.as_str(),
            };
            let dtype = self.dtype(arg, name)?;
            // SAFETY: a C-contiguous array's data covers its nbytes; `args` keeps it alive
            // while the views are.
            let bytes = unsafe { array_bytes(&arg.array) };
            views.push((name, TensorView::from_bytes(dtype, arg.array.shape(), bytes).map_err(py_err)?));
        }
        Ok(views)
    }

    /// A run (or with `step`, a training step: its outputs but the next state), `inputs`
    /// by name, outputs as new numpy arrays.
    fn call<'py>(
        &self,
        py: Python<'py>,
        inputs: Option<&Bound<'py, PyDict>>,
        step: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let args = self.args(py, inputs)?;
        let views = self.views(&args)?;
        let session = &self.session;
        if !step && session.loaded().meta.symbolic.is_some() {
            // Over symbolic dims each call decides its outputs' shapes: the session makes
            // them, and they are copied into arrays of those shapes.
            let tensors = py.detach(move || session.run(&views)).map_err(py_err)?;
            return self.arrays(py, &tensors);
        }
        let out = PyDict::new(py);
        let mut dst = Vec::with_capacity(self.outputs.len());
        for o in self.outputs.iter().filter(|o| !(step && o.next_state)) {
            let array = empty(py, &o.descr, &o.dims)?;
            // SAFETY: a fresh C-contiguous array, referenced by `out` until the run has returned.
            let bytes = unsafe { array_bytes(&array) };
            dst.push((
                o.info.name.as_str(),
                TensorViewMut::from_bytes(o.info.dtype, &o.info.shape, bytes).map_err(py_err)?,
            ));
            out.set_item(o.name.bind(py), array)?;
        }
        py.detach(move || match step {
            false => session.run_into(&views, &mut dst),
            true => session.step_into(&views, &mut dst),
        })
        .map_err(py_err)?;
        Ok(out)
    }

    /// Host tensors as new numpy arrays, by name.
    fn arrays<'py>(&self, py: Python<'py>, tensors: &BTreeMap<String, Tensor>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for (name, t) in tensors {
            let descr = &self.dtypes.iter().find(|(d, _)| *d == t.dtype()).expect("every dtype has its numpy dtype").1;
            let dims: Vec<npy_intp> = t.shape.iter().map(|&d| d as npy_intp).collect();
            let array = empty(py, descr, &dims)?;
            // SAFETY: a fresh C-contiguous array of the tensor's bytes, nowhere else yet.
            unsafe { array_bytes(&array) }.copy_from_slice(meshc_runtime::exec::io::le_bytes(t));
            out.set_item(name, array)?;
        }
        Ok(out)
    }

    /// The meshc dtype of an input's array: the model's for that input when the array has
    /// it (a pointer comparison for numpy's own dtypes), else whichever it has.
    fn dtype(&self, arg: &Arg<'_>, name: &str) -> PyResult<DType> {
        let have = arg.array.dtype();
        let py = arg.array.py();
        if let Ok(i) = arg.port {
            if have.is_equiv_to(self.inputs[i].descr.bind(py)) {
                return Ok(self.inputs[i].info.dtype);
            }
        }
        match self.dtypes.iter().find(|(_, d)| have.is_equiv_to(d.bind(py))) {
            Some((d, _)) => Ok(*d),
            None => Err(MismatchError::new_err(format!(
                "input '{name}' is a numpy {} array, which meshc does not take",
                have.str()?
            ))),
        }
    }
}

/// A new C-contiguous numpy array of dtype `descr` and shape `dims`, its memory not yet
/// written.
fn empty<'py>(py: Python<'py>, descr: &Py<PyArrayDescr>, dims: &[npy_intp]) -> PyResult<Bound<'py, PyUntypedArray>> {
    // SAFETY: numpy's array constructor with a dtype reference of our own (it steals one),
    // a shape of `dims.len()` dims, no strides and no data (numpy allocates C-order).
    unsafe {
        let descr = descr.clone_ref(py).into_ptr().cast::<PyArray_Descr>();
        let ptr = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            PY_ARRAY_API.get_type_object(py, NpyTypes::PyArray_Type),
            descr,
            dims.len() as c_int,
            dims.as_ptr().cast_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
        );
        Ok(Bound::from_owned_ptr_or_err(py, ptr)?.downcast_into_unchecked())
    }
}

/// The bytes of a C-contiguous array.
///
/// # Safety
/// `a` is C-contiguous; the slice is used only while `a` is alive and nothing else writes it.
unsafe fn array_bytes<'a>(a: &Bound<'_, PyUntypedArray>) -> &'a mut [u8] {
    let len = a.len() * a.dtype().itemsize();
    if len == 0 {
        return &mut [];
    }
    // SAFETY: the caller's contract; the data pointer covers the array's `len` bytes.
    unsafe { std::slice::from_raw_parts_mut((*a.as_array_ptr()).data.cast::<u8>(), len) }
}

#[pymethods]
impl Model {
    /// The inputs, a `TensorInfo(name, dtype, shape, layout, dims)` each: `layout` over the
    /// mesh (`[data, -]`), `dims` the names the graph gives the dimensions (None: unnamed).
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
        self.call(py, Some(inputs), false)
    }

    /// `model(x=array)`: as `run`.
    #[pyo3(signature = (**inputs))]
    fn __call__<'py>(&self, py: Python<'py>, inputs: Option<&Bound<'py, PyDict>>) -> PyResult<Bound<'py, PyDict>> {
        self.call(py, inputs, false)
    }

    /// A training artifact's state: the inputs a step reads from the devices and replaces
    /// there (parameters, optimizer moments). Empty for an inference artifact.
    #[getter]
    fn state_names(&self) -> Vec<String> {
        self.state.clone()
    }

    /// The state compiled into a training artifact (its initial parameters and optimizer
    /// state), as numpy arrays by name.
    fn initial_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let init = State::initial(self.session.loaded(), &self.file)
            .map_err(|e| MeshcError::new_err(meshc_runtime::api::error::one_line(&e)))?
            .ok_or_else(|| MeshcError::new_err(format!("{}: the artifact holds no state", self.file)))?;
        self.arrays(py, &init.tensors)
    }

    /// `model.set_state(model.initial_state())`: puts every state tensor (by name, numpy
    /// arrays, copied) on the devices; the next `step` starts from it.
    fn set_state(&self, py: Python<'_>, state: &Bound<'_, PyDict>) -> PyResult<()> {
        let args = self.args(py, Some(state))?;
        let tensors: BTreeMap<String, Tensor> =
            self.views(&args)?.iter().map(|(n, v)| (n.to_string(), v.to_tensor())).collect();
        py.detach(|| self.session.set_state(&tensors)).map_err(py_err)
    }

    /// The state on the devices, as numpy arrays by name (what a checkpoint holds).
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let state = py.detach(|| self.session.state()).map_err(py_err)?;
        self.arrays(py, &state)
    }

    /// `model.step(x=batch, ...)`: one training step on the batch (every input that is not
    /// state); the state on the devices is read and replaced, the other outputs (the loss)
    /// returned.
    #[pyo3(signature = (**inputs))]
    fn step<'py>(&self, py: Python<'py>, inputs: Option<&Bound<'py, PyDict>>) -> PyResult<Bound<'py, PyDict>> {
        self.call(py, inputs, true)
    }

    /// `model.generate(prompt, max_new_tokens, context, sample="greedy", seed=0, stop=(),
    /// prefill=None)`: the new ids a decode-step artifact gives after each row of `prompt`
    /// (integer token ids, [batch, prompt_len]), as int64 [batch, steps] with -1 after a
    /// sequence's stop id. `sample` is greedy, temperature:T, top-k:K or top-p:P; `prefill`,
    /// a loaded prefill artifact that runs the prompt in one call (docs/generation.md).
    #[pyo3(signature = (prompt, max_new_tokens, context, sample = "greedy", seed = 0, stop = Vec::new(), prefill = None))]
    #[allow(clippy::too_many_arguments)]
    fn generate<'py>(
        &self,
        py: Python<'py>,
        prompt: &Bound<'py, PyAny>,
        max_new_tokens: usize,
        context: usize,
        sample: &str,
        seed: u64,
        stop: Vec<i64>,
        prefill: Option<PyRef<'py, Model>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let rows: Vec<Vec<i64>> = match prompt.hasattr("tolist")? {
            true => prompt.call_method0("tolist")?.extract()?,
            false => prompt.extract()?,
        };
        let sampling = sample.parse::<Sampling>().map_err(MeshcError::new_err)?;
        let options = GenerateOptions { max_new_tokens, context, sampling, seed, stop };
        let prefill = prefill.as_deref().map(|p| &p.session);
        let generated = py
            .detach(|| match prefill {
                Some(p) => self.session.generate_with_prefill(p, &rows, &options),
                None => self.session.generate(&rows, &options),
            })
            .map_err(py_err)?;
        let ids = self.arrays(py, &BTreeMap::from([("ids".to_string(), generated.to_tensor())]))?;
        Ok(ids.get_item("ids")?.expect("just put there"))
    }

    fn __repr__(&self) -> String {
        let names = |t: &[Port]| t.iter().map(|t| t.info.name.as_str()).collect::<Vec<_>>().join(", ");
        format!("meshc.Model(inputs: {}; outputs: {})", names(&self.inputs), names(&self.outputs))
    }
}

/// `meshc.load(path)`: opens the artifact (every checksum verified) and makes it ready to call.
#[pyfunction]
fn load(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Model> {
    let (model, session) = py
        .detach(|| {
            let model = meshc_runtime::api::Model::open(&path)?;
            let session = Session::new(&model)?;
            Ok((model, session))
        })
        .map_err(py_err)?;
    let state = model.state_names();
    let ports = |t: &[TensorInfo]| t.iter().map(|t| Port::new(py, t, &state)).collect::<PyResult<Vec<_>>>();
    let dtypes = DType::ALL.into_iter().map(|d| Ok((d, descr_of(py, d)?))).collect::<PyResult<_>>()?;
    let file = path.display().to_string();
    Ok(Model { session, inputs: ports(model.inputs())?, outputs: ports(model.outputs())?, dtypes, state, file })
}

/// The flags `meshc.compile` takes: those of `meshc compile` that shape the artifact.
#[derive(clap::Parser)]
#[command(name = "meshc.compile", no_binary_name = true)]
struct CompileFlags {
    #[command(flatten)]
    codegen: CodegenArgs,
    #[command(flatten)]
    pilot: PilotArgs,
}

/// `meshc.compile(graph, output, flags)`: compiles the graph file or ONNX model `graph` into
/// the artifact `output` in this process, as `meshc compile GRAPH -o OUTPUT FLAGS...` does
/// (the same steps, the same artifact, the same one-line errors).
#[pyfunction]
fn compile(py: Python<'_>, graph: std::path::PathBuf, output: std::path::PathBuf, flags: Vec<String>) -> PyResult<()> {
    let flags = <CompileFlags as clap::Parser>::try_parse_from(&flags).map_err(|e| {
        let text = e.to_string();
        MeshcError::new_err(text.lines().next().unwrap_or_default().trim_start_matches("error: ").to_string())
    })?;
    py.detach(|| {
        let dumps = Dumps::default();
        let inst = Instrument::dumps(&dumps);
        compile_cmd(&graph, Some(&output), &flags.codegen, None, &inst, &flags.pilot, None)
    })
    .map_err(|e| MeshcError::new_err(meshc_runtime::api::error::one_line(&e)))
}

#[pymodule]
fn _meshc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add("MeshcError", m.py().get_type::<MeshcError>())?;
    m.add("MismatchError", m.py().get_type::<MismatchError>())?;
    m.add("TensorInfo", tensor_info_type(m.py())?)?;
    Ok(())
}
