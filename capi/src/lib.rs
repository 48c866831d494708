//! The C ABI of the meshc runtime (capi/include/meshc.h, generated from this file by
//! cbindgen): opaque handles over `meshc_runtime::api`'s `Model` and `Session`, a status per
//! call with its message kept per thread, every panic caught at the boundary.
//!
//! A handle is not a pointer to memory but a number the library hands out once and never
//! again: every call looks it up in the table of live handles and takes a reference to what
//! it names. So a handle freed while a call on it runs in another thread is freed when that
//! call returns, and a freed handle (or a pointer that never was one) is refused with
//! MESHC_CLOSED instead of being read.
#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use meshc_ir::DType;
use meshc_ir::Tensor;
use meshc_runtime::api::{Error, Model, Session, TensorView, TensorViewMut};

/// What a call did: MESHC_OK, or the kind of its failure (meshc_last_error() has the message).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum meshc_status {
    MESHC_OK = 0,
    /// A NULL handle or pointer where one is required.
    MESHC_NULL = 1,
    /// An argument that is not valid: a path or name not UTF-8, an unknown dtype number, an
    /// index out of range.
    MESHC_INVALID = 2,
    /// The artifact could not be opened, verified or loaded.
    MESHC_OPEN = 3,
    /// A tensor that does not fit the graph: wrong name, dtype or shape, missing input.
    MESHC_MISMATCH = 4,
    /// A tensor whose shape, dtype and byte count disagree.
    MESHC_VIEW = 5,
    /// The run failed.
    MESHC_RUN = 6,
    /// A training call without state, or with state that does not fit.
    MESHC_STATE = 7,
    /// A panic inside the library, caught at the boundary (a meshc bug).
    MESHC_PANIC = 8,
    /// A handle that is not open: freed already, or never one the library handed out.
    MESHC_CLOSED = 9,
}

/// The element type of a tensor.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum meshc_dtype {
    MESHC_F32 = 0,
    MESHC_I32 = 1,
    MESHC_I64 = 2,
    /// One byte per element, 0 or 1.
    MESHC_BOOL = 3,
    MESHC_F16 = 4,
    MESHC_BF16 = 5,
    /// 8-bit integers (quantized tensors).
    MESHC_I8 = 6,
    MESHC_U8 = 7,
    /// The other integers ONNX names (storage: computed on widened).
    MESHC_I16 = 8,
    MESHC_U16 = 9,
    MESHC_U32 = 10,
    MESHC_U64 = 11,
}

/// A tensor crossing a call, in the caller's memory: row-major (C order), little-endian,
/// `shape[0..rank]` elements of `dtype` at `data`. For an input, `data` is only read; for an
/// output, the run writes the tensor's bytes there. `name` is the graph's input or output.
#[repr(C)]
pub struct meshc_tensor {
    pub name: *const c_char,
    pub dtype: meshc_dtype,
    pub rank: usize,
    pub shape: *const usize,
    pub data: *mut c_void,
}

/// An input or output of a model, as meshc_model_tensor describes it. The name and shape
/// are the model's: valid until the model is freed.
#[repr(C)]
pub struct meshc_tensor_info {
    pub name: *const c_char,
    pub dtype: meshc_dtype,
    pub rank: usize,
    pub shape: *const usize,
    /// 1 for an input that is a training artifact's state (meshc_session_set_state puts it
    /// on the devices, meshc_session_step reads and replaces it), else 0.
    pub is_state: i32,
}

/// An opened artifact (meshc_model_open).
pub struct meshc_model {
    _opaque: [u8; 0],
}

/// A model ready to run (meshc_session_new). Thread-safe: calls from several threads at once
/// are queued and each is correct.
pub struct meshc_session {
    _opaque: [u8; 0],
}

/// What a model handle names.
struct ModelEntry {
    model: Model,
    /// NUL-terminated names of the inputs, then the outputs.
    names: Vec<CString>,
    /// The names of their dimensions, in the same order (`None`: unnamed).
    dims: Vec<Vec<Option<CString>>>,
}

impl ModelEntry {
    /// Input `index` (`output` 0) or output `index` (`output` 1), and its place in `names`.
    fn port(&self, output: i32, index: usize) -> Result<(&meshc_runtime::api::TensorInfo, usize), Fail> {
        let (list, base) = match output {
            0 => (self.model.inputs(), 0),
            _ => (self.model.outputs(), self.model.inputs().len()),
        };
        let t = list.get(index).ok_or_else(|| invalid(format!("index {index}: the model has {}", list.len())))?;
        Ok((t, base + index))
    }
}

/// What a handle names.
#[derive(Clone)]
enum Entry {
    Model(Arc<ModelEntry>),
    Session(Arc<Session>),
}

/// The live handles, and the number the next one gets (never 0, never reused).
struct Handles {
    live: HashMap<usize, Entry>,
    next: usize,
}

static HANDLES: Mutex<Option<Handles>> = Mutex::new(None);

fn handles() -> std::sync::MutexGuard<'static, Option<Handles>> {
    HANDLES.lock().unwrap_or_else(|p| p.into_inner())
}

/// A new handle for `e`.
fn open_handle(e: Entry) -> usize {
    let mut guard = handles();
    let h = guard.get_or_insert_with(|| Handles { live: HashMap::new(), next: 1 });
    let id = h.next;
    h.next += 1;
    h.live.insert(id, e);
    id
}

/// What handle `p` names, or MESHC_NULL / MESHC_CLOSED naming `what`.
fn lookup(p: usize, what: &str) -> Result<Entry, Fail> {
    if p == 0 {
        return Err(Fail(meshc_status::MESHC_NULL, format!("{what} is NULL")));
    }
    let closed = || Fail(meshc_status::MESHC_CLOSED, format!("{what} is not open (freed already, or not a {what})"));
    handles().as_ref().and_then(|h| h.live.get(&p).cloned()).ok_or_else(closed)
}

fn model_of(p: *const meshc_model) -> Result<Arc<ModelEntry>, Fail> {
    match lookup(p as usize, "model")? {
        Entry::Model(m) => Ok(m),
        Entry::Session(_) => Err(Fail(meshc_status::MESHC_CLOSED, "model is a session handle".into())),
    }
}

fn session_of(p: *const meshc_session) -> Result<Arc<Session>, Fail> {
    match lookup(p as usize, "session")? {
        Entry::Session(s) => Ok(s),
        Entry::Model(_) => Err(Fail(meshc_status::MESHC_CLOSED, "session is a model handle".into())),
    }
}

/// Takes handle `p` out of the table; what it names is dropped when the last call using it
/// returns. An unknown handle is ignored.
fn close_handle(p: usize) {
    let entry = handles().as_mut().and_then(|h| h.live.remove(&p));
    // Dropped outside the lock: freeing a model unmaps it, which may take a while.
    drop(entry);
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: &str) {
    let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// A failed call: its status and message.
struct Fail(meshc_status, String);

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        let status = match &e {
            Error::Mismatch(_) => meshc_status::MESHC_MISMATCH,
            Error::View(_) => meshc_status::MESHC_VIEW,
            Error::Open(_) => meshc_status::MESHC_OPEN,
            Error::Run(_) => meshc_status::MESHC_RUN,
            Error::State(_) => meshc_status::MESHC_STATE,
        };
        Fail(status, e.to_string())
    }
}

fn invalid(msg: String) -> Fail {
    Fail(meshc_status::MESHC_INVALID, msg)
}

/// Runs `f` with panics caught, recording the message of a failure for meshc_last_error.
fn guard(what: &str, f: impl FnOnce() -> Result<(), Fail>) -> meshc_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => meshc_status::MESHC_OK,
        Ok(Err(Fail(status, msg))) => {
            set_error(&msg);
            status
        }
        Err(panic) => {
            let msg = (panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            set_error(&format!("{what}: panicked: {msg}"));
            meshc_status::MESHC_PANIC
        }
    }
}

/// `p` as a reference, or MESHC_NULL naming `what`.
///
/// # Safety
/// `p` is NULL or points to a live `T`.
unsafe fn non_null<'a, T>(p: *const T, what: &str) -> Result<&'a T, Fail> {
    // SAFETY: the caller's contract.
    unsafe { p.as_ref() }.ok_or_else(|| Fail(meshc_status::MESHC_NULL, format!("{what} is NULL")))
}

/// A NUL-terminated UTF-8 string.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, Fail> {
    // SAFETY: the caller's contract.
    let s = unsafe { non_null(p, what).map(|_| CStr::from_ptr(p)) }?;
    s.to_str().map_err(|_| invalid(format!("{what} is not UTF-8")))
}

fn dtype_of(d: meshc_dtype) -> DType {
    match d {
        meshc_dtype::MESHC_F32 => DType::F32,
        meshc_dtype::MESHC_I32 => DType::I32,
        meshc_dtype::MESHC_I64 => DType::I64,
        meshc_dtype::MESHC_BOOL => DType::Bool,
        meshc_dtype::MESHC_F16 => DType::F16,
        meshc_dtype::MESHC_BF16 => DType::BF16,
        meshc_dtype::MESHC_I8 => DType::I8,
        meshc_dtype::MESHC_U8 => DType::U8,
        meshc_dtype::MESHC_I16 => DType::I16,
        meshc_dtype::MESHC_U16 => DType::U16,
        meshc_dtype::MESHC_U32 => DType::U32,
        meshc_dtype::MESHC_U64 => DType::U64,
    }
}

fn dtype_to(d: DType) -> meshc_dtype {
    match d {
        DType::F32 => meshc_dtype::MESHC_F32,
        DType::I32 => meshc_dtype::MESHC_I32,
        DType::I64 => meshc_dtype::MESHC_I64,
        DType::Bool => meshc_dtype::MESHC_BOOL,
        DType::F16 => meshc_dtype::MESHC_F16,
        DType::BF16 => meshc_dtype::MESHC_BF16,
        DType::I8 => meshc_dtype::MESHC_I8,
        DType::U8 => meshc_dtype::MESHC_U8,
        DType::I16 => meshc_dtype::MESHC_I16,
        DType::U16 => meshc_dtype::MESHC_U16,
        DType::U32 => meshc_dtype::MESHC_U32,
        DType::U64 => meshc_dtype::MESHC_U64,
    }
}

/// The dtype number a caller passed, checked: a C enum may hold any int.
fn checked_dtype(t: &meshc_tensor) -> Result<DType, Fail> {
    // SAFETY: reading the field as its underlying int, whatever the caller stored.
    let raw = unsafe { std::ptr::addr_of!(t.dtype).cast::<u32>().read() };
    match raw {
        0..=11 => Ok(dtype_of(t.dtype)),
        n => Err(invalid(format!("dtype {n} is none of meshc_dtype's"))),
    }
}

/// Returns the message of the last failed call on this thread ("" if none failed). The
/// string is the library's: valid until the next failing call on this thread.
#[no_mangle]
pub extern "C" fn meshc_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Opens the artifact at `path` (verifying every checksum) into `*out`. Free it with
/// meshc_model_free.
///
/// # Safety
/// `path` is a NUL-terminated string; `out` points to writable memory for a pointer.
#[no_mangle]
pub unsafe extern "C" fn meshc_model_open(path: *const c_char, out: *mut *mut meshc_model) -> meshc_status {
    guard("meshc_model_open", || {
        // SAFETY: the caller's contract.
        let path = unsafe { text(path, "path") }?;
        // SAFETY: as above.
        unsafe { non_null(out.cast_const(), "out") }?;
        let model = Model::open(path)?;
        let c = |what: &str, s: &str| CString::new(s).map_err(|_| invalid(format!("{what} '{s}' holds a NUL")));
        let ports = || model.inputs().iter().chain(model.outputs());
        let names = ports().map(|t| c("tensor name", &t.name)).collect::<Result<_, _>>()?;
        let dims = ports()
            .map(|t| t.dims.iter().map(|d| d.as_deref().map(|d| c("dim name", d)).transpose()).collect())
            .collect::<Result<_, _>>()?;
        let id = open_handle(Entry::Model(Arc::new(ModelEntry { model, names, dims })));
        // SAFETY: checked non-NULL above.
        unsafe { *out = id as *mut meshc_model };
        Ok(())
    })
}

/// Frees a model (NULL, and a handle freed already, are ignored). Sessions made from it stay
/// valid; a call on it in flight in another thread finishes first.
#[no_mangle]
pub extern "C" fn meshc_model_free(model: *mut meshc_model) {
    // A panic in a drop is caught rather than unwinding into C.
    let _ = catch_unwind(|| close_handle(model as usize));
}

/// Writes the number of inputs and of outputs of `model` to `*inputs` and `*outputs`.
///
/// # Safety
/// `inputs` and `outputs` point to writable size_t.
#[no_mangle]
pub unsafe extern "C" fn meshc_model_counts(
    model: *const meshc_model,
    inputs: *mut usize,
    outputs: *mut usize,
) -> meshc_status {
    guard("meshc_model_counts", || {
        let m = model_of(model)?;
        // SAFETY: the caller's contract.
        unsafe { non_null(inputs.cast_const(), "inputs").and(non_null(outputs.cast_const(), "outputs")) }?;
        // SAFETY: checked non-NULL above.
        unsafe { (*inputs, *outputs) = (m.model.inputs().len(), m.model.outputs().len()) };
        Ok(())
    })
}

/// Describes input `index` (`output` 0) or output `index` (`output` 1) of `model` in
/// `*info`; its name and shape stay valid until the model is freed.
///
/// # Safety
/// `info` points to a writable meshc_tensor_info.
#[no_mangle]
pub unsafe extern "C" fn meshc_model_tensor(
    model: *const meshc_model,
    output: i32,
    index: usize,
    info: *mut meshc_tensor_info,
) -> meshc_status {
    guard("meshc_model_tensor", || {
        let m = model_of(model)?;
        // SAFETY: the caller's contract.
        unsafe { non_null(info.cast_const(), "info") }?;
        let (t, at) = m.port(output, index)?;
        let i = meshc_tensor_info {
            name: m.names[at].as_ptr(),
            dtype: dtype_to(t.dtype),
            rank: t.shape.len(),
            shape: t.shape.as_ptr(),
            is_state: (output == 0 && m.model.state_names().contains(&t.name)).into(),
        };
        // SAFETY: checked non-NULL above; the pointers stay valid while the handle is open
        // (the table holds the model).
        unsafe { info.write(i) };
        Ok(())
    })
}

/// Writes to `*name` the name the graph gives dimension `dim` of input `index` (`output` 0)
/// or output `index` (`output` 1) of `model` — `batch` for `x: f32[8,32] dims(batch, _)`,
/// an ONNX input's dim_param — or NULL when that dimension is unnamed. The string is the
/// model's, NUL-terminated UTF-8: valid until the model is freed, not to be freed or
/// written by the caller. `dim` is below the tensor's rank (meshc_tensor_info.rank), else
/// MESHC_INVALID.
///
/// # Safety
/// `name` points to writable memory for a pointer.
#[no_mangle]
pub unsafe extern "C" fn meshc_model_dim_name(
    model: *const meshc_model,
    output: i32,
    index: usize,
    dim: usize,
    name: *mut *const c_char,
) -> meshc_status {
    guard("meshc_model_dim_name", || {
        let m = model_of(model)?;
        // SAFETY: the caller's contract.
        unsafe { non_null(name.cast_const(), "name") }?;
        let (t, at) = m.port(output, index)?;
        let d = m.dims[at]
            .get(dim)
            .ok_or_else(|| invalid(format!("dim {dim}: '{}' has rank {}", t.name, t.shape.len())))?;
        // SAFETY: checked non-NULL above; the string stays valid while the handle is open
        // (the table holds the model).
        unsafe { name.write(d.as_ref().map_or(std::ptr::null(), |d| d.as_ptr())) };
        Ok(())
    })
}

/// A session on `model` into `*out`: its arenas allocated once, its device threads started
/// by the first run and reused. Free it with meshc_session_free.
///
/// # Safety
/// `out` points to writable memory for a pointer.
#[no_mangle]
pub unsafe extern "C" fn meshc_session_new(model: *const meshc_model, out: *mut *mut meshc_session) -> meshc_status {
    guard("meshc_session_new", || {
        let m = model_of(model)?;
        // SAFETY: the caller's contract.
        unsafe { non_null(out.cast_const(), "out") }?;
        let id = open_handle(Entry::Session(Arc::new(Session::new(&m.model)?)));
        // SAFETY: checked non-NULL above.
        unsafe { *out = id as *mut meshc_session };
        Ok(())
    })
}

/// Frees a session (NULL, and a handle freed already, are ignored). A call on it in flight
/// in another thread finishes first; a call after the free returns MESHC_CLOSED.
#[no_mangle]
pub extern "C" fn meshc_session_free(session: *mut meshc_session) {
    // A panic in a drop is caught rather than unwinding into C.
    let _ = catch_unwind(|| close_handle(session as usize));
}

/// `n` tensors at `p` (NULL allowed when `n` is 0).
///
/// # Safety
/// `p` points to `n` meshc_tensor.
unsafe fn tensors<'a>(p: *const meshc_tensor, n: usize, what: &str) -> Result<&'a [meshc_tensor], Fail> {
    if n == 0 {
        return Ok(&[]);
    }
    // SAFETY: the caller's contract.
    unsafe { non_null(p, what) }?;
    // SAFETY: as above.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// A tensor's name, dtype, shape and byte count, checked.
///
/// # Safety
/// The tensor's pointers are NULL or valid for what they describe.
unsafe fn parts<'a>(t: &'a meshc_tensor, what: &str) -> Result<(&'a str, DType, &'a [usize], usize), Fail> {
    // SAFETY: the caller's contract.
    let name = unsafe { text(t.name, &format!("{what} name")) }?;
    let dtype = checked_dtype(t)?;
    let shape: &[usize] = match t.rank {
        0 => &[],
        // SAFETY: the caller's contract.
        r => unsafe { std::slice::from_raw_parts(non_null(t.shape, &format!("{what} '{name}': shape"))?, r) },
    };
    let bytes = (shape.iter().try_fold(dtype.size_bytes(), |n, &d| n.checked_mul(d)))
        .ok_or_else(|| Fail(meshc_status::MESHC_VIEW, format!("{what} '{name}': shape {shape:?} overflows")))?;
    if bytes > 0 && t.data.is_null() {
        return Err(Fail(meshc_status::MESHC_NULL, format!("{what} '{name}': data is NULL")));
    }
    Ok((name, dtype, shape, bytes))
}

/// The caller's tensors at `p` as views of their memory, read only.
///
/// # Safety
/// `p` points to `n` meshc_tensor whose `data` holds the bytes their shape says.
unsafe fn views<'a>(p: *const meshc_tensor, n: usize) -> Result<Vec<(&'a str, TensorView<'a>)>, Fail> {
    // SAFETY: the caller's contract.
    let ts = unsafe { tensors(p, n, "inputs") }?;
    let mut views = Vec::with_capacity(ts.len());
    for t in ts {
        // SAFETY: as above.
        let (name, dtype, shape, bytes) = unsafe { parts(t, "input") }?;
        let data: &[u8] = match bytes {
            0 => &[],
            // SAFETY: `data` holds `bytes` bytes (the caller's contract), only read.
            _ => unsafe { std::slice::from_raw_parts(t.data.cast::<u8>().cast_const(), bytes) },
        };
        views.push((name, TensorView::from_bytes(dtype, shape, data)?));
    }
    Ok(views)
}

/// The caller's tensors at `p` as buffers a call writes into.
///
/// # Safety
/// `p` points to `n` meshc_tensor whose `data` holds the writable bytes their shape says,
/// overlapping no other argument.
unsafe fn buffers<'a>(p: *const meshc_tensor, n: usize) -> Result<Vec<(&'a str, TensorViewMut<'a>)>, Fail> {
    // SAFETY: the caller's contract.
    let ts = unsafe { tensors(p, n, "outputs") }?;
    let mut dst = Vec::with_capacity(ts.len());
    for t in ts {
        // SAFETY: as above.
        let (name, dtype, shape, bytes) = unsafe { parts(t, "output") }?;
        let data: &mut [u8] = match bytes {
            0 => &mut [],
            // SAFETY: `data` holds `bytes` writable bytes no other argument overlaps.
            _ => unsafe { std::slice::from_raw_parts_mut(t.data.cast::<u8>(), bytes) },
        };
        dst.push((name, TensorViewMut::from_bytes(dtype, shape, data)?));
    }
    Ok(dst)
}

/// Runs the model once: `inputs[0..n_inputs]` (every input of the graph, once) are read
/// where they are, and each of `outputs[0..n_outputs]` (any of the graph's outputs) is
/// written into its `data`. Nothing is allocated for the tensors; the caller owns all of
/// them. Several threads may call this on one session at once: the calls are queued.
///
/// # Safety
/// `inputs` and `outputs` point to that many meshc_tensor whose names are NUL-terminated
/// and whose `data` holds the bytes their shape says.
#[no_mangle]
pub unsafe extern "C" fn meshc_session_run(
    session: *const meshc_session,
    inputs: *const meshc_tensor,
    n_inputs: usize,
    outputs: *const meshc_tensor,
    n_outputs: usize,
) -> meshc_status {
    // SAFETY: the caller's contract.
    unsafe { call("meshc_session_run", session, (inputs, n_inputs), (outputs, n_outputs), Session::run_into) }
}

/// A call on a session over the caller's inputs and output buffers (`Session::run_into`,
/// `Session::step_into`).
type SessionCall = fn(&Session, &[(&str, TensorView)], &mut [(&str, TensorViewMut)]) -> Result<(), Error>;

/// The caller's inputs and output buffers handed to `f` on the session, as
/// meshc_session_run and meshc_session_step do.
///
/// # Safety
/// As meshc_session_run.
unsafe fn call(
    what: &str,
    session: *const meshc_session,
    (inputs, n_inputs): (*const meshc_tensor, usize),
    (outputs, n_outputs): (*const meshc_tensor, usize),
    f: SessionCall,
) -> meshc_status {
    guard(what, || {
        let session = session_of(session)?;
        // SAFETY: the caller's contract.
        let (views, mut dst) = unsafe { (views(inputs, n_inputs)?, buffers(outputs, n_outputs)?) };
        f(&session, &views, &mut dst)?;
        Ok(())
    })
}

/// Puts a training artifact's initial state (the one compiled into it) on the devices of
/// `session`: the next meshc_session_step starts from it.
#[no_mangle]
pub extern "C" fn meshc_session_reset_state(session: *const meshc_session) -> meshc_status {
    guard("meshc_session_reset_state", || {
        let session = session_of(session)?;
        let init = meshc_runtime::tools::steps::State::initial(session.loaded(), "the artifact")
            .map_err(|e| Fail(meshc_status::MESHC_STATE, meshc_runtime::api::error::one_line(&e)))?;
        let init = init.ok_or_else(|| Fail(meshc_status::MESHC_STATE, "the artifact holds no state".into()))?;
        session.set_state(&init.tensors)?;
        Ok(())
    })
}

/// Puts the state `state[0..n_state]` (every state input of the model, by name; see
/// meshc_tensor_info.is_state) on the devices of `session`, copied: the caller keeps its
/// buffers.
///
/// # Safety
/// `state` points to that many meshc_tensor as meshc_session_run's inputs.
#[no_mangle]
pub unsafe extern "C" fn meshc_session_set_state(
    session: *const meshc_session,
    state: *const meshc_tensor,
    n_state: usize,
) -> meshc_status {
    guard("meshc_session_set_state", || {
        let session = session_of(session)?;
        // SAFETY: the caller's contract.
        let views = unsafe { views(state, n_state) }?;
        let tensors: BTreeMap<String, Tensor> = views.iter().map(|(n, v)| (n.to_string(), v.to_tensor())).collect();
        session.set_state(&tensors)?;
        Ok(())
    })
}

/// Copies the state on the devices of `session` into the caller's buffers
/// `state[0..n_state]`, each named for a state input and of its dtype and shape.
///
/// # Safety
/// `state` points to that many meshc_tensor as meshc_session_run's outputs.
#[no_mangle]
pub unsafe extern "C" fn meshc_session_get_state(
    session: *const meshc_session,
    state: *const meshc_tensor,
    n_state: usize,
) -> meshc_status {
    guard("meshc_session_get_state", || {
        let session = session_of(session)?;
        // SAFETY: the caller's contract.
        let mut dst = unsafe { buffers(state, n_state) }?;
        session.state_into(&mut dst)?;
        Ok(())
    })
}

/// How meshc_session_generate picks each new token.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum meshc_sampling {
    /// The highest logit (the first of equal ones); `value` is not read.
    MESHC_GREEDY = 0,
    /// From softmax(logits / T), T = `value` > 0.
    MESHC_TEMPERATURE = 1,
    /// From the K = `value` highest logits (a whole number ≥ 1).
    MESHC_TOP_K = 2,
    /// From the smallest set of the highest logits whose probabilities reach P = `value`,
    /// in (0, 1].
    MESHC_TOP_P = 3,
}

/// What meshc_session_generate does besides the prompt (docs/generation.md).
#[repr(C)]
pub struct meshc_generate_options {
    /// At most this many new tokens per sequence.
    pub max_new_tokens: usize,
    /// The positions a sequence may take, prompt included: at most the artifact's.
    pub context: usize,
    pub sampling: meshc_sampling,
    /// The sampling's T, K or P.
    pub value: f64,
    /// The seed of the random draws: the same seed gives the same tokens.
    pub seed: u64,
    /// `stop[0..n_stop]`: a sequence that emits one of these ids stops (NULL when 0).
    pub stop: *const i64,
    pub n_stop: usize,
}

/// Generates tokens after `prompt` (`batch` rows of `prompt_len` ids, row-major) on the
/// decode-step artifact of `session`: its caches start empty, the prompt runs through
/// `prefill` (a prefill artifact's session) in one call, or one position a step when
/// `prefill` is NULL, then each new token is sampled and fed back. `out` receives
/// `batch × max_new_tokens` ids, row-major, -1 after a sequence's stop token and after the
/// last step; `*steps` (if not NULL) the number of steps run, less than max_new_tokens when
/// every sequence stopped first.
///
/// # Safety
/// `prompt` points to `batch × prompt_len` int64, `out` to `batch × max_new_tokens`
/// writable int64, `options` to one meshc_generate_options whose `stop` points to `n_stop`
/// int64.
#[no_mangle]
pub unsafe extern "C" fn meshc_session_generate(
    session: *const meshc_session,
    prefill: *const meshc_session,
    prompt: *const i64,
    batch: usize,
    prompt_len: usize,
    options: *const meshc_generate_options,
    out: *mut i64,
    steps: *mut usize,
) -> meshc_status {
    guard("meshc_session_generate", || {
        let session = session_of(session)?;
        let prefill = if prefill.is_null() { None } else { Some(session_of(prefill)?) };
        if prompt.is_null() || options.is_null() || out.is_null() {
            return Err(Fail(meshc_status::MESHC_NULL, "prompt, options and out must not be NULL".into()));
        }
        // SAFETY: the caller's contract.
        let o = unsafe { &*options };
        let invalid = |why: String| Fail(meshc_status::MESHC_INVALID, why);
        let sampling = match o.sampling {
            meshc_sampling::MESHC_GREEDY => "greedy".to_string(),
            meshc_sampling::MESHC_TEMPERATURE => format!("temperature:{}", o.value),
            meshc_sampling::MESHC_TOP_K if o.value.fract() == 0.0 => format!("top-k:{}", o.value),
            meshc_sampling::MESHC_TOP_K => {
                return Err(invalid(format!("top-k: K = {} is not a whole number", o.value)))
            }
            meshc_sampling::MESHC_TOP_P => format!("top-p:{}", o.value),
        };
        let sampling = sampling.parse::<meshc_runtime::api::Sampling>().map_err(invalid)?;
        let stop = match o.n_stop {
            0 => Vec::new(),
            _ if o.stop.is_null() => {
                return Err(Fail(meshc_status::MESHC_NULL, "stop is NULL, n_stop is not 0".into()))
            }
            // SAFETY: the caller's contract.
            n => unsafe { std::slice::from_raw_parts(o.stop, n) }.to_vec(),
        };
        let cells = batch.checked_mul(prompt_len).ok_or_else(|| invalid("batch × prompt_len overflows".into()))?;
        let room =
            batch.checked_mul(o.max_new_tokens).ok_or_else(|| invalid("batch × max_new_tokens overflows".into()))?;
        // SAFETY: the caller's contract.
        let ids = unsafe { std::slice::from_raw_parts(prompt, cells) };
        let rows: Vec<Vec<i64>> = (0..batch).map(|b| ids[b * prompt_len..(b + 1) * prompt_len].to_vec()).collect();
        let options = meshc_runtime::api::GenerateOptions {
            max_new_tokens: o.max_new_tokens,
            context: o.context,
            sampling,
            seed: o.seed,
            stop,
        };
        let got = match &prefill {
            Some(p) => session.generate_with_prefill(p, &rows, &options)?,
            None => session.generate(&rows, &options)?,
        };
        // SAFETY: the caller's contract.
        let out = unsafe { std::slice::from_raw_parts_mut(out, room) };
        out.fill(-1);
        for (row, tokens) in out.chunks_mut(o.max_new_tokens.max(1)).zip(&got.tokens) {
            row[..tokens.len()].copy_from_slice(tokens);
        }
        if !steps.is_null() {
            // SAFETY: the caller's contract.
            unsafe { *steps = got.steps };
        }
        Ok(())
    })
}

/// One training step: `inputs` are the batch (every input that is not state), the state on
/// the devices is read and replaced, and each of `outputs` (the loss, any output of the
/// graph) is written into its `data`, as meshc_session_run writes them.
///
/// # Safety
/// As meshc_session_run.
#[no_mangle]
pub unsafe extern "C" fn meshc_session_step(
    session: *const meshc_session,
    inputs: *const meshc_tensor,
    n_inputs: usize,
    outputs: *const meshc_tensor,
    n_outputs: usize,
) -> meshc_status {
    // SAFETY: the caller's contract.
    unsafe { call("meshc_session_step", session, (inputs, n_inputs), (outputs, n_outputs), Session::step_into) }
}
