//! Every file meshc writes is all-or-nothing: it is written to a temporary file in the same
//! directory and renamed over its name only when the whole command has succeeded, so a
//! failure (an error, a full disk, a kill) never leaves a half-written or a missing file
//! where an old one was. The temporaries are registered, so that SIGINT, SIGTERM, SIGHUP
//! and SIGQUIT remove them before the process ends. Also here: SIGPIPE back to its default, so
//! that `meshc inspect A | head -1` ends quietly (status 141) instead of panicking on the
//! closed pipe.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Once;

use crate::comm::sync::{Mutex, MutexGuard};

use anyhow::{anyhow, bail, Context, Result};

/// Temporaries not yet renamed or removed: what a signal must clean up.
static PENDING: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

fn pending() -> MutexGuard<'static, BTreeSet<PathBuf>> {
    PENDING.lock()
}

/// Process-wide setup of both binaries: SIGPIPE to its default action, and a thread that
/// on SIGINT/SIGTERM/SIGHUP/SIGQUIT removes the registered temporaries and ends the process with
/// the signal's conventional status (128 + signal).
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: setting a signal's disposition has no preconditions. A file over the
        // size limit (`ulimit -f`) then fails its write with EFBIG, an error like a full
        // disk, instead of killing the process with its temporaries left behind.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        }
        use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
        let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT]) else { return };
        std::thread::spawn(move || {
            if let Some(sig) = signals.forever().next() {
                for tmp in pending().iter() {
                    let _ = std::fs::remove_file(tmp);
                }
                std::process::exit(128 + sig);
            }
        });
    });
}

/// A temporary file beside `path`, registered for cleanup.
struct Temp {
    path: PathBuf,
}

impl Temp {
    /// `.NAME.tmpPID-N` beside `path`. Temporaries of NAME that a process killed outright
    /// (SIGKILL, a crash: no handler ran) left behind are removed first: their PID names no
    /// running process.
    fn beside(path: &Path) -> Result<Temp> {
        let name = path.file_name().ok_or_else(|| anyhow!("{}: not a file name", path.display()))?;
        let prefix = format!(".{}.tmp", name.to_string_lossy());
        remove_stale(path, &prefix);
        static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = path.with_file_name(format!("{prefix}{}-{n}", std::process::id()));
        pending().insert(tmp.clone());
        Ok(Temp { path: tmp })
    }
}

/// Removes the files `PREFIX<pid>-<n>` beside `path` whose pid is no running process. A
/// live process's (another meshc writing the same name now) are left alone; a reused pid
/// only delays the removal to a later run.
fn remove_stale(path: &Path, prefix: &str) {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(pid) = file.to_str().and_then(|f| f.strip_prefix(prefix)).and_then(|rest| rest.split_once('-')) else {
            continue;
        };
        let (Ok(pid), true) = (pid.0.parse::<i32>(), pid.1.bytes().all(|b| b.is_ascii_digit())) else { continue };
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = pid > 0
            && unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Exclusive `flock`s on directories, released when dropped: two processes committing into
/// one directory rename their files one after the other, never interleaved.
struct DirLocks {
    _held: Vec<std::fs::File>,
}

impl DirLocks {
    fn take<'a>(paths: impl Iterator<Item = &'a Path>) -> Result<DirLocks> {
        use std::os::fd::AsRawFd;
        let mut dirs: Vec<PathBuf> = paths
            .map(|p| p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new(".")))
            .map(|d| d.canonicalize().unwrap_or_else(|_| d.to_path_buf()))
            .collect();
        // One order for every process, so two never wait on each other.
        dirs.sort();
        dirs.dedup();
        let mut held = Vec::new();
        for d in dirs {
            let f = std::fs::File::open(&d)
                .with_context(|| format!("{}: cannot open the directory to lock it", d.display()))?;
            // SAFETY: flock on a descriptor we own; it is released when the file closes.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
                let e = std::io::Error::last_os_error();
                bail!("{}: cannot lock the directory: {e}", d.display());
            }
            held.push(f);
        }
        Ok(DirLocks { _held: held })
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        pending().remove(&self.path);
    }
}

/// Writes staged together: each `write` goes to a temporary file (flushed to disk);
/// `commit` renames them all into place. Dropped without `commit` (an error on the way),
/// the temporaries are removed and no final name has changed.
/// `-` stages standard output, and a path that is no regular file (`/dev/null`, a pipe)
/// its bytes: both are written after the files are renamed.
#[derive(Default)]
pub struct Outputs {
    staged: Vec<(Temp, PathBuf)>,
    stdout: Option<Vec<u8>>,
    devices: Vec<(PathBuf, Vec<u8>)>,
}

impl Outputs {
    pub fn new() -> Outputs {
        Outputs::default()
    }

    /// Stages `path`, its contents written by `fill`. Two writes to one path are refused.
    pub fn write(&mut self, path: &Path, fill: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<()> {
        if meshc_ir::file::is_stdio(path) {
            if self.stdout.is_some() {
                bail!("-: two outputs of one command would be written to standard output");
            }
            let mut bytes = Vec::new();
            fill(&mut bytes)?;
            self.stdout = Some(bytes);
            return Ok(());
        }
        if self.staged.iter().any(|(_, p)| same_file(p, path)) || self.devices.iter().any(|(p, _)| p == path) {
            bail!("{}: two outputs of one command would be written to this file", path.display());
        }
        // A device or a pipe is written into: renamed over, the device node itself would be
        // replaced wherever the user may (`-o /dev/null` as root replaced /dev/null).
        if std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
            let mut bytes = Vec::new();
            fill(&mut bytes)?;
            self.devices.push((path.to_path_buf(), bytes));
            return Ok(());
        }
        let tmp = Temp::beside(path)?;
        let written = std::fs::File::create(&tmp.path).map_err(anyhow::Error::from).and_then(|f| {
            let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
            fill(&mut w)?;
            w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            Ok(())
        });
        written.with_context(|| format!("{}: cannot write", path.display()))?;
        self.staged.push((tmp, path.to_path_buf()));
        Ok(())
    }

    /// Stages `path` with `bytes`.
    pub fn write_bytes(&mut self, path: &Path, bytes: &[u8]) -> Result<()> {
        self.write(path, |w| Ok(w.write_all(bytes)?))
    }

    /// Renames every staged file into place, in the order they were staged, holding a lock
    /// on their directories: files written together (a graph and its weights) are replaced
    /// together, never paired with another process's writing the same names.
    pub fn commit(mut self) -> Result<()> {
        let _locks = DirLocks::take(self.staged.iter().map(|(_, p)| p.as_path()))?;
        for (tmp, path) in self.staged.drain(..) {
            std::fs::rename(&tmp.path, &path).with_context(|| format!("{}: cannot write", path.display()))?;
            pending().remove(&tmp.path);
            std::mem::forget(tmp);
        }
        for (path, bytes) in self.devices.drain(..) {
            let written = std::fs::OpenOptions::new().write(true).open(&path).and_then(|mut f| f.write_all(&bytes));
            written.with_context(|| format!("{}: cannot write", path.display()))?;
        }
        if let Some(bytes) = self.stdout.take() {
            let mut out = std::io::stdout().lock();
            out.write_all(&bytes).and_then(|()| out.flush()).context("-: cannot write to standard output")?;
        }
        Ok(())
    }
}

/// Whether two paths name one file: equal as given, or equal once their directories are
/// resolved (`out/y.npy` and `./out/y.npy`).
fn same_file(a: &Path, b: &Path) -> bool {
    let resolved = |p: &Path| {
        let dir = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        dir.canonicalize().ok().zip(p.file_name()).map(|(d, n)| d.join(n))
    };
    a == b || resolved(a).is_some_and(|x| Some(x) == resolved(b))
}

/// Checks that an output name is a plain file name: it becomes `DIR/NAME.npy`, so
/// separators, `..`, an empty name or control characters could write outside DIR or make
/// an unreadable name.
pub fn check_output_name(name: &str) -> Result<()> {
    let bad = if name.is_empty() {
        Some("it is empty")
    } else if name == "." || name == ".." {
        Some("it names a directory")
    } else if name.contains('/') || name.contains('\\') {
        Some("it contains a path separator")
    } else if name.chars().any(char::is_control) {
        Some("it contains a control character")
    } else {
        None
    };
    match bad {
        Some(why) => bail!("output name '{}' cannot be a file name: {why}", meshc_ir::error::shorten(name)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("meshc-output-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn files(d: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn nothing_changes_until_commit_and_nothing_is_left_on_failure() {
        let d = dir("commit");
        std::fs::write(d.join("a"), "old a").unwrap();
        let mut out = Outputs::new();
        out.write_bytes(&d.join("a"), b"new a").unwrap();
        out.write_bytes(&d.join("b"), b"new b").unwrap();
        assert_eq!(std::fs::read_to_string(d.join("a")).unwrap(), "old a");
        assert!(out.write_bytes(&d.join("a"), b"again").unwrap_err().to_string().contains("two outputs"));
        // A failing write: the staged ones are dropped with it, the old file stays.
        let failing = out.write(&d.join("c"), |_| bail!("disk full"));
        assert!(format!("{:#}", failing.unwrap_err()).contains("disk full"));
        drop(out);
        assert_eq!(files(&d), ["a"]);
        assert_eq!(std::fs::read_to_string(d.join("a")).unwrap(), "old a");

        let mut out = Outputs::new();
        out.write_bytes(&d.join("a"), b"new a").unwrap();
        out.write_bytes(&d.join("b"), b"new b").unwrap();
        out.commit().unwrap();
        assert_eq!(files(&d), ["a", "b"]);
        assert_eq!(std::fs::read_to_string(d.join("a")).unwrap(), "new a");
        assert!(pending().is_empty());
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn stale_temporaries_of_dead_processes_are_removed() {
        let d = dir("stale");
        // No process has pid i32::MAX (pid_max is at most 2^22); this one is alive.
        let dead = d.join(format!(".a.tmp{}-0", i32::MAX));
        let live = d.join(format!(".a.tmp{}-99", std::process::id()));
        let other = d.join(format!(".b.tmp{}-0", i32::MAX));
        for f in [&dead, &live, &other] {
            std::fs::write(f, "x").unwrap();
        }
        let mut out = Outputs::new();
        out.write_bytes(&d.join("a"), b"new a").unwrap();
        out.commit().unwrap();
        assert_eq!(
            files(&d),
            [".a.tmp".to_string() + &format!("{}-99", std::process::id()), format!(".b.tmp{}-0", i32::MAX), "a".into()]
        );
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn output_names_must_be_plain_file_names() {
        for ok in ["y", "logits.0", "a b", "ü"] {
            check_output_name(ok).unwrap();
        }
        for (bad, why) in [
            ("", "empty"),
            ("..", "directory"),
            ("../../escaped", "separator"),
            ("/abs/path", "separator"),
            ("a\nb", "control"),
        ] {
            assert!(check_output_name(bad).unwrap_err().to_string().contains(why), "{bad:?}");
        }
    }
}
