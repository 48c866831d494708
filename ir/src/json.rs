//! The JSON format `meshc-graph/1`: parse (strictly: unknown keys are errors, so typos do
//! not pass silently) and print (canonical: one input, param or node per line, keys in a
//! fixed order). Errors name the entry; JSON syntax errors carry line:col.

use serde_json::{Map, Value};

use crate::attr::{Attr, Attrs};
use crate::dtype::{DType, TensorType};
use crate::error::{shorten, Error, Loc, Result};
use crate::graph::{Dims, Graph, Init, Input, Node, Output, Param, ParamData};
use crate::ops::Op;
use crate::sym::symbol::{Symbol, Symbols, MAX_BOUND};

pub const FORMAT: &str = "meshc-graph/1";

pub fn parse(src: &str) -> Result<Graph> {
    let v: Value = serde_json::from_str(src).map_err(|e| {
        let loc = (e.line() > 0).then(|| Loc { line: e.line() as u32, col: e.column().max(1) as u32 });
        Error::at(loc, format!("invalid JSON: {}", strip_position(&e.to_string())))
    })?;
    let top = object(&v, "the graph")?;
    check_keys(top, "the graph", &["format", "name", "symbols", "inputs", "params", "nodes", "outputs"])?;
    match top.get("format") {
        Some(Value::String(f)) if f == FORMAT => {}
        Some(other) => return Err(Error::new(format!("unsupported format {}, expected \"{FORMAT}\"", shown(other)))),
        None => return Err(Error::new(format!("missing \"format\": \"{FORMAT}\""))),
    }
    let name = match top.get("name") {
        Some(n) => string(n, "the graph's \"name\"")?.to_string(),
        None => String::new(),
    };
    let inputs =
        list(top, "inputs", "the graph")?.iter().enumerate().map(|(i, v)| parse_input(i, v)).collect::<Result<_>>()?;
    let params =
        list(top, "params", "the graph")?.iter().enumerate().map(|(i, v)| parse_param(i, v)).collect::<Result<_>>()?;
    let nodes =
        list(top, "nodes", "the graph")?.iter().enumerate().map(|(i, v)| parse_node(i, v)).collect::<Result<_>>()?;
    let outputs = list(top, "outputs", "the graph")?
        .iter()
        .map(|v| Ok(Output::new(string(v, "an entry of \"outputs\"")?)))
        .collect::<Result<_>>()?;
    let symbols = match top.get("symbols") {
        Some(v) => parse_symbols(v, src)?,
        None => Symbols::new(),
    };
    Ok(Graph { name, inputs, params, nodes, outputs, symbols })
}

/// `"symbols": {"seq": {"lo": 1, "hi": 512, "multiple_of": 8}, ...}` (`multiple_of`
/// optional): the bounds of the graph's symbolic dims, as `dim seq = 1..512:multiple_of=8`
/// in the text format.
fn parse_symbols(v: &Value, src: &str) -> Result<Symbols> {
    let obj = object(v, "\"symbols\"")?;
    let mut seen = std::collections::HashSet::new();
    if let Some(twice) = symbol_keys(src).into_iter().find(|k| !seen.insert(k.clone())) {
        return Err(Error::new(format!("symbol '{}' is declared twice in \"symbols\"", shorten(&twice))));
    }
    let mut out = Symbols::new();
    for (name, b) in obj {
        let what = format!("symbol '{}'", shorten(name));
        let b = object(b, &what)?;
        check_keys(b, &what, &["lo", "hi", "multiple_of"])?;
        let int = |key: &str, default: Option<i64>| -> Result<i64> {
            match b.get(key) {
                Some(x) => match (x.as_i64(), x.as_u64()) {
                    (Some(v), _) => Ok(v),
                    (None, Some(v)) => Err(Error::new(format!(
                        "{what}: {key} {v} is above the largest size a symbol may take ({MAX_BOUND})"
                    ))),
                    _ => Err(Error::new(format!("{what}: \"{key}\" must be an integer, found {}", shown(x)))),
                },
                None => default.ok_or_else(|| Error::new(format!("{what} has no \"{key}\""))),
            }
        };
        let sym = Symbol::new(name, int("lo", None)?, int("hi", None)?, int("multiple_of", Some(1))?)
            .map_err(|e| Error::new(format!("{what}: {e}")))?;
        out.insert(name.clone(), sym);
    }
    Ok(out)
}

/// The keys of the top-level `"symbols"` object in the order written, repeats kept: a
/// JSON object keeps only the last of a repeated key, and a symbol declared twice must be
/// refused rather than one of its bounds silently chosen.
fn symbol_keys(src: &str) -> Vec<String> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    #[derive(Default)]
    struct Keys(Vec<String>);
    impl<'de> serde::Deserialize<'de> for Keys {
        fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Keys, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Keys;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<Keys, A::Error> {
                    let mut keys = Vec::new();
                    while let Some((k, IgnoredAny)) = m.next_entry::<String, IgnoredAny>()? {
                        keys.push(k);
                    }
                    Ok(Keys(keys))
                }
            }
            d.deserialize_map(V)
        }
    }
    #[derive(serde::Deserialize)]
    struct Top {
        #[serde(default)]
        symbols: Keys,
    }
    // The file parsed as a `Value` already, so this parse fails only where that one
    // reported the problem (a repeated top-level key, which `Value` keeps the last of).
    serde_json::from_str::<Top>(src).map(|t| t.symbols.0).unwrap_or_default()
}

/// serde_json appends " at line L column C"; we report the position as line:col instead.
fn strip_position(msg: &str) -> &str {
    msg.rfind(" at line ").map_or(msg, |i| &msg[..i])
}

fn object<'a>(v: &'a Value, what: &str) -> Result<&'a Map<String, Value>> {
    v.as_object().ok_or_else(|| Error::new(format!("{what} must be a JSON object")))
}

fn string<'a>(v: &'a Value, what: &str) -> Result<&'a str> {
    v.as_str().ok_or_else(|| Error::new(format!("{what} must be a string, found {}", shown(v))))
}

fn list<'a>(obj: &'a Map<String, Value>, key: &str, what: &str) -> Result<&'a [Value]> {
    match obj.get(key) {
        None => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(v) => Err(Error::new(format!("\"{key}\" of {what} must be a list, found {}", shown(v)))),
    }
}

/// A value from the file as an error quotes it: shortened, as names are (a 1 MB string
/// must not become a 1 MB error line).
fn shown(v: &Value) -> String {
    shorten(&v.to_string()).into_owned()
}

fn check_keys(obj: &Map<String, Value>, what: &str, allowed: &[&str]) -> Result<()> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(Error::new(format!("{what}: unknown key \"{}\" (allowed: {})", shorten(k), allowed.join(", ")))),
        None => Ok(()),
    }
}

/// The name of entry `i` of a section, for messages about entries whose name is missing.
fn entry_name(obj: &Map<String, Value>, section: &str, i: usize) -> Result<String> {
    match obj.get("name") {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v) => Err(Error::new(format!("{section} #{i}: \"name\" must be a string, found {}", shown(v)))),
        None => Err(Error::new(format!("{section} #{i} has no \"name\""))),
    }
}

fn dtype(v: Option<&Value>, what: &str) -> Result<DType> {
    let v = v.ok_or_else(|| Error::new(format!("{what} has no \"dtype\"")))?;
    let s = string(v, &format!("\"dtype\" of {what}"))?;
    DType::parse(s).ok_or_else(|| {
        Error::new(format!(
            "{what}: unknown dtype \"{}\" (expected f32, i32, i64, bool, f16, bf16, i8, u8, i16, u16, u32 or u64)",
            shorten(s)
        ))
    })
}

fn shape(v: &Value, what: &str) -> Result<Vec<usize>> {
    let bad = || Error::new(format!("{what}: \"shape\" must be a list of non-negative integers, found {}", shown(v)));
    v.as_array().ok_or_else(bad)?.iter().map(|d| d.as_u64().map(|d| d as usize).ok_or_else(bad)).collect()
}

fn dims(v: Option<&Value>, what: &str) -> Result<Option<Dims>> {
    let Some(v) = v else { return Ok(None) };
    let bad = || Error::new(format!("{what}: \"dims\" must be a list of names or nulls, found {}", shown(v)));
    v.as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|d| match d {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s.clone())),
            _ => Err(bad()),
        })
        .collect::<Result<_>>()
        .map(Some)
}

fn tensor_type(obj: &Map<String, Value>, what: &str) -> Result<TensorType> {
    let dt = dtype(obj.get("dtype"), what)?;
    let sh = obj.get("shape").ok_or_else(|| Error::new(format!("{what} has no \"shape\"")))?;
    Ok(TensorType::new(dt, shape(sh, what)?))
}

fn parse_input(i: usize, v: &Value) -> Result<Input> {
    let obj = object(v, &format!("input #{i}"))?;
    let name = entry_name(obj, "input", i)?;
    let what = format!("input '{name}'");
    check_keys(obj, &what, &["name", "dtype", "shape", "dims"])?;
    Ok(Input { ty: tensor_type(obj, &what)?, dims: dims(obj.get("dims"), &what)?, name, loc: None })
}

fn parse_param(i: usize, v: &Value) -> Result<Param> {
    let obj = object(v, &format!("param #{i}"))?;
    let name = entry_name(obj, "param", i)?;
    let what = format!("param '{name}'");
    check_keys(obj, &what, &["name", "dtype", "shape", "dims", "file", "key", "init", "value"])?;
    let sources: Vec<&str> = ["file", "init", "value"].into_iter().filter(|k| obj.contains_key(*k)).collect();
    if sources.len() != 1 {
        return Err(Error::new(format!(
            "{what} needs exactly one of \"file\", \"init\", \"value\" (found {})",
            if sources.is_empty() { "none".to_string() } else { sources.join(", ") }
        )));
    }
    if obj.contains_key("key") && !obj.contains_key("file") {
        return Err(Error::new(format!("{what}: \"key\" is only meaningful with \"file\"")));
    }
    let data = match sources[0] {
        "file" => ParamData::File {
            path: string(&obj["file"], &format!("\"file\" of {what}"))?.to_string(),
            key: obj.get("key").map(|k| string(k, &format!("\"key\" of {what}")).map(str::to_string)).transpose()?,
        },
        "init" => ParamData::Init(parse_init(&obj["init"], &what)?),
        _ => ParamData::Value(attr(&obj["value"], &format!("\"value\" of {what}"))?),
    };
    Ok(Param { ty: tensor_type(obj, &what)?, dims: dims(obj.get("dims"), &what)?, data, name, loc: None })
}

fn parse_init(v: &Value, what: &str) -> Result<Init> {
    let bad = |msg: String| Error::new(format!("{what}: bad \"init\": {msg}"));
    let (kind, args) = match v {
        Value::String(s) => (s.as_str(), None),
        Value::Object(o) if o.len() == 1 => {
            let (k, a) = o.iter().next().expect("one entry");
            (k.as_str(), Some(object(a, &format!("{what}: \"init\" arguments"))?))
        }
        _ => {
            return Err(bad(format!(
                "expected \"zeros\", \"ones\", {{\"normal\": {{...}}}} or {{\"uniform\": {{...}}}}, found {}",
                shown(v)
            )))
        }
    };
    let num = |key: &str, default: Option<f64>| -> Result<f64> {
        match args.and_then(|a| a.get(key)) {
            Some(x) => x.as_f64().ok_or_else(|| bad(format!("\"{key}\" must be a number, found {}", shown(x)))),
            None => default.ok_or_else(|| bad(format!("{kind} needs \"{key}\""))),
        }
    };
    let seed = || -> Result<u64> {
        match args.and_then(|a| a.get("seed")) {
            Some(x) => x.as_u64().ok_or_else(|| bad(format!("\"seed\" must be a non-negative integer, found {x}"))),
            None => Err(bad(format!("{kind} needs \"seed\""))),
        }
    };
    let keys = |allowed: &[&str]| args.map_or(Ok(()), |a| check_keys(a, &format!("{what}: \"init\" {kind}"), allowed));
    match kind {
        "zeros" | "ones" => {
            keys(&[])?;
            Ok(if kind == "zeros" { Init::Zeros } else { Init::Ones })
        }
        "normal" => {
            keys(&["seed", "mean", "std"])?;
            Ok(Init::Normal { seed: seed()?, mean: num("mean", Some(0.0))?, std: num("std", None)? })
        }
        "uniform" => {
            keys(&["seed", "low", "high"])?;
            Ok(Init::Uniform { seed: seed()?, low: num("low", None)?, high: num("high", None)? })
        }
        other => {
            Err(bad(format!("unknown initialiser \"{}\" (expected normal, uniform, zeros or ones)", shorten(other))))
        }
    }
}

/// Attribute values are JSON scalars and lists; objects have no meaning there.
fn attr(v: &Value, what: &str) -> Result<Attr> {
    fn has_object(v: &Value) -> bool {
        match v {
            Value::Object(_) => true,
            Value::Array(a) => a.iter().any(has_object),
            _ => false,
        }
    }
    if has_object(v) {
        return Err(Error::new(format!("{what} must be a number, string, bool, null or list, found {}", shown(v))));
    }
    Ok(Attr::from_json(v))
}

fn parse_node(i: usize, v: &Value) -> Result<Node> {
    let obj = object(v, &format!("node #{i}"))?;
    let name = entry_name(obj, "node", i)?;
    let what = format!("node '{name}'");
    check_keys(obj, &what, &["name", "op", "inputs", "attrs", "dtype", "shape", "dims", "device"])?;
    let op_name = string(
        obj.get("op").ok_or_else(|| Error::new(format!("{what} has no \"op\"")))?,
        &format!("\"op\" of {what}"),
    )?;
    let op = Op::from_name(op_name).ok_or_else(|| Error::new(format!("{what}: unknown op '{op_name}'")))?;
    let inputs = list(obj, "inputs", &what)?
        .iter()
        .map(|v| string(v, &format!("an operand of {what}")).map(str::to_string))
        .collect::<Result<_>>()?;
    let mut attrs = Attrs::new();
    if let Some(a) = obj.get("attrs") {
        for (k, v) in object(a, &format!("\"attrs\" of {what}"))? {
            attrs.insert(k.clone(), attr(v, &format!("{what}: attribute '{k}'"))?);
        }
    }
    let device = match obj.get("device") {
        None => None,
        Some(d) => Some(
            d.as_u64()
                .and_then(|d| u32::try_from(d).ok())
                .ok_or_else(|| Error::new(format!("{what}: \"device\" must be a device index, found {d}")))?,
        ),
    };
    Ok(Node {
        op,
        inputs,
        attrs,
        dtype: obj.get("dtype").map(|d| dtype(Some(d), &what)).transpose()?,
        shape: obj.get("shape").map(|s| shape(s, &what)).transpose()?,
        dims: dims(obj.get("dims"), &what)?,
        device,
        name,
        loc: None,
    })
}

fn symbol_json(s: &Symbol) -> Value {
    let mut m = Map::new();
    m.insert("lo".into(), s.lo.into());
    m.insert("hi".into(), s.hi.into());
    if s.multiple_of > 1 {
        m.insert("multiple_of".into(), s.multiple_of.into());
    }
    Value::Object(m)
}

fn dims_json(d: &Dims) -> Value {
    Value::Array(d.iter().map(|n| n.as_ref().map_or(Value::Null, |s| Value::String(s.clone()))).collect())
}

fn shape_json(s: &[usize]) -> Value {
    Value::Array(s.iter().map(|&d| Value::from(d)).collect())
}

fn typed_entry(name: &str, ty: &TensorType, dims: &Option<Dims>) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("name".into(), name.into());
    m.insert("dtype".into(), ty.dtype.name().into());
    m.insert("shape".into(), shape_json(&ty.shape));
    if let Some(d) = dims {
        m.insert("dims".into(), dims_json(d));
    }
    m
}

fn init_json(init: &Init) -> Value {
    let f = |x: f64| Attr::Float(x).to_json();
    match *init {
        Init::Zeros => "zeros".into(),
        Init::Ones => "ones".into(),
        Init::Normal { seed, mean, std } => {
            let mut a = Map::new();
            a.insert("seed".into(), seed.into());
            if mean != 0.0 {
                a.insert("mean".into(), f(mean));
            }
            a.insert("std".into(), f(std));
            serde_json::json!({ "normal": a })
        }
        Init::Uniform { seed, low, high } => {
            serde_json::json!({ "uniform": { "seed": seed, "low": f(low), "high": f(high) } })
        }
    }
}

fn param_json(p: &Param) -> Map<String, Value> {
    let mut m = typed_entry(&p.name, &p.ty, &p.dims);
    match &p.data {
        ParamData::File { path, key } => {
            m.insert("file".into(), path.as_str().into());
            if let Some(k) = key {
                m.insert("key".into(), k.as_str().into());
            }
        }
        ParamData::Init(i) => {
            m.insert("init".into(), init_json(i));
        }
        ParamData::Value(v) => {
            m.insert("value".into(), v.to_json());
        }
    }
    m
}

fn node_json(n: &Node) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("name".into(), n.name.as_str().into());
    m.insert("op".into(), n.op.name().into());
    m.insert("inputs".into(), n.inputs.iter().map(|s| Value::from(s.as_str())).collect());
    if !n.attrs.is_empty() {
        m.insert("attrs".into(), Value::Object(n.attrs.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()));
    }
    if let Some(d) = n.dtype {
        m.insert("dtype".into(), d.name().into());
    }
    if let Some(s) = &n.shape {
        m.insert("shape".into(), shape_json(s));
    }
    if let Some(d) = &n.dims {
        m.insert("dims".into(), dims_json(d));
    }
    if let Some(d) = n.device {
        m.insert("device".into(), d.into());
    }
    m
}

/// Canonical JSON: the layout of docs/format.md, one entry per line.
pub fn print(g: &Graph) -> String {
    fn section(out: &mut String, key: &str, entries: Vec<Map<String, Value>>, last: bool) {
        out.push_str(&format!("  \"{key}\": ["));
        for (i, e) in entries.iter().enumerate() {
            out.push_str(if i == 0 { "\n    " } else { ",\n    " });
            out.push_str(&serde_json::to_string(e).expect("JSON values serialize"));
        }
        out.push_str(if entries.is_empty() { "]" } else { "\n  ]" });
        out.push_str(if last { "\n" } else { ",\n" });
    }
    let mut out = String::from("{\n");
    out.push_str(&format!("  \"format\": \"{FORMAT}\",\n"));
    out.push_str(&format!("  \"name\": {},\n", Value::from(g.name.as_str())));
    if !g.symbols.is_empty() {
        let symbols: Map<String, Value> = g.symbols.values().map(|s| (s.name.clone(), symbol_json(s))).collect();
        out.push_str(&format!("  \"symbols\": {},\n", Value::Object(symbols)));
    }
    section(&mut out, "inputs", g.inputs.iter().map(|i| typed_entry(&i.name, &i.ty, &i.dims)).collect(), false);
    section(&mut out, "params", g.params.iter().map(param_json).collect(), false);
    section(&mut out, "nodes", g.nodes.iter().map(node_json).collect(), false);
    let outputs: Vec<Value> = g.outputs.iter().map(|o| Value::from(o.name.as_str())).collect();
    out.push_str(&format!("  \"outputs\": {}\n}}\n", Value::Array(outputs)));
    out
}
