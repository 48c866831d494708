//! An artifact opened for embedding: read into memory, verified (checksums, and the signature when a
//! key is given), its programs checked, and its metadata in the caller's terms. Opening
//! starts no thread; sessions (`crate::api::session`) share the one copy.

use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use ed25519_dalek::VerifyingKey;
use meshc_ir::DType;

use crate::api::error::{one_line, Error};
use crate::exec::loader::parse_sections;
use crate::exec::runner::{Code, Loaded, Weights};
use crate::format::artifact::{Artifact, Verify};
use crate::format::mesh::{Layout, Mesh};
use crate::format::program::{IoSpec, Meta, Program};

/// An input or output of a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    /// The whole tensor's shape (the caller always hands and gets whole tensors).
    pub shape: Vec<usize>,
    /// The name the graph gives each dimension, one per entry of `shape`: `Some("batch")`
    /// for a dim the graph names (`dims(batch, _)` in the text format, `"dims"` in JSON,
    /// an ONNX input's `dim_param` or the name the importer gives a dim), `None` for an
    /// unnamed one. Names describe the shape; they change nothing about a run.
    pub dims: Vec<Option<String>>,
    /// How the devices hold it: per dimension, the mesh axis it is split over (an index
    /// into the mesh's axes, or a sub-axis as `Mesh::part` numbers them), or `None`.
    pub layout: Layout,
    /// `layout` as `meshc inspect` prints it, e.g. `[data, -]`.
    pub layout_text: String,
}

/// How `Model::open_with` opens an artifact.
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// Skip the weights' checksum (the rest is always verified): opening a large artifact
    /// then reads none of its weights.
    pub trust_weights: bool,
    /// Refuse the artifact unless this key signed it and the signature matches every
    /// section; checked before any code is mapped executable.
    pub public_key: Option<VerifyingKey>,
}

/// An opened artifact.
pub struct Model {
    art: Arc<Artifact>,
    meta: Meta,
    programs: Vec<Program>,
    inputs: Vec<TensorInfo>,
    outputs: Vec<TensorInfo>,
    /// What names the artifact in errors.
    file: String,
    /// The runner built while checking the programs at open, for the first session.
    first: Mutex<Option<Loaded>>,
}

impl Model {
    /// Opens the artifact at `path`, verifying every checksum.
    pub fn open(path: impl AsRef<Path>) -> Result<Model, Error> {
        Model::open_with(path, &OpenOptions::default())
    }

    /// Opens the artifact at `path` as `options` say.
    pub fn open_with(path: impl AsRef<Path>, options: &OpenOptions) -> Result<Model, Error> {
        Model::open_inner(path.as_ref(), options).map_err(|e| Error::Open(one_line(&e)))
    }

    /// An artifact's bytes, held in an anonymous in-memory file (the code is mapped
    /// executable from it, as from a file on disk); errors name it `<bytes>`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Model, Error> {
        let open = || -> anyhow::Result<Model> {
            use std::io::Write;
            // SAFETY: a NUL-terminated name and no flags; the result is checked.
            let fd = unsafe { libc::memfd_create(c"meshc-artifact".as_ptr(), 0) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error()).context("memfd_create");
            }
            // SAFETY: a descriptor just created and owned by nothing else.
            let mut file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
            file.write_all(bytes).context("writing the artifact into memory")?;
            let path = format!("/proc/self/fd/{fd}");
            let model = Model::open_inner(Path::new(&path), &OpenOptions::default());
            model.map_err(|e| anyhow::anyhow!("{}", format!("{e:#}").replace(&path, "<bytes>"))).map(|mut m| {
                m.file = "<bytes>".into();
                m
            })
        };
        open().map_err(|e| Error::Open(one_line(&e)))
    }

    /// `open_with` for the command line, which reports the error itself.
    pub(crate) fn open_inner(path: &Path, options: &OpenOptions) -> anyhow::Result<Model> {
        let file = path.display().to_string();
        let art = Artifact::open_with(path, if options.trust_weights { Verify::SkipBulk } else { Verify::All })?;
        if let Some(key) = &options.public_key {
            crate::format::signature::require(art.signature()?, key, &file)?;
        }
        let (meta, programs) = parse_sections(&art, &file)?;
        let art = Arc::new(art);
        let loaded = load(&art, &meta, &programs).with_context(|| file.clone())?;
        let info = |specs: &[IoSpec]| specs.iter().map(|s| info(&meta.mesh, s)).collect::<anyhow::Result<Vec<_>>>();
        let (inputs, outputs) = (info(&meta.inputs)?, info(&meta.outputs)?);
        Ok(Model { art, meta, programs, inputs, outputs, file, first: Mutex::new(Some(loaded)) })
    }

    pub fn inputs(&self) -> &[TensorInfo] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[TensorInfo] {
        &self.outputs
    }

    /// The devices the artifact runs on.
    pub fn mesh(&self) -> &Mesh {
        &self.meta.mesh
    }

    /// Everything the artifact's metadata says (target, features, FLOPs, hosts...).
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// The inputs S of a training artifact that have an output `next.S`: its state, kept on
    /// the devices between `Session::step`s. Empty for an inference artifact.
    pub fn state_names(&self) -> Vec<String> {
        let next = |n: &str| self.meta.outputs.iter().any(|o| o.name == meshc_ir::optim::next_name(n));
        self.meta.inputs.iter().filter(|i| next(&i.name)).map(|i| i.name.clone()).collect()
    }

    /// A runner of the model's programs (what `crate::api::session::Session::new` wraps),
    /// its own arenas and device threads: the first
    /// takes the one built at open, later ones load the programs again over the shared
    /// mapping (a new executable mapping of the code, verified again).
    pub fn load(&self) -> Result<Loaded, Error> {
        self.load_inner().map_err(|e| Error::Open(one_line(&e)))
    }

    /// `load` for the command line, which reports the error itself.
    pub(crate) fn load_inner(&self) -> anyhow::Result<Loaded> {
        match self.first.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(l) => Ok(l),
            None => load(&self.art, &self.meta, &self.programs).with_context(|| self.file.clone()),
        }
    }
}

fn load(art: &Arc<Artifact>, meta: &Meta, programs: &[Program]) -> anyhow::Result<Loaded> {
    let code = Code::Mapped(art.map_code()?);
    Loaded::new(meta.clone(), programs.to_vec(), code, Weights::Artifact(art.clone()))
}

fn info(mesh: &Mesh, s: &IoSpec) -> anyhow::Result<TensorInfo> {
    let ty = s.ty().ok_or_else(|| anyhow::anyhow!("'{}' has unknown dtype {}", s.name, s.dtype))?;
    Ok(TensorInfo {
        name: s.name.clone(),
        dtype: ty.dtype,
        shape: s.shape.clone(),
        dims: s.dim_names(),
        layout: s.layout.clone(),
        layout_text: s.mesh(mesh).layout_string(&s.layout),
    })
}
