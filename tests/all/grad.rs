//! `meshc grad` end to end: the gradients of the MLP and the transformer block of
//! testdata (with a mean-squared-error loss) against jax.grad's (tools/gen_grad_testdata.py,
//! float64), on the interpreter; compiled gradient graphs (one device, and split over a
//! 2x4 mesh) against the interpreter's; an embedding's gradient under data parallelism
//! (a partial scatter-add, all-reduced); and the command's refusals.

use std::path::Path;

use crate::common::{assert_close, compare_expected, input_args, meshc, scratch};

fn grad_graph(name: &str, dir: &Path) -> (String, String) {
    let src = format!("testdata/grad/{name}/graph.json");
    let out = dir.join("g.json").display().to_string();
    let r = meshc(&["grad", &src, "--loss", "loss", "-o", &out]);
    assert_eq!(r.status, Some(0), "{r:?}");
    (src, out)
}

fn run_to(cmd: &str, graph: &str, inputs_of: &str, extra: &[&str], out: &Path) {
    let mut args: Vec<String> = vec![cmd.into(), graph.into()];
    args.extend(input_args(Path::new(inputs_of)));
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(["--output-dir".into(), out.display().to_string()]);
    let r = meshc(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(r.status, Some(0), "meshc {}: {r:?}", args.join(" "));
}

#[test]
fn mlp_and_transformer_gradients_match_jax() {
    for name in ["mlp", "transformer"] {
        let dir = scratch(&format!("grad-jax-{name}"));
        let (src, g) = grad_graph(name, &dir);
        run_to("interp", &g, &src, &[], &dir.join("interp"));
        let n = compare_expected(Path::new(&src), &dir.join("interp")).unwrap();
        assert!(n >= 3, "{name}: {n} expected files compared");
    }
}

#[test]
fn compiled_gradients_match_the_interpreter_on_one_device_and_a_2x4_mesh() {
    for name in ["mlp", "transformer"] {
        let dir = scratch(&format!("grad-compiled-{name}"));
        let (src, g) = grad_graph(name, &dir);
        run_to("interp", &g, &src, &[], &dir.join("interp"));
        for (label, extra) in [
            ("one device", vec![]),
            ("dp-2x4", vec!["--layout".to_string(), format!("testdata/{name}/layouts/dp-2x4.json")]),
            ("mp-2x4", vec!["--layout".to_string(), format!("testdata/{name}/layouts/mp-2x4.json")]),
        ] {
            let out = dir.join(label);
            run_to("run", &g, &src, &extra.iter().map(String::as_str).collect::<Vec<_>>(), &out);
            let mut files: Vec<_> = std::fs::read_dir(dir.join("interp")).unwrap().map(|e| e.unwrap().path()).collect();
            files.sort();
            assert!(files.len() >= 3);
            for want in files {
                let file = want.file_name().unwrap();
                let want = meshc_ir::Tensor::read_npy(&want).unwrap();
                let got = meshc_ir::Tensor::read_npy(&out.join(file)).unwrap();
                assert_close(&format!("{name} {label} {}", file.to_string_lossy()), &got, &want).unwrap();
            }
        }
    }
}

#[test]
fn grad_refusals_are_one_line_errors() {
    let dir = scratch("grad-refusals");
    let out = dir.join("g.txt").display().to_string();
    let src = "testdata/grad/mlp/graph.json";
    for (args, want) in [
        (vec!["--loss", "nope"], "testdata/grad/mlp/graph.json: --loss 'nope' is not a tensor of the graph"),
        (vec!["--loss", "Loss"], "--loss 'Loss' is not a tensor of the graph (did you mean 'loss'?)"),
        (vec!["--loss", "loss.sq"], "--loss 'loss.sq' is f32[16,64]; the loss must be a scalar f32[]"),
        (vec!["--loss", "loss", "--wrt", "w1,v*"], "--wrt 'v*' matches no param or input of the graph"),
    ] {
        let mut a = vec!["grad", src, "-o", &out];
        a.extend(args);
        let r = meshc(&a);
        assert_eq!(r.status, Some(1), "{r:?}");
        assert!(r.stderr.contains(want) && r.stderr.lines().count() == 1, "{}", r.stderr);
        assert!(!Path::new(&out).exists());
    }
    // --wrt picks: only grad.w2 is added, and the text form reads back.
    let r = meshc(&["grad", src, "--loss", "loss", "--wrt", "w2", "-o", &out]);
    assert_eq!(r.status, Some(0), "{r:?}");
    let c = meshc(&["check", &out]);
    assert_eq!(c.status, Some(0), "{c:?}");
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("grad.w2") && !text.contains("grad.w1"), "{text}");
}

/// Under data parallelism the embedding's gradient (a scatter-add of the batch's rows)
/// runs where its batch-split indices are: one all-reduce of the table's partial sums,
/// explained as such, and nothing gathers the integer indices.
#[test]
fn an_embedding_gradient_is_a_partial_scatter_add_all_reduced() {
    let dir = scratch("grad-embed-dp");
    let out = dir.join("g.json").display().to_string();
    let r = meshc(&["grad", "testdata/train_small/embed.txt", "--loss", "loss", "-o", &out]);
    assert_eq!(r.status, Some(0), "{r:?}");
    let e = meshc(&["explain", &out, "--layout", "testdata/train_small/dp-2.json"]);
    assert_eq!(e.status, Some(0), "{e:?}");
    let steps: Vec<&str> = e.stdout.lines().filter(|l| l.contains("scatter-add of split updates")).collect();
    assert_eq!(steps.len(), 1, "{}", e.stdout);
    assert!(steps[0].contains("all_reduce") && steps[0].contains("partial(data)"), "{}", steps[0]);
    assert!(!e.stdout.contains("all_gather"), "{}", e.stdout);
}
