//! The op set: each op's name, arity and attribute schema, in one table. Shapes live in
//! `infer`, values in `interp`; this module only says what a well-formed use looks like.

use std::fmt;

macro_rules! ops {
    ($($variant:ident = $name:literal),* $(,)?) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Op { $($variant),* }

        impl Op {
            pub const ALL: &'static [Op] = &[$(Op::$variant),*];

            pub fn name(self) -> &'static str {
                match self { $(Op::$variant => $name),* }
            }
        }
    };
}

ops! {
    Add = "add", Sub = "sub", Mul = "mul", Div = "div",
    Maximum = "maximum", Minimum = "minimum", Pow = "pow",
    Neg = "neg", Abs = "abs", Exp = "exp", Log = "log", Sqrt = "sqrt", Rsqrt = "rsqrt",
    Tanh = "tanh", Erf = "erf", Sigmoid = "sigmoid", Relu = "relu", Gelu = "gelu",
    Cast = "cast", Where = "where",
    MatMul = "matmul", Einsum = "einsum", Attention = "attention",
    ReduceSum = "reduce_sum", ReduceMean = "reduce_mean", ReduceMax = "reduce_max",
    Equal = "equal", Less = "less", LessEqual = "less_equal", Greater = "greater", GreaterEqual = "greater_equal",
    And = "and", Or = "or", Xor = "xor", Not = "not",
    Mod = "mod", Floor = "floor", Ceil = "ceil", Round = "round",
    Softmax = "softmax", LayerNorm = "layer_norm",
    Reshape = "reshape", Transpose = "transpose", BroadcastTo = "broadcast_to",
    Concat = "concat", Slice = "slice", Gather = "gather", ScatterElements = "scatter_elements",
    Send = "send", Recv = "recv",
    AllReduce = "all_reduce", AllGather = "all_gather",
    ReduceScatter = "reduce_scatter", AllToAll = "all_to_all",
    Conv = "conv", MaxPool = "max_pool", AvgPool = "avg_pool", Pad = "pad",
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

/// The kind of value an attribute must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttrKind {
    Int,
    Float,
    Bool,
    Str,
    /// A string naming a dtype.
    DType,
    /// One of the listed strings.
    Enum(&'static [&'static str]),
    Ints,
    /// A list of lists of ints: device groups of a collective.
    Groups,
}

impl fmt::Display for AttrKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttrKind::Int => f.write_str("an int"),
            AttrKind::Float => f.write_str("a number"),
            AttrKind::Bool => f.write_str("a bool"),
            AttrKind::Str => f.write_str("a string"),
            AttrKind::DType => f.write_str("a dtype (f32, i32, i64, bool)"),
            AttrKind::Enum(vals) => write!(f, "one of {}", vals.join(", ")),
            AttrKind::Ints => f.write_str("a list of ints"),
            AttrKind::Groups => f.write_str("a list of device groups (lists of ints)"),
        }
    }
}

/// One attribute an op accepts.
#[derive(Clone, Copy, Debug)]
pub struct AttrSpec {
    pub name: &'static str,
    pub kind: AttrKind,
    pub required: bool,
}

const fn req(name: &'static str, kind: AttrKind) -> AttrSpec {
    AttrSpec { name, kind, required: true }
}

const fn opt(name: &'static str, kind: AttrKind) -> AttrSpec {
    AttrSpec { name, kind, required: false }
}

pub const REDUCE_KINDS: &[&str] = &["sum", "max", "mean"];
/// How a send/recv pair moves its data (chosen by the send/recv pass, see meshc's `program::Protocol`).
pub const PROTOCOLS: &[&str] = &["move", "copy", "remote"];
/// How `scatter_elements` combines an update with the element it lands on.
pub const SCATTER_REDUCTIONS: &[&str] = &["none", "add", "mul", "max", "min"];
pub const GELU_APPROX: &[&str] = &["none", "tanh"];
/// The modes of `pad` (`window` gives their meaning).
pub const PAD_MODES: &[&str] = &["constant", "reflect", "edge", "wrap"];
const POOL_ATTRS: &[AttrSpec] = &[
    req("kernel", AttrKind::Ints),
    opt("strides", AttrKind::Ints),
    opt("pads", AttrKind::Ints),
    opt("dilations", AttrKind::Ints),
    opt("ceil_mode", AttrKind::Bool),
    opt("count_include_pad", AttrKind::Bool),
];

impl Op {
    pub fn from_name(s: &str) -> Option<Op> {
        Op::ALL.iter().copied().find(|op| op.name() == s)
    }

    pub fn is_binary_elementwise(self) -> bool {
        use Op::*;
        matches!(self, Add | Sub | Mul | Div | Maximum | Minimum | Pow)
            || self.is_comparison()
            || self.is_logic()
            || self == Mod
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
        use Op::*;
        matches!(self, Neg | Abs | Exp | Log | Sqrt | Rsqrt | Tanh | Erf | Sigmoid | Relu | Gelu | Cast)
            || matches!(self, Not | Floor | Ceil | Round)
    }

    /// Elementwise ops (with broadcasting): the ones a fuser may chain into one loop.
    pub fn is_elementwise(self) -> bool {
        self.is_binary_elementwise() || self.is_unary_elementwise() || self == Op::Where
    }

    pub fn is_communication(self) -> bool {
        use Op::*;
        matches!(self, Send | Recv | AllReduce | AllGather | ReduceScatter | AllToAll)
    }

    pub fn arity(self) -> Arity {
        use Op::*;
        match self {
            _ if self.is_binary_elementwise() => Arity::Exactly(2),
            _ if self.is_unary_elementwise() => Arity::Exactly(1),
            Where | LayerNorm | ScatterElements => Arity::Exactly(3),
            Gather => Arity::Exactly(2),
            // The operands of its epilogue's binary steps follow a and b.
            MatMul => Arity::AtLeast(2),
            // q, kᵀ, v, then the operands of its `scores` steps.
            Attention => Arity::AtLeast(3),
            Conv => Arity::AtLeast(2),
            Einsum | Concat => Arity::AtLeast(1),
            Recv => Arity::Exactly(0),
            _ => Arity::Exactly(1),
        }
    }

    pub fn attrs(self) -> &'static [AttrSpec] {
        use AttrKind as K;
        use Op::*;
        match self {
            Gelu => const { &[opt("approximate", K::Enum(GELU_APPROX))] },
            MatMul => const { &[opt("epilogue", K::Str)] },
            Attention => const { &[opt("scores", K::Enum(ATTENTION_SCORES))] },
            Cast => const { &[req("to", K::DType)] },
            Mod => const { &[opt("fmod", K::Bool)] },
            Einsum => const { &[req("equation", K::Str)] },
            ReduceSum | ReduceMean | ReduceMax => const { &[opt("axes", K::Ints), opt("keepdims", K::Bool)] },
            Softmax => const { &[opt("axis", K::Int)] },
            LayerNorm => const { &[opt("axis", K::Int), opt("eps", K::Float)] },
            Reshape => const { &[req("shape", K::Ints)] },
            Transpose => const { &[opt("perm", K::Ints)] },
            BroadcastTo => const { &[req("shape", K::Ints)] },
            Concat => const { &[req("axis", K::Int)] },
            Slice => {
                const { &[req("starts", K::Ints), req("ends", K::Ints), opt("axes", K::Ints), opt("steps", K::Ints)] }
            }
            Gather => const { &[opt("axis", K::Int)] },
            ScatterElements => const { &[opt("axis", K::Int), opt("reduction", K::Enum(SCATTER_REDUCTIONS))] },
            Send => const { &[req("key", K::Str), req("to", K::Int), opt("protocol", K::Enum(PROTOCOLS))] },
            Recv => {
                const {
                    &[
                        req("key", K::Str),
                        req("from", K::Int),
                        req("shape", K::Ints),
                        req("dtype", K::DType),
                        opt("protocol", K::Enum(PROTOCOLS)),
                    ]
                }
            }
            AllReduce => const { &[req("groups", K::Groups), opt("reduce", K::Enum(REDUCE_KINDS))] },
            AllGather => const { &[req("groups", K::Groups), req("axis", K::Int)] },
            ReduceScatter => {
                const { &[req("groups", K::Groups), req("axis", K::Int), opt("reduce", K::Enum(REDUCE_KINDS))] }
            }
            AllToAll => const { &[req("groups", K::Groups), req("split_axis", K::Int), req("concat_axis", K::Int)] },
            Conv => {
                const { &[opt("strides", K::Ints), opt("pads", K::Ints), opt("dilations", K::Ints), opt("groups", K::Int)] }
            }
            // max_pool takes all but the last (count_include_pad).
            MaxPool => &POOL_ATTRS[..POOL_ATTRS.len() - 1],
            AvgPool => POOL_ATTRS,
            Pad => const { &[req("pads", K::Ints), opt("mode", K::Enum(PAD_MODES)), opt("value", K::Float)] },
            _ => &[],
        }
    }
}

/// The steps a matmul's `epilogue` attribute may list (docs/ops.md), with whether each takes
/// an operand: the matmul's operands after `a` and `b`, one per such step, in order.
pub const EPILOGUE_STEPS: &[(&str, bool)] =
    &[("add", true), ("mul", true), ("div", true), ("relu", false), ("gelu", false), ("gelu_tanh", false)];

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

/// The `scores` attribute of `attention` (docs/ops.md): the steps applied to `q @ kᵀ` before
/// the softmax, each taking the next operand after `v` — a scale (`mul`, `div`) first, then
/// an additive mask (`add`).
pub const ATTENTION_SCORES: &[&str] = &["", "mul", "div", "add", "mul,add", "div,add"];

/// The steps of an `attention` node's `scores` attribute (`ATTENTION_SCORES`), in order.
pub fn attention_steps(attr: &str) -> Vec<&str> {
    attr.split(',').filter(|s| !s.is_empty()).collect()
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
