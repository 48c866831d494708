//! The C ABI called as C calls it (through its extern functions, from Rust): a training
//! artifact stepped with its state on the devices, read back and written again, against
//! the reference losses; and handles misused — NULL, freed, freed twice, freed while calls
//! on them run in other threads — refused with a status, never a crash.

use std::ffi::{c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;

use meshc_ir::Tensor;
use meshcrt::*;

/// The directory cargo put this build's binaries in (target/release or target/debug).
fn build_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// `graph` compiled by the meshc binary with `extra` arguments, into `name.mshc`.
fn compile(graph: &str, name: &str, extra: &[&str]) -> CString {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let dir = build_dir().join("capi-calls");
    std::fs::create_dir_all(&dir).unwrap();
    let art = dir.join(format!("{name}.mshc"));
    let meshc = build_dir().join("meshc");
    assert!(meshc.is_file(), "{} is missing: build meshc first (make test does)", meshc.display());
    let out = Command::new(&meshc).current_dir(root).args(["compile", graph, "-o"]).arg(&art).args(extra).output();
    let out = out.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    CString::new(art.to_str().unwrap()).unwrap()
}

fn last_error() -> String {
    // SAFETY: the library's NUL-terminated message.
    unsafe { CStr::from_ptr(meshc_last_error()) }.to_string_lossy().into_owned()
}

fn ok(s: meshc_status) {
    assert_eq!(s, meshc_status::MESHC_OK, "{}", last_error());
}

/// A tensor crossing the ABI, over `data` (f32).
fn tensor(name: &CStr, shape: &[usize], data: &mut [f32]) -> meshc_tensor {
    meshc_tensor {
        name: name.as_ptr(),
        dtype: meshc_dtype::MESHC_F32,
        rank: shape.len(),
        shape: shape.as_ptr(),
        data: data.as_mut_ptr().cast::<c_void>(),
    }
}

fn open(art: &CStr) -> (*mut meshc_model, *mut meshc_session) {
    let (mut model, mut session) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: a NUL-terminated path and writable out-pointers.
    unsafe {
        ok(meshc_model_open(art.as_ptr(), &mut model));
        ok(meshc_session_new(model, &mut session));
    }
    (model, session)
}

#[test]
fn a_training_artifact_steps_from_c_as_the_reference_does() {
    let art = compile("testdata/train/classifier.json", "train", &["--loss", "loss", "--optimizer", "sgd:0.1"]);
    let (model, session) = open(&art);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let read = |f: &str| Tensor::read_npy(&root.join("testdata/train").join(f)).unwrap();
    let (x, labels, want) = (read("data/x.npy"), read("data/labels.npy"), read("expected/sgd.npy"));
    let (x, labels, want) = (x.as_f32().unwrap(), labels.as_f32().unwrap(), want.as_f32().unwrap());
    let (xn, ln, lossn) = (c"x", c"labels", c"loss");
    let mut loss = [0f32];
    let out = [tensor(lossn, &[], &mut loss)];
    // SAFETY: every tensor points to live memory of its shape's bytes.
    unsafe {
        assert_eq!(meshc_session_step(session, std::ptr::null(), 0, out.as_ptr(), 1), meshc_status::MESHC_STATE);
        assert!(last_error().contains("set_state"), "{}", last_error());
        ok(meshc_session_reset_state(session));
        for (step, want) in want.iter().enumerate().take(5) {
            let mut xb = x[step * 128..(step + 1) * 128].to_vec();
            let mut lb = labels[step * 64..(step + 1) * 64].to_vec();
            let ins = [tensor(xn, &[16, 8], &mut xb), tensor(ln, &[16, 4], &mut lb)];
            ok(meshc_session_step(session, ins.as_ptr(), 2, out.as_ptr(), 1));
            let got = *out[0].data.cast::<f32>();
            assert!((got - want).abs() <= 1e-4 * want.abs(), "step {}: loss {got}, reference {want}", step + 1);
        }
        // Every state input read back into buffers of its type, written again, read again.
        let (mut n_in, mut n_out) = (0, 0);
        ok(meshc_model_counts(model, &mut n_in, &mut n_out));
        let mut state = Vec::new();
        for k in 0..n_in {
            let mut info = std::mem::zeroed::<meshc_tensor_info>();
            ok(meshc_model_tensor(model, 0, k, &mut info));
            if info.is_state == 1 {
                let shape = std::slice::from_raw_parts(info.shape, info.rank).to_vec();
                let n = shape.iter().product();
                state.push((CStr::from_ptr(info.name).to_owned(), shape, vec![f32::NAN; n]));
            }
        }
        assert!(!state.is_empty());
        let views: Vec<meshc_tensor> = state.iter_mut().map(|(n, s, d)| tensor(n, s, d)).collect();
        ok(meshc_session_get_state(session, views.as_ptr(), views.len()));
        let before: Vec<Vec<f32>> = state.iter().map(|s| s.2.clone()).collect();
        assert!(before.iter().flatten().all(|v| v.is_finite()));
        ok(meshc_session_set_state(session, views.as_ptr(), views.len()));
        for (_, _, d) in state.iter_mut() {
            d.fill(0.0);
        }
        let mut views: Vec<meshc_tensor> = state.iter_mut().map(|(n, s, d)| tensor(n, s, d)).collect();
        ok(meshc_session_get_state(session, views.as_ptr(), views.len()));
        assert_eq!(state.iter().map(|s| s.2.clone()).collect::<Vec<_>>(), before);
        // A buffer of the wrong shape is refused, naming the tensor.
        views[0].rank = 0;
        assert_eq!(meshc_session_get_state(session, views.as_ptr(), 1), meshc_status::MESHC_STATE);
        assert!(last_error().starts_with("state tensor '"), "{}", last_error());
        meshc_session_free(session);
        meshc_model_free(model);
    }
}

#[test]
fn misused_handles_are_refused_and_never_crash() {
    let art = compile("testdata/mlp/graph.json", "mlp", &[]);
    let (model, session) = open(&art);
    let (xn, yn) = (c"x", c"y");
    let (mut x, mut y) = (vec![0.5f32; 16 * 64], vec![0f32; 16 * 64]);
    let (ins, outs) = ([tensor(xn, &[16, 64], &mut x)], [tensor(yn, &[16, 64], &mut y)]);
    let run = |s: *const meshc_session| {
        // SAFETY: the tensors point to live memory of their shapes' bytes.
        unsafe { meshc_session_run(s, ins.as_ptr(), 1, outs.as_ptr(), 1) }
    };
    ok(run(session));
    assert_eq!(run(std::ptr::null()), meshc_status::MESHC_NULL);
    // A pointer that never was a handle, and a model where a session belongs.
    assert_eq!(run(0xdead_beef as *const meshc_session), meshc_status::MESHC_CLOSED);
    assert_eq!(run(model.cast::<meshc_session>()), meshc_status::MESHC_CLOSED);
    assert_eq!(last_error(), "session is a model handle");
    // Calls from another thread while the model and then the session are freed: each
    // returns OK or CLOSED, and once freed, CLOSED.
    let handle = session as usize;
    let (x, y) = (x.as_ptr() as usize, y.as_mut_ptr() as usize);
    let worker = std::thread::spawn(move || {
        let shape_x = [16usize, 64];
        let shape_y = [16usize, 64];
        let t = |n: &CStr, s: &[usize], d: usize| meshc_tensor {
            name: n.as_ptr(),
            dtype: meshc_dtype::MESHC_F32,
            rank: 2,
            shape: s.as_ptr(),
            data: d as *mut c_void,
        };
        let (ins, outs) = ([t(c"x", &shape_x, x)], [t(c"y", &shape_y, y)]);
        let mut statuses = Vec::new();
        loop {
            // SAFETY: the buffers outlive the thread (joined below).
            let s = unsafe { meshc_session_run(handle as *const meshc_session, ins.as_ptr(), 1, outs.as_ptr(), 1) };
            statuses.push(s);
            if s != meshc_status::MESHC_OK || statuses.len() > 1_000_000 {
                return statuses;
            }
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(20));
    meshc_model_free(model);
    std::thread::sleep(std::time::Duration::from_millis(20));
    meshc_session_free(session);
    let statuses = worker.join().unwrap();
    let (last, rest) = statuses.split_last().unwrap();
    assert_eq!(*last, meshc_status::MESHC_CLOSED, "{} calls", statuses.len());
    assert!(rest.len() > 1 && rest.iter().all(|s| *s == meshc_status::MESHC_OK));
    assert_eq!(run(session), meshc_status::MESHC_CLOSED);
    assert_eq!(last_error(), "session is not open (freed already, or not a session)");
    // Freed twice, and NULL: ignored.
    meshc_session_free(session);
    meshc_model_free(model);
    meshc_model_free(std::ptr::null_mut());
    let mut s2 = std::ptr::null_mut();
    // SAFETY: a writable out-pointer.
    assert_eq!(unsafe { meshc_session_new(model, &mut s2) }, meshc_status::MESHC_CLOSED);
}

#[test]
fn dim_names_read_back_as_the_graph_gives_them_null_where_unnamed() {
    let art = compile("testdata/transformer/graph.json", "transformer", &[]);
    let (model, session) = open(&art);
    let name = |output: i32, index: usize, dim: usize| {
        let mut p = c"not written".as_ptr();
        // SAFETY: a writable out-pointer; a non-NULL result is the model's NUL-terminated string.
        let s = unsafe { meshc_model_dim_name(model, output, index, dim, &mut p) };
        (s == meshc_status::MESHC_OK).then(|| (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_str().unwrap()))
    };
    // Input 1 is `mask: f32[2,1,1,8] dims(batch, _, _, seq)`.
    let mask: Vec<_> = (0..4).map(|d| name(0, 1, d)).collect();
    assert_eq!(mask, [Some(Some("batch")), Some(None), Some(None), Some(Some("seq"))]);
    assert_eq!(name(0, 0, 1), Some(Some("seq")));
    // The output's names are the ones inference carries through the graph.
    assert_eq!(name(1, 0, 0), Some(Some("batch")));
    assert_eq!(name(0, 1, 4), None);
    assert_eq!(last_error(), "dim 4: 'mask' has rank 4");
    assert_eq!(name(0, 2, 0), None);
    assert_eq!(last_error(), "index 2: the model has 2");
    // SAFETY: NULL where the out-pointer belongs is refused, not written.
    assert_eq!(unsafe { meshc_model_dim_name(model, 0, 0, 0, std::ptr::null_mut()) }, meshc_status::MESHC_NULL);
    meshc_session_free(session);
    meshc_model_free(model);
    assert_eq!(name(0, 0, 0), None);
    assert_eq!(last_error(), "model is not open (freed already, or not a model)");
}

#[test]
fn an_onnx_decoder_generates_torchs_greedy_ids_from_c() {
    let d = "testdata/onnx_decoders/gpt2";
    let model = format!("{d}/model.onnx");
    let args = ["--decode-context", "40", "--decode-batch", "2"];
    let step = compile(&model, "gpt2-step", &args);
    let prefill = compile(&model, "gpt2-prefill", &[&args[..], &["--decode-prefill", "5"]].concat());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let read = |f: &str| match Tensor::read_npy(&root.join(d).join(f)).unwrap().data {
        meshc_ir::Data::I64(v) => v,
        _ => panic!("{f} holds int64"),
    };
    let (prompt, want) = (read("prompt.npy"), read("greedy.npy"));
    let ((m, s), (pm, ps)) = (open(&step), open(&prefill));
    let mut options = meshc_generate_options {
        max_new_tokens: 32,
        context: 40,
        sampling: meshc_sampling::MESHC_GREEDY,
        value: 0.0,
        seed: 0,
        stop: std::ptr::null(),
        n_stop: 0,
    };
    let mut out = vec![0i64; 2 * 32];
    let mut steps = 0usize;
    // SAFETY: the prompt holds 2 × 5 ids, out 2 × 32, and options is one struct.
    unsafe {
        for by in [std::ptr::null(), ps.cast_const()] {
            out.fill(0);
            ok(meshc_session_generate(s, by, prompt.as_ptr(), 2, 5, &options, out.as_mut_ptr(), &mut steps));
            assert_eq!((&out, steps), (&want, 32), "with the prefill: {}", !by.is_null());
        }
        // A stop id ends its sequence: -1 after it.
        let stop = [want[3]];
        (options.stop, options.n_stop) = (stop.as_ptr(), 1);
        ok(meshc_session_generate(s, ps, prompt.as_ptr(), 2, 5, &options, out.as_mut_ptr(), &mut steps));
        for (got, want) in out.chunks(32).zip(want.chunks(32)) {
            let end = want.iter().position(|&t| t == stop[0]).map_or(32, |i| i + 1);
            assert_eq!(&got[..end], &want[..end]);
            assert!(got[end..].iter().all(|&t| t == -1), "{got:?}");
        }
        // Refusals: a NULL prompt, a K that is not whole, a prompt of another batch.
        let refused = |status: meshc_status, want: &str| {
            assert_ne!(status, meshc_status::MESHC_OK);
            assert!(last_error().contains(want), "{}", last_error());
        };
        let o = &options;
        let none = std::ptr::null();
        refused(
            meshc_session_generate(s, none, std::ptr::null(), 2, 5, o, out.as_mut_ptr(), &mut steps),
            "must not be NULL",
        );
        let top = meshc_generate_options { sampling: meshc_sampling::MESHC_TOP_K, value: 1.5, ..options };
        refused(meshc_session_generate(s, none, prompt.as_ptr(), 2, 5, &top, out.as_mut_ptr(), &mut steps), "1.5");
        refused(meshc_session_generate(s, none, prompt.as_ptr(), 1, 5, o, out.as_mut_ptr(), &mut steps), "batch of 2");
        for h in [s, ps] {
            meshc_session_free(h);
        }
        for h in [m, pm] {
            meshc_model_free(h);
        }
    }
}
