//! Symbolic shape inference on small graphs, one rule at a time: the shapes it prints, the
//! run-time checks it lists, and the errors that name the node.

use meshc_ir::sym::{self, infer::show, parse_symbols};
use meshc_ir::{text, verify};

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
