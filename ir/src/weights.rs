//! Weight files, each opened once per `WeightFiles`: `.npy` files, `.safetensors` files
//! and Hugging Face checkpoint indexes (`*.index.json`, whose `weight_map` names the shard
//! holding each tensor, a file beside the index). Headers are parsed when a file is first
//! named; every param that names it is then a view of the one open file, whose bytes are
//! read (`pread`) when they are needed, straight into the buffer that keeps them.
//!
//! The files are read, not mapped: a mapped file another process truncates faults
//! (SIGBUS) at the first read past its new end, which no reader catches portably, where a
//! read that comes short is an error, "changed while meshc read it" (`file::Pinned`).
//! `check_unchanged` also compares every file's size and modification time with those it
//! had when opened, for a rewrite in place that keeps the size.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use safetensors::tensor::Metadata;

use crate::dtype::{DType, TensorType};
use crate::error::{shorten, Error, Result};
use crate::file::Pinned;
use crate::tensor::{
    check_npy_size, npy_data_offset, npy_type, safetensors_data_end, MAX_NPY_HEADER, MAX_SAFETENSORS_HEADER,
};

/// What a file's header says, parsed once.
enum Header {
    Npy { ty: TensorType, offset: u64 },
    Safetensors { data_start: u64, metadata: Metadata },
    Index { weight_map: BTreeMap<String, String> },
}

struct Opened {
    file: Pinned,
    header: Header,
}

/// A tensor as it lies in a weight file: its type, and where its little-endian, row-major
/// bytes are.
pub struct View<'a> {
    pub ty: TensorType,
    file: &'a Pinned,
    offset: u64,
}

impl View<'_> {
    /// Its bytes, read now.
    pub fn bytes(&self) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        self.read_into(0, self.ty.size_bytes(), &mut v)?;
        Ok(v)
    }

    /// `len` of its bytes from byte `at`, read now and appended to `out`.
    pub fn read_into(&self, at: usize, len: usize, out: &mut Vec<u8>) -> Result<()> {
        assert!(at + len <= self.ty.size_bytes(), "a range inside the tensor");
        (self.file.read_into(self.offset + at as u64, len, out))
            .map_err(|e| e.in_file(self.file.path().display().to_string()))
    }
}

/// The weight files a graph's params name, relative to the graph's directory `base`.
pub struct WeightFiles {
    base: PathBuf,
    files: HashMap<PathBuf, Opened>,
    /// In the order first opened (the depfile lists them so).
    order: Vec<PathBuf>,
}

/// How many names a "no tensor" error lists in full before it lists only the closest.
const LIST_ALL_NAMES: usize = 8;

impl WeightFiles {
    pub fn new(base: &Path) -> WeightFiles {
        WeightFiles { base: base.to_path_buf(), files: HashMap::new(), order: Vec::new() }
    }

    /// Every file opened so far (shards included), in the order first opened.
    pub fn paths(&self) -> &[PathBuf] {
        &self.order
    }

    /// The tensor `key` of `file` (a path relative to the base): the whole array of a
    /// `.npy` (`key` must be `None`), a tensor of a `.safetensors`, or of the shard an
    /// index names for it. Errors name the file the way the caller spelled it.
    pub fn view(&mut self, file: &str, key: Option<&str>) -> Result<View<'_>> {
        self.resolve(file, key)?;
        self.get(file, key)
    }

    /// Opens what `get(file, key)` reads: the file, and for an index the shard it names.
    fn resolve(&mut self, file: &str, key: Option<&str>) -> Result<()> {
        let path = self.base.join(file);
        self.open(&path).map_err(|e| e.in_file(file))?;
        if let (Header::Index { weight_map }, Some(k)) = (&self.files[&path].header, key) {
            let (shard, shard_path) = shard_of(weight_map, &path, file, k)?;
            let shard = shard.to_string();
            self.open(&shard_path).map_err(|e| {
                Error::new(format!("shard '{}' of tensor '{}': {}", shorten(&shard), shorten(k), e.msg)).in_file(file)
            })?;
            if matches!(self.files[&shard_path].header, Header::Index { .. }) {
                return Err(Error::new(format!("shard '{}' is itself an index", shorten(&shard))).in_file(file));
            }
        }
        Ok(())
    }

    /// What `view` gives, of files opened already (by `view`); a file not opened yet is an
    /// error.
    pub fn get(&self, file: &str, key: Option<&str>) -> Result<View<'_>> {
        let path = self.base.join(file);
        let opened = |p: &Path| self.files.get(p).ok_or_else(|| Error::new("not opened").in_file(file));
        let (m, spelled) = match (&opened(&path)?.header, key) {
            (Header::Index { weight_map }, Some(k)) => {
                let (shard, shard_path) = shard_of(weight_map, &path, file, k)?;
                let spelled = Path::new(file).parent().unwrap_or(Path::new("")).join(shard).display().to_string();
                (opened(&shard_path)?, spelled)
            }
            (Header::Index { .. }, None) => {
                return Err(Error::new("a checkpoint index names shards: the param must give a key").in_file(file))
            }
            (_, _) => (opened(&path)?, file.to_string()),
        };
        match (&m.header, key) {
            (Header::Npy { ty, offset }, None) => Ok(View { ty: ty.clone(), file: &m.file, offset: *offset }),
            (Header::Npy { .. }, Some(k)) => {
                Err(Error::new(format!("a .npy file holds one array: key '{}' needs a .safetensors file", shorten(k)))
                    .in_file(spelled))
            }
            (Header::Safetensors { data_start, metadata }, Some(k)) => {
                let info = metadata.info(k).ok_or_else(|| no_tensor(k, metadata.tensors().keys()).in_file(&spelled))?;
                let dtype = safetensors_dtype(info.dtype)
                    .ok_or_else(|| {
                        Error::new(format!(
                            "tensor '{}' has dtype {:?}, which meshc does not read (F32, F16, BF16, I8, I16, I32, I64, U8, U16, U32, U64, BOOL)",
                            shorten(k),
                            info.dtype
                        ))
                    })
                    .map_err(|e| e.in_file(&spelled))?;
                let ty = TensorType::new(dtype, info.shape.clone());
                Ok(View { ty, file: &m.file, offset: data_start + info.data_offsets.0 as u64 })
            }
            (Header::Safetensors { .. }, None) => {
                Err(Error::new("a .safetensors file holds named tensors: the param must give a key").in_file(spelled))
            }
            (Header::Index { .. }, _) => Err(Error::new("a shard that is itself an index").in_file(spelled)),
        }
    }

    /// Opens `path` and parses its header, unless that was done already.
    fn open(&mut self, path: &Path) -> Result<()> {
        if self.files.contains_key(path) {
            return Ok(());
        }
        let file = Pinned::open(path, "")?;
        let is_index = path.to_str().is_some_and(|p| p.ends_with(".json"));
        let header = if is_index {
            let max = crate::file::MAX_TEXT_BYTES;
            if file.len() > max {
                return Err(Error::new(format!(
                    "checkpoint index of {} bytes is larger than the {max} bytes meshc reads",
                    file.len()
                )));
            }
            Header::Index { weight_map: parse_index(&file.read(0, file.len() as usize)?)? }
        } else {
            let magic = file.read(0, (file.len() as usize).min(crate::tensor::NPY_MAGIC.len()))?;
            let npy = path.extension().is_some_and(|e| e == "npy") || magic == crate::tensor::NPY_MAGIC;
            parse_header(&file, npy)?
        };
        self.files.insert(path.to_path_buf(), Opened { file, header });
        self.order.push(path.to_path_buf());
        Ok(())
    }

    /// Refuses when a file opened here has since changed size or modification time: what
    /// was compiled may then mix the old and the new contents.
    pub fn check_unchanged(&self) -> Result<()> {
        for path in &self.order {
            self.files[path].file.unchanged().map_err(|e| e.in_file(path.display().to_string()))?;
        }
        Ok(())
    }
}

/// The shard an index (at `path`, spelled `file`) names for tensor `k`: its name as the
/// index gives it, and its path. A shard lies in the index's directory: a name that leads
/// elsewhere (`../../x`, an absolute path, a symbolic link out) is refused.
fn shard_of<'m>(
    weight_map: &'m BTreeMap<String, String>,
    path: &Path,
    file: &str,
    k: &str,
) -> Result<(&'m str, PathBuf)> {
    let shard = weight_map.get(k).ok_or_else(|| no_tensor(k, weight_map.keys()).in_file(file))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let shard_path = crate::file::inside(dir, shard, "the index's directory")
        .map_err(|e| Error::new(format!("shard '{}' of tensor '{}' {e}", shorten(shard), shorten(k))).in_file(file))?;
    Ok((shard, shard_path))
}

/// The header of a `.npy` (`npy`: by its name or magic) or `.safetensors` file, read
/// alone: what it declares must then cover the file exactly.
fn parse_header(file: &Pinned, npy: bool) -> Result<Header> {
    let len = file.len();
    if npy {
        let prefix = file.read(0, len.min(12) as usize)?;
        if !prefix.starts_with(crate::tensor::NPY_MAGIC) {
            return Err(Error::new("not a valid .npy file: magic not found for NPY file"));
        }
        // `npy_type` refuses a header that does not fit the bytes given it.
        let offset = npy_data_offset(&prefix) as u64;
        let header = file.read(0, offset.min(MAX_NPY_HEADER as u64 + 1).min(len) as usize)?;
        let ty = npy_type(&header)?;
        check_npy_size(&ty, len - offset, ty.size_bytes() as u64)?;
        return Ok(Header::Npy { ty, offset });
    }
    let n = file.read(0, len.min(8) as usize)?;
    let header = n.get(..8).map_or(0, |n| u64::from_le_bytes(n.try_into().expect("8 bytes")));
    // The header's length is not quoted: a file that is not safetensors at all (a text
    // file, another format) would have its first 8 bytes printed as a number.
    if len < 8 || header > MAX_SAFETENSORS_HEADER || 8 + header > len {
        return Err(Error::new(format!(
            "not a valid .safetensors file: its first 8 bytes do not give the length of a header that fits in its {len} bytes"
        )));
    }
    let text = file.read(8, header as usize)?;
    let end = safetensors_data_end(&text)?;
    if 8 + header + end != len {
        return Err(Error::new(format!(
            "not a valid .safetensors file: its header covers {} bytes, the file has {len}",
            8 + header + end
        )));
    }
    let metadata: Metadata = serde_json::from_slice(&text)
        .map_err(|e| Error::new(format!("not a valid .safetensors file: {}", shorten(&e.to_string()))))?;
    Ok(Header::Safetensors { data_start: 8 + header, metadata })
}

/// A Hugging Face checkpoint index: `{"metadata": ..., "weight_map": {tensor: shard}}`.
fn parse_index(text: &[u8]) -> Result<BTreeMap<String, String>> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: BTreeMap<String, String>,
    }
    let index: Index = serde_json::from_slice(text)
        .map_err(|e| Error::new(format!("not a valid checkpoint index: {}", shorten(&e.to_string()))))?;
    Ok(index.weight_map)
}

fn safetensors_dtype(d: safetensors::Dtype) -> Option<DType> {
    use safetensors::Dtype as S;
    Some(match d {
        S::F32 => DType::F32,
        S::I32 => DType::I32,
        S::I64 => DType::I64,
        S::BOOL => DType::Bool,
        S::F16 => DType::F16,
        S::BF16 => DType::BF16,
        S::I8 => DType::I8,
        S::U8 => DType::U8,
        S::I16 => DType::I16,
        S::U16 => DType::U16,
        S::U32 => DType::U32,
        S::U64 => DType::U64,
        _ => return None,
    })
}

/// "no tensor 'k'": with every name when there are few, else the closest few and the count.
/// Each name is quoted and shortened, as every name from a file is in an error: a file's
/// names may hold anything, line breaks included (the command line escapes what is quoted).
fn no_tensor<'a>(key: &str, names: impl Iterator<Item = &'a String>) -> Error {
    let mut names: Vec<&str> = names.map(String::as_str).collect();
    names.sort();
    let quoted = |names: &[&str]| names.iter().map(|n| format!("'{}'", shorten(n))).collect::<Vec<_>>().join(", ");
    if names.len() <= LIST_ALL_NAMES {
        return Error::new(format!("no tensor '{}' (it has: {})", shorten(key), quoted(&names)));
    }
    let count = names.len();
    names.sort_by_key(|n| (strsim::levenshtein(n, key), *n));
    Error::new(format!("no tensor '{}' (closest: {}; {count} in all)", shorten(key), quoted(&names[..3])))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of its own under the system's temporary directory, removed on drop.
    struct Scratch(PathBuf);
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn scratch(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("meshc-weights-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn safetensors(tensors: &[(&str, &[f32])]) -> Vec<u8> {
        let bytes: Vec<Vec<u8>> =
            tensors.iter().map(|(_, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
            .iter()
            .zip(&bytes)
            .map(|((k, v), b)| {
                (
                    k.to_string(),
                    safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![v.len()], b).unwrap(),
                )
            })
            .collect();
        safetensors::serialize(views, None).unwrap()
    }

    #[test]
    fn a_file_is_mapped_once_and_an_index_picks_the_shard() {
        let s = scratch("index");
        std::fs::write(s.0.join("a.safetensors"), safetensors(&[("x", &[1.0, 2.0]), ("y", &[3.0])])).unwrap();
        std::fs::write(s.0.join("b.safetensors"), safetensors(&[("z", &[4.0, 5.0, 6.0])])).unwrap();
        let index =
            r#"{"metadata": {}, "weight_map": {"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"}}"#;
        std::fs::write(s.0.join("m.index.json"), index).unwrap();
        let mut files = WeightFiles::new(&s.0);
        for (key, want) in [("x", vec![1.0f32, 2.0]), ("z", vec![4.0, 5.0, 6.0]), ("y", vec![3.0])] {
            let v = files.view("m.index.json", Some(key)).unwrap();
            assert_eq!(v.ty, TensorType::new(DType::F32, vec![want.len()]));
            let got: Vec<f32> =
                v.bytes().unwrap().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            assert_eq!(got, want, "{key}");
        }
        assert_eq!(files.view("a.safetensors", Some("y")).unwrap().bytes().unwrap(), 3.0f32.to_le_bytes());
        // The index and each shard, each once.
        let names: Vec<_> = files.paths().iter().map(|p| p.file_name().unwrap().to_str().unwrap()).collect();
        assert_eq!(names, ["m.index.json", "a.safetensors", "b.safetensors"]);
        files.check_unchanged().unwrap();
    }

    #[test]
    fn a_file_that_changes_while_read_is_refused() {
        let s = scratch("changed");
        let path = s.0.join("w.safetensors");
        std::fs::write(&path, safetensors(&[("w", &[1.0])])).unwrap();
        let mut files = WeightFiles::new(&s.0);
        files.view("w.safetensors", Some("w")).unwrap();
        std::fs::write(&path, safetensors(&[("w", &[1.0, 2.0])])).unwrap();
        let e = files.check_unchanged().unwrap_err();
        assert!(e.msg.starts_with("changed while meshc read it"), "{}", e.msg);
        assert_eq!(e.file.as_deref(), Some(path.display().to_string().as_str()));
    }

    /// Truncated after its header was read, a file's data reads short: an error, not the
    /// SIGBUS a mapping would give.
    #[test]
    fn a_file_truncated_while_read_is_refused() {
        let s = scratch("truncated");
        let path = s.0.join("w.safetensors");
        std::fs::write(&path, safetensors(&[("w", &[1.0; 1024])])).unwrap();
        let mut files = WeightFiles::new(&s.0);
        files.view("w.safetensors", Some("w")).unwrap();
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(100).unwrap();
        let e = files.get("w.safetensors", Some("w")).unwrap().bytes().unwrap_err();
        assert!(e.msg.starts_with("changed while meshc read it"), "{}", e.msg);
        assert_eq!(e.file.as_deref(), Some(path.display().to_string().as_str()));
    }

    /// An index's shards lie beside it: `..`, absolute paths and symbolic links out are
    /// refused, and a file that is not safetensors is not quoted as a number.
    #[test]
    fn shards_outside_the_index_directory_are_refused() {
        let s = scratch("shards");
        std::fs::create_dir_all(s.0.join("ckpt")).unwrap();
        std::os::unix::fs::symlink("/etc", s.0.join("ckpt/etclink")).unwrap();
        std::fs::write(s.0.join("secret.safetensors"), "not weights at all").unwrap();
        for (shard, why) in [
            ("../secret.safetensors", "is not a relative path inside the index's directory"),
            ("/etc/hostname", "is not a relative path inside the index's directory"),
            ("etclink/passwd", "leads out of the index's directory through a symbolic link"),
        ] {
            let index = format!(r#"{{"weight_map": {{"w": "{shard}"}}}}"#);
            std::fs::write(s.0.join("ckpt/m.index.json"), index).unwrap();
            let e = WeightFiles::new(&s.0).view("ckpt/m.index.json", Some("w")).err().unwrap();
            assert!(e.msg.starts_with(&format!("shard '{shard}' of tensor 'w' {why}")), "{}", e.msg);
        }
        std::fs::write(s.0.join("ckpt/secret.safetensors"), "not weights at all").unwrap();
        let e = WeightFiles::new(&s.0).view("ckpt/secret.safetensors", Some("w")).err().unwrap();
        assert_eq!(
            e.msg,
            "not a valid .safetensors file: its first 8 bytes do not give the length of a header that fits in its 18 bytes"
        );
    }

    #[test]
    fn a_missing_key_among_many_names_the_closest() {
        let names: Vec<String> = (0..20).map(|i| format!("layer.{i}.weight")).collect();
        let e = no_tensor("layer.1.weigth", names.iter());
        assert_eq!(
            e.msg,
            "no tensor 'layer.1.weigth' (closest: 'layer.1.weight', 'layer.0.weight', 'layer.10.weight'; 20 in all)"
        );
    }
}
