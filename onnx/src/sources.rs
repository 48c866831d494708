//! Where each IR op comes from in an ONNX import: the ONNX op types whose converters emit
//! it, or `None` with the reason no ONNX op does. One `match` over the op table without a
//! catch-all, so an op added to ir/src/ops.rs does not compile here until someone decides;
//! the tests below hold the table to the converters.

use meshc_ir::Op;

/// The ONNX side of one IR op.
#[derive(Clone, Copy, Debug)]
pub enum Source {
    /// ONNX op types whose converters emit the op (directly or inside a decomposition).
    Onnx(&'static [&'static str]),
    /// No ONNX op is converted to it, and why.
    None(&'static str),
}

/// The ONNX op types an import turns into `op`, or why there are none.
pub fn source(op: Op) -> Source {
    use Op::*;
    use Source::Onnx;
    const COLLECTIVE: Source = Source::None("a collective, inserted by lowering under a layout");
    match op {
        Neg => Onnx(&["Neg"]),
        Abs => Onnx(&["Abs"]),
        Exp => Onnx(&["Exp"]),
        Log => Onnx(&["Log"]),
        Sqrt => Onnx(&["Sqrt"]),
        Rsqrt => Onnx(&["LayerNormalization", "RMSNormalization"]),
        Tanh => Onnx(&["Tanh"]),
        Erf => Onnx(&["Erf"]),
        Erfc => Source::None("ONNX has no Erfc"),
        Sin => Onnx(&["Sin"]),
        Cos => Onnx(&["Cos"]),
        Sigmoid => Onnx(&["Sigmoid"]),
        Relu => Onnx(&["Relu"]),
        Gelu => Onnx(&["Gelu"]),
        Cast => Onnx(&["Cast"]),
        Not => Onnx(&["Not"]),
        Floor => Onnx(&["Floor"]),
        Ceil => Onnx(&["Ceil"]),
        Round => Onnx(&["Round"]),
        Add => Onnx(&["Add", "Sum"]),
        Sub => Onnx(&["Sub"]),
        Mul => Onnx(&["Mul"]),
        Div => Onnx(&["Div"]),
        Maximum => Onnx(&["Max"]),
        Minimum => Onnx(&["Min"]),
        Pow => Onnx(&["Pow"]),
        Equal => Onnx(&["Equal"]),
        Less => Onnx(&["Less"]),
        LessEqual => Onnx(&["LessOrEqual"]),
        Greater => Onnx(&["Greater"]),
        GreaterEqual => Onnx(&["GreaterOrEqual"]),
        And => Onnx(&["And"]),
        Or => Onnx(&["Or"]),
        Xor => Onnx(&["Xor"]),
        Mod => Onnx(&["Mod"]),
        Where => Onnx(&["Where"]),
        MatMul => Onnx(&["MatMul", "Gemm"]),
        Einsum => Onnx(&["Einsum"]),
        Attention => Source::None("made by the attention pass of compile; ONNX Attention is decomposed"),
        ReduceSum => Onnx(&["ReduceSum"]),
        ReduceMean => Onnx(&["ReduceMean"]),
        ReduceMax => Onnx(&["ReduceMax"]),
        Softmax => Onnx(&["Softmax"]),
        LayerNorm => Onnx(&["LayerNormalization"]),
        Reshape => Onnx(&["Reshape", "Flatten"]),
        Transpose => Onnx(&["Transpose"]),
        BroadcastTo => Onnx(&["Expand"]),
        // In an import with ranged dims, for a shape read from a tensor (`symbolic.rs`).
        BroadcastLike => Onnx(&["Expand", "ConstantOfShape"]),
        Concat => Onnx(&["Concat"]),
        Slice => Onnx(&["Slice"]),
        Gather => Onnx(&["Gather"]),
        // In an import with ranged dims, for a length read from a shape (`symbolic.rs`).
        Iota => Onnx(&["Range", "Slice"]),
        ScatterElements => Onnx(&["ScatterElements"]),
        Pad => Onnx(&["Pad"]),
        DynamicSlice => Source::None(
            "a window at run-time starts of a fixed size; ONNX's Slice with run-time starts has a run-time size",
        ),
        DynamicUpdateSlice => Source::None(
            "no ONNX op writes a window at run-time starts; the decoder import (decoder.rs) makes one of the concat that appends to a past",
        ),
        Conv => Onnx(&["Conv"]),
        MaxPool => Onnx(&["MaxPool"]),
        AvgPool => Onnx(&["AveragePool"]),
        CumSum => Onnx(&["CumSum"]),
        Send | Recv | AllReduce | AllGather | ReduceScatter | AllToAll => COLLECTIVE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The converter sources: this file, the generated ones, and decoder.rs, which
    /// rewrites an imported graph rather than converting an ONNX op, left out.
    fn converter_sources() -> String {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        let mut all = String::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            if name.ends_with(".rs") && !["sources.rs", "onnx.rs", "schemas.rs", "decoder.rs"].contains(&name.as_str())
            {
                all += &std::fs::read_to_string(&path).unwrap();
            }
        }
        all
    }

    /// Every ONNX op type named has a converter, and the converters name the IR op exactly
    /// when the table says an ONNX op produces it: an op marked `None` that a converter
    /// starts emitting, or a mapping whose converter stopped, fails here.
    #[test]
    fn every_ir_op_has_an_onnx_source_or_an_explicit_none() {
        let supported = crate::supported();
        let code = converter_sources();
        for &op in Op::ALL {
            let variant = format!("Op::{op:?}");
            let emitted = code
                .match_indices(&variant)
                .any(|(i, _)| !code[i + variant.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_'));
            match source(op) {
                Source::Onnx(types) => {
                    assert!(!types.is_empty(), "{op}: an empty list of ONNX ops (say None and why)");
                    for t in types {
                        assert!(supported.contains(t), "{op}: ONNX {t} has no converter");
                    }
                    assert!(emitted, "{op}: said to come from {types:?}, but no converter names {variant}");
                }
                Source::None(why) => {
                    assert!(!why.is_empty(), "{op}: None needs its reason");
                    assert!(!emitted, "{op}: marked None ({why}), but a converter names {variant}");
                }
            }
        }
    }
}
