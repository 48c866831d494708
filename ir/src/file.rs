//! Reading files a user hands us, which are hostile until checked: only regular files
//! (a FIFO would hang the read, a device such as /dev/zero never ends, a directory is a
//! mistake), never more bytes than the caller can use, and memory asked for fallibly so
//! that a size the system cannot give becomes an error, not an abort.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The largest graph file or layout spec read (text or JSON; weights belong in `.npy` or
/// `.safetensors` files, which have no such limit).
pub const MAX_TEXT_BYTES: u64 = 256 << 20;

/// What a path that is not a regular file is, as the refusal says it.
fn kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "is a directory"
    } else if t.is_fifo() {
        "is a FIFO"
    } else if t.is_char_device() || t.is_block_device() {
        "is a device"
    } else if t.is_socket() {
        "is a socket"
    } else {
        "is not a regular file"
    }
}

/// Opens `path` for reading if it is a regular file, with its size; errors say "cannot
/// read WHAT: ..." (`what` may be empty). The type is checked before opening (opening a
/// FIFO blocks until a writer comes) and again on the open file (the name may have been
/// swapped in between).
pub fn open(path: &Path, what: &str) -> Result<(File, u64)> {
    let fail = |why: &dyn std::fmt::Display| {
        Error::new(format!("cannot read{}{what}: {why}", if what.is_empty() { "" } else { " " }))
    };
    let meta = std::fs::metadata(path).map_err(|e| fail(&e))?;
    if !meta.is_file() {
        return Err(fail(&kind(&meta)));
    }
    let f = File::open(path).map_err(|e| fail(&e))?;
    let meta = f.metadata().map_err(|e| fail(&e))?;
    if !meta.is_file() {
        return Err(fail(&kind(&meta)));
    }
    Ok((f, meta.len()))
}

/// A buffer of `len` bytes' capacity, or an error naming `what` when the system cannot
/// give it.
pub fn buffer(len: u64, what: &str) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    usize::try_from(len)
        .ok()
        .and_then(|n| v.try_reserve_exact(n).ok())
        .ok_or_else(|| Error::new(format!("cannot allocate {len} bytes for {what}")))?;
    Ok(v)
}

/// Reads exactly `len` bytes of `f` (its size as `open` saw it) into a fresh buffer; a file
/// that shrank meanwhile is an error.
pub fn read_exact(f: &mut File, len: u64, what: &str) -> Result<Vec<u8>> {
    let mut v = buffer(len, what)?;
    f.take(len).read_to_end(&mut v).map_err(|e| Error::new(format!("cannot read: {e}")))?;
    if (v.len() as u64) < len {
        return Err(Error::new(format!("file ends early: {} of {len} bytes", v.len())));
    }
    Ok(v)
}

/// Whether `path` is `-`, which names standard input (or output) where a file is expected.
pub fn is_stdio(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// All of standard input, at most `max` bytes, as `what`. A command reads it once: a second
/// `-` is refused naming the first, and a terminal is refused rather than waited on.
pub fn read_stdin(max: u64, what: &str) -> Result<Vec<u8>> {
    use std::io::IsTerminal;
    static TAKEN: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(first) = taken.as_ref() {
        return Err(Error::new(format!("-: standard input is already the {first}; give the {what} as a file")));
    }
    *taken = Some(what.to_string());
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Err(Error::new(format!("-: standard input is a terminal; pipe the {what} in, or give a file")));
    }
    let mut v = Vec::new();
    stdin
        .lock()
        .take(max.saturating_add(1))
        .read_to_end(&mut v)
        .map_err(|e| Error::new(format!("-: cannot read: {e}")))?;
    if v.len() as u64 > max {
        return Err(Error::new(format!("-: the {what} on standard input is larger than the {max} bytes meshc reads")));
    }
    Ok(v)
}

/// The whole of a regular file of at most `max` bytes (`-`: standard input); `what` names
/// it in errors.
pub fn read(path: &Path, max: u64, what: &str) -> Result<Vec<u8>> {
    if is_stdio(path) {
        return read_stdin(max, what);
    }
    let (mut f, len) = open(path, what)?;
    if len > max {
        return Err(Error::new(format!("{what} of {len} bytes is larger than the {max} bytes meshc reads")));
    }
    read_exact(&mut f, len, what)
}

/// A regular file read in ranges, each through `pread` into memory of its own, each
/// checked to get every byte asked for. A file truncated while meshc reads it then gives
/// "changed while meshc read it", where a mapping of it would fault (SIGBUS, which no
/// reader catches portably). `unchanged` compares the file at the path now with the file
/// opened (size, modification time), for what a rewrite in place leaves the same size.
pub struct Pinned {
    file: File,
    path: PathBuf,
    stamp: Stamp,
}

/// A file's size and modification time.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        Stamp { len: meta.len(), modified: meta.modified().ok() }
    }
}

/// What a file that changed under a read is told.
const CHANGED: &str = "changed while meshc read it (its size or modification time differ): run again";

impl Pinned {
    /// Opens `path` (a regular file: `open`).
    pub fn open(path: &Path, what: &str) -> Result<Pinned> {
        let (file, _) = open(path, what)?;
        let meta = file.metadata().map_err(|e| Error::new(format!("cannot read: {e}")))?;
        Ok(Pinned { file, path: path.to_path_buf(), stamp: Stamp::of(&meta) })
    }

    /// The path it was opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The size the file had when opened.
    pub fn len(&self) -> u64 {
        self.stamp.len
    }

    pub fn is_empty(&self) -> bool {
        self.stamp.len == 0
    }

    /// `len` bytes from `offset`, appended to `out`; a range past the size the file had when
    /// opened is the caller's mistake, one the file no longer has is `CHANGED`.
    pub fn read_into(&self, offset: u64, len: usize, out: &mut Vec<u8>) -> Result<()> {
        use std::os::unix::fs::FileExt;
        assert!(offset.checked_add(len as u64).is_some_and(|end| end <= self.stamp.len), "a range inside the file");
        let start = out.len();
        out.try_reserve_exact(len).map_err(|_| Error::new(format!("cannot allocate {len} bytes to read")))?;
        out.resize(start + len, 0);
        match self.file.read_exact_at(&mut out[start..], offset) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(Error::new(CHANGED)),
            Err(e) => Err(Error::new(format!("cannot read: {e}"))),
        }
    }

    /// `len` bytes from `offset` (`read_into`).
    pub fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        self.read_into(offset, len, &mut v)?;
        Ok(v)
    }

    /// Refuses when the file at the path now differs in size or modification time from the
    /// one opened (rewritten, replaced, or gone): what was read may mix the two.
    pub fn unchanged(&self) -> Result<()> {
        match std::fs::metadata(&self.path).map(|m| Stamp::of(&m)) {
            Ok(now) if now == self.stamp => Ok(()),
            _ => Err(Error::new(CHANGED)),
        }
    }
}

/// `rel`, a path one file names for another (an ONNX model its external data, a checkpoint
/// index its shards), resolved in `dir`, the naming file's directory: it must be relative,
/// without `..`, and must not lead out of `dir` through a symbolic link either (as
/// onnxruntime refuses external data that escapes the model's directory). A path that
/// does not exist is given back as it is, for the open to say so. The error says what is
/// wrong with `rel` (`dir_is` naming `dir`), for the caller to name `rel`.
pub fn inside(dir: &Path, rel: &str, dir_is: &str) -> std::result::Result<PathBuf, String> {
    use std::path::Component;
    let path = Path::new(rel);
    if rel.is_empty() || path.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir)) {
        return Err(format!("is not a relative path inside {dir_is}"));
    }
    let joined = dir.join(path);
    let (Ok(root), Ok(target)) = (dir.canonicalize(), joined.canonicalize()) else { return Ok(joined) };
    if !target.starts_with(&root) {
        return Err(format!(
            "leads out of {dir_is} through a symbolic link (to '{}')",
            crate::error::shorten(&target.display().to_string())
        ));
    }
    Ok(joined)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_is_not_a_regular_file() {
        let e = read(Path::new("/dev/zero"), MAX_TEXT_BYTES, "graph").unwrap_err();
        assert_eq!(e.msg, "cannot read graph: is a device");
        let e = read(Path::new("/"), MAX_TEXT_BYTES, "layout spec").unwrap_err();
        assert_eq!(e.msg, "cannot read layout spec: is a directory");
    }

    #[test]
    fn paths_named_by_files_stay_inside_their_directory() {
        let dir = std::env::temp_dir().join(format!("meshc-inside-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/w.bin"), b"w").unwrap();
        let _ = std::os::unix::fs::symlink("/", dir.join("rootlink"));
        let _ = std::os::unix::fs::symlink("sub", dir.join("sublink"));
        let inside = |rel: &str| inside(&dir, rel, "its directory");
        assert_eq!(inside("sub/w.bin"), Ok(dir.join("sub/w.bin")));
        assert_eq!(inside("sublink/w.bin"), Ok(dir.join("sublink/w.bin")));
        assert_eq!(inside("./missing"), Ok(dir.join("./missing")));
        for bad in ["../x", "/etc/passwd", "sub/../../x", ""] {
            assert_eq!(inside(bad).unwrap_err(), "is not a relative path inside its directory", "{bad}");
        }
        assert_eq!(
            inside("rootlink/etc").unwrap_err(),
            "leads out of its directory through a symbolic link (to '/etc')"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_files_over_the_limit_and_sizes_the_system_cannot_give() {
        let e = read(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src/file.rs")), 10, "graph").unwrap_err();
        assert!(e.msg.starts_with("graph of ") && e.msg.ends_with("larger than the 10 bytes meshc reads"), "{}", e.msg);
        assert_eq!(buffer(u64::MAX, "x").unwrap_err().msg, format!("cannot allocate {} bytes for x", u64::MAX));
    }
}
