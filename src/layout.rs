//! The layout spec `meshc-layout/1` (docs/layout.md; docs/design.md §3): reading and validating a
//! spec on its own (mesh, rules, per-tensor layouts, placement, degraded devices and links,
//! memory per device), the legality of a layout for a tensor shape, and the layouts a spec
//! fixes for the tensors of a verified graph — the seeds layout propagation starts from.
//! Every error is one line naming the spec file and the tensor, rule or field at fault.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::marker::PhantomData;
use std::path::Path;

use meshc_ir::verify::Info;
use meshc_ir::{Error, Graph, Loc};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use meshc_runtime::format::degradation::Degradation;
use meshc_runtime::format::mesh::{Layout, Mesh, Topology};

pub const FORMAT: &str = "meshc-layout/1";

/// The largest mesh accepted: every device is a host thread, and a mesh past this size is a
/// typo rather than a plan.
pub const MAX_DEVICES: usize = 4096;

/// A validated layout spec. Axes are resolved to indices into `mesh.axes`.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    /// The path as given, for error messages.
    pub file: String,
    pub mesh: Mesh,
    /// Dim name → mesh axis, in file order.
    pub rules: Vec<(String, usize)>,
    /// Explicit per-tensor layouts; each is injective and names existing axes (rank and
    /// divisibility need the graph: `seed_layouts` checks them).
    pub layouts: BTreeMap<String, Layout>,
    /// As written (node names and slices need the graph: `passes::place` resolves them).
    pub placement: Option<Placement>,
    pub degraded: Degraded,
    pub memory_per_device: Option<u64>,
    /// The devices of each host (`hosts`; host h is MPI rank h), each group in ascending
    /// order; empty when the whole mesh is one host.
    pub hosts: Vec<Vec<usize>>,
}

/// Failed devices and links, by mesh coordinates. Every coordinate is in range, nothing is
/// listed twice, and every link joins two neighbours of the topology.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Degraded {
    pub nodes: Vec<Vec<usize>>,
    pub links: Vec<(Vec<usize>, Vec<usize>)>,
}

impl Degraded {
    /// The validated coordinates as device numbers, as the runtime's planner takes them.
    pub fn degradation(&self, mesh: &Mesh) -> Degradation {
        Degradation {
            nodes: self.nodes.iter().map(|c| mesh.device(c)).collect(),
            links: self.links.iter().map(|(a, b)| (mesh.device(a), mesh.device(b))).collect(),
            along: Vec::new(),
        }
    }
}

/// The spec's `placement` (docs/layout.md): how the nodes go to stages, and into how many
/// micro-batches the pipeline splits the batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub stages: Stages,
    /// Only in the object form; `passes::place` checks the range.
    pub microbatches: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Stages {
    /// Entries naming nodes and the sub-mesh they go to.
    Listed(Vec<Entry>),
    /// Cut by the auto placer.
    Auto(Auto),
}

/// One entry of a listed placement: `{"nodes": [...], "devices": ..., "layouts": ..., "rules": ...}`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a placement entry {\"nodes\": [...], \"devices\": ...}")]
pub struct Entry {
    #[serde(deserialize_with = "node_names")]
    pub nodes: Vec<String>,
    pub devices: Devices,
    /// The stage's own layouts and rules, replacing the spec's (both, when either is given).
    #[serde(default)]
    pub layouts: Option<LayoutEntries>,
    #[serde(default)]
    pub rules: Option<RuleEntries>,
}

/// An entry's `devices`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(untagged, expecting = "\"devices\" must be a mesh slice such as \"0:1,*\" or a device number")]
pub enum Devices {
    /// Per mesh axis `*`, `k` or `a:b` (`passes::place::parse_slice`).
    Slice(String),
    Device(u64),
}

/// `{"auto": {"stages": N}}`; `passes::place` checks that N is positive.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, expecting = "\"auto\" to be {\"stages\": N}")]
pub struct Auto {
    #[serde(deserialize_with = "stage_count")]
    pub stages: u64,
}

/// The object form of `placement`, before it is checked to name its stages one way.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlacementObject {
    #[serde(default)]
    auto: Option<Auto>,
    #[serde(default)]
    stages: Option<Vec<Entry>>,
    #[serde(default, deserialize_with = "microbatch_count")]
    microbatches: Option<u64>,
}

/// `"placement"` is a list of entries or an object; serde's derives cannot tell those apart
/// without giving up the errors inside the entries, so a visitor does.
impl<'de> Deserialize<'de> for Placement {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Placement;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "\"placement\" to be a list of stage assignments, {\"stages\": [...], \"microbatches\": M} or \
                     {\"auto\": {\"stages\": N}, \"microbatches\": M}",
                )
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Placement, A::Error> {
                let entries = Vec::deserialize(de::value::SeqAccessDeserializer::new(seq))?;
                Ok(Placement { stages: Stages::Listed(entries), microbatches: None })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Placement, A::Error> {
                let o = PlacementObject::deserialize(de::value::MapAccessDeserializer::new(map))?;
                let stages = match (o.auto, o.stages) {
                    (Some(auto), None) => Stages::Auto(auto),
                    (None, Some(entries)) => Stages::Listed(entries),
                    (Some(_), Some(_)) => {
                        return Err(de::Error::custom("\"placement\" has both \"auto\" and \"stages\""))
                    }
                    (None, None) => return Err(de::Error::custom("\"placement\" has neither \"auto\" nor \"stages\"")),
                };
                Ok(Placement { stages, microbatches: o.microbatches })
            }
        }
        d.deserialize_any(V)
    }
}

/// A `T`, or the error `msg`: serde's own ("invalid type: string, expected a sequence")
/// would not say which field is wrong.
fn or_say<'de, T: Deserialize<'de>, D: Deserializer<'de>>(d: D, msg: &'static str) -> Result<T, D::Error> {
    T::deserialize(d).map_err(|_| de::Error::custom(msg))
}

fn node_names<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    or_say(d, "\"nodes\" must be a list of node names or patterns")
}

fn stage_count<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    or_say(d, "\"stages\" must be a positive number")
}

fn microbatch_count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    or_say(d, "\"microbatches\" must be a number of micro-batches").map(Some)
}

/// A present field that may not be null (`Option`'s own impl would read null as absent).
fn present<'de, T: Deserialize<'de>, D: Deserializer<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// Where a tensor's layout came from, as dumps report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// An explicit `layouts` entry of the spec.
    Spec,
    /// A dim-name rule of the spec.
    Rule,
    Propagated,
    /// Nothing reached it: replicated.
    Default,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Spec => "spec",
            Source::Rule => "rule",
            Source::Propagated => "propagated",
            Source::Default => "replicated",
        }
    }
}

/// A layout the spec fixes for one tensor, and why. A rule fixes only the dims it names:
/// the others are `open`, left to propagation (as GSPMD leaves the dims a sharding
/// annotation does not constrain); a `layouts` entry fixes every dim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seed {
    pub layout: Layout,
    pub source: Source,
    pub open: Vec<bool>,
}

impl Seed {
    /// A layout given in the spec's `layouts`: every dim fixed.
    pub fn spec(layout: Layout) -> Seed {
        Seed { open: vec![false; layout.len()], layout, source: Source::Spec }
    }
}

/// Reads, parses and validates a spec file (everything that does not need the graph).
pub fn load(path: &Path) -> Result<Spec, Error> {
    let file = path.display().to_string();
    let src =
        meshc_ir::file::read(path, meshc_ir::file::MAX_TEXT_BYTES, "layout spec").map_err(|e| e.in_file(&file))?;
    let src = String::from_utf8(src).map_err(|_| Error::new("layout spec is not UTF-8 text").in_file(&file))?;
    parse(&src, &file)
}

/// Parses and validates a spec; `file` names it in errors.
pub fn parse(src: &str, file: &str) -> Result<Spec, Error> {
    parse_raw(src).and_then(|raw| validate(raw, file)).map_err(|e| e.in_file(file))
}

/// Checks that `layout` can lay out a tensor of `shape` on `mesh`: one entry per dim, each
/// naming an existing axis at most once, and each split dim divisible by its axis's size.
/// The message is a clause without the tensor's name, for the caller to prefix.
pub fn check_layout(mesh: &Mesh, shape: &[usize], layout: &[Option<usize>]) -> Result<(), String> {
    if layout.len() != shape.len() {
        let entries = count(layout.len(), "entry", "entries");
        return Err(format!("the layout has {entries}, the tensor has rank {} (shape {shape:?})", shape.len()));
    }
    check_injective(mesh, layout)?;
    for (d, (&n, a)) in shape.iter().zip(layout).enumerate() {
        if let Some(a) = *a {
            check_divides(mesh, d, n, a)?;
        }
    }
    Ok(())
}

/// Every axis exists and splits at most one dim; sub-axes of one axis share no factor.
fn check_injective(mesh: &Mesh, layout: &[Option<usize>]) -> Result<(), String> {
    for (d, a) in layout.iter().enumerate() {
        let Some(a) = *a else { continue };
        let (x, pre, size) = mesh.split(a);
        if x >= mesh.shape.len() {
            return Err(no_such_axis(mesh, x));
        }
        if !mesh.valid(a) {
            let k = mesh.shape[x];
            return Err(format!("sub-axis '{}:({pre}){size}' does not fit mesh axis of size {k}", mesh.axes[x]));
        }
        let Some(first) = layout[..d].iter().position(|&b| b.is_some_and(|b| mesh.overlaps(a, b))) else { continue };
        let b = layout[first].expect("found");
        if a == b && a < mesh.shape.len() {
            return Err(format!(
                "mesh axis '{}' splits both dim {first} and dim {d} (a layout uses each axis at most once)",
                mesh.axes[a]
            ));
        }
        return Err(format!(
            "{} (dim {first}) and {} (dim {d}) share a factor of mesh axis '{}' (a layout uses each factor of an axis at most once)",
            entry_name(mesh, b),
            entry_name(mesh, a),
            mesh.axes[mesh.split(a).0]
        ));
    }
    Ok(())
}

/// "mesh axis 'model'" or "sub-axis 'model:(1)4'", as errors name a layout entry.
fn entry_name(mesh: &Mesh, a: usize) -> String {
    let name = mesh.entry_name(a);
    let what = if a < mesh.shape.len() { "mesh axis" } else { "sub-axis" };
    format!("{what} '{name}'")
}

fn check_divides(mesh: &Mesh, dim: usize, size: usize, axis: usize) -> Result<(), String> {
    let k = mesh.shards(axis);
    if size.is_multiple_of(k) {
        Ok(())
    } else {
        Err(format!("dim {dim} (size {size}) does not divide by {} (size {k})", entry_name(mesh, axis)))
    }
}

fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn no_such_axis(mesh: &Mesh, axis: usize) -> String {
    format!("mesh axis {axis} does not exist (the mesh has {} axes)", mesh.shape.len())
}

impl Spec {
    /// Layouts fixed by the spec for tensors of this verified graph: the explicit `layouts`
    /// entries, then `rules` applied to the dim names of every other input, param and node.
    /// A rule gives its axis to the first dim of a tensor that carries its name; later dims
    /// of that tensor with the same axis stay replicated (a layout is injective). Tensors no
    /// rule touches get no seed. Every seed is checked against the tensor's shape.
    pub fn seed_layouts(&self, g: &Graph, info: &Info) -> Result<BTreeMap<String, Seed>, Error> {
        let err = |msg: String| Error::new(msg).in_file(&self.file);
        let mut seeds = BTreeMap::new();
        let (layouts, unmatched) = self.expand_patterns(g).map_err(err)?;
        if let Some(p) = unmatched.first() {
            return Err(err(format!("layout of '{p}': the pattern matches no tensor of graph '{}'", g.name)));
        }
        for (name, layout) in &layouts {
            let ty = info.types.get(name).ok_or_else(|| {
                let hint = meshc_ir::suggest::did_you_mean(name, info.types.keys().map(String::as_str));
                err(format!("layout of '{name}': graph '{}' has no tensor '{name}'{hint}", g.name))
            })?;
            check_layout(&self.mesh, &ty.shape, layout).map_err(|m| err(format!("layout of '{name}': {m}")))?;
            seeds.insert(name.clone(), Seed::spec(layout.clone()));
        }
        // A rule whose dim name no tensor carries is a typo, not a no-op.
        for (rule, _) in &self.rules {
            if !info.dims.values().flatten().any(|d| d.as_deref() == Some(rule.as_str())) {
                return Err(err(format!("rule '{rule}': no dimension of graph '{}' is named '{rule}'", g.name)));
            }
        }
        for name in g.tensor_names() {
            let Some(dims) = info.dims.get(name) else { continue };
            if seeds.contains_key(name) {
                continue;
            }
            let shape = &info.types[name].shape;
            let mut layout: Layout = vec![None; dims.len()];
            let mut open = vec![true; dims.len()];
            for (d, dim) in dims.iter().enumerate() {
                let Some(&(_, axis)) = self.rules.iter().find(|(r, _)| Some(r) == dim.as_ref()) else { continue };
                open[d] = false;
                if layout.iter().flatten().any(|&b| self.mesh.overlaps(axis, b)) {
                    continue;
                }
                check_divides(&self.mesh, d, shape[d], axis).map_err(|m| {
                    let rule = dim.as_deref().unwrap_or_default();
                    err(format!("layout of '{name}' by rule '{rule}' -> '{}': {m}", self.mesh.axes[axis]))
                })?;
                layout[d] = Some(axis);
            }
            if layout.iter().any(Option::is_some) {
                seeds.insert(name.clone(), Seed { layout, source: Source::Rule, open });
            }
        }
        Ok(seeds)
    }
}

// ---------------------------------------------------------------------------------------
// The file as written. serde checks the structure (with line:col); `validate` the meaning.

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a meshc-layout/1 object")]
struct Raw {
    // Checked before this struct is read, so that a spec of another format says so.
    #[serde(rename = "format")]
    _format: de::IgnoredAny,
    mesh: RawMesh,
    #[serde(default)]
    rules: RuleEntries,
    #[serde(default)]
    layouts: LayoutEntries,
    #[serde(default, deserialize_with = "present")]
    placement: Option<Placement>,
    #[serde(default)]
    degraded: RawDegraded,
    #[serde(default)]
    memory_per_device: Option<Value>,
    #[serde(default)]
    hosts: Option<RawHosts>,
}

/// `hosts` as written: one host per index of a mesh axis, or explicit device groups.
#[derive(Deserialize)]
#[serde(untagged, expecting = "hosts: {\"axis\": AXIS} or a list of device groups [[0, 1], [2, 3], ...]")]
enum RawHosts {
    Axis(RawHostAxis),
    Groups(Vec<Vec<usize>>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHostAxis {
    axis: AxisRef,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mesh {\"shape\": [...], \"axes\": [...], \"topology\": ...}")]
struct RawMesh {
    shape: Vec<usize>,
    axes: Vec<String>,
    #[serde(default)]
    topology: Option<Topology>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "{\"nodes\": [coordinates...], \"links\": [[coordinates, coordinates]...]}")]
struct RawDegraded {
    #[serde(default)]
    nodes: Vec<Vec<usize>>,
    #[serde(default)]
    links: Vec<[Vec<usize>; 2]>,
}

/// A mesh axis as written: its name or its index.
#[derive(Clone, Debug, PartialEq)]
pub enum AxisRef {
    Name(String),
    Index(usize),
}

impl<'de> Deserialize<'de> for AxisRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = AxisRef;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mesh axis (its name or index)")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<AxisRef, E> {
                Ok(AxisRef::Name(s.to_string()))
            }
            fn visit_u64<E: de::Error>(self, i: u64) -> Result<AxisRef, E> {
                usize::try_from(i).map(AxisRef::Index).map_err(|_| E::invalid_value(de::Unexpected::Unsigned(i), &self))
            }
        }
        d.deserialize_any(V)
    }
}

/// A JSON object's entries in file order. A key given twice is an error: serde_json's maps
/// would silently keep the last one, hiding a mistake in a hand-written spec.
#[derive(Clone, Debug, PartialEq)]
pub struct Entries<T>(Vec<(String, T)>);

/// Dim-name rules as written: dim name → axis.
pub type RuleEntries = Entries<AxisRef>;
/// Per-tensor layouts as written: tensor → an axis or null per dim.
pub type LayoutEntries = Entries<Vec<Option<AxisRef>>>;

impl<T> Default for Entries<T> {
    fn default() -> Self {
        Entries(Vec::new())
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Entries<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Entries<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries<T>, A::Error> {
                let mut seen = HashSet::new();
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    if !seen.insert(key.clone()) {
                        return Err(de::Error::custom(format!("\"{key}\" is given twice")));
                    }
                    entries.push((key, map.next_value()?));
                }
                Ok(Entries(entries))
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

fn parse_raw(src: &str) -> Result<Raw, Error> {
    // The format is checked first, so that a spec of another version says so instead of
    // failing on the first field this version does not know.
    let v: Value = serde_json::from_str(src).map_err(json_error)?;
    let top = v.as_object().ok_or_else(|| Error::new("the layout spec must be a JSON object"))?;
    match top.get("format") {
        Some(Value::String(f)) if f == FORMAT => {}
        Some(other) => return Err(Error::new(format!("unsupported format {other}, expected \"{FORMAT}\""))),
        None => return Err(Error::new(format!("missing \"format\": \"{FORMAT}\""))),
    }
    serde_json::from_str(src).map_err(json_error)
}

fn json_error(e: serde_json::Error) -> Error {
    let loc = (e.line() > 0).then(|| Loc { line: e.line() as u32, col: e.column().max(1) as u32 });
    // serde_json appends " at line L column C"; the position goes into `loc` instead.
    let msg = e.to_string();
    let msg = msg.rfind(" at line ").map_or(msg.as_str(), |i| &msg[..i]);
    match e.classify() {
        serde_json::error::Category::Data => Error::at(loc, msg),
        _ => Error::at(loc, format!("invalid JSON: {msg}")),
    }
}

fn resolve_axis(mesh: &Mesh, a: &AxisRef) -> Result<usize, String> {
    match a {
        AxisRef::Name(n) => {
            mesh.axis(n).ok_or_else(|| format!("unknown mesh axis '{n}' (the mesh's axes: {})", mesh.axes.join(", ")))
        }
        AxisRef::Index(i) if *i < mesh.shape.len() => Ok(*i),
        AxisRef::Index(i) => Err(no_such_axis(mesh, *i)),
    }
}

/// A layout entry as written: a mesh axis, or a sub-axis `NAME:(PRE)SIZE` (Shardy's
/// notation: the factor SIZE of the axis that follows its factor PRE), as `Mesh::part`.
pub fn resolve_entry(mesh: &Mesh, a: &AxisRef) -> Result<usize, String> {
    let AxisRef::Name(n) = a else { return resolve_axis(mesh, a) };
    let Some((name, factors)) = n.split_once(':') else { return resolve_axis(mesh, a) };
    let parsed = factors.strip_prefix('(').and_then(|f| f.split_once(')'));
    let number = |s: &str| s.parse::<usize>().ok().filter(|_| s.bytes().all(|b| b.is_ascii_digit()));
    let Some((pre, size)) = parsed.and_then(|(p, s)| number(p).zip(number(s))) else {
        return Err(format!("'{n}' is neither a mesh axis nor a sub-axis NAME:(PRE)SIZE such as 'model:(1)4'"));
    };
    let axis = resolve_axis(mesh, &AxisRef::Name(name.to_string()))?;
    let k = mesh.shape[axis];
    if pre == 0 || size < 2 || !k.is_multiple_of(pre.saturating_mul(size)) {
        return Err(format!(
            "sub-axis '{n}': PRE ({pre}) times SIZE ({size}, at least 2) must divide the size of mesh axis '{name}' ({k})"
        ));
    }
    Ok(mesh.part(axis, pre, size))
}

/// Dim-name rules as written, their axes resolved on `mesh`.
pub fn resolve_rules(mesh: &Mesh, rules: &RuleEntries) -> Result<Vec<(String, usize)>, Error> {
    (rules.0.iter())
        .map(|(dim, a)| {
            let a = resolve_entry(mesh, a).map_err(|m| Error::new(format!("rule '{dim}': {m}")))?;
            Ok((dim.clone(), a))
        })
        .collect()
}

/// Whether a `layouts` key is a glob pattern (`*`, `?`, `[...]`) rather than a tensor name.
/// A name may hold those characters too (ONNX's `x[0]`): `expand_patterns` takes a key that
/// is a tensor's name as that name.
pub fn is_pattern(key: &str) -> bool {
    key.contains(['*', '?', '['])
}

fn pattern(key: &str) -> Result<glob::Pattern, String> {
    glob::Pattern::new(key).map_err(|e| format!("layout of '{key}': not a valid pattern: {}", e.msg))
}

impl Spec {
    /// The explicit layouts with each glob pattern replaced by the tensors of `g` it
    /// matches (an exact name wins over a pattern, and a key that is a tensor's name is no
    /// pattern; two patterns that give one tensor different layouts are an error naming
    /// both), and the patterns that matched nothing.
    pub fn expand_patterns(&self, g: &Graph) -> Result<(BTreeMap<String, Layout>, Vec<String>), String> {
        let names: Vec<&str> = g.tensor_names().map(String::as_str).collect();
        let literal = |k: &str| !is_pattern(k) || names.contains(&k);
        let mut out: BTreeMap<String, Layout> =
            self.layouts.iter().filter(|(k, _)| literal(k)).map(|(k, l)| (k.clone(), l.clone())).collect();
        let mut by: BTreeMap<&str, &str> = BTreeMap::new();
        let mut unmatched = Vec::new();
        for (key, layout) in self.layouts.iter().filter(|(k, _)| !literal(k)) {
            let pat = pattern(key)?;
            let matched: Vec<&str> = names.iter().copied().filter(|n| pat.matches(n)).collect();
            if matched.is_empty() {
                unmatched.push(key.clone());
            }
            for name in matched {
                if self.layouts.contains_key(name) {
                    continue;
                }
                if let Some(other) = by.insert(name, key) {
                    if &self.layouts[other] != layout {
                        return Err(format!(
                            "layout of '{name}': matched by the patterns '{other}' and '{key}', which give it different layouts"
                        ));
                    }
                }
                out.insert(name.to_string(), layout.clone());
            }
        }
        Ok((out, unmatched))
    }
}

/// Per-tensor layouts as written, their axes resolved on `mesh`; each is injective, and a
/// key that is a pattern is a valid one.
pub fn resolve_layouts(mesh: &Mesh, layouts: &LayoutEntries) -> Result<BTreeMap<String, Layout>, Error> {
    (layouts.0.iter())
        .map(|(name, entries)| {
            let layout: Layout = entries
                .iter()
                .map(|a| a.as_ref().map(|a| resolve_entry(mesh, a)).transpose())
                .collect::<Result<_, _>>()
                .and_then(|l: Layout| check_injective(mesh, &l).map(|()| l))
                .map_err(|m| Error::new(format!("layout of '{name}': {m}")))?;
            if is_pattern(name) {
                pattern(name).map_err(Error::new)?;
            }
            Ok((name.clone(), layout))
        })
        .collect()
}

fn validate(raw: Raw, file: &str) -> Result<Spec, Error> {
    let mesh = validate_mesh(raw.mesh)?;
    let rules = resolve_rules(&mesh, &raw.rules)?;
    let layouts = resolve_layouts(&mesh, &raw.layouts)?;
    let degraded = validate_degraded(&mesh, raw.degraded)?;
    let memory_per_device = raw
        .memory_per_device
        .map(|v| {
            memory_size(&v).ok_or_else(|| {
                Error::new(format!(
                    "memory_per_device: {v} is not a size (expected a positive number of bytes, optionally with a \
                     unit {}; e.g. \"512MiB\")",
                    meshc_ir::budget::UNITS.iter().map(|(u, _)| *u).collect::<Vec<_>>().join(", ")
                ))
            })
        })
        .transpose()?;
    let hosts = raw.hosts.map(|h| validate_hosts(&mesh, h)).transpose()?.unwrap_or_default();
    Ok(Spec {
        file: file.to_string(),
        mesh,
        rules,
        layouts,
        placement: raw.placement,
        degraded,
        memory_per_device,
        hosts,
    })
}

/// The device groups of `hosts`: every device of the mesh on exactly one host.
fn validate_hosts(mesh: &Mesh, raw: RawHosts) -> Result<Vec<Vec<usize>>, Error> {
    let bad = |msg: String| Error::new(format!("hosts: {msg}"));
    let mut groups = match raw {
        RawHosts::Axis(RawHostAxis { axis }) => {
            let a = resolve_axis(mesh, &axis).map_err(bad)?;
            let mut groups = vec![Vec::new(); mesh.shape[a]];
            for d in 0..mesh.devices() {
                groups[mesh.coords(d)[a]].push(d);
            }
            groups
        }
        RawHosts::Groups(groups) => groups,
    };
    let mut host_of = vec![None; mesh.devices()];
    for (h, g) in groups.iter_mut().enumerate() {
        if g.is_empty() {
            return Err(bad(format!("host {h} has no device")));
        }
        for &d in g.iter() {
            let slot = host_of
                .get_mut(d)
                .ok_or_else(|| bad(format!("host {h}: device {d} is not in the mesh of {} devices", mesh.devices())))?;
            if let Some(other) = slot.replace(h) {
                return Err(bad(format!("device {d} is on host {other} and on host {h}")));
            }
        }
        g.sort_unstable();
    }
    if let Some(d) = host_of.iter().position(Option::is_none) {
        return Err(bad(format!("device {d} ({:?}) is on no host", mesh.coords(d))));
    }
    Ok(groups)
}

fn is_identifier(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn validate_mesh(raw: RawMesh) -> Result<Mesh, Error> {
    let bad = |msg: String| Err(Error::new(format!("mesh: {msg}")));
    if raw.shape.is_empty() {
        return bad("\"shape\" is empty (a mesh has at least one axis)".into());
    }
    if raw.axes.len() != raw.shape.len() {
        let names = count(raw.axes.len(), "axis name", "axis names");
        return bad(format!("{names} for a shape of rank {} ({:?})", raw.shape.len(), raw.shape));
    }
    for (i, a) in raw.axes.iter().enumerate() {
        if !is_identifier(a) {
            return bad(format!(
                "axis name {a:?} is not an identifier (letters, digits and _, not starting with a digit)"
            ));
        }
        if raw.axes[..i].contains(a) {
            return bad(format!("axis '{a}' is named twice"));
        }
        if raw.shape[i] == 0 {
            return bad(format!("axis '{a}' has size 0"));
        }
    }
    let devices = raw.shape.iter().try_fold(1usize, |n, &k| n.checked_mul(k).filter(|&n| n <= MAX_DEVICES));
    if devices.is_none() {
        return bad(format!("{:?} has more than {MAX_DEVICES} devices, the most meshc runs", raw.shape));
    }
    Ok(Mesh { shape: raw.shape, axes: raw.axes, topology: raw.topology.unwrap_or(Topology::Mesh) })
}

fn check_coords(mesh: &Mesh, c: &[usize]) -> Result<(), String> {
    if c.len() != mesh.shape.len() {
        return Err(format!("{}, the mesh has rank {}", count(c.len(), "coordinate", "coordinates"), mesh.shape.len()));
    }
    match c.iter().zip(&mesh.shape).position(|(&x, &n)| x >= n) {
        Some(a) => {
            Err(format!("coordinate {} is out of range along axis '{}' (size {})", c[a], mesh.axes[a], mesh.shape[a]))
        }
        None => Ok(()),
    }
}

/// Whether a link joins `a` and `b`: one step apart along exactly one axis, or the two ends
/// of an axis on a torus.
fn neighbours(mesh: &Mesh, a: &[usize], b: &[usize]) -> bool {
    let mut differ = (0..a.len()).filter(|&i| a[i] != b[i]);
    let (Some(i), None) = (differ.next(), differ.next()) else { return false };
    let (lo, hi) = (a[i].min(b[i]), a[i].max(b[i]));
    hi - lo == 1 || (mesh.topology == Topology::Torus && lo == 0 && hi == mesh.shape[i] - 1)
}

fn validate_degraded(mesh: &Mesh, raw: RawDegraded) -> Result<Degraded, Error> {
    let bad = |msg: String| Err(Error::new(format!("degraded: {msg}")));
    for (i, c) in raw.nodes.iter().enumerate() {
        if let Err(m) = check_coords(mesh, c) {
            return bad(format!("node {c:?}: {m}"));
        }
        if raw.nodes[..i].contains(c) {
            return bad(format!("node {c:?} is listed twice"));
        }
    }
    if raw.nodes.len() == mesh.devices() {
        return bad(format!(
            "every device of the mesh is listed, none is left to compute ({} devices)",
            mesh.devices()
        ));
    }
    let mut links: Vec<(Vec<usize>, Vec<usize>)> = Vec::new();
    for [a, b] in raw.links {
        for c in [&a, &b] {
            if let Err(m) = check_coords(mesh, c) {
                return bad(format!("link {a:?}-{b:?}: node {c:?}: {m}"));
            }
        }
        if !neighbours(mesh, &a, &b) {
            return bad(format!(
                "link {a:?}-{b:?} does not join neighbours (links join devices one step apart along one axis, {})",
                match mesh.topology {
                    Topology::Torus => "or the two ends of an axis on a torus",
                    Topology::Mesh => "without wrap-around on a mesh",
                }
            ));
        }
        if links.iter().any(|(x, y)| (x, y) == (&a, &b) || (x, y) == (&b, &a)) {
            return bad(format!("link {a:?}-{b:?} is listed twice"));
        }
        links.push((a, b));
    }
    Ok(Degraded { nodes: raw.nodes, links })
}

/// A positive byte count: a JSON integer, or a string of digits with an optional unit
/// ("512MiB", "2 GiB", "8G", "1000000"; `meshc_ir::budget::parse_size`).
fn memory_size(v: &Value) -> Option<u64> {
    let bytes = match v {
        Value::Number(n) => n.as_u64()?,
        Value::String(s) => meshc_ir::budget::parse_size(s)?,
        _ => return None,
    };
    (bytes > 0).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example spec of docs/layout.md, verbatim.
    const SPEC_EXAMPLE: &str = r#"{ "format": "meshc-layout/1",
  "mesh": {"shape": [2, 4], "axes": ["data", "model"], "topology": "torus"},
  "rules":   {"batch": "data", "hidden": "model"},
  "layouts": {"x": ["data", null], "w1": [null, "model"]},
  "placement": [{"nodes": ["h", "a"], "devices": "0:1,*"}],
  "degraded":  {"nodes": [[1, 2]], "links": [[[0, 0], [0, 1]]]},
  "memory_per_device": "512MiB" }"#;

    /// The error message of `src`, which must fail to parse.
    fn error(src: &str) -> String {
        parse(src, "spec.json").expect_err("the spec should be refused").to_string()
    }

    /// A minimal spec on a 2x4 mesh with `extra` fields added.
    fn spec_with(extra: &str) -> String {
        format!(r#"{{"format": "meshc-layout/1", "mesh": {{"shape": [2, 4], "axes": ["data", "model"]}}{extra}}}"#)
    }

    #[test]
    fn design_example_parses() {
        let s = parse(SPEC_EXAMPLE, "spec.json").unwrap();
        assert_eq!(s.mesh.shape, vec![2, 4]);
        assert_eq!(s.mesh.axes, vec!["data", "model"]);
        assert_eq!(s.mesh.topology, Topology::Torus);
        assert_eq!(s.rules, vec![("batch".to_string(), 0), ("hidden".to_string(), 1)]);
        assert_eq!(s.layouts["x"], vec![Some(0), None]);
        assert_eq!(s.layouts["w1"], vec![None, Some(1)]);
        let entries = match &s.placement.as_ref().unwrap().stages {
            Stages::Listed(entries) => entries,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            (entries[0].nodes.clone(), entries[0].devices.clone()),
            (vec!["h".into(), "a".into()], Devices::Slice("0:1,*".into()))
        );
        assert_eq!(s.degraded.nodes, vec![vec![1, 2]]);
        assert_eq!(s.degraded.links, vec![(vec![0, 0], vec![0, 1])]);
        assert_eq!(s.memory_per_device, Some(512 << 20));
    }

    #[test]
    fn defaults_and_axis_indices() {
        let s = parse(&spec_with(r#", "rules": {"seq": 1, "batch": 0}, "layouts": {"w": [1, null, 0]}"#), "f").unwrap();
        assert_eq!(s.mesh.topology, Topology::Mesh);
        // File order, not sorted.
        assert_eq!(s.rules, vec![("seq".to_string(), 1), ("batch".to_string(), 0)]);
        assert_eq!(s.layouts["w"], vec![Some(1), None, Some(0)]);
        assert_eq!(s.degraded, Degraded::default());
        assert_eq!((s.placement, s.memory_per_device), (None, None));
        let auto = parse(&spec_with(r#", "placement": {"auto": {"stages": 2}}"#), "f").unwrap();
        assert_eq!(auto.placement.unwrap(), Placement { stages: Stages::Auto(Auto { stages: 2 }), microbatches: None });
    }

    #[test]
    fn structural_errors_carry_file_and_position() {
        assert_eq!(error("{\"format\": \"meshc-layout/1\",}"), "spec.json:1:29: invalid JSON: trailing comma");
        assert_eq!(error("[]"), "spec.json: the layout spec must be a JSON object");
        assert_eq!(
            error(r#"{"format": "meshc-layout/2"}"#),
            r#"spec.json: unsupported format "meshc-layout/2", expected "meshc-layout/1""#
        );
        assert_eq!(error(r#"{"mesh": {}}"#), r#"spec.json: missing "format": "meshc-layout/1""#);
        assert!(
            error(&spec_with(r#", "rule": {}"#)).starts_with("spec.json:1:"),
            "{}",
            error(&spec_with(r#", "rule": {}"#))
        );
        assert!(error(&spec_with(r#", "rule": {}"#)).contains("unknown field `rule`"));
        assert!(error(r#"{"format": "meshc-layout/1"}"#).contains("missing field `mesh`"));
        assert!(error(&spec_with(r#", "layouts": {"x": [1.5]}"#)).contains("expected a mesh axis (its name or index)"));
        assert!(error(&spec_with(r#", "layouts": {"x": [-1]}"#)).contains("expected a mesh axis"));
        let twice = error(&spec_with(r#", "rules": {"batch": 0, "batch": 1}"#));
        assert!(twice.starts_with("spec.json:1:") && twice.ends_with(r#""batch" is given twice"#), "{twice}");
        let topo = r#"{"format": "meshc-layout/1", "mesh": {"shape": [2], "axes": ["a"], "topology": "ring"}}"#;
        assert!(error(topo).contains("unknown variant `ring`, expected `mesh` or `torus`"));
    }

    #[test]
    fn hosts_by_axis_or_groups() {
        let hosts = |h: &str| parse(&spec_with(&format!(r#", "hosts": {h}"#)), "f").map(|s| s.hosts);
        assert_eq!(hosts(r#"{"axis": "data"}"#).unwrap(), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        assert_eq!(hosts(r#"{"axis": 1}"#).unwrap(), vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]);
        // Explicit groups keep their order (host h is rank h); devices sorted inside.
        assert_eq!(hosts("[[7, 6, 5, 4], [0, 1, 2, 3]]").unwrap(), vec![vec![4, 5, 6, 7], vec![0, 1, 2, 3]]);
        assert_eq!(parse(&spec_with(""), "f").unwrap().hosts, Vec::<Vec<usize>>::new());
        let error = |h: &str| error(&spec_with(&format!(r#", "hosts": {h}"#)));
        assert_eq!(
            error(r#"{"axis": "dat"}"#),
            "spec.json: hosts: unknown mesh axis 'dat' (the mesh's axes: data, model)"
        );
        assert_eq!(error("[[0, 1, 2, 3], [3, 4, 5, 6, 7]]"), "spec.json: hosts: device 3 is on host 0 and on host 1");
        assert_eq!(error("[[0, 1, 2, 3], [4, 5, 6]]"), "spec.json: hosts: device 7 ([1, 3]) is on no host");
        assert_eq!(error("[[0, 1, 2, 3, 4, 5, 6, 7], []]"), "spec.json: hosts: host 1 has no device");
        assert_eq!(
            error("[[0, 1, 2, 3, 4, 5, 6, 7, 8]]"),
            "spec.json: hosts: host 0: device 8 is not in the mesh of 8 devices"
        );
        assert!(error(r#"{"axes": "data"}"#).contains("hosts: {\"axis\": AXIS} or a list of device groups"));
    }

    #[test]
    fn mesh_errors() {
        let mesh = |shape: &str, axes: &str| {
            error(&format!(r#"{{"format": "meshc-layout/1", "mesh": {{"shape": {shape}, "axes": {axes}}}}}"#))
        };
        assert_eq!(mesh("[]", "[]"), "spec.json: mesh: \"shape\" is empty (a mesh has at least one axis)");
        assert_eq!(mesh("[2, 4]", r#"["a"]"#), "spec.json: mesh: 1 axis name for a shape of rank 2 ([2, 4])");
        assert_eq!(mesh("[2, 2]", r#"["a", "a"]"#), "spec.json: mesh: axis 'a' is named twice");
        assert_eq!(mesh("[2, 0]", r#"["a", "b"]"#), "spec.json: mesh: axis 'b' has size 0");
        assert!(mesh("[2]", r#"["1st"]"#).contains("axis name \"1st\" is not an identifier"));
        assert!(mesh("[2]", r#"["a-b"]"#).contains("is not an identifier"));
        assert!(mesh("[65, 64]", r#"["a", "b"]"#).contains("more than 4096 devices"));
        // Overflowing the device count is refused, not wrapped.
        assert!(mesh("[4294967296, 4294967296, 2]", r#"["a", "b", "c"]"#).contains("more than 4096 devices"));
        assert!(parse(&mesh_src("[64, 64]"), "f").is_ok());
    }

    fn mesh_src(shape: &str) -> String {
        format!(r#"{{"format": "meshc-layout/1", "mesh": {{"shape": {shape}, "axes": ["a", "b"]}}}}"#)
    }

    #[test]
    fn axis_references_must_exist() {
        assert_eq!(
            error(&spec_with(r#", "rules": {"batch": "dta"}"#)),
            "spec.json: rule 'batch': unknown mesh axis 'dta' (the mesh's axes: data, model)"
        );
        assert_eq!(
            error(&spec_with(r#", "rules": {"batch": 2}"#)),
            "spec.json: rule 'batch': mesh axis 2 does not exist (the mesh has 2 axes)"
        );
        assert_eq!(
            error(&spec_with(r#", "layouts": {"x": [null, "modl"]}"#)),
            "spec.json: layout of 'x': unknown mesh axis 'modl' (the mesh's axes: data, model)"
        );
        assert_eq!(
            error(&spec_with(r#", "layouts": {"x": ["data", 0]}"#)),
            "spec.json: layout of 'x': mesh axis 'data' splits both dim 0 and dim 1 (a layout uses each axis at most once)"
        );
    }

    #[test]
    fn placement_shape_is_checked() {
        let placement = |p: &str| error(&spec_with(&format!(r#", "placement": {p}"#)));
        assert!(placement(r#""auto""#).contains(r#"invalid type: string "auto", expected "placement" to be a list"#));
        assert!(placement("null").contains("invalid type: null"));
        assert!(placement(r#"{"auto": 2}"#).contains(r#"expected "auto" to be {"stages": N}"#));
        assert!(placement(r#"{"auto": {"stages": 2}, "x": 1}"#).contains("unknown field `x`"));
        assert!(placement(r#"{"auto": {"stages": "2"}}"#).ends_with(r#""stages" must be a positive number"#));
        assert!(placement(r#"{"auto": {"stages": 2}, "stages": []}"#).ends_with(r#"has both "auto" and "stages""#));
        assert!(placement(r#"{"microbatches": 2}"#).ends_with(r#"has neither "auto" nor "stages""#));
        assert!(placement(r#"{"stages": [], "microbatches": "2"}"#).ends_with("must be a number of micro-batches"));
        assert!(placement(r#"[{"nodes": ["h"], "device": 0}]"#).contains("unknown field `device`"));
        assert!(placement(r#"[{"devices": 0}]"#).contains("missing field `nodes`"));
        assert!(placement(r#"[{"nodes": "h", "devices": 0}]"#)
            .ends_with(r#""nodes" must be a list of node names or patterns"#));
        assert!(placement(r#"[{"nodes": ["h"], "devices": -1}]"#)
            .ends_with(r#""devices" must be a mesh slice such as "0:1,*" or a device number"#));
        assert!(placement(r#"[{"nodes": ["h"], "devices": 0, "rules": {"b": 0, "b": 1}}]"#)
            .ends_with(r#""b" is given twice"#));
        // Every error points into the file.
        assert!(placement(r#"[{"nodes": "h", "devices": 0}]"#).starts_with("spec.json:1:"));
    }

    #[test]
    fn degraded_nodes_and_links() {
        let torus = |d: &str| {
            parse(
                &format!(
                    r#"{{"format": "meshc-layout/1", "mesh": {{"shape": [2, 4], "axes": ["a", "b"], "topology": "torus"}}, "degraded": {d}}}"#
                ),
                "spec.json",
            )
            .map_err(|e| e.to_string())
        };
        let flat =
            |d: &str| parse(&spec_with(&format!(r#", "degraded": {d}"#)), "spec.json").map_err(|e| e.to_string());
        // Wrap-around links exist on a torus only.
        assert!(torus(r#"{"links": [[[0, 3], [0, 0]]]}"#).is_ok());
        assert!(flat(r#"{"links": [[[0, 3], [0, 0]]]}"#).unwrap_err().contains("does not join neighbours"));
        assert!(flat(r#"{"links": [[[1, 2], [0, 2]], [[0, 1], [0, 2]]]}"#).is_ok());
        for not_a_link in [r#"[[0, 0], [1, 1]]"#, r#"[[0, 0], [0, 2]]"#, r#"[[0, 1], [0, 1]]"#] {
            let e = torus(&format!(r#"{{"links": [{not_a_link}]}}"#)).unwrap_err();
            assert!(e.contains("does not join neighbours"), "{not_a_link}: {e}");
        }
        assert_eq!(
            flat(r#"{"links": [[[0, 1], [0, 2]], [[0, 2], [0, 1]]]}"#).unwrap_err(),
            "spec.json: degraded: link [0, 2]-[0, 1] is listed twice"
        );
        assert_eq!(
            flat(r#"{"nodes": [[2, 0]]}"#).unwrap_err(),
            "spec.json: degraded: node [2, 0]: coordinate 2 is out of range along axis 'data' (size 2)"
        );
        assert_eq!(
            flat(r#"{"nodes": [[1]]}"#).unwrap_err(),
            "spec.json: degraded: node [1]: 1 coordinate, the mesh has rank 2"
        );
        assert!(flat(r#"{"links": [[[0, 0], [0, 4]]]}"#).unwrap_err().contains("node [0, 4]: coordinate 4"));
        assert!(flat(r#"{"nodes": [[1, 1], [1, 1]]}"#).unwrap_err().contains("node [1, 1] is listed twice"));
        let all = r#"{"nodes": [[0, 0], [0, 1], [0, 2], [0, 3], [1, 0], [1, 1], [1, 2], [1, 3]]}"#;
        assert!(flat(all).unwrap_err().contains("every device of the mesh is listed"));
    }

    #[test]
    fn memory_sizes() {
        let size =
            |v: &str| parse(&spec_with(&format!(r#", "memory_per_device": {v}"#)), "f").map(|s| s.memory_per_device);
        assert_eq!(size(r#""512MiB""#).unwrap(), Some(512 << 20));
        assert_eq!(size(r#""2 GiB""#).unwrap(), Some(2 << 30));
        assert_eq!(size(r#""1000000""#).unwrap(), Some(1_000_000));
        assert_eq!(size("4096").unwrap(), Some(4096));
        assert_eq!(size(r#""3MB""#).unwrap(), Some(3_000_000));
        assert_eq!(size(r#""1TiB""#).unwrap(), Some(1 << 40));
        for bad in
            [r#""0""#, "0", r#""1.5GiB""#, r#""GiB""#, r#""12 XB""#, r#""-1""#, "-1", r#""99999999999TiB""#, "true"]
        {
            let e = size(bad).unwrap_err().to_string();
            assert!(e.starts_with("f: memory_per_device: ") && e.contains("is not a size"), "{bad}: {e}");
        }
    }

    #[test]
    fn check_layout_reports_each_illegality() {
        let m = Mesh { shape: vec![2, 4], axes: vec!["data".into(), "model".into()], topology: Topology::Mesh };
        assert_eq!(check_layout(&m, &[8, 8], &[Some(0), Some(1)]), Ok(()));
        assert_eq!(check_layout(&m, &[], &[]), Ok(()));
        assert_eq!(check_layout(&m, &[0, 3], &[Some(1), None]), Ok(()), "an empty dim divides by anything");
        assert_eq!(
            check_layout(&m, &[8, 8], &[None]),
            Err("the layout has 1 entry, the tensor has rank 2 (shape [8, 8])".into())
        );
        assert_eq!(
            check_layout(&m, &[6, 8], &[Some(1), None]),
            Err("dim 0 (size 6) does not divide by mesh axis 'model' (size 4)".into())
        );
        assert!(check_layout(&m, &[8, 8], &[Some(1), Some(1)]).unwrap_err().contains("splits both dim 0 and dim 1"));
        assert_eq!(check_layout(&m, &[8], &[Some(2)]), Err("mesh axis 2 does not exist (the mesh has 2 axes)".into()));
    }

    fn graph(src: &str) -> (Graph, Info) {
        let g = meshc_ir::json::parse(src).unwrap();
        let info = meshc_ir::verify::verify(&g).unwrap();
        (g, info)
    }

    /// Attention-shaped: `s` is [batch, seq, seq] by inference.
    const ATTN: &str = r#"{"format": "meshc-graph/1", "name": "attn",
      "inputs": [{"name": "q", "dtype": "f32", "shape": [4, 8, 6], "dims": ["batch", "seq", "d"]},
                 {"name": "k", "dtype": "f32", "shape": [4, 6, 8], "dims": ["batch", "d", "seq"]}],
      "nodes": [{"name": "s", "op": "matmul", "inputs": ["q", "k"]},
                {"name": "p", "op": "softmax", "inputs": ["s"], "attrs": {"axis": -1}},
                {"name": "u", "op": "reduce_sum", "inputs": ["p"], "attrs": {"axes": [0, 1, 2]}}],
      "outputs": ["u"]}"#;

    fn seeds(spec: &str) -> Result<Vec<(String, String, &'static str)>, String> {
        let (g, info) = graph(ATTN);
        let s = parse(spec, "spec.json").map_err(|e| e.to_string())?;
        let seeds = s.seed_layouts(&g, &info).map_err(|e| e.to_string())?;
        Ok(seeds.into_iter().map(|(n, sd)| (n, s.mesh.layout_string(&sd.layout), sd.source.name())).collect())
    }

    fn row(n: &str, l: &str, s: &'static str) -> (String, String, &'static str) {
        (n.to_string(), l.to_string(), s)
    }

    #[test]
    fn rules_give_an_axis_to_the_first_dim_that_names_it() {
        let got = seeds(&spec_with(r#", "rules": {"seq": "model", "batch": "data"}"#)).unwrap();
        assert_eq!(
            got,
            vec![
                row("k", "[data, -, model]", "rule"),
                row("p", "[data, model, -]", "rule"),
                row("q", "[data, model, -]", "rule"),
                row("s", "[data, model, -]", "rule"),
            ],
            "u is a scalar with no dims, so no rule reaches it"
        );
    }

    #[test]
    fn patterns_select_tensors_and_exact_names_win() {
        // `?` matches `q` and `k` (and `s`, `p`, `u`); `[qk]` only the first two.
        let got = seeds(&spec_with(r#", "layouts": {"[qk]": ["data", null, null], "q": [null, "model", null]}"#));
        assert_eq!(got.unwrap(), vec![row("k", "[data, -, -]", "spec"), row("q", "[-, model, -]", "spec")]);
        let got = seeds(&spec_with(r#", "layouts": {"*": [], "s": ["data", null, null]}"#));
        let e = got.unwrap_err();
        assert!(e.contains("layout of 'k': "), "{e}");
        let same = seeds(&spec_with(r#", "layouts": {"[qk]": ["data", null, null], "?": ["data", null, null]}"#));
        let e = same.unwrap_err();
        assert!(e.contains("layout of 'u'"), "`?` also matches the scalar u: {e}");
        let clash = seeds(&spec_with(r#", "layouts": {"[qp]": ["data", null, null], "[qk]": [null, "model", null]}"#));
        assert_eq!(
            clash.unwrap_err(),
            "spec.json: layout of 'q': matched by the patterns '[qk]' and '[qp]', which give it different layouts"
        );
        let none = seeds(&spec_with(r#", "layouts": {"enc.*.w": [null]}"#));
        assert_eq!(none.unwrap_err(), "spec.json: layout of 'enc.*.w': the pattern matches no tensor of graph 'attn'");
        let bad = parse(&spec_with(r#", "layouts": {"w[": [null]}"#), "spec.json").unwrap_err().to_string();
        assert!(bad.starts_with("spec.json: layout of 'w[': not a valid pattern"), "{bad}");
    }

    #[test]
    fn explicit_layouts_override_rules_entirely() {
        let spec = spec_with(
            r#", "rules": {"batch": "data", "seq": "model"}, "layouts": {"s": [null, null, "model"], "u": []}"#,
        );
        let got = seeds(&spec).unwrap();
        assert!(got.contains(&row("s", "[-, -, model]", "spec")), "{got:?}");
        assert!(got.contains(&row("u", "[]", "spec")), "{got:?}");
        assert!(got.contains(&row("p", "[data, model, -]", "rule")), "{got:?}");
    }

    #[test]
    fn seeds_are_checked_against_the_graph() {
        assert_eq!(
            seeds(&spec_with(r#", "layouts": {"z": [null]}"#)).unwrap_err(),
            "spec.json: layout of 'z': graph 'attn' has no tensor 'z'"
        );
        assert_eq!(
            seeds(&spec_with(r#", "layouts": {"q": [null, "data"]}"#)).unwrap_err(),
            "spec.json: layout of 'q': the layout has 2 entries, the tensor has rank 3 (shape [4, 8, 6])"
        );
        assert_eq!(
            seeds(&spec_with(r#", "layouts": {"q": [null, null, "model"]}"#)).unwrap_err(),
            "spec.json: layout of 'q': dim 2 (size 6) does not divide by mesh axis 'model' (size 4)"
        );
        // `d` (size 6) appears in q as dim 2 and in k as dim 1; q comes first in the graph.
        assert_eq!(
            seeds(&spec_with(r#", "rules": {"d": "model"}"#)).unwrap_err(),
            "spec.json: layout of 'q' by rule 'd' -> 'model': dim 2 (size 6) does not divide by mesh axis 'model' (size 4)"
        );
        // An explicit layout for q moves the failure to k, the next tensor the rule touches.
        assert_eq!(
            seeds(&spec_with(r#", "rules": {"d": "model"}, "layouts": {"q": [null, null, null]}"#)).unwrap_err(),
            "spec.json: layout of 'k' by rule 'd' -> 'model': dim 1 (size 6) does not divide by mesh axis 'model' (size 4)"
        );
    }

    #[test]
    fn load_names_the_file() {
        let e = load(Path::new("/nonexistent/spec.json")).unwrap_err().to_string();
        assert!(e.starts_with("/nonexistent/spec.json: cannot read layout spec: "), "{e}");
    }
}
