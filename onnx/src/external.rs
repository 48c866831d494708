//! External data of ONNX initializers: a model saved with its weights beside it
//! (`model.onnx` + `model.onnx.data`, as `onnx.save_model(..., save_as_external_data=True)`
//! and exporters of models over 2 GB write it). Each file is opened once per import and a
//! tensor's bytes are a bounds-checked range of it, read with `pread` (`file::Pinned`: a
//! file truncated meanwhile is an error, not the SIGBUS of a mapping); a location must be a relative
//! path inside the model's directory, also once symbolic links are followed, as
//! onnxruntime requires (`meshc_ir::file::inside`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use meshc_ir::error::shorten;
use meshc_ir::file::Pinned;

use super::proto::TensorProto;

type R<T> = std::result::Result<T, String>;

/// The external data files of one model, opened as they are first named.
pub struct External {
    dir: PathBuf,
    files: HashMap<String, Pinned>,
}

impl External {
    /// For a model in directory `dir`.
    pub fn new(dir: &Path) -> External {
        External { dir: dir.to_path_buf(), files: HashMap::new() }
    }

    /// The bytes `t` keeps in an external file (its `location`, `offset` and `length`),
    /// read now.
    pub fn bytes(&mut self, t: &TensorProto) -> R<Vec<u8>> {
        let entry =
            |key: &str| t.external_data.iter().find(|e| e.key.as_deref() == Some(key)).and_then(|e| e.value.as_deref());
        let location = entry("location").ok_or("its data is external, but it names no location")?;
        let path = meshc_ir::file::inside(&self.dir, location, "the model's directory")
            .map_err(|e| format!("external data location '{}' {e}", shorten(location)))?;
        let number = |key: &str| -> R<Option<u64>> {
            entry(key)
                .map(|v| v.parse::<u64>().map_err(|_| format!("external data {key} '{v}' is not a byte count")))
                .transpose()
        };
        let (offset, length) = (number("offset")?.unwrap_or(0), number("length")?);
        if !self.files.contains_key(location) {
            let what = format!("external data file '{}'", path.display());
            self.files.insert(location.to_string(), Pinned::open(&path, &what).map_err(|e| e.msg)?);
        }
        let file = &self.files[location];
        let end = match length {
            Some(n) => offset.checked_add(n),
            None => Some(file.len()),
        };
        match end {
            Some(end) if offset <= end && end <= file.len() => (file.read(offset, (end - offset) as usize))
                .map_err(|e| format!("external data file '{}': {}", path.display(), e.msg)),
            _ => Err(format!(
                "external data at offset {offset}{} is past the end of '{location}' ({} bytes)",
                length.map_or(String::new(), |n| format!(", length {n}")),
                file.len()
            )),
        }
    }

    /// Refuses when an external data file has changed since it was opened (`Pinned::unchanged`).
    pub fn check_unchanged(&self) -> R<()> {
        for (location, file) in &self.files {
            file.unchanged().map_err(|e| format!("external data file '{location}': {}", e.msg))?;
        }
        Ok(())
    }
}
