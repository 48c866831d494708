//! Training end to end: the classifier of testdata/train compiled as a training step
//! (`compile --loss --optimizer`) and run 200 steps (`run --steps --data`) must give the
//! loss curve of tools/gen_train_testdata.py's float64 reference within 1e-4 relative at
//! every step, with SGD and AdamW, on one device and split over a 2x4 (data x model)
//! mesh; data parallel over a ring of 8 with a degraded device, the curve of the healthy
//! devices' data; the checkpoint resumes to the same curve; and a run killed while it
//! writes checkpoints leaves a whole one.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::{meshc, scratch};
use meshc_runtime::tools::steps::State;

const GRAPH: &str = "testdata/train/classifier.json";

/// The losses `run --steps` printed, in order.
fn losses(stdout: &str) -> Vec<f64> {
    stdout
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert!(f.len() == 4 && f[0] == "step" && f[2] == "loss", "unexpected line '{l}'");
            f[3].parse().unwrap()
        })
        .collect()
}

fn compile(dir: &Path, spec: &str, layout: Option<&str>) -> String {
    compile_with(dir, "train.mshc", spec, layout, &[])
}

fn compile_with(dir: &Path, name: &str, spec: &str, layout: Option<&str>, more: &[&str]) -> String {
    let art = dir.join(name).display().to_string();
    let mut args = vec!["compile", GRAPH, "--loss", "loss", "--optimizer", spec, "-o", &art];
    if let Some(l) = layout {
        args.extend(["--layout", l]);
    }
    args.extend(more);
    let c = meshc(&args);
    assert_eq!(c.status, Some(0), "{c:?}");
    art
}

/// A training artifact loaded, with the initial state its state section holds.
fn open(art: &str) -> (meshc_runtime::exec::runner::Loaded, State) {
    let a = meshc_runtime::format::artifact::Artifact::open(Path::new(art)).unwrap();
    let loaded = meshc_runtime::exec::loader::load_artifact(a, art).unwrap();
    let init = State::initial(&loaded, art).unwrap().expect("a state section");
    (loaded, init)
}

fn assert_curve(label: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{label}: {} steps", got.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-4 * w.abs(), "{label}: step {} loss {g}, reference {w}", i + 1);
    }
}

#[test]
fn classifier_trains_along_the_reference_curve_on_one_device_and_a_2x4_mesh() {
    for (name, spec) in [("sgd", "sgd:0.1"), ("adamw", "adamw:0.01,0.9,0.999,1e-8,0.01")] {
        let want = meshc_ir::Tensor::read_npy(Path::new(&format!("testdata/train/expected/{name}.npy"))).unwrap();
        let want = want.data.to_f64();
        for layout in [None, Some("testdata/train/layouts/mp-2x4.json")] {
            let label = format!("{name} {}", layout.unwrap_or("one device"));
            let dir = scratch(&format!("train-{name}-{}", layout.is_some()));
            let art = compile(&dir, spec, layout);
            let ckpt = dir.join("ck.safetensors").display().to_string();
            let r = meshc(&["run", &art, "--steps", "200", "--data", "testdata/train/data", "--checkpoint", &ckpt]);
            assert_eq!(r.status, Some(0), "{label}: {r:?}");
            assert_curve(&label, &losses(&r.stdout), &want);
            let state = State::read(Path::new(&ckpt)).unwrap();
            assert_eq!(state.step, 200);
            assert!(state.tensors.contains_key("w1") && state.tensors.contains_key("b2"));
        }
    }
}

/// Data parallel over a ring of 8 (the gradients all-reduced), fault-free and with device
/// 3 degraded: the degraded run must follow the reference trained on the healthy
/// devices' rows only (its mean over 14 rows, forward and backward).
#[test]
fn a_degraded_ring_trains_like_the_healthy_devices_data_alone() {
    let dir = scratch("train-degraded");
    let art = compile(&dir, "sgd:0.1", Some("testdata/train/layouts/ring-8.json"));
    let ckpt = dir.join("ck.safetensors").display().to_string();
    for (degrade, want) in [(None, "sgd"), (Some("3"), "sgd-ring-8-degraded-3")] {
        let want = meshc_ir::Tensor::read_npy(Path::new(&format!("testdata/train/expected/{want}.npy"))).unwrap();
        let mut args = vec!["run", &art, "--steps", "200", "--data", "testdata/train/data", "--checkpoint", &ckpt];
        if let Some(d) = degrade {
            args.extend(["--degrade", d]);
        }
        let r = meshc(&args);
        assert_eq!(r.status, Some(0), "{r:?}");
        assert_curve(&format!("ring-8 degraded {degrade:?}"), &losses(&r.stdout), &want.data.to_f64());
    }
}

#[test]
fn a_resumed_run_continues_the_same_curve() {
    let dir = scratch("train-resume");
    let art = compile(&dir, "adamw:0.01,0.9,0.999,1e-8,0.01", None);
    let (a, b) = (dir.join("a.safetensors").display().to_string(), dir.join("b.safetensors").display().to_string());
    let whole = meshc(&["run", &art, "--steps", "20", "--data", "testdata/train/data", "--checkpoint", &a]);
    let first = meshc(&["run", &art, "--steps", "12", "--data", "testdata/train/data", "--checkpoint", &b]);
    let rest =
        meshc(&["run", &art, "--steps", "8", "--data", "testdata/train/data", "--resume", &b, "--checkpoint", &b]);
    for r in [&whole, &first, &rest] {
        assert_eq!(r.status, Some(0), "{r:?}");
    }
    assert_eq!(whole.stdout, first.stdout + &rest.stdout);
    // Steps are numbered like the batches they read: from 0, a resumed run from the
    // checkpoint's count.
    assert!(whole.stdout.starts_with("step 0 loss ") && rest.stdout.starts_with("step 12 loss "), "{rest:?}");
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), "the checkpoints differ");
}

#[test]
fn a_run_killed_while_saving_leaves_a_whole_checkpoint() {
    let dir = scratch("train-kill");
    let art = compile(&dir, "sgd:0.1", None);
    let ckpt = dir.join("ck.safetensors");
    // Kill at several moments, a few milliseconds apart: each time, the checkpoint on disk
    // is one a completed save wrote (it reads back, with its step's state).
    let mut seen = Vec::new();
    for i in 0..6u64 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_meshc"))
            .args(["run", &art, "--steps", "200", "--save-every", "1", "--data", "testdata/train/data"])
            .args(["--checkpoint", &ckpt.display().to_string()])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(150 + 37 * i));
        child.kill().unwrap();
        child.wait().unwrap();
        if ckpt.exists() {
            let s = State::read(&ckpt).unwrap_or_else(|e| panic!("kill {i}: a torn checkpoint: {e:#}"));
            assert_eq!(s.tensors.len(), 4);
            seen.push(s.step);
        }
    }
    assert!(!seen.is_empty(), "no run got as far as its first checkpoint");
}

#[test]
fn training_refusals_are_one_line_errors() {
    let dir = scratch("train-refusals");
    let art = dir.join("t.mshc").display().to_string();
    for (args, want) in [
        (vec!["--loss", "loss", "--optimizer", "adam:1"], "unknown optimizer 'adam'"),
        (vec!["--loss", "p", "--optimizer", "sgd:0.1"], "--loss 'p' is f32[16,4]; the loss must be a scalar f32[]"),
        (vec!["--loss", "loss", "--optimizer", "sgd:1e40"], "--optimizer 'sgd:1e40': lr = 1e40 is beyond f32's range"),
    ] {
        let mut a = vec!["compile", GRAPH, "-o", &art];
        a.extend(args);
        let r = meshc(&a);
        assert_eq!(r.status, Some(1), "{r:?}");
        assert!(r.stderr.contains(want) && r.stderr.lines().count() == 1, "{}", r.stderr);
    }
    // A training step over several hosts is refused when compiled, not at its first run.
    let hosts = dir.join("hosts.json");
    let mut spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("testdata/train/layouts/ring-8.json").unwrap()).unwrap();
    spec["hosts"] = serde_json::json!([[0, 1, 2, 3], [4, 5, 6, 7]]);
    std::fs::write(&hosts, spec.to_string()).unwrap();
    let hosts = hosts.display().to_string();
    let r = meshc(&["compile", GRAPH, "--loss", "loss", "--optimizer", "sgd:0.1", "--layout", &hosts, "-o", &art]);
    assert_eq!(r.status, Some(1), "{r:?}");
    let want =
        "hosts.json: hosts: a training step (--loss) runs in one process; training over several hosts is not supported";
    assert!(r.stderr.contains(want) && r.stderr.lines().count() == 1, "{}", r.stderr);
    // Hostile or missing files around a run: one line each, naming the file.
    let good = compile(&dir, "sgd:0.1", None);
    let junk = dir.join("junk.safetensors");
    std::fs::write(&junk, b"not a checkpoint").unwrap();
    let other = dir.join("other.safetensors");
    let (_, mut st) = open(&good);
    st.tensors.remove("w2");
    st.save(&other).unwrap();
    let (junk, other) = (junk.display().to_string(), other.display().to_string());
    let data = ["--data", "testdata/train/data"];
    for (args, want) in [
        (vec!["--steps", "1", "--resume", &junk], "junk.safetensors: not a safetensors checkpoint"),
        (vec!["--steps", "1", "--resume", &other], "the initial state has no tensor 'w2'"),
        (vec!["--steps", "201"], "holds 200 steps; steps 0 to 200 need a batch each"),
        (vec!["--steps", "1", "--input", "x=testdata/train/data/x.npy"], "cannot be used with"),
    ] {
        let mut a = vec!["run", &good];
        a.extend(args);
        a.extend(data);
        let r = meshc(&a);
        assert_eq!(r.status, Some(1), "{r:?}");
        assert!(r.stderr.contains(want) && r.stderr.lines().count() == 1, "{}", r.stderr);
    }
    let r = meshc(&["run", &good, "--steps", "1", "--data", "testdata/train/nope"]);
    assert_eq!(r.status, Some(1), "{r:?}");
    assert!(r.stderr.contains("testdata/train/nope/x.npy") && r.stderr.lines().count() == 1, "{}", r.stderr);
    let plain = dir.join("plain.mshc").display().to_string();
    assert_eq!(meshc(&["compile", GRAPH, "-o", &plain]).status, Some(0));
    let r = meshc(&["run", &plain, "--steps", "2", "--data", "testdata/train/data"]);
    assert_eq!(r.status, Some(1), "{r:?}");
    assert!(r.stderr.contains("not a training artifact") && r.stderr.lines().count() == 1, "{}", r.stderr);
}

/// The step run with its state on the devices (`Loaded::upload`, `run_resident`) against
/// the state handed through the host every step (`Loaded::run` with the state as inputs):
/// the same losses and the same final state, bit for bit, on one device and on the 2x4
/// mesh; and per step only the batch's blocks go in and the loss comes out — the state's
/// blocks are cut once (the upload) and gathered once (the download), whatever the steps.
#[test]
fn resident_state_steps_like_the_host_round_trip_and_never_reslices() {
    use meshc_runtime::tools::steps::state_names;
    use std::collections::HashMap;
    let x = meshc_ir::Tensor::read_npy(Path::new("testdata/train/data/x.npy")).unwrap();
    let labels = meshc_ir::Tensor::read_npy(Path::new("testdata/train/data/labels.npy")).unwrap();
    let batch = |s: usize| {
        let cut = |t: &meshc_ir::Tensor| {
            let ty = meshc_ir::TensorType::new(t.dtype(), t.shape[1..].to_vec());
            let bytes = t.to_le_bytes();
            meshc_ir::Tensor::from_le_bytes(&ty, &bytes[s * ty.size_bytes()..(s + 1) * ty.size_bytes()])
        };
        HashMap::from([("x".to_string(), cut(&x)), ("labels".to_string(), cut(&labels))])
    };
    for layout in [None, Some("testdata/train/layouts/mp-2x4.json")] {
        let dir = scratch(&format!("train-resident-{}", layout.is_some()));
        let art = compile(&dir, "adamw:0.01,0.9,0.999,1e-8,0.01", layout);
        let (loaded, init) = open(&art);
        let names = state_names(&loaded);
        assert!(names.len() >= 8, "{names:?}");
        let steps = 6;
        // Through the host.
        let mut host = init.tensors.clone();
        let mut host_losses = Vec::new();
        for s in 0..steps {
            let mut inputs = batch(s);
            inputs.extend(host.iter().map(|(n, t)| (n.clone(), t.clone())));
            let mut out = loaded.run(&inputs).unwrap();
            for n in &names {
                host.insert(n.clone(), out.remove(&meshc_ir::optim::next_name(n)).unwrap());
            }
            host_losses.push(out["loss"].to_le_bytes());
        }
        // Resident.
        let before = loaded.host_copies();
        let mut resident = loaded.upload(&init.tensors, &names, meshc_ir::optim::next_name).unwrap();
        let devices = loaded.meta.mesh.devices() as u64;
        assert_eq!(loaded.host_copies() - before, devices * names.len() as u64, "{art}: the upload");
        for (s, want) in host_losses.iter().enumerate() {
            let before = loaded.host_copies();
            let out = loaded.run_resident(&batch(s), &mut resident).unwrap();
            // x and labels into every device, the loss out of one.
            assert_eq!(loaded.host_copies() - before, 2 * devices + 1, "{art}: step {s}");
            assert_eq!(out.keys().collect::<Vec<_>>(), ["loss"]);
            assert_eq!(&out["loss"].to_le_bytes(), want, "{art}: step {s}'s loss");
        }
        let state = loaded.download(&resident).unwrap();
        for n in &names {
            assert_eq!(state[n].ty(), host[n].ty());
            assert_eq!(state[n].to_le_bytes(), host[n].to_le_bytes(), "{art}: '{n}' after {steps} steps");
        }
    }
}

/// The artifact alone trains: its state section holds the params' initial values and
/// names the zero optimizer state without storing it, and a run needs no other file.
#[test]
fn a_training_artifact_needs_nothing_beside_it() {
    let dir = scratch("train-alone");
    let art = compile(&dir, "adamw:0.01,0.9,0.999,1e-8,0.01", None);
    let files: Vec<_> = std::fs::read_dir(&*dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(files, ["train.mshc"], "compile wrote more than the artifact");
    let (loaded, init) = open(&art);
    assert_eq!(init.step, 0);
    let graph = meshc_ir::load::load(Path::new(GRAPH)).unwrap().0;
    for p in &graph.params {
        let (m, v) = (&init.tensors[&format!("opt.m.{}", p.name)], &init.tensors[&format!("opt.v.{}", p.name)]);
        assert!(m.to_le_bytes().iter().chain(&v.to_le_bytes()).all(|&b| b == 0), "{}'s moments", p.name);
        assert_eq!(init.tensors[&p.name].ty(), m.ty());
    }
    // Only the params' bytes are stored: the zero moments are named, not written.
    let params: usize = graph.params.iter().map(|p| p.ty.size_bytes()).sum();
    let section = loaded.section(meshc_runtime::format::artifact::SectionKind::State).unwrap().len();
    assert!(section < params + 4096, "a state section of {section} bytes for {params} bytes of params");
    // The checkpoint goes to the scratch directory, not the default beside the sources.
    let ckpt = dir.join("alone.ckpt.safetensors").display().to_string();
    let r = meshc(&["run", &art, "--steps", "3", "--data", "testdata/train/data", "--checkpoint", &ckpt]);
    assert_eq!(r.status, Some(0), "{r:?}");
    let want = meshc_ir::Tensor::read_npy(Path::new("testdata/train/expected/adamw.npy")).unwrap();
    assert_curve("alone", &losses(&r.stdout), &want.data.to_f64()[..3]);
}

/// `--degrade` of a ZeRO-1 artifact: the device cannot drop out, and the one line says
/// why — a shard of optimizer state split over the data axis (it once blamed "params",
/// which --zero leaves replicated), or, with no state (sgd), the gather that needs its
/// block (it once failed inside the run, at the collective).
#[test]
fn degrading_a_zero_artifact_names_what_the_device_holds() {
    let dir = scratch("train-zero-degrade");
    let l = "testdata/train/layouts/ring-8.json";
    for (spec, want) in [
        (
            "momentum:0.1,0.9",
            "error: --degrade: device (1) cannot be left out: it holds a shard of a param or of optimizer state (split over mesh axis 'data': model parallel, or --zero) that the others cannot do without; only layouts that replicate both can lose a device\n",
        ),
        ("sgd:0.1", "error: --degrade: device (1) cannot be left out: node '"),
    ] {
        let art = compile_with(&dir, "zero.mshc", spec, Some(l), &["--zero"]);
        let r = meshc(&["run", &art, "--degrade", "1", "--steps", "1", "--data", "testdata/train/data"]);
        assert_eq!(r.status, Some(1), "{r:?}");
        assert_eq!(r.stderr.lines().count(), 1, "{r:?}");
        assert!(r.stderr.starts_with(want), "{spec}: {r:?}");
        if spec.starts_with("sgd") {
            assert!(r.stderr.contains("needs its block; only reductions can leave a device's operand out"), "{r:?}");
        }
    }
}

/// ZeRO-1 (`--zero`) on the 2x4 mesh (data x model) and data parallel over a ring of 8:
/// the optimizer state of each param is split over the data axis on top of its own layout
/// (per device, a half or an eighth of the bytes), the gradients reach it by reduce-scatter
/// and the params leave by all-gather; the run follows the run without --zero (only the
/// order of the gradient's reduction may differ) and the reference curve.
#[test]
fn zero_shards_the_optimizer_state_and_trains_like_the_plain_run() {
    use meshc_runtime::format::program::{CollectiveOp, Exec};
    let want = meshc_ir::Tensor::read_npy(Path::new("testdata/train/expected/adamw.npy")).unwrap().data.to_f64();
    let spec = "adamw:0.01,0.9,0.999,1e-8,0.01";
    for (layout, data, device) in [("mp-2x4", 2, "1,0"), ("ring-8", 8, "1")] {
        let dir = scratch(&format!("train-zero-{layout}"));
        let l = format!("testdata/train/layouts/{layout}.json");
        let plain = compile_with(&dir, "plain.mshc", spec, Some(&l), &[]);
        let zero = compile_with(&dir, "zero.mshc", spec, Some(&l), &["--zero"]);
        let ((p, _), (z, _)) = (open(&plain), open(&zero));
        let bytes = |l: &meshc_runtime::exec::runner::Loaded, name: &str| {
            let i = l.meta.inputs.iter().position(|s| s.name == name).unwrap();
            l.programs.iter().map(|q| q.buffers[q.inputs[i]].bytes).max().unwrap()
        };
        // w1 [8, 32] and w2 [32, 4] have a dim the data axis divides: their moments shrink
        // on every device; the params themselves stay whole.
        for m in ["opt.m.w1", "opt.v.w1", "opt.m.w2", "opt.v.w2"] {
            assert_eq!(bytes(&z, m) * data, bytes(&p, m), "{layout}: '{m}' per device");
        }
        assert_eq!(bytes(&z, "w1"), bytes(&p, "w1"), "{layout}");
        let count = |l: &meshc_runtime::exec::runner::Loaded, f: fn(&CollectiveOp) -> bool| {
            (l.programs[0].steps.iter()).filter(|s| matches!(&s.exec, Exec::Collective(c) if f(&c.op))).count()
        };
        let scatter = |c: &CollectiveOp| matches!(c, CollectiveOp::ReduceScatter { .. });
        let gather = |c: &CollectiveOp| matches!(c, CollectiveOp::AllGather { .. });
        assert_eq!(count(&p, scatter), 0, "{layout}");
        assert!(count(&z, scatter) >= 2 && count(&z, gather) >= 2, "{layout}: {} reduce-scatters", count(&z, scatter));
        let run = |art: &str, ckpt: &str| {
            let ckpt = dir.join(ckpt).display().to_string();
            let r = meshc(&["run", art, "--steps", "200", "--data", "testdata/train/data", "--checkpoint", &ckpt]);
            assert_eq!(r.status, Some(0), "{r:?}");
            (losses(&r.stdout), State::read(Path::new(&ckpt)).unwrap())
        };
        let ((lp, sp), (lz, sz)) = (run(&plain, "p.safetensors"), run(&zero, "z.safetensors"));
        assert_curve(&format!("{layout} --zero"), &lz, &want);
        for (i, (a, b)) in lp.iter().zip(&lz).enumerate() {
            assert!((a - b).abs() <= 1e-5 * a.abs(), "{layout}: step {} loss {b} with --zero, {a} without", i + 1);
        }
        for (n, t) in &sp.tensors {
            let c = sz.tensors[n].closeness(t);
            assert!(c.max_abs_err <= 1e-4 && c.nan_mismatches == 0, "{layout}: '{n}' after 200 steps: {c:?}");
        }
        // Each device holds the only copy of its shard of the optimizer state: losing one
        // would lose it, so a degraded device is refused.
        let r = meshc(&["run", &zero, "--steps", "1", "--data", "testdata/train/data", "--degrade", device]);
        assert_eq!(r.status, Some(1), "{r:?}");
        assert!(
            r.stderr.contains("holds a shard of a param or of optimizer state") && r.stderr.lines().count() == 1,
            "{}",
            r.stderr
        );
    }
}

/// The classifier with its batch of 16 rows as a 4x4 grid (dims rx, ry: one row per device
/// of a 4x4 torus), or as `rows` rows.
fn classifier_variant(batch: &[usize], dims: &[&str]) -> String {
    let mut g: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(GRAPH).unwrap()).unwrap();
    for input in g["inputs"].as_array_mut().unwrap() {
        let last = input["shape"].as_array().unwrap().last().unwrap().clone();
        let last_dim = input["dims"].as_array().unwrap().last().unwrap().clone();
        let mut shape: Vec<serde_json::Value> = batch.iter().map(|&b| b.into()).collect();
        shape.push(last);
        let mut names: Vec<serde_json::Value> = dims.iter().map(|&d| d.into()).collect();
        names.push(last_dim);
        input["shape"] = shape.into();
        input["dims"] = names.into();
    }
    for n in g["nodes"].as_array_mut().unwrap().iter_mut().filter(|n| n["name"] == "s") {
        n["attrs"]["axes"] = serde_json::json!([batch.len()]);
    }
    serde_json::to_string(&g).unwrap()
}

/// Seed 002 end to end: a step on a 4x4 torus (one row of the batch per device) with
/// devices (1,1) and (2,3) degraded applies the update of the fault-free step over the
/// healthy devices' 14 rows: 200 steps follow, loss by loss and in the final state, the
/// same training run on one device over those rows alone.
#[test]
fn a_degraded_4x4_torus_trains_like_the_fault_free_step_over_the_healthy_rows() {
    let dir = scratch("train-torus");
    let read = |n: &str| meshc_ir::Tensor::read_npy(Path::new(&format!("testdata/train/data/{n}.npy"))).unwrap();
    let (x, labels) = (read("x"), read("labels"));
    let (torus_data, rows_data) = (dir.join("torus"), dir.join("rows"));
    let lost = [5usize, 11]; // rows 4*i + j of devices (1,1) and (2,3)
    for d in [&torus_data, &rows_data] {
        std::fs::create_dir(d).unwrap();
    }
    for (name, t) in [("x", &x), ("labels", &labels)] {
        let (steps, rows, width) = (t.shape[0], t.shape[1], t.shape[2]);
        let grid = meshc_ir::TensorType::new(t.dtype(), vec![steps, 4, 4, width]);
        meshc_ir::Tensor::from_le_bytes(&grid, &t.to_le_bytes())
            .write_npy(&torus_data.join(format!("{name}.npy")))
            .unwrap();
        let v = t.data.to_f64();
        let kept: Vec<f32> = (0..steps * rows)
            .filter(|r| !lost.contains(&(r % rows)))
            .flat_map(|r| v[r * width..(r + 1) * width].iter().map(|&e| e as f32))
            .collect();
        let healthy = meshc_ir::Tensor::new(vec![steps, rows - lost.len(), width], meshc_ir::Data::F32(kept));
        healthy.write_npy(&rows_data.join(format!("{name}.npy"))).unwrap();
    }
    let torus_graph = dir.join("torus.json");
    std::fs::write(&torus_graph, classifier_variant(&[4, 4], &["rx", "ry"])).unwrap();
    let rows_graph = dir.join("rows.json");
    std::fs::write(&rows_graph, classifier_variant(&[14], &["batch"])).unwrap();
    let layout = "testdata/dp_train/layouts/torus-4x4.json";
    for spec in ["sgd:0.1", "adamw:0.01,0.9,0.999,1e-8,0.01"] {
        let run = |graph: &Path, data: &Path, more: &[&str]| {
            let ckpt = dir.join("ck.safetensors").display().to_string();
            let (graph, data) = (graph.display().to_string(), data.display().to_string());
            let mut args = vec!["run", &graph, "--loss", "loss", "--optimizer", spec, "--steps", "200"];
            args.extend(["--data", &data, "--checkpoint", &ckpt]);
            args.extend(more);
            let r = meshc(&args);
            assert_eq!(r.status, Some(0), "{r:?}");
            (losses(&r.stdout), State::read(Path::new(&ckpt)).unwrap())
        };
        let (want, want_state) = run(&rows_graph, &rows_data, &[]);
        let (got, state) =
            run(&torus_graph, &torus_data, &["--layout", layout, "--degrade", "1,1", "--degrade", "2,3"]);
        let (free, _) = run(&torus_graph, &torus_data, &["--layout", layout]);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-5 * w.abs(), "{spec}: step {} loss {g} degraded, {w} over the 14 rows", i + 1);
        }
        assert!(free.iter().zip(&want).any(|(f, w)| (f - w).abs() > 1e-3 * w.abs()), "{spec}: nothing was left out");
        for (n, t) in &want_state.tensors {
            let c = state.tensors[n].closeness(t);
            assert!(c.max_abs_err <= 1e-4 && c.nan_mismatches == 0, "{spec}: '{n}' after 200 steps: {c:?}");
        }
    }
}

/// The small CNN (conv → relu → max_pool → reshape → matmul) and the embedding table
/// (gather, whose gradient is a scatter-add) of testdata/train_small, trained 5 steps by
/// the compiled artifact on one device and data parallel over 2 (where the embedding's
/// gradient is a partial sum per device, all-reduced; reduce-scattered with `--zero`)
/// against the same step run by the interpreter, state fed back by hand: the losses agree
/// within 1e-4 relative.
#[test]
fn a_cnn_and_an_embedding_train_compiled_as_interpreted_on_one_and_two_devices() {
    use meshc_ir::{optim, params, verify, Data, Tensor};
    use std::collections::HashMap;
    const STEPS: usize = 5;
    // The batches: x/t (or ids/t) with a leading step axis, from a fixed xorshift stream.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut unit = |n: usize| (0..n).map(|_| (next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0).collect::<Vec<_>>();
    let mut ids = (0..STEPS * 20).map(|i| (i as i64 * 7 + i as i64 / 3) % 10).collect::<Vec<_>>();
    ids.rotate_left(3);
    let cases = [
        ("cnn", "momentum:0.05,0.9", vec![("x", Tensor::f32(vec![STEPS, 4, 1, 6, 6], unit(STEPS * 144)))]),
        ("embed", "sgd:0.5", vec![("ids", Tensor::new(vec![STEPS, 4, 5], Data::I64(ids)))]),
    ];
    for (name, spec, mut inputs) in cases {
        let dir = scratch(&format!("train-small-{name}"));
        let data = dir.join("data");
        std::fs::create_dir_all(&data).unwrap();
        inputs.push(("t", Tensor::f32(vec![STEPS, 4, 3], unit(STEPS * 12))));
        for (input, t) in &inputs {
            t.write_npy(&data.join(format!("{input}.npy"))).unwrap();
        }
        // The interpreter's curve.
        let src = format!("testdata/train_small/{name}.txt");
        let g = meshc_ir::load::load(Path::new(&src)).unwrap().0;
        let info = verify::verify(&g).unwrap();
        let wrt = meshc_ir::grad::select_wrt(&g, &[]).unwrap();
        let opt = optim::Optimizer::parse(spec).unwrap();
        let (step, state) = optim::train_step(&g, &info, "loss", &wrt, opt).unwrap();
        let sinfo = verify::verify(&step).unwrap();
        let mut values: HashMap<String, Tensor> = params::load_all(&step, Path::new(".")).unwrap();
        let mut want = Vec::new();
        for s in 0..STEPS {
            for (input, t) in &inputs {
                let ty = meshc_ir::TensorType::new(t.dtype(), t.shape[1..].to_vec());
                let bytes = t.to_le_bytes();
                let at = Tensor::from_le_bytes(&ty, &bytes[s * ty.size_bytes()..(s + 1) * ty.size_bytes()]);
                values.insert(input.to_string(), at);
            }
            let mut out = meshc_ir::interp::run(&step, &sinfo.order, &sinfo.types, values.clone()).unwrap();
            for n in &state {
                values.insert(n.clone(), out.remove(&optim::next_name(n)).unwrap());
            }
            want.push(out["loss"].data.to_f64()[0]);
        }
        assert!(want[STEPS - 1] < want[0], "{name}: the loss does not fall: {want:?}");
        let dp = ["--layout", "testdata/train_small/dp-2.json"];
        for layout in [&[][..], &dp, &[dp[0], dp[1], "--zero"]] {
            let art = dir.join("train.mshc").display().to_string();
            let mut args = vec!["compile", &src, "--loss", "loss", "--optimizer", spec, "-o", &art];
            args.extend(layout);
            let c = meshc(&args);
            assert_eq!(c.status, Some(0), "{c:?}");
            let ckpt = dir.join("small.ckpt.safetensors").display().to_string();
            let r = meshc(&["run", &art, "--steps", "5", "--data", &data.display().to_string(), "--checkpoint", &ckpt]);
            assert_eq!(r.status, Some(0), "{name} {layout:?}: {r:?}");
            assert_curve(&format!("{name} {layout:?}"), &losses(&r.stdout), &want);
        }
    }
}

/// Without --checkpoint the state goes to NAME.ckpt.safetensors in the working directory, and
/// meshc says so: never beside the graph, which is the user's source.
#[test]
fn the_default_checkpoint_is_announced_and_not_beside_the_source() {
    let dir = scratch("train-default-checkpoint");
    let graph = std::fs::canonicalize(GRAPH).unwrap();
    let data = std::fs::canonicalize("testdata/train/data").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meshc"))
        .current_dir(&dir)
        .args(["run", graph.to_str().unwrap(), "--loss", "loss", "--optimizer", "sgd:0.1", "--steps", "2"])
        .args(["--data", data.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("checkpoint: classifier.ckpt.safetensors (no --checkpoint given)"), "{stderr}");
    assert_eq!(State::read(&dir.join("classifier.ckpt.safetensors")).unwrap().step, 2);
    assert!(!Path::new("testdata/train/classifier.ckpt.safetensors").exists());
}

/// A training run's own files are hostile too: `--resume` of a FIFO or a device is
/// refused at once, as is a checkpoint with a flipped bit, one of another optimizer, or
/// one whose step count would wrap; a bad batch found only at its step (per-step batch
/// directories) ends the run with the steps before it saved.
#[test]
fn checkpoints_and_batches_that_would_lose_or_corrupt_work_are_refused() {
    let dir = scratch("train-trust");
    let sgd = compile(&dir, "sgd:0.1", None);
    let adamw = compile_with(&dir, "adamw.mshc", "adamw:0.01,0.9,0.999,1e-8,0.01", None, &[]);
    let data = ["--data", "testdata/train/data"];
    let path = |name: &str| dir.join(name).display().to_string();
    let moments = path("adamw.safetensors");
    let r = meshc(&["run", &adamw, "--steps", "2", data[0], data[1], "--checkpoint", &moments]);
    assert_eq!(r.status, Some(0), "{r:?}");
    let mut bytes = std::fs::read(&moments).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0x10;
    std::fs::write(path("flipped.safetensors"), bytes).unwrap();
    let (_, mut late) = open(&sgd);
    late.step = u64::MAX - 1;
    late.save(Path::new(&path("late.safetensors"))).unwrap();
    assert!(Command::new("mkfifo").arg(path("fifo")).status().unwrap().success());
    let (_, init) = open(&sgd);
    let tensors: Vec<(&str, &meshc_ir::Tensor)> = init.tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let meta = std::collections::HashMap::from([("meshc.step".to_string(), "-5".to_string())]);
    std::fs::write(path("minus.safetensors"), meshc_ir::tensor::safetensors_bytes(&tensors, Some(meta)).unwrap())
        .unwrap();
    let minus = path("minus.safetensors");
    let (fifo, flipped, late) = (path("fifo"), path("flipped.safetensors"), path("late.safetensors"));
    for (art, resume, want) in [
        (&sgd, fifo.as_str(), "fifo: cannot read checkpoint: is a FIFO"),
        (&sgd, "/dev/zero", "/dev/zero: cannot read checkpoint: is a device"),
        (&adamw, &flipped, "flipped.safetensors: its contents do not match its checksum 'meshc.crc32'"),
        (&sgd, &moments, "which is no state of this program (a checkpoint of another optimizer?)"),
        (&sgd, &late, "--steps 2 from step 18446744073709551614: the step count would pass 18446744073709551615"),
        (&sgd, &minus, "minus.safetensors: 'meshc.step' is '-5', not a count of steps"),
    ] {
        let r = meshc(&["run", art, "--steps", "2", data[0], data[1], "--resume", resume]);
        assert_eq!(r.status, Some(1), "{resume}: {r:?}");
        assert!(r.stderr.contains(want) && r.stderr.lines().count() == 1, "{resume}: {}", r.stderr);
    }
    // Per-step batches, step 2's x of the wrong shape: steps 0 and 1 are kept.
    let batches = dir.join("batches");
    for name in ["x", "labels"] {
        let all = meshc_ir::Tensor::read_npy(&Path::new("testdata/train/data").join(format!("{name}.npy"))).unwrap();
        let ty = meshc_ir::TensorType::new(all.dtype(), all.shape[1..].to_vec());
        let bytes = all.to_le_bytes();
        for k in 0..3 {
            let step = batches.join(format!("step_{k:06}"));
            std::fs::create_dir_all(&step).unwrap();
            let mut ty = ty.clone();
            if k == 2 && name == "x" {
                ty.shape[0] -= 1;
            }
            let at = k * ty.size_bytes();
            let t = meshc_ir::Tensor::from_le_bytes(&ty, &bytes[at..at + ty.size_bytes()]);
            t.write_npy(&step.join(format!("{name}.npy"))).unwrap();
        }
    }
    let (batches, kept) = (batches.display().to_string(), path("kept.safetensors"));
    let r = meshc(&["run", &sgd, "--steps", "5", "--data", &batches, "--checkpoint", &kept]);
    assert_eq!(r.status, Some(1), "{r:?}");
    assert_eq!(r.stdout.lines().count(), 2, "{}", r.stdout);
    assert!(
        r.stderr.contains("step_000002/x.npy")
            && r.stderr.contains(&format!("(the state after step 1 is saved in {kept})"))
            && r.stderr.lines().count() == 1,
        "{}",
        r.stderr
    );
    assert_eq!(State::read(Path::new(&kept)).unwrap().step, 2);
}

/// An imported ONNX model trains with a built-in loss attached (`--loss mse:OUTPUT`, the
/// truth read as the new input `target`): the first step's loss is onnxruntime's output
/// against the target (tools/gen_encoder_train_data.py), the Megatron-sharded run follows
/// the one-device curve, and the loss falls.
#[test]
fn an_imported_encoder_fine_tunes_with_a_built_in_loss_on_one_device_and_megatron() {
    let data = "testdata/onnx/encoder/train";
    let loss0 = meshc_ir::Tensor::read_npy(Path::new(&format!("{data}/expected/loss0.npy"))).unwrap().data.to_f64()[0];
    let mut curves = Vec::new();
    for layout in [None, Some("testdata/onnx/encoder/layouts/megatron-rules.json")] {
        let dir = scratch(&format!("train-encoder-{}", layout.is_some()));
        let ckpt = dir.join("ck.safetensors").display().to_string();
        let mut args = vec!["run", "testdata/onnx/encoder/model.onnx", "--dim", "batch=2", "--dim", "seq=5"];
        args.extend(["--loss", "mse:last_hidden_state", "--optimizer", "adamw:lr=1e-2", "--steps", "8"]);
        args.extend(["--data", data, "--checkpoint", &ckpt]);
        if let Some(l) = layout {
            args.extend(["--layout", l]);
        }
        let r = meshc(&args);
        assert_eq!(r.status, Some(0), "{r:?}");
        curves.push(losses(&r.stdout));
    }
    let one = &curves[0];
    assert!((one[0] - loss0).abs() <= 1e-5 * loss0, "step 0 loss {}, onnxruntime's {loss0}", one[0]);
    assert_curve("megatron against one device", &curves[1], one);
    assert!(one[7] < 0.8 * one[0], "the loss did not fall: {one:?}");
}
