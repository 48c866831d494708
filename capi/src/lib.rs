//! The C ABI of the meshc runtime (capi/include/meshc.h, generated from this file by
//! cbindgen): opaque handles over `meshc_runtime::api`'s `Model` and `Session`, a status per
//! call with its message kept per thread, every panic caught at the boundary.
#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use meshc_ir::DType;
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

/// An input or output of a model, as meshc_model_input/meshc_model_output describe it. The
/// name and shape are the model's: valid until the model is freed.
#[repr(C)]
pub struct meshc_tensor_info {
    pub name: *const c_char,
    pub dtype: meshc_dtype,
    pub rank: usize,
    pub shape: *const usize,
}

/// An opened artifact (meshc_model_open).
pub struct meshc_model {
    model: Model,
    /// NUL-terminated names of the inputs, then the outputs.
    names: Vec<CString>,
}

/// A model ready to run (meshc_session_new). Thread-safe: calls from several threads at once
/// are queued and each is correct.
pub struct meshc_session {
    session: Arc<Session>,
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
    }
}

/// The dtype number a caller passed, checked: a C enum may hold any int.
fn checked_dtype(t: &meshc_tensor) -> Result<DType, Fail> {
    // SAFETY: reading the field as its underlying int, whatever the caller stored.
    let raw = unsafe { std::ptr::addr_of!(t.dtype).cast::<u32>().read() };
    match raw {
        0..=5 => Ok(dtype_of(t.dtype)),
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
        let names = (model.inputs().iter().chain(model.outputs()))
            .map(|t| {
                CString::new(t.name.as_str()).map_err(|_| invalid(format!("tensor name '{}' holds a NUL", t.name)))
            })
            .collect::<Result<_, _>>()?;
        // SAFETY: checked non-NULL above.
        unsafe { *out = Box::into_raw(Box::new(meshc_model { model, names })) };
        Ok(())
    })
}

/// Frees a model (NULL is ignored). Sessions made from it stay valid.
///
/// # Safety
/// `model` is NULL or from meshc_model_open, not freed before.
#[no_mangle]
pub unsafe extern "C" fn meshc_model_free(model: *mut meshc_model) {
    if !model.is_null() {
        // SAFETY: the caller's contract; a panic in a drop is caught rather than unwinding into C.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(model) })));
    }
}

/// Writes the number of inputs and of outputs of `model` to `*inputs` and `*outputs`.
///
/// # Safety
/// `model` is a live model; `inputs` and `outputs` point to writable size_t.
#[no_mangle]
pub unsafe extern "C" fn meshc_model_counts(
    model: *const meshc_model,
    inputs: *mut usize,
    outputs: *mut usize,
) -> meshc_status {
    guard("meshc_model_counts", || {
        // SAFETY: the caller's contract.
        let m = unsafe { non_null(model, "model") }?;
        // SAFETY: as above.
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
/// `model` is a live model; `info` points to a writable meshc_tensor_info.
#[no_mangle]
pub unsafe extern "C" fn meshc_model_tensor(
    model: *const meshc_model,
    output: i32,
    index: usize,
    info: *mut meshc_tensor_info,
) -> meshc_status {
    guard("meshc_model_tensor", || {
        // SAFETY: the caller's contract.
        let m = unsafe { non_null(model, "model") }?;
        // SAFETY: as above.
        unsafe { non_null(info.cast_const(), "info") }?;
        let (list, base) = match output {
            0 => (m.model.inputs(), 0),
            _ => (m.model.outputs(), m.model.inputs().len()),
        };
        let t = list.get(index).ok_or_else(|| invalid(format!("index {index}: the model has {}", list.len())))?;
        let i = meshc_tensor_info {
            name: m.names[base + index].as_ptr(),
            dtype: dtype_to(t.dtype),
            rank: t.shape.len(),
            shape: t.shape.as_ptr(),
        };
        // SAFETY: checked non-NULL above.
        unsafe { info.write(i) };
        Ok(())
    })
}

/// A session on `model` into `*out`: its arenas allocated once, its device threads started
/// by the first run and reused. Free it with meshc_session_free.
///
/// # Safety
/// `model` is a live model; `out` points to writable memory for a pointer.
#[no_mangle]
pub unsafe extern "C" fn meshc_session_new(model: *const meshc_model, out: *mut *mut meshc_session) -> meshc_status {
    guard("meshc_session_new", || {
        // SAFETY: the caller's contract.
        let m = unsafe { non_null(model, "model") }?;
        // SAFETY: as above.
        unsafe { non_null(out.cast_const(), "out") }?;
        let session = Arc::new(Session::new(&m.model)?);
        // SAFETY: checked non-NULL above.
        unsafe { *out = Box::into_raw(Box::new(meshc_session { session })) };
        Ok(())
    })
}

/// Frees a session (NULL is ignored). A run already in flight on it in another thread
/// finishes first (it holds the session); starting one after the free is the caller's error.
///
/// # Safety
/// `session` is NULL or from meshc_session_new, not freed before.
#[no_mangle]
pub unsafe extern "C" fn meshc_session_free(session: *mut meshc_session) {
    if !session.is_null() {
        // SAFETY: the caller's contract; a panic in a drop is caught rather than unwinding into C.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(session) })));
    }
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

/// Runs the model once: `inputs[0..n_inputs]` (every input of the graph, once) are read
/// where they are, and each of `outputs[0..n_outputs]` (any of the graph's outputs) is
/// written into its `data`. Nothing is allocated for the tensors; the caller owns all of
/// them. Several threads may call this on one session at once: the calls are queued.
///
/// # Safety
/// `session` is a live session; `inputs` and `outputs` point to that many meshc_tensor
/// whose names are NUL-terminated and whose `data` holds the bytes their shape says.
#[no_mangle]
pub unsafe extern "C" fn meshc_session_run(
    session: *const meshc_session,
    inputs: *const meshc_tensor,
    n_inputs: usize,
    outputs: *const meshc_tensor,
    n_outputs: usize,
) -> meshc_status {
    guard("meshc_session_run", || {
        // SAFETY: the caller's contract.
        let session = unsafe { non_null(session, "session") }?.session.clone();
        // SAFETY: as above.
        let (ins, outs) = unsafe { (tensors(inputs, n_inputs, "inputs")?, tensors(outputs, n_outputs, "outputs")?) };
        let mut views = Vec::with_capacity(ins.len());
        for t in ins {
            // SAFETY: as above.
            let (name, dtype, shape, bytes) = unsafe { parts(t, "input") }?;
            let data: &[u8] = match bytes {
                0 => &[],
                // SAFETY: `data` holds `bytes` bytes (the caller's contract), only read.
                _ => unsafe { std::slice::from_raw_parts(t.data.cast::<u8>().cast_const(), bytes) },
            };
            views.push((name, TensorView::from_bytes(dtype, shape, data)?));
        }
        let mut dst = Vec::with_capacity(outs.len());
        for t in outs {
            // SAFETY: as above.
            let (name, dtype, shape, bytes) = unsafe { parts(t, "output") }?;
            let data: &mut [u8] = match bytes {
                0 => &mut [],
                // SAFETY: `data` holds `bytes` writable bytes no other argument overlaps.
                _ => unsafe { std::slice::from_raw_parts_mut(t.data.cast::<u8>(), bytes) },
            };
            dst.push((name, TensorViewMut::from_bytes(dtype, shape, data)?));
        }
        session.run_into(&views, &mut dst)?;
        Ok(())
    })
}
