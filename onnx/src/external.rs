//! External data of ONNX initializers: a model saved with its weights beside it
//! (`model.onnx` + `model.onnx.data`, as `onnx.save_model(..., save_as_external_data=True)`
//! and exporters of models over 2 GB write it). Each file is mapped once per import and a
//! tensor's bytes are a bounds-checked range of its mapping; a location must be a relative
//! path inside the model's directory, also once symbolic links are followed, as
//! onnxruntime requires (`meshc_ir::file::inside`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use meshc_ir::error::shorten;

use memmap2::Mmap;

use super::proto::TensorProto;

type R<T> = std::result::Result<T, String>;

/// The external data files of one model, mapped as they are first named.
pub struct External {
    dir: PathBuf,
    maps: HashMap<String, Mmap>,
}

impl External {
    /// For a model in directory `dir`.
    pub fn new(dir: &Path) -> External {
        External { dir: dir.to_path_buf(), maps: HashMap::new() }
    }

    /// The bytes `t` keeps in an external file (its `location`, `offset` and `length`).
    pub fn bytes(&mut self, t: &TensorProto) -> R<&[u8]> {
        let entry =
            |key: &str| t.external_data.iter().find(|e| e.key.as_deref() == Some(key)).and_then(|e| e.value.as_deref());
        let location = entry("location").ok_or("its data is external, but it names no location")?;
        let path = meshc_ir::file::inside(&self.dir, location, "the model's directory")
            .map_err(|e| format!("external data location '{}' {e}", shorten(location)))?;
        let number = |key: &str| -> R<Option<usize>> {
            entry(key)
                .map(|v| v.parse::<usize>().map_err(|_| format!("external data {key} '{v}' is not a byte count")))
                .transpose()
        };
        let (offset, length) = (number("offset")?.unwrap_or(0), number("length")?);
        if !self.maps.contains_key(location) {
            let what = format!("external data file '{}'", path.display());
            let (file, _) = meshc_ir::file::open(&path, &what).map_err(|e| e.msg)?;
            // Safety: the mapping is read-only and lives as long as the import; a file
            // truncated under it would fault, as for any reader of a file being replaced.
            let map = unsafe { Mmap::map(&file) }
                .map_err(|e| format!("external data file '{}': cannot map it: {e}", path.display()))?;
            self.maps.insert(location.to_string(), map);
        }
        let map = &self.maps[location];
        let end = match length {
            Some(n) => offset.checked_add(n),
            None => Some(map.len()),
        };
        match end {
            Some(end) if offset <= end && end <= map.len() => Ok(&map[offset..end]),
            _ => Err(format!(
                "external data at offset {offset}{} is past the end of '{location}' ({} bytes)",
                length.map_or(String::new(), |n| format!(", length {n}")),
                map.len()
            )),
        }
    }
}
