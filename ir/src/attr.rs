//! Op attributes: a small JSON-like value tree (`Attr`) shared by both formats, with typed
//! accessors that turn a wrong kind into an error naming the attribute.

use std::collections::BTreeMap;

/// Attributes of a node, sorted by name so both formats print them in one order.
pub type Attrs = BTreeMap<String, Attr>;

#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<Attr>),
}

impl Attr {
    pub fn kind(&self) -> &'static str {
        match self {
            Attr::Null => "null",
            Attr::Bool(_) => "bool",
            Attr::Int(_) => "int",
            Attr::Float(_) => "float",
            Attr::Str(_) => "string",
            Attr::List(_) => "list",
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            Attr::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// Ints are accepted where a float is wanted (`eps = 1` means 1.0).
    pub fn as_float(&self) -> Option<f64> {
        match self {
            Attr::Float(f) => Some(*f),
            Attr::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Attr::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Attr::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_ints(&self) -> Option<Vec<i64>> {
        match self {
            Attr::List(l) => l.iter().map(Attr::as_int).collect(),
            _ => None,
        }
    }

    pub fn as_int_lists(&self) -> Option<Vec<Vec<i64>>> {
        match self {
            Attr::List(l) => l.iter().map(Attr::as_ints).collect(),
            _ => None,
        }
    }

    pub fn ints(v: &[i64]) -> Attr {
        Attr::List(v.iter().map(|&i| Attr::Int(i)).collect())
    }

    pub fn from_json(v: &serde_json::Value) -> Attr {
        use serde_json::Value as V;
        match v {
            V::Null => Attr::Null,
            V::Bool(b) => Attr::Bool(*b),
            V::Number(n) => match n.as_i64() {
                Some(i) => Attr::Int(i),
                None => Attr::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            V::String(s) => Attr::Str(s.clone()),
            V::Array(a) => Attr::List(a.iter().map(Attr::from_json).collect()),
            // Objects are not attribute values; callers reject them before getting here.
            V::Object(_) => Attr::Null,
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as V;
        match self {
            Attr::Null => V::Null,
            Attr::Bool(b) => V::Bool(*b),
            Attr::Int(i) => V::from(*i),
            Attr::Float(f) => serde_json::Number::from_f64(*f).map(V::Number).unwrap_or(V::Null),
            Attr::Str(s) => V::String(s.clone()),
            Attr::List(l) => V::Array(l.iter().map(Attr::to_json).collect()),
        }
    }
}

/// Writes an attribute the way the text format spells it: JSON-like literals, floats
/// always with a `.` or exponent so they read back as floats.
impl std::fmt::Display for Attr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Attr::Null => f.write_str("null"),
            Attr::Bool(b) => write!(f, "{b}"),
            Attr::Int(i) => write!(f, "{i}"),
            Attr::Float(x) => write!(f, "{x:?}"),
            Attr::Str(s) => f.write_str(&serde_json::to_string(s).map_err(|_| std::fmt::Error)?),
            Attr::List(l) => {
                f.write_str("[")?;
                for (i, a) in l.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{a}")?;
                }
                f.write_str("]")
            }
        }
    }
}
