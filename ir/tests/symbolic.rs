//! Symbolic shape inference on small graphs, one rule at a time: the shapes it prints, the
//! run-time checks it lists, and the errors that name the node.

use meshc_ir::sym::{self, infer::show, parse_symbols};
use meshc_ir::{json, text, verify};

/// The symbolic shape of `out` and the checks, for `src` with `dims`.
fn infer(src: &str, dims: &[&str], out: &str) -> Result<(String, Vec<String>), String> {
    let g = text::parse(src).unwrap();
    let info = verify::verify(&g).unwrap();
    let symbols = parse_symbols(&dims.iter().map(|d| d.to_string()).collect::<Vec<_>>())?;
    let si = sym::infer_graph(&g, &info, &symbols)?;
    Ok((show(&si.shapes[out]), si.checks.iter().map(|c| c.to_string()).collect()))
}

const ENC: &str = "graph g {
  input x: f32[2,5,6] dims(batch, seq, _)
  param w: f32[6,6] = init zeros
  flat = reshape(x) {shape = [10, 6]}
  h = matmul(flat, w)
  back = reshape(h) {shape = [2, 5, 3, 2]}
  heads = transpose(back) {perm = [0, 2, 1, 3]}
  merged = reshape(heads) {shape = [-1, 2]}
  output merged
}";

#[test]
fn reshape_carries_products_both_ways() {
    let d = ["batch=1..64", "seq=1..512"];
    assert_eq!(infer(ENC, &d, "flat").unwrap().0, "[batch*seq, 6]");
    assert_eq!(infer(ENC, &d, "back").unwrap().0, "[batch, seq, 3, 2]");
    assert_eq!(infer(ENC, &d, "heads").unwrap().0, "[batch, 3, seq, 2]");
    assert_eq!(infer(ENC, &d, "merged").unwrap(), ("[3*batch*seq, 2]".to_string(), vec![]));
}

#[test]
fn a_split_by_a_constant_is_a_division_checked_exact() {
    let src = "graph g {
  input x: f32[16] dims(seq)
  r = reshape(x) {shape = [-1, 8]}
  output r
}";
    let (shape, checks) = infer(src, &["seq=1..512"], "r").unwrap();
    assert_eq!(shape, "[seq/8, 8]");
    assert_eq!(checks, ["seq divisible by 8 (node 'r')"]);
    // A divisor on the symbol proves it.
    assert_eq!(infer(src, &["seq=8..512:multiple_of=8"], "r").unwrap().1, Vec::<String>::new());
}

#[test]
fn symbols_with_one_example_size_make_a_reshape_ambiguous() {
    let src = "graph g {
  input x: f32[4,4,3] dims(a, b, _)
  r = reshape(x) {shape = [16, 3]}
  s = reshape(r) {shape = [4, 4, 3]}
  output s
}";
    let e = infer(src, &["a=1..9", "b=1..9"], "s").unwrap_err();
    assert!(e.starts_with("node 's' (reshape): target size 4 is both a and b"), "{e}");
}

#[test]
fn broadcasts_concat_slices_and_windows() {
    let src = "graph g {
  input x: f32[3,7] dims(n, t)
  input y: f32[3,7] dims(n, u)
  input img: f32[1,2,9,9] dims(_, _, hw, _)
  c = concat(x, y) {axis = 1}
  s = slice(c) {starts = [1], ends = [100], axes = [1]}
  tail = slice(x) {starts = [-2], ends = [7], axes = [1]}
  e = add(x, x)
  m = add(x, y)
  p = max_pool(img) {kernel = [3, 3], strides = [2, 2]}
  output c
  output s
  output tail
  output e
  output m
  output p
}";
    let d = ["n=1..8", "t=2..64", "u=1..64", "hw=3..99"];
    assert_eq!(infer(src, &d, "c").unwrap().0, "[n, t + u]");
    assert_eq!(infer(src, &d, "s").unwrap().0, "[n, t + u - 1]");
    assert_eq!(infer(src, &d, "tail").unwrap().0, "[n, 2]");
    assert_eq!(infer(src, &d, "e").unwrap().0, "[n, t]");
    assert_eq!(infer(src, &d, "p").unwrap().0, "[1, 2, (hw + 1)/2 - 1, 4]");
    // Two symbols meeting elementwise must be equal on every call: a run-time check.
    let checks = infer(src, &d, "m").unwrap().1;
    assert!(checks.contains(&"t == u (node 'm')".to_string()), "{checks:?}");
}

#[test]
fn equalities_no_size_can_meet_are_errors() {
    let src = "graph g {
  input x: f32[3,7] dims(n, t)
  param w: f32[7] = init zeros
  y = add(x, w)
  output y
}";
    assert_eq!(infer(src, &["t=1..64"], "y").unwrap().1, ["t == 7 (node 'y')"]);
    let e = infer(src, &["t=8..64"], "y").unwrap_err();
    assert_eq!(e, "node 'y' (add): needs t == 7, which no size within the bounds meets");
}

/// Found by the differential fuzzer: a slice empty at the graph's sizes has length 0
/// there, not its (negative) span, so it is refused, not read as `2 - batch`.
#[test]
fn a_slice_empty_at_the_graph_s_sizes_is_refused() {
    let src = "graph g {
  input x: f32[4] dims(batch)
  y = slice(x) {starts = [4], ends = [2], axes = [0], steps = [1]}
  output y
}";
    let e = infer(src, &["batch=1..4"], "y").unwrap_err();
    assert_eq!(
        e,
        "node 'y' (slice): it is empty along dim 0 (batch) at the graph's sizes, and an empty slice of a symbolic dim is not read symbolically: give batch a value"
    );
}

/// Found by the differential fuzzer: a dim of 1 at the graph's sizes (`batch - 1` at
/// batch 2) stretched against `batch` is refused, not read as `batch - 1`.
#[test]
fn a_symbolic_dim_stretched_from_1_is_refused() {
    let src = "graph g {
  input x: f32[2] dims(batch)
  p = pad(x) {pads = [-1, 0]}
  y = add(p, x)
  output y
}";
    let e = infer(src, &["batch=1..2"], "y").unwrap_err();
    assert!(
        e.starts_with("node 'y' (add): needs batch - 1 == batch, which the graph's own sizes do not meet (1 and 2"),
        "{e}"
    );
}

#[test]
fn binding_names_the_input_the_symbol_and_the_bound() {
    let g = text::parse(ENC).unwrap();
    let info = verify::verify(&g).unwrap();
    let si = sym::infer_graph(&g, &info, &parse_symbols(&["seq=1..512".into()]).unwrap()).unwrap();
    let bind = |s: &[usize]| sym::bind(&g, &si, |_| Some(s));
    assert_eq!(bind(&[2, 600, 6]).unwrap_err(), "input x: dim 1 (seq) is 600, outside 1..512");
    assert_eq!(bind(&[3, 9, 6]).unwrap_err(), "input x: dim 0 is 3, the graph's is 2");
    let at = bind(&[2, 9, 6]).unwrap();
    let written = sym::specialise(&g, &si, &at).unwrap();
    let types = verify::verify(&written).unwrap().types;
    assert_eq!(types["merged"].shape, [2 * 9 * 3, 2]);
    assert_eq!(sym::specialise(&g, &si, &si.example).unwrap(), g);
}

const DECLARED: &str = "graph g {
  dim batch = 1..64
  dim seq = 8..512:multiple_of=8
  input x: f32[2,16,6] dims(batch, seq, _)
  y = relu(x)
  output y
}";

/// The bounds as (name, lo, hi, multiple_of), in name order.
fn bounds(g: &meshc_ir::Graph) -> Vec<(String, i64, i64, i64)> {
    g.symbols.values().map(|s| (s.name.clone(), s.lo, s.hi, s.multiple_of)).collect()
}

#[test]
fn declared_symbols_read_the_same_in_both_formats_and_round_trip() {
    let g = text::parse(DECLARED).unwrap();
    let want = vec![("batch".to_string(), 1, 64, 1), ("seq".to_string(), 8, 512, 8)];
    assert_eq!(bounds(&g), want);
    verify::verify(&g).unwrap();
    let j = json::print(&g);
    assert!(j.contains(r#""symbols": {"batch":{"lo":1,"hi":64},"seq":{"lo":8,"hi":512,"multiple_of":8}},"#), "{j}");
    let back = json::parse(&j).unwrap();
    assert_eq!(back, g);
    assert_eq!(text::parse(&text::print(&back)).unwrap(), g);
    // Written by hand, in any key order, `multiple_of` left out.
    let hand = r#"{"format": "meshc-graph/1", "symbols": {"seq": {"hi": 9, "lo": 2}},
        "inputs": [{"name": "x", "dtype": "f32", "shape": [3], "dims": ["seq"]}], "outputs": ["x"]}"#;
    assert_eq!(bounds(&json::parse(hand).unwrap()), vec![("seq".to_string(), 2, 9, 1)]);
    // A graph without symbols prints as it always did: no `dim` line, no "symbols" key.
    let plain = meshc_ir::Graph { symbols: Default::default(), ..g };
    assert!(!text::print(&plain).contains("dim ") && !json::print(&plain).contains("symbols"));
}

#[test]
fn declared_symbols_are_symbolic_and_specialise_to_a_graph_without_them() {
    let g = text::parse(DECLARED).unwrap();
    let info = verify::verify(&g).unwrap();
    let si = sym::infer_graph(&g, &info, &g.symbols).unwrap();
    assert_eq!(show(&si.shapes["y"]), "[batch, seq, 6]");
    for at in [si.example.clone(), [("batch".to_string(), 3), ("seq".to_string(), 24)].into()] {
        let sg = sym::specialise(&g, &si, &at).unwrap();
        assert!(sg.symbols.is_empty(), "{}", text::print(&sg));
        verify::verify(&sg).unwrap();
    }
}

#[test]
fn malformed_json_symbols_are_one_line_errors() {
    let with = |symbols: &str| {
        let src = format!(
            r#"{{"format": "meshc-graph/1", "symbols": {symbols}, "inputs": [{{"name": "x", "dtype": "f32", "shape": [16], "dims": ["seq"]}}]}}"#
        );
        json::parse(&src).map(|g| bounds(&g)).map_err(|e| e.to_string())
    };
    assert_eq!(with(r#"{"seq": {"lo": 1, "hi": 32}}"#), Ok(vec![("seq".to_string(), 1, 32, 1)]));
    for (symbols, want) in [
        (r#"{"seq": {"lo": 9, "hi": 2}}"#, "symbol 'seq': the range 9..2 is empty"),
        (r#"{"seq": {"lo": 1, "hi": 8, "multiple_of": 0}}"#, "symbol 'seq': multiple_of must be at least 1, not 0"),
        (r#"{"seq": {"lo": -1, "hi": 8}}"#, "symbol 'seq': lo must be at least 0, not -1"),
        (r#"{"seq": {"lo": 1}}"#, "symbol 'seq' has no \"hi\""),
        (r#"{"seq": {"lo": 1, "hi": 2.5}}"#, "symbol 'seq': \"hi\" must be an integer, found 2.5"),
        (
            r#"{"seq": {"lo": 1, "hi": 18446744073709551615}}"#,
            "symbol 'seq': hi 18446744073709551615 is above the largest size a symbol may take (1099511627776)",
        ),
        (
            r#"{"seq": {"lo": 1, "hi": 8, "step": 2}}"#,
            "symbol 'seq': unknown key \"step\" (allowed: lo, hi, multiple_of)",
        ),
        (r#"{"seq": {"lo": 1, "hi": 8}, "seq": {"lo": 2, "hi": 4}}"#, "symbol 'seq' is declared twice in \"symbols\""),
        (r#"{"x y": {"lo": 1, "hi": 8}}"#, "symbol 'x y': the name must be letters, digits, '_' or '.'"),
        (r#"["seq"]"#, "\"symbols\" must be a JSON object"),
        (r#"{"seq": "1..8"}"#, "symbol 'seq' must be a JSON object"),
    ] {
        assert_eq!(with(symbols), Err(want.to_string()), "{symbols}");
    }
}

#[test]
fn the_verifier_refuses_symbols_the_inputs_contradict() {
    let refused = |src: &str| verify::verify(&text::parse(src).unwrap()).map(|_| ()).map_err(|e| e.to_string());
    assert_eq!(
        refused("graph g {\n  dim rows = 1..4\n  input x: f32[2] dims(batch)\n  output x\n}"),
        Err("symbol 'rows': no input has a dim named 'rows' (named input dims: batch)".to_string())
    );
    assert_eq!(
        refused("graph g {\n  dim batch = 1..4\n  input x: f32[2,8] dims(_, batch)\n  output x\n}"),
        Err("3:9: symbol 'batch': input 'x' is written with batch = 8 (dim 1), outside 1..4".to_string())
    );
    assert_eq!(
        refused("graph g {\n  dim batch = 4..64:multiple_of=4\n  input x: f32[6] dims(batch)\n  output x\n}"),
        Err("3:9: symbol 'batch': input 'x' is written with batch = 6 (dim 0), not a multiple of 4".to_string())
    );
    // A param naming the dim does not give it a value: only inputs do.
    assert!(refused(
        "graph g {\n  dim e = 1..8\n  input x: f32[2]\n  param w: f32[2] dims(e) = init zeros\n  output x\n}"
    )
    .is_err_and(|e| e.contains("no input has a dim named 'e' (named input dims: none)")));
}

/// Reflect, edge and wrap padding copy the dim's elements: a symbolic dim they pad must
/// not be empty (found by the fuzzer: at batch 1 the slice below is empty).
#[test]
fn copying_pads_need_a_non_empty_dim() {
    let src = "graph g {
  input x: f32[4,3] dims(batch, _)
  s = slice(x) {starts = [1], ends = [100], axes = [0]}
  y = pad(s) {pads = [1, 0, 1, 0], mode = \"reflect\"}
  z = pad(s) {pads = [1, 0, 1, 0]}
  output y, z
}";
    assert_eq!(infer(src, &["batch=1..4"], "y").unwrap().1, ["batch >= 2 (node 'y')"]);
}
