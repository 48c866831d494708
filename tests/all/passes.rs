//! Per-pass text tests: every `tests/passes/<pass>/*.txt` runs the pipeline on its input
//! up to that pass (`--stop-after`) and compares the pass's dump with the expected text
//! below the marker; `make golden` (MESHC_BLESS=1) rewrites the expected text instead. The
//! format is in docs/testing.md:
//!
//! ```text
//! # pass: lower                      the pass (the directory's name)
//! # layout: {"format": ...}          a layout spec, inline or a path (optional)
//! # options: gemm=library ...        compile options (optional)
//! # Any other comment line says what the case shows.
//! graph g { ... }                    the input: a graph, or per-device programs
//! # ---- after lower ----
//! ...                                the pass's dump (or `error: ...`)
//! ```
//!
//! A graph runs from the first pass; per-device programs (`# device N` before each, the
//! text the dumps of lower, sendrecv, expand, attention and epilogue print) from the first
//! device pass, so a device pass is tested on the programs it is given.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use meshc::compile::{Gemm, Options};
use meshc::passes::fold::WeightsDtype;
use meshc::passes::pilot::{Config, Select, Simplify};
use meshc::pipeline::{Dumps, Instrument, NAMES};
use meshc_ir::{params, text, verify, Graph, Init, Tensor};
use meshc_runtime::format::mesh::{Mesh, Topology};

use crate::common::{blessing, same_text, scratch};

/// One test file, split into its parts.
struct Case {
    path: PathBuf,
    pass: String,
    layout: Option<String>,
    options: Vec<String>,
    /// The header and the input, as written (bless keeps them).
    head: String,
    input: String,
    /// The text after the marker, and the number of lines before it.
    expected: Option<(String, usize)>,
}

/// Whether `line` heads a device's program (`# device 0`), as `passes::lower::parse` reads it.
fn device_line(line: &str) -> bool {
    line.strip_prefix("# device ").is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
}

fn marker(pass: &str) -> String {
    format!("# ---- after {pass} ----")
}

/// Splits a test file: the header (comment lines up to the input), the input, and the
/// expected text after the marker (None when there is none yet).
fn read_case(path: &Path) -> Result<Case, String> {
    let src = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let dir = path.parent().unwrap().file_name().unwrap().to_string_lossy().to_string();
    let mut case = Case {
        path: path.to_path_buf(),
        pass: String::new(),
        layout: None,
        options: Vec::new(),
        head: String::new(),
        input: String::new(),
        expected: None,
    };
    let lines: Vec<&str> = src.split_inclusive('\n').collect();
    let header = lines.iter().take_while(|l| l.starts_with('#') && !device_line(l)).count();
    for l in &lines[..header] {
        let l = l.trim_end();
        if let Some(v) = l.strip_prefix("# pass:") {
            case.pass = v.trim().to_string();
        } else if let Some(v) = l.strip_prefix("# layout:") {
            case.layout = Some(v.trim().to_string());
        } else if let Some(v) = l.strip_prefix("# options:") {
            case.options.extend(v.split_whitespace().map(str::to_string));
        }
    }
    if case.pass != dir {
        return Err(format!("its header names pass '{}' (a line '# pass: {dir}')", case.pass));
    }
    let mark = marker(&case.pass);
    let at = lines.iter().position(|l| l.trim_end() == mark).unwrap_or(lines.len());
    case.head = lines[..header].concat();
    case.input = lines[header..at].concat();
    if at < lines.len() {
        case.expected = Some((lines[at + 1..].concat(), at + 1));
    }
    if case.input.trim().is_empty() {
        return Err("no input after the header".into());
    }
    Ok(case)
}

/// The compile options a case's `options:` line gives, on top of the defaults (target
/// x86-64-v3, so that no dump depends on the machine that runs the test).
fn options(case: &Case) -> Result<(Options, Option<Pilot>), String> {
    let mut o = Options { target: "x86-64-v3".into(), emit: meshc::compile::Emit::Artifact, ..Options::default() };
    let mut pilot: Option<Pilot> = None;
    for opt in &case.options {
        let (key, value) = opt.split_once('=').unwrap_or((opt, ""));
        let bad = || format!("option '{opt}'");
        let number = |v: &str| v.parse::<f64>().map_err(|_| bad());
        match (key, value) {
            ("target", t) => o.target = t.to_string(),
            ("gemm", "auto") => o.gemm = Gemm::Auto,
            ("gemm", "cranelift") => o.gemm = Gemm::Cranelift,
            ("gemm", "library") => o.gemm = Gemm::Library,
            ("weights-dtype", "keep") => o.weights = WeightsDtype::Keep,
            ("weights-dtype", "f32") => o.weights = WeightsDtype::F32,
            ("weights-dtype", "bf16") => o.weights = WeightsDtype::BF16,
            ("weights-dtype", "f16") => o.weights = WeightsDtype::F16,
            ("weights-dtype", "int8") => o.weights = WeightsDtype::Int8,
            ("single-stream", "") => o.streams.single = true,
            ("compute-streams", n) => o.streams.compute_streams = n.parse().map_err(|_| bad())?,
            ("comm-stream", "always") => o.streams.comm_always = true,
            ("no-epilogues", "") => o.epilogues = false,
            ("no-attention", "") => o.attention = false,
            ("naive-arena", "") => o.plan_arena = false,
            ("pilot-runs", n) => pilot_of(&mut pilot).runs = n.parse().map_err(|_| bad())?,
            ("pilot-keep", f) => pilot_of(&mut pilot).cfg.select = Select::Keep(number(f)?),
            ("pilot-threshold", t) => pilot_of(&mut pilot).cfg.select = Select::Threshold(number(t)?),
            ("pilot-simplify", how) => {
                pilot_of(&mut pilot).cfg.simplify = Simplify::parse(how).map_err(|e| e.to_string())?
            }
            ("pilot-block", n) => pilot_of(&mut pilot).cfg.block = n.parse().map_err(|_| bad())?,
            _ => return Err(bad()),
        }
    }
    Ok((o, pilot))
}

/// The pilot settings `p` holds, the defaults of `compile` until an option changes them.
fn pilot_of(p: &mut Option<Pilot>) -> &mut Pilot {
    p.get_or_insert(Pilot {
        runs: 1,
        cfg: Config {
            runs: Vec::new(),
            simplify: Simplify::parse("bits:7").unwrap(),
            block: meshc::passes::pilot::DEFAULT_BLOCK,
            select: Select::Keep(1.0),
        },
    })
}

/// The pilot pass's settings of a case (`pilot-*` options).
struct Pilot {
    runs: u64,
    /// Its runs are drawn once the graph is known (`Pilot::config`).
    cfg: Config,
}

impl Pilot {
    /// The configuration for `g`: pilot run `k` gives every input of `g` values drawn from
    /// normal{seed = k}, so a case needs no input files.
    fn config(mut self, g: &Graph) -> Result<Config, String> {
        self.cfg.runs = (0..self.runs)
            .map(|seed| {
                let init = Init::Normal { seed, mean: 0.0, std: 1.0 };
                (g.inputs.iter())
                    .map(|i| {
                        Ok((i.name.clone(), meshc_ir::init::materialize(&init, &i.ty).map_err(|e| e.to_string())?))
                    })
                    .collect::<Result<HashMap<String, Tensor>, String>>()
            })
            .collect::<Result<_, _>>()?;
        Ok(self.cfg)
    }
}

/// The spec of a case: a path (of the repository), or the JSON itself.
fn spec(case: &Case) -> Result<Option<meshc::layout::Spec>, String> {
    let Some(l) = &case.layout else { return Ok(None) };
    let spec = if l.starts_with('{') {
        meshc::layout::parse(l, &case.path.display().to_string())
    } else {
        meshc::layout::load(Path::new(l))
    };
    spec.map(Some).map_err(|e| e.to_string())
}

/// What the case's pass dumps of its input, or `error: ...` when the pipeline fails.
fn run_case(case: &Case, dir: &Path) -> Result<String, String> {
    let (opts, pilot) = options(case)?;
    let spec = spec(case)?;
    let dumps = Dumps { after: Vec::new(), dir: Some(dir.to_path_buf()), format: Default::default() };
    let inst = Instrument::new(&dumps, Some(&case.pass), false).map_err(|e| e.to_string())?;
    // Params come from the text (values, inits) or from files named from the repository.
    let load = |g: &Graph| params::load_all(g, Path::new(".")).map_err(|e| e.to_string());
    let result = if case.input.lines().any(device_line) {
        let n = case.input.lines().filter(|l| device_line(l)).count();
        let mesh = match &spec {
            Some(s) => s.mesh.clone(),
            None => Mesh { shape: vec![n], axes: vec!["device".into()], topology: Topology::Mesh },
        };
        let lowered = meshc::passes::lower::parse(&case.input, mesh).map_err(|e| format!("{e:#}"))?;
        if NAMES.iter().position(|p| *p == case.pass) < NAMES.iter().position(|p| *p == "expand") {
            return Err(format!("pass {} runs before the device passes: give it a graph", case.pass));
        }
        let mut values = HashMap::new();
        for dev in &lowered.devices {
            values.extend(load(dev)?);
        }
        let infos = vec![None; lowered.devices.len()];
        meshc::compile::run(&lowered, infos, &(&values).into(), &opts, &inst).map(|_| ())
    } else {
        let g = text::parse(&case.input).map_err(|e| e.to_string())?;
        let info = verify::verify(&g).map_err(|e| e.to_string())?;
        let pilot = pilot.map(|p| p.config(&g)).transpose()?;
        let values = load(&g)?;
        meshc::driver::Job::new(&g, &info, &values, &opts)
            .spec(spec.as_ref())
            .pilot(pilot.as_ref())
            .run(&inst)
            .map(|_| ())
    };
    match result {
        Ok(()) => {
            let file = dumps.file(&case.pass).expect("dumps go to a directory");
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))
        }
        Err(e) => Ok(format!("error: {e:#}\n")),
    }
}

/// Every `tests/passes/<pass>/*.txt`, sorted.
fn cases() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = (std::fs::read_dir("tests/passes").expect("tests/passes exists"))
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|f| f.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_pass_gives_its_expected_output() {
    let files = cases();
    let mut failures = Vec::new();
    for (k, path) in files.iter().enumerate() {
        let dir = scratch(&format!("passes-{k}"));
        let at = |e: String| format!("{}: {e}", path.display());
        let checked = read_case(path).map_err(at).and_then(|case| {
            let actual = run_case(&case, &dir).map_err(at)?;
            match &case.expected {
                _ if blessing() => {
                    let text = format!("{}{}{}\n{actual}", case.head, case.input, marker(&case.pass));
                    std::fs::write(path, text).map_err(|e| at(e.to_string()))
                }
                Some((expected, skip)) => same_text(path, *skip, expected, &actual),
                None => Err(at(format!("no line '{}'; run `make golden` and review it", marker(&case.pass)))),
            }
        });
        failures.extend(checked.err());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Every pass has cases of its own: a pass added to the table needs some.
#[test]
fn every_pass_has_text_tests() {
    let files = cases();
    let missing: Vec<&str> =
        (NAMES.iter().copied()).filter(|p| !files.iter().any(|f| f.parent().unwrap().ends_with(p))).collect();
    assert!(missing.is_empty(), "passes without tests/passes/<pass>/*.txt: {missing:?}");
    let strays: Vec<&PathBuf> =
        files.iter().filter(|f| !NAMES.iter().any(|p| f.parent().unwrap().ends_with(p))).collect();
    assert!(strays.is_empty(), "tests under no pass's name: {strays:?}");
}

/// What lower and sendrecv print parses back to the same programs, for every testdata spec.
#[test]
fn lowered_programs_parse_back_from_their_dump() {
    for case in crate::common::layout_cases() {
        let (g, info) = meshc_ir::load::load(&case.graph).unwrap();
        let spec = meshc::layout::load(&case.spec).unwrap();
        let (lowered, _) = meshc::driver::lower_spec(&g, &info, &spec).unwrap();
        let back = meshc::passes::lower::parse(&meshc::passes::lower::dump(&lowered), lowered.mesh.clone())
            .unwrap_or_else(|e| panic!("{}: {e:#}", case.label));
        let print = |l: &meshc::passes::lower::Lowered| l.devices.iter().map(text::print).collect::<Vec<_>>();
        assert_eq!(print(&back), print(&lowered), "{}", case.label);
    }
}
