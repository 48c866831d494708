//! Typed op attributes: one struct per attribute set (`attrs::LayerNorm { axis, eps }`),
//! declared once with each field's kind and default. The struct's `SCHEMA` is what the
//! verifier checks a node against and what docs/ops.md lists; `of` reads a verified node's
//! attributes with the defaults filled in, so no pass spells an attribute name or a default.

use std::fmt;

use crate::attr::{Attr, Attrs};
use crate::dtype::DType;

/// What attribute sets are read from: a node (`graph::Node`), named in the message of a
/// node that was not verified.
pub trait HasAttrs {
    fn attrs(&self) -> &Attrs;
    fn describe(&self) -> String;
}

impl<T: HasAttrs> HasAttrs for &T {
    fn attrs(&self) -> &Attrs {
        (*self).attrs()
    }

    fn describe(&self) -> String {
        (*self).describe()
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

/// One attribute an op accepts: its kind, whether it must be given, and the value it takes
/// when it is not (docs/ops.md shows it).
#[derive(Clone, Copy, Debug)]
pub struct AttrSpec {
    pub name: &'static str,
    pub kind: AttrKind,
    pub required: bool,
    pub default: Option<fn() -> Attr>,
}

impl AttrSpec {
    /// Whether `v` is a value of this attribute's kind.
    pub fn accepts(&self, v: &Attr) -> bool {
        match self.kind {
            AttrKind::Int => v.as_int().is_some(),
            AttrKind::Float => v.as_float().is_some(),
            AttrKind::Bool => v.as_bool().is_some(),
            AttrKind::Str => v.as_str().is_some(),
            AttrKind::DType => v.as_str().and_then(DType::parse).is_some(),
            AttrKind::Enum(vals) => v.as_str().is_some_and(|s| vals.contains(&s)),
            AttrKind::Ints => v.as_ints().is_some(),
            AttrKind::Groups => v.as_int_lists().is_some(),
        }
    }
}

/// A Rust type an attribute reads into.
pub trait AttrValue: Sized {
    const KIND: AttrKind;
    /// Optional attributes without a default read as `None` when absent.
    const OPTIONAL: bool = false;
    fn from_attr(a: &Attr) -> Option<Self>;
    /// The value when the attribute is absent and has no default (`None` for an `Option`).
    fn absent() -> Option<Self> {
        None
    }
    /// The attribute value, `None` for an absent optional one.
    fn to_attr(&self) -> Option<Attr>;
}

impl AttrValue for i64 {
    const KIND: AttrKind = AttrKind::Int;
    fn from_attr(a: &Attr) -> Option<Self> {
        a.as_int()
    }
    fn to_attr(&self) -> Option<Attr> {
        Some(Attr::Int(*self))
    }
}

impl AttrValue for f64 {
    const KIND: AttrKind = AttrKind::Float;
    fn from_attr(a: &Attr) -> Option<Self> {
        a.as_float()
    }
    fn to_attr(&self) -> Option<Attr> {
        Some(Attr::Float(*self))
    }
}

impl AttrValue for bool {
    const KIND: AttrKind = AttrKind::Bool;
    fn from_attr(a: &Attr) -> Option<Self> {
        a.as_bool()
    }
    fn to_attr(&self) -> Option<Attr> {
        Some(Attr::Bool(*self))
    }
}

impl AttrValue for String {
    const KIND: AttrKind = AttrKind::Str;
    fn from_attr(a: &Attr) -> Option<Self> {
        a.as_str().map(str::to_string)
    }
    fn to_attr(&self) -> Option<Attr> {
        Some(Attr::Str(self.clone()))
    }
}

impl AttrValue for DType {
    const KIND: AttrKind = AttrKind::DType;
    fn from_attr(a: &Attr) -> Option<Self> {
        a.as_str().and_then(DType::parse)
    }
    fn to_attr(&self) -> Option<Attr> {
        Some(Attr::Str(self.name().to_string()))
    }
}

impl AttrValue for Vec<i64> {
    const KIND: AttrKind = AttrKind::Ints;
    fn from_attr(a: &Attr) -> Option<Self> {
        a.as_ints()
    }
    fn to_attr(&self) -> Option<Attr> {
        Some(Attr::ints(self))
    }
}

impl AttrValue for Vec<Vec<i64>> {
    const KIND: AttrKind = AttrKind::Groups;
    fn from_attr(a: &Attr) -> Option<Self> {
        a.as_int_lists()
    }
    fn to_attr(&self) -> Option<Attr> {
        Some(Attr::List(self.iter().map(|g| Attr::ints(g)).collect()))
    }
}

impl<T: AttrValue> AttrValue for Option<T> {
    const KIND: AttrKind = T::KIND;
    const OPTIONAL: bool = true;
    fn from_attr(a: &Attr) -> Option<Self> {
        T::from_attr(a).map(Some)
    }
    fn absent() -> Option<Self> {
        Some(None)
    }
    fn to_attr(&self) -> Option<Attr> {
        self.as_ref().and_then(T::to_attr)
    }
}

/// Reads attribute `name` of `attrs` as a `T`: its default (or `T::absent`) when it is
/// missing or null, an error naming it when it has another kind or a required one is missing.
fn read<T: AttrValue>(attrs: &Attrs, name: &str, default: Option<fn() -> T>) -> Result<T, String> {
    match attrs.get(name).filter(|a| **a != Attr::Null) {
        Some(a) => {
            T::from_attr(a).ok_or_else(|| format!("attribute '{name}' must be {}, got {} {a}", T::KIND, a.kind()))
        }
        None => default.map(|d| d()).or_else(T::absent).ok_or_else(|| format!("missing required attribute '{name}'")),
    }
}

/// An attribute that is one of a fixed set of strings, read into a Rust enum.
macro_rules! attr_enums {
    ($( $(#[$doc:meta])* $name:ident { $($variant:ident = $s:literal),* $(,)? } )*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($variant),* }

        impl $name {
            pub const NAMES: &'static [&'static str] = &[$($s),*];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $s),* }
            }

            pub fn parse(s: &str) -> Option<Self> {
                match s { $($s => Some($name::$variant),)* _ => None }
            }
        }

        impl AttrValue for $name {
            const KIND: AttrKind = AttrKind::Enum(Self::NAMES);
            fn from_attr(a: &Attr) -> Option<Self> {
                a.as_str().and_then(Self::parse)
            }
            fn to_attr(&self) -> Option<Attr> {
                Some(Attr::Str(self.as_str().to_string()))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )*};
}

attr_enums! {
    /// gelu: exact (erf) or the tanh approximation.
    GeluApprox { None = "none", Tanh = "tanh" }
    /// How a collective combines the contributions of a group.
    ReduceKind { Sum = "sum", Max = "max", Mean = "mean" }
    /// How a send/recv pair moves its data (chosen by the send/recv pass).
    Protocol { Move = "move", Copy = "copy", Remote = "remote" }
    /// How `scatter_elements` combines an update with the element it lands on.
    ScatterReduction { None = "none", Add = "add", Mul = "mul", Max = "max", Min = "min" }
    /// The modes of `pad` (`window` gives their meaning).
    PadMode { Constant = "constant", Reflect = "reflect", Edge = "edge", Wrap = "wrap" }
    /// The steps applied to `q @ kᵀ` before attention's softmax, each taking the next
    /// operand after `v`: a scale (`mul`, `div`) first, then an additive mask (`add`).
    AttentionScores { None = "", Mul = "mul", Div = "div", Add = "add", MulAdd = "mul,add", DivAdd = "div,add" }
}

impl AttentionScores {
    /// The steps in order (`mul,add` → `["mul", "add"]`).
    pub fn steps(self) -> Vec<&'static str> {
        self.as_str().split(',').filter(|s| !s.is_empty()).collect()
    }
}

/// The attribute sets: each a struct with `SCHEMA`, `of` (a verified node), `try_of` (any
/// node) and `to_attrs`. A field with `= default` is optional with that default; an
/// `Option` field without one is optional and `None` when absent; any other is required.
macro_rules! attr_structs {
    ($( $(#[$doc:meta])* $name:ident { $( $field:ident : $ty:ty $(= $default:expr)? ),* $(,)? } )*) => {$(
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq)]
        pub struct $name { $( pub $field: $ty ),* }

        impl $name {
            pub const SCHEMA: &'static [AttrSpec] = &[$(
                AttrSpec {
                    name: stringify!($field),
                    kind: <$ty as AttrValue>::KIND,
                    required: attr_structs!(@required $ty $(, $default)?),
                    default: attr_structs!(@shown $ty $(, $default)?),
                }
            ),*];

            /// The attributes of `n`, whose kinds the verifier has checked.
            pub fn of(n: &impl HasAttrs) -> Self {
                Self::try_of(n).unwrap_or_else(|e| panic!("{} was not verified: {e}", n.describe()))
            }

            pub fn try_of(n: &impl HasAttrs) -> Result<Self, String> {
                Self::from_attrs(n.attrs())
            }

            pub fn from_attrs(attrs: &Attrs) -> Result<Self, String> {
                let _ = attrs;
                Ok($name { $( $field: read::<$ty>(attrs, stringify!($field), attr_structs!(@default $ty $(, $default)?))? ),* })
            }

            /// The attributes as a node holds them (absent optional ones left out).
            pub fn to_attrs(&self) -> Attrs {
                #[allow(unused_mut)]
                let mut attrs = Attrs::new();
                $( if let Some(v) = AttrValue::to_attr(&self.$field) { attrs.insert(stringify!($field).to_string(), v); } )*
                attrs
            }
        }
    )*};
    (@required $ty:ty) => { !<$ty as AttrValue>::OPTIONAL };
    (@required $ty:ty, $default:expr) => { false };
    (@shown $ty:ty) => { None };
    (@shown $ty:ty, $default:expr) => {
        Some((|| <$ty as AttrValue>::to_attr(&$default).expect("a default is a value")) as fn() -> Attr)
    };
    (@default $ty:ty) => { None };
    (@default $ty:ty, $default:expr) => { Some((|| $default) as fn() -> $ty) };
}

attr_structs! {
    /// Ops that take no attributes.
    Plain {}
    Gelu { approximate: GeluApprox = GeluApprox::None }
    Cast { to: DType }
    /// mod: integer remainder with the divisor's sign (numpy), or the dividend's (`fmod`).
    Mod { fmod: bool = false }
    /// matmul: the elementwise steps fused after the product (`ops::epilogue_steps`); with
    /// `a_zero_point`, `a` is 8-bit and the operand after `b` its zero point
    /// (`ops::matmul_operands`).
    MatMul { epilogue: Option<String>, a_zero_point: bool = false }
    Einsum { equation: String }
    Attention { scores: AttentionScores = AttentionScores::None }
    /// reduce_sum, reduce_mean, reduce_max: every axis when `axes` is absent.
    Reduce { axes: Option<Vec<i64>>, keepdims: bool = false }
    Softmax { axis: i64 = -1 }
    LayerNorm { axis: i64 = -1, eps: f64 = 1e-5 }
    /// reshape and broadcast_to.
    Shape { shape: Vec<i64> }
    /// transpose: reversed dims when `perm` is absent.
    Transpose { perm: Option<Vec<i64>> }
    Concat { axis: i64 }
    Slice { starts: Vec<i64>, ends: Vec<i64>, axes: Option<Vec<i64>>, steps: Option<Vec<i64>> }
    Gather { axis: i64 = 0 }
    Iota { axis: i64 }
    ScatterElements { axis: i64 = 0, reduction: ScatterReduction = ScatterReduction::None }
    /// dynamic_slice: `sizes[i]` elements along `axes[i]`, from a start the op reads at run
    /// time and clamps into the operand (`infer::dynamic_starts`).
    DynamicSlice { axes: Vec<i64>, sizes: Vec<i64> }
    /// dynamic_update_slice: the operand with the update written along `axes` at run-time
    /// starts, clamped as dynamic_slice's are.
    DynamicUpdateSlice { axes: Vec<i64> }
    Send { key: String, to: i64, protocol: Protocol = Protocol::Copy }
    Recv { key: String, from: i64, shape: Vec<i64>, dtype: DType, protocol: Protocol = Protocol::Copy }
    AllReduce { groups: Vec<Vec<i64>>, reduce: ReduceKind = ReduceKind::Sum }
    AllGather { groups: Vec<Vec<i64>>, axis: i64 }
    ReduceScatter { groups: Vec<Vec<i64>>, axis: i64, reduce: ReduceKind = ReduceKind::Sum }
    AllToAll { groups: Vec<Vec<i64>>, split_axis: i64, concat_axis: i64 }
    Conv { strides: Option<Vec<i64>>, pads: Option<Vec<i64>>, dilations: Option<Vec<i64>>, groups: i64 = 1 }
    MaxPool {
        kernel: Vec<i64>,
        strides: Option<Vec<i64>>,
        pads: Option<Vec<i64>>,
        dilations: Option<Vec<i64>>,
        ceil_mode: bool = false,
    }
    AvgPool {
        kernel: Vec<i64>,
        strides: Option<Vec<i64>>,
        pads: Option<Vec<i64>>,
        dilations: Option<Vec<i64>>,
        ceil_mode: bool = false,
        count_include_pad: bool = false,
    }
    Pad { pads: Vec<i64>, mode: PadMode = PadMode::Constant, value: f64 = 0.0 }
    /// cumsum: running sums along `axis` (ONNX CumSum).
    CumSum { axis: i64, exclusive: bool = false, reverse: bool = false }
}

impl Slice {
    /// The sliced axes: `axes`, or the leading dims, one per start, when it is absent.
    pub fn axes_or_leading(&self) -> Vec<i64> {
        self.axes.clone().unwrap_or_else(|| (0..self.starts.len() as i64).collect())
    }

    /// The steps: `steps`, or 1 per start when it is absent.
    pub fn steps_or_ones(&self) -> Vec<i64> {
        self.steps.clone().unwrap_or_else(|| vec![1; self.starts.len()])
    }
}
