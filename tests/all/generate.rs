//! `meshc generate` on testdata/decoder, a tiny GPT-style decode step: greedy ids as the
//! numpy reference generated them (tools/gen_testdata.py: the prompt fed one position a
//! step from empty caches, each top logit ahead of the next by a margin f32 cannot
//! overturn), on one device and with the heads split over two; seeded sampling repeated
//! exactly; stop ids; and every refusal as one line. Then transformers' GPT-2 and Llama
//! exported to ONNX with past/present KV (tools/export_decoders.py), imported as decode
//! steps: greedy ids as torch's `generate()` picked them.

use std::path::Path;

use meshc_ir::{Data, Tensor};

use crate::common::{meshc, scratch};

const GRAPH: &str = "testdata/decoder/graph.json";
const PROMPT: &str = "testdata/decoder/generate/prompt.npy";

fn generate(extra: &[&str]) -> crate::common::Run {
    let mut args = vec!["generate", GRAPH, "--prompt", PROMPT, "--context", "16"];
    args.extend(extra);
    meshc(&args)
}

fn greedy() -> Vec<Vec<i64>> {
    rows("testdata/decoder/generate/greedy.npy")
}

pub(crate) fn rows(path: &str) -> Vec<Vec<i64>> {
    let t = Tensor::read_npy(Path::new(path)).unwrap();
    let Data::I64(v) = &t.data else { panic!("{path} holds int64") };
    v.chunks(t.shape[1]).map(<[i64]>::to_vec).collect()
}

/// Each command exits 1 with one line of stderr holding its message.
fn refused_in_one_line(cases: &[(Vec<&str>, &str)]) {
    for (args, want) in cases {
        let r = meshc(args);
        assert_eq!(r.status, Some(1), "{args:?}: {r:?}");
        assert!(r.stderr.contains(want) && r.stderr.trim().lines().count() == 1, "{args:?}: {}", r.stderr);
    }
}

pub(crate) fn printed(stdout: &str) -> Vec<Vec<i64>> {
    stdout.lines().map(|l| l.split(' ').map(|t| t.parse().unwrap()).collect()).collect()
}

#[test]
fn greedy_ids_are_numpys_on_one_device_and_with_the_heads_split() {
    let want = greedy();
    assert_eq!(want[0].len(), 14, "the reference runs to the context");
    for extra in [vec![], vec!["--layout", "testdata/decoder/layouts/heads-2.json"]] {
        let mut args = vec!["--max-new-tokens", "14"];
        args.extend(&extra);
        let r = generate(&args);
        assert_eq!(r.status, Some(0), "{r:?}");
        assert_eq!(printed(&r.stdout), want, "{extra:?}");
        assert!(r.stderr.contains("28 new tokens") && r.stderr.contains("tokens/s"), "{}", r.stderr);
    }
    // Fewer new tokens are the first of them; an artifact gives the same as the graph.
    let dir = scratch("generate-greedy");
    let art = dir.join("decoder.mshc");
    assert_eq!(meshc(&["compile", GRAPH, "-o", art.to_str().unwrap()]).status, Some(0));
    let out = dir.join("ids.npy");
    let r = meshc(&[
        "generate",
        art.to_str().unwrap(),
        "--prompt",
        PROMPT,
        "--context",
        "12",
        "--max-new-tokens",
        "5",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(r.status, Some(0), "{r:?}");
    assert!(r.stdout.is_empty(), "{}", r.stdout);
    let got = Tensor::read_npy(&out).unwrap();
    assert_eq!(got.shape, [2, 5]);
    let first: Vec<i64> = want.iter().flat_map(|w| w[..5].to_vec()).collect();
    assert_eq!(got.data, Data::I64(first));
}

#[test]
fn sampling_repeats_with_its_seed_and_stops_at_a_stop_id() {
    let run = |extra: &[&str]| {
        let mut args = vec!["--max-new-tokens", "10"];
        args.extend(extra);
        let r = generate(&args);
        assert_eq!(r.status, Some(0), "{r:?}");
        printed(&r.stdout)
    };
    for how in ["temperature:1.5", "top-k:8", "top-p:0.9"] {
        let a = run(&["--sample", how, "--seed", "7"]);
        assert_eq!(a, run(&["--sample", how, "--seed", "7"]), "{how}");
        assert!(a.iter().flatten().all(|&t| (0..40).contains(&t)), "{how}: {a:?}");
    }
    let seeds: std::collections::BTreeSet<Vec<Vec<i64>>> =
        (0..6).map(|s| run(&["--sample", "temperature:2", "--seed", &s.to_string()])).collect();
    assert!(seeds.len() > 1, "every seed gave the same tokens");
    assert_eq!(run(&["--sample", "top-k:1", "--seed", "3"]), run(&[]).iter().map(|r| r.to_vec()).collect::<Vec<_>>());
    // A greedy token of sequence 0 that sequence 1 never emits in its first ten stops
    // sequence 0 there; sequence 1 runs on, and the .npy marks sequence 0's missing tokens
    // with -1.
    let want = greedy();
    let i = (1..10).find(|&i| !want[1][..10].contains(&want[0][i]) && !want[0][..i].contains(&want[0][i])).unwrap();
    let stop = want[0][i];
    let got = run(&["--stop", &stop.to_string()]);
    assert_eq!(got, [want[0][..=i].to_vec(), want[1][..10].to_vec()]);
    let dir = scratch("generate-stop");
    let out = dir.join("ids.npy");
    let r = generate(&["--max-new-tokens", "10", "--stop", &stop.to_string(), "--output", out.to_str().unwrap()]);
    assert_eq!(r.status, Some(0), "{r:?}");
    let t = Tensor::read_npy(&out).unwrap();
    let Data::I64(v) = &t.data else { panic!("int64") };
    assert_eq!(t.shape, [2, 10]);
    assert_eq!(&v[..10], [&want[0][..=i], &vec![-1; 9 - i][..]].concat().as_slice());
}

#[test]
fn refusals_are_one_line() {
    let dir = scratch("generate-refusals");
    let f32s = dir.join("f32.npy");
    Tensor::f32(vec![2, 3], vec![1.0; 6]).write_npy(&f32s).unwrap();
    let wide = dir.join("wide.npy");
    Tensor::new(vec![3, 2], Data::I64(vec![1; 6])).write_npy(&wide).unwrap();
    let big = dir.join("big.npy");
    Tensor::new(vec![2, 1], Data::I64(vec![1, 40])).write_npy(&big).unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["generate", GRAPH, "--prompt", PROMPT, "--context", "17", "--max-new-tokens", "2"],
            "beyond the artifact's 16 positions",
        ),
        (
            vec!["generate", GRAPH, "--prompt", PROMPT, "--context", "16", "--max-new-tokens", "15"],
            "take 17 positions, beyond the context of 16",
        ),
        (
            vec!["generate", GRAPH, "--prompt", f32s.to_str().unwrap(), "--context", "16", "--max-new-tokens", "2"],
            "token ids are int64 or int32",
        ),
        (
            vec!["generate", GRAPH, "--prompt", wide.to_str().unwrap(), "--context", "16", "--max-new-tokens", "2"],
            "the artifact takes a batch of 2",
        ),
        (
            vec!["generate", GRAPH, "--prompt", big.to_str().unwrap(), "--context", "16", "--max-new-tokens", "2"],
            "prompt id 40 is outside the vocabulary 0..40",
        ),
        (
            vec![
                "generate",
                GRAPH,
                "--prompt",
                PROMPT,
                "--context",
                "16",
                "--max-new-tokens",
                "2",
                "--sample",
                "top-p:2",
            ],
            "P must be a number in (0, 1]",
        ),
        (
            vec!["generate", "testdata/mlp/graph.json", "--prompt", PROMPT, "--context", "16", "--max-new-tokens", "2"],
            "not a decode-step artifact (docs/generation.md): it has no input 'ids'",
        ),
    ];
    refused_in_one_line(&cases);
}

/// The tiny decoders tools/export_decoders.py exported, with 32 greedy ids from torch.
pub(crate) const DECODERS: [&str; 2] = ["testdata/onnx_decoders/gpt2", "testdata/onnx_decoders/llama"];

#[test]
fn onnx_decoders_generate_torchs_greedy_ids() {
    let dir = scratch("generate-onnx");
    for d in DECODERS {
        let model = format!("{d}/model.onnx");
        let prompt = format!("{d}/prompt.npy");
        let want = rows(&format!("{d}/greedy.npy"));
        assert_eq!(want[0].len(), 32);
        // 5 prompt ids and 31 fed back take 36 of the 40 positions.
        let base = ["generate", &model, "--prompt", &prompt, "--context", "40", "--max-new-tokens", "32"];
        let layout = format!("{d}/layouts/heads-2.json");
        for extra in [vec![], vec!["--layout", layout.as_str()]] {
            let r = meshc(&[&base[..], &extra].concat());
            assert_eq!(r.status, Some(0), "{d} {extra:?}: {r:?}");
            assert_eq!(printed(&r.stdout), want, "{d} {extra:?}");
        }
        assert!(meshc(&base).stderr.contains("the prompt's prefill included"), "{d}: the prompt in one call");
        // Compiled once, at the prompt's batch and a context of 37, with the prefill of a
        // 5-id prompt beside it: the artifacts generate the same ids with the prefill and
        // with the prompt fed one position a step, and refuse a context beyond their own.
        let compile = |extra: &[&str], out: &str| {
            let out = dir.join(out).to_str().unwrap().to_string();
            let args =
                [&["compile", &model, "--decode-context", "37", "--decode-batch", "2", "-o", &out], extra].concat();
            let r = meshc(&args);
            assert_eq!(r.status, Some(0), "{d}: {r:?}");
            out
        };
        let (step, prefill) = (compile(&[], "step.mshc"), compile(&["--decode-prefill", "5"], "prefill.mshc"));
        // The prefill projects only each prompt's last position onto the vocabulary.
        let shown = meshc(&["inspect", &prefill]);
        assert!(shown.stdout.contains("output logits: f32[2, 1, "), "{shown:?}");
        for by in [vec![], vec!["--prefill", prefill.as_str()]] {
            let run = |context: &str| {
                let args = ["generate", &step, "--prompt", &prompt, "--context", context, "--max-new-tokens", "32"];
                meshc(&[&args[..], &by].concat())
            };
            let r = run("37");
            assert_eq!(r.status, Some(0), "{d} {by:?}: {r:?}");
            assert_eq!(printed(&r.stdout), want, "{d}: the artifact {by:?}");
            let r = run("38");
            assert_eq!(r.status, Some(1), "{d}: {r:?}");
            assert!(r.stderr.contains("beyond the artifact's 37 positions"), "{}", r.stderr);
        }
        // A shorter prompt runs through the same prefill, padded after its end: the ids
        // are those of the prompt fed one position a step. A longer one is refused in one
        // line.
        let p = rows(&prompt);
        let short = dir.join("short.npy");
        let ids: Vec<i64> = p.iter().flat_map(|r| r[..3].to_vec()).collect();
        Tensor::new(vec![p.len(), 3], Data::I64(ids)).write_npy(&short).unwrap();
        let long = dir.join("long.npy");
        Tensor::new(vec![2, 6], Data::I64(vec![1; 12])).write_npy(&long).unwrap();
        let gen = |prompt: &std::path::Path, by: &[&str]| {
            let args =
                ["generate", &step, "--prompt", prompt.to_str().unwrap(), "--context", "20", "--max-new-tokens", "12"];
            meshc(&[&args[..], by].concat())
        };
        let (fed, padded) = (gen(&short, &[]), gen(&short, &["--prefill", &prefill]));
        assert_eq!(fed.status, Some(0), "{d}: {fed:?}");
        assert_eq!(padded.status, Some(0), "{d}: {padded:?}");
        assert_eq!(printed(&padded.stdout), printed(&fed.stdout), "{d}: a 3-id prompt through the 5-id prefill");
        let r = gen(&long, &["--prefill", &prefill]);
        assert_eq!(r.status, Some(1), "{d}: {r:?}");
        let want = "the prefill takes ids i64[2,5]: prompts of at most 5 ids, where the prompt is [2, 6]";
        assert!(r.stderr.contains(want), "{}", r.stderr);
        assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    }
}

/// A session reuses its caches from one generation to the next, zeroing only what the
/// last one wrote: a second, shorter generation on it gives the ids and leaves the caches,
/// bit for bit, of the same generation on a fresh session, with its prefill and without,
/// after a longer one, after `set_state` and after a step by hand far along the context.
#[test]
fn a_second_generation_on_a_session_sees_nothing_of_the_first() {
    use meshc_runtime::api::{GenerateOptions, Model, Sampling, Session, TensorView};
    let dir = scratch("generate-again");
    for d in DECODERS {
        let name = Path::new(d).file_name().unwrap().to_str().unwrap();
        let compile = |extra: &[&str], out: &str| {
            let out = dir.join(format!("{name}-{out}"));
            let model = format!("{d}/model.onnx");
            let args = [
                &["compile", &model, "--decode-context", "37", "--decode-batch", "2", "-o", out.to_str().unwrap()],
                extra,
            ]
            .concat();
            let r = meshc(&args);
            assert_eq!(r.status, Some(0), "{d}: {r:?}");
            Model::open(&out).unwrap()
        };
        let (step, prefill) = (compile(&[], "step.mshc"), compile(&["--decode-prefill", "5"], "prefill.mshc"));
        let prefill = Session::new(&prefill).unwrap();
        let long = rows(&format!("{d}/prompt.npy"));
        let short: Vec<Vec<i64>> = long.iter().map(|r| r[1..4].to_vec()).collect();
        let options = |new| GenerateOptions {
            max_new_tokens: new,
            context: 37,
            sampling: Sampling::Greedy,
            seed: 0,
            stop: vec![],
        };
        let run = |s: &Session, by: Option<&Session>, prompt: &[Vec<i64>], new| match by {
            Some(p) => s.generate_with_prefill(p, prompt, &options(new)).unwrap().tokens,
            None => s.generate(prompt, &options(new)).unwrap().tokens,
        };
        let bytes = |s: &Session| -> Vec<(String, Vec<u8>)> {
            s.state().unwrap().into_iter().map(|(n, t)| (n, t.to_le_bytes())).collect()
        };
        for by in [Some(&prefill), None] {
            let fresh = Session::new(&step).unwrap();
            let want = (run(&fresh, by, &short, 12), bytes(&fresh));
            let again = Session::new(&step).unwrap();
            // 5 prompt ids and 31 fed back write 36 of the 37 positions.
            run(&again, Some(&prefill), &long, 32);
            assert_eq!((run(&again, by, &short, 12), bytes(&again)), want, "{d} {}", by.is_some());
            run(&again, None, &long, 32);
            assert_eq!((run(&again, by, &short, 12), bytes(&again)), want, "{d} {}", by.is_some());
            let ones = fresh.state().unwrap().into_iter().map(|(n, t)| {
                let ones = meshc_ir::Tensor::new(t.shape.clone(), meshc_ir::Data::F32(vec![1.0; t.numel()]));
                (n, ones)
            });
            again.set_state(&ones.collect()).unwrap();
            assert_eq!((run(&again, by, &short, 12), bytes(&again)), want, "{d} {}: after set_state", by.is_some());
            let (ids, pos) = (
                meshc_ir::Tensor::new(vec![2, 1], meshc_ir::Data::I64(vec![7, 9])),
                meshc_ir::Tensor::new(vec![1], meshc_ir::Data::I64(vec![33])),
            );
            again.step(&[("ids", TensorView::of(&ids)), ("pos", TensorView::of(&pos))]).unwrap();
            assert_eq!((run(&again, by, &short, 12), bytes(&again)), want, "{d} {}: after a step", by.is_some());
        }
    }
}

#[test]
fn onnx_decoder_refusals_are_one_line() {
    let gpt2 = "testdata/onnx_decoders/gpt2/model.onnx";
    let prompt = "testdata/onnx_decoders/gpt2/prompt.npy";
    let dir = scratch("generate-onnx-refusals");
    let art = dir.join("decoder.mshc");
    assert_eq!(meshc(&["compile", GRAPH, "-o", art.to_str().unwrap()]).status, Some(0));
    let art = art.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["generate", gpt2, "--prompt", prompt, "--context", "65", "--max-new-tokens", "2"],
            "a context of 65 is beyond the model's 64 positions (its position table 'model.transformer.wpe.weight')",
        ),
        (
            vec!["generate", gpt2, "--prompt", prompt, "--context", "1", "--max-new-tokens", "1"],
            "a context of 1 positions is too short for a decoder's cache",
        ),
        (
            vec![
                "generate",
                "testdata/onnx/encoder/model.onnx",
                "--prompt",
                prompt,
                "--context",
                "8",
                "--max-new-tokens",
                "2",
            ],
            "not a decoder export with a KV cache: no input is named past_key_values.N.key or .value",
        ),
        (
            vec![
                "generate",
                gpt2,
                "--prompt",
                prompt,
                "--context",
                "8",
                "--max-new-tokens",
                "2",
                "--decode-context",
                "8",
            ],
            "generate makes an ONNX decoder's decode step and prefill from --context and the prompt",
        ),
        (
            vec!["compile", GRAPH, "--decode-context", "8", "-o", "/dev/null"],
            "--decode-context imports an ONNX decoder as a decode step; this is a graph",
        ),
        (
            vec![
                "generate",
                art,
                "--prompt",
                PROMPT,
                "--context",
                "8",
                "--max-new-tokens",
                "2",
                "--decode-context",
                "8",
            ],
            "--decode-context applies when a graph is compiled; this artifact is already compiled",
        ),
    ];
    refused_in_one_line(&cases);
}

/// Llama's heads split over two devices as Megatron splits them, its grouped key/value heads
/// with them: one all_reduce after attention's output projection and one after the MLP, per
/// layer, and nothing else.
#[test]
fn llamas_heads_split_costs_two_all_reduces_a_layer() {
    let d = "testdata/onnx_decoders/llama";
    let r = meshc(&[
        "explain",
        &format!("{d}/model.onnx"),
        "--decode-context",
        "40",
        "--decode-batch",
        "2",
        "--layout",
        &format!("{d}/layouts/heads-2.json"),
    ]);
    assert_eq!(r.status, Some(0), "{r:?}");
    assert!(r.stdout.contains("communication: 4 step(s)"), "{}", r.stdout);
    let steps: Vec<&str> = r.stdout.lines().filter(|l| l.contains("all_reduce")).collect();
    assert_eq!(steps.len(), 4, "{}", r.stdout);
    for proj in ["self_attn_o_proj", "mlp_down_proj"] {
        assert_eq!(steps.iter().filter(|l| l.contains(proj)).count(), 2, "{}", r.stdout);
    }
}
