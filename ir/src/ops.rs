//! The op set: each op's name, family, arity and attribute set, in one table. Attributes
//! are typed in `attrs`, shapes live in `infer`, values in `interp`; this module only says
//! what a well-formed use looks like.

use std::fmt;

use crate::attrs::{self, AttrSpec};

/// The op table. Each family block lists its ops with their arity and attribute set
/// (`attrs`); the block's name is also a pattern macro (`unary_ops!()`) that matches every op
/// of the family, so a pass handles a whole elementwise family in one arm and must name
/// every other op: its `match` has no catch-all, and an op added here without a rule there
/// does not compile.
macro_rules! ops {
    ($( $(#[$fdoc:meta])* $family:ident $pattern:ident { $( $variant:ident = $name:literal, $arity:expr, $attrs:ident; )* } )*) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Op { $($($variant),*),* }

        /// What kind of computation an op is: which rules of layout, lowering, cost and
        /// code generation apply to it.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Family { $( $(#[$fdoc])* $family ),* }

        impl Op {
            pub const ALL: &'static [Op] = &[$($(Op::$variant),*),*];

            pub fn name(self) -> &'static str {
                match self { $($(Op::$variant => $name,)*)* }
            }

            pub fn family(self) -> Family {
                match self { $($(Op::$variant => Family::$family,)*)* }
            }

            /// How many operands the op takes.
            pub fn arity(self) -> Arity {
                use Arity::*;
                match self { $($(Op::$variant => $arity,)*)* }
            }

            /// The attributes the op accepts (`attrs::$attrs::SCHEMA`).
            pub fn attrs(self) -> &'static [AttrSpec] {
                match self { $($(Op::$variant => attrs::$attrs::SCHEMA,)*)* }
            }

            /// The name of the op's attribute struct in `attrs`.
            pub fn attrs_struct(self) -> &'static str {
                match self { $($(Op::$variant => stringify!($attrs),)*)* }
            }
        }

        $(
            #[doc = concat!("A pattern matching every op of family `", stringify!($family), "`.")]
            #[macro_export]
            macro_rules! $pattern {
                () => { $( $crate::ops::Op::$variant )|* };
            }
        )*
    };
}

ops! {
    /// Elementwise with one operand.
    Unary unary_ops {
        Neg = "neg", Exactly(1), Plain;
        Abs = "abs", Exactly(1), Plain;
        Exp = "exp", Exactly(1), Plain;
        Log = "log", Exactly(1), Plain;
        Sqrt = "sqrt", Exactly(1), Plain;
        Rsqrt = "rsqrt", Exactly(1), Plain;
        Tanh = "tanh", Exactly(1), Plain;
        Erf = "erf", Exactly(1), Plain;
        Erfc = "erfc", Exactly(1), Plain;
        Sin = "sin", Exactly(1), Plain;
        Cos = "cos", Exactly(1), Plain;
        Sigmoid = "sigmoid", Exactly(1), Plain;
        Relu = "relu", Exactly(1), Plain;
        Gelu = "gelu", Exactly(1), Gelu;
        Cast = "cast", Exactly(1), Cast;
        Not = "not", Exactly(1), Plain;
        Floor = "floor", Exactly(1), Plain;
        Ceil = "ceil", Exactly(1), Plain;
        Round = "round", Exactly(1), Plain;
    }
    /// Elementwise with two operands, broadcast as numpy does.
    Binary binary_ops {
        Add = "add", Exactly(2), Plain;
        Sub = "sub", Exactly(2), Plain;
        Mul = "mul", Exactly(2), Plain;
        Div = "div", Exactly(2), Plain;
        Maximum = "maximum", Exactly(2), Plain;
        Minimum = "minimum", Exactly(2), Plain;
        Pow = "pow", Exactly(2), Plain;
        Equal = "equal", Exactly(2), Plain;
        Less = "less", Exactly(2), Plain;
        LessEqual = "less_equal", Exactly(2), Plain;
        Greater = "greater", Exactly(2), Plain;
        GreaterEqual = "greater_equal", Exactly(2), Plain;
        And = "and", Exactly(2), Plain;
        Or = "or", Exactly(2), Plain;
        Xor = "xor", Exactly(2), Plain;
        Mod = "mod", Exactly(2), Mod;
    }
    /// Elementwise with three operands: `where`.
    Ternary ternary_ops {
        Where = "where", Exactly(3), Plain;
    }
    /// Sums of products over shared dims.
    Contraction contraction_ops {
        // The operands of its epilogue's binary steps follow a and b.
        MatMul = "matmul", AtLeast(2), MatMul;
        Einsum = "einsum", AtLeast(1), Einsum;
    }
    /// Several ops fused into one by a compiler pass.
    Fused fused_ops {
        // q, kᵀ, v, then the operands of its `scores` steps.
        Attention = "attention", AtLeast(3), Attention;
    }
    /// Reductions over axes to fewer elements.
    Reduction reduction_ops {
        ReduceSum = "reduce_sum", Exactly(1), Reduce;
        ReduceMean = "reduce_mean", Exactly(1), Reduce;
        ReduceMax = "reduce_max", Exactly(1), Reduce;
    }
    /// A reduction over an axis applied back to every element of it.
    Normalization normalization_ops {
        Softmax = "softmax", Exactly(1), Softmax;
        LayerNorm = "layer_norm", Exactly(3), LayerNorm;
    }
    /// Elements moved or selected, not computed.
    Movement movement_ops {
        Reshape = "reshape", Exactly(1), Shape;
        Transpose = "transpose", Exactly(1), Transpose;
        BroadcastTo = "broadcast_to", Exactly(1), Shape;
        // x broadcast against `like` (numpy, both ways), whose values are not read: `like`
        // gives only its shape, so a constant sized to a dim that varies with the symbols
        // (an ONNX `ConstantOfShape(Shape(y))` or `Expand(v, Shape(y))`) has a tensor that
        // carries it.
        BroadcastLike = "broadcast_like", Exactly(2), Plain;
        Concat = "concat", AtLeast(1), Concat;
        Slice = "slice", Exactly(1), Slice;
        Gather = "gather", Exactly(2), Gather;
        ScatterElements = "scatter_elements", Exactly(3), ScatterElements;
        // x, then its starts along `axes`: i32 or i64 `[len(axes)]`, read at run time.
        DynamicSlice = "dynamic_slice", Exactly(2), DynamicSlice;
        // x, the update, then its starts along `axes` as for dynamic_slice.
        DynamicUpdateSlice = "dynamic_update_slice", Exactly(3), DynamicUpdateSlice;
        Pad = "pad", Exactly(1), Pad;
        // The positions 0, 1, ... along `axis` of x, as i64: x gives only its size, so a
        // length that varies with the symbols (an ONNX `Range(0, Shape(x)[1])`) has a
        // tensor that carries it.
        Iota = "iota", Exactly(1), Iota;
    }
    /// Sliding windows over spatial dims.
    Window window_ops {
        Conv = "conv", AtLeast(2), Conv;
        MaxPool = "max_pool", Exactly(1), MaxPool;
        AvgPool = "avg_pool", Exactly(1), AvgPool;
    }
    /// Running combinations along one axis: each result element depends on every operand
    /// element before it (after it, reversed), so a split of that axis is not slice-wise.
    Scan scan_ops {
        CumSum = "cumsum", Exactly(1), CumSum;
    }
    /// Data exchanged between devices (inserted by lowering and send/recv splitting).
    Communication communication_ops {
        Send = "send", Exactly(1), Send;
        Recv = "recv", Exactly(0), Recv;
        AllReduce = "all_reduce", Exactly(1), AllReduce;
        AllGather = "all_gather", Exactly(1), AllGather;
        ReduceScatter = "reduce_scatter", Exactly(1), ReduceScatter;
        AllToAll = "all_to_all", Exactly(1), AllToAll;
    }
}

/// How many operands an op takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    Exactly(usize),
    AtLeast(usize),
}

impl Arity {
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Exactly(k) => n == k,
            Arity::AtLeast(k) => n >= k,
        }
    }
}

impl fmt::Display for Arity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arity::Exactly(1) => f.write_str("1 operand"),
            Arity::Exactly(k) => write!(f, "{k} operands"),
            Arity::AtLeast(k) => write!(f, "at least {k} operand{}", if *k == 1 { "" } else { "s" }),
        }
    }
}

impl Op {
    pub fn from_name(s: &str) -> Option<Op> {
        Op::ALL.iter().copied().find(|op| op.name() == s)
    }

    pub fn is_binary_elementwise(self) -> bool {
        self.family() == Family::Binary
    }

    /// equal, less, less_equal, greater, greater_equal: same-dtype operands, a bool result.
    pub fn is_comparison(self) -> bool {
        use Op::*;
        matches!(self, Equal | Less | LessEqual | Greater | GreaterEqual)
    }

    /// and, or, xor (binary) on bools.
    pub fn is_logic(self) -> bool {
        use Op::*;
        matches!(self, And | Or | Xor)
    }

    pub fn is_unary_elementwise(self) -> bool {
        self.family() == Family::Unary
    }

    /// Elementwise ops (with broadcasting): the ones a fuser may chain into one loop.
    pub fn is_elementwise(self) -> bool {
        matches!(self.family(), Family::Unary | Family::Binary | Family::Ternary)
    }

    pub fn is_communication(self) -> bool {
        self.family() == Family::Communication
    }
}

/// The steps a matmul's `epilogue` attribute may list (docs/ops.md), with whether each takes
/// an operand: the matmul's operands after `a` and `b`, one per such step, in order.
pub const EPILOGUE_STEPS: &[(&str, bool)] = &[
    ("to_f32", false),
    ("add", true),
    ("mul", true),
    ("div", true),
    ("relu", false),
    ("gelu", false),
    ("gelu_tanh", false),
    ("silu", false),
];

/// The steps of an `epilogue` attribute (comma-separated names of `EPILOGUE_STEPS`), with
/// whether each takes an operand.
pub fn epilogue_steps(attr: &str) -> Result<Vec<(&'static str, bool)>, String> {
    attr.split(',')
        .map(|name| {
            let name = name.trim();
            EPILOGUE_STEPS.iter().find(|(n, _)| *n == name).copied().ok_or_else(|| {
                let known: Vec<&str> = EPILOGUE_STEPS.iter().map(|s| s.0).collect();
                format!("unknown epilogue step '{name}' (steps: {})", known.join(", "))
            })
        })
        .collect()
}

/// Checks where `to_f32` stands among an epilogue's `steps` (names): first in the epilogue
/// of an `integer` product and nowhere else, as the steps after it, and every step of an
/// f32 product's, are f32 arithmetic.
pub fn check_epilogue_conversion<'s>(steps: impl IntoIterator<Item = &'s str>, integer: bool) -> Result<(), String> {
    let steps: Vec<&str> = steps.into_iter().collect();
    let first = steps.first() == Some(&"to_f32");
    if steps.iter().skip(1).any(|s| *s == "to_f32") || (!steps.is_empty() && first != integer) {
        return Err(match integer {
            true => "an epilogue of an i32 product starts with to_f32, and has it once".to_string(),
            false => "an epilogue of an f32 product has no to_f32".to_string(),
        });
    }
    Ok(())
}

/// A matmul's operands after `a` and `b` (`rest`), split: the zero point of an 8-bit `a`
/// when `a_zero_point` says there is one (`a` is u8 or i8, and the product is of
/// `cast(a, i32) − zero point`, an i32 of one element, by an i32 `b`), then the operands of
/// its epilogue's steps.
pub fn matmul_operands<T>(rest: &[T], a_zero_point: bool) -> (Option<&T>, &[T]) {
    match rest.split_first() {
        Some((zp, steps)) if a_zero_point => (Some(zp), steps),
        _ => (None, rest),
    }
}

/// Checks that an epilogue operand of shape `operand` broadcasts (numpy's rules) to the
/// matmul's result `out` without growing it: the kernels apply it to the result in place.
pub fn check_epilogue_operand(operand: &[usize], out: &[usize]) -> Result<(), String> {
    let fits =
        operand.len() <= out.len() && operand.iter().rev().zip(out.iter().rev()).all(|(&o, &r)| o == r || o == 1);
    match fits {
        true => Ok(()),
        false => Err(format!(
            "epilogue operand {} does not broadcast to the result {}",
            crate::dtype::ShapeDisplay(operand),
            crate::dtype::ShapeDisplay(out)
        )),
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
