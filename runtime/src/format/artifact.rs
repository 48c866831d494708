//! The artifact container: one little-endian file holding typed sections (metadata,
//! per-device programs, machine code, weights) at page-aligned offsets, each with a CRC-32.
//! This module owns the byte layout (specified in docs/artifact.md), writing it
//! deterministically, and opening it: mapping the file read-only, validating every byte of
//! structure before handing out zero-copy slices, and mapping the code section executable
//! only once its checksum has been verified. What the sections contain belongs to the
//! compiler and the runner.

use std::borrow::Cow;
use std::fmt;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use memmap2::{Mmap, MmapOptions};

use crate::format::signature::{self, Part, Signed};

/// The first 8 bytes of every artifact.
pub const MAGIC: [u8; 8] = *b"MESHC\0AR";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 9;
/// Sections start at multiples of this many bytes, so each can be mapped on its own.
pub const PAGE: usize = 4096;
/// Section flag: the section's checksum is checked by `Verify::All` or
/// `Artifact::verify_bulk`, not by a plain `open` (see `Verify`).
pub const SECTION_BULK: u32 = 1;

const HEADER_LEN: usize = 64;
const ENTRY_LEN: usize = 32;
/// Bytes 0..60 of the header are covered by the header checksum stored at 60..64.
const HEADER_CRC_AT: usize = 60;

/// What a section holds. The numbers are part of the format.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SectionKind {
    Meta = 1,
    Program = 2,
    Code = 3,
    Weights = 4,
    /// Optional: an Ed25519 signature over every other section (`crate::format::signature`).
    Signature = 5,
    /// Optional: a training step's initial state (`crate::tools::steps::State::to_section`).
    State = 6,
}

impl SectionKind {
    pub const ALL: [SectionKind; 6] = [
        SectionKind::Meta,
        SectionKind::Program,
        SectionKind::Code,
        SectionKind::Weights,
        SectionKind::Signature,
        SectionKind::State,
    ];

    pub fn from_u32(v: u32) -> Option<SectionKind> {
        SectionKind::ALL.into_iter().find(|k| *k as u32 == v)
    }

    pub fn name(self) -> &'static str {
        match self {
            SectionKind::Meta => "meta",
            SectionKind::Program => "program",
            SectionKind::Code => "code",
            SectionKind::Weights => "weights",
            SectionKind::Signature => "signature",
            SectionKind::State => "state",
        }
    }

    /// Bulk sections are large data whose checksum a caller may choose to skip at load
    /// time (load cost must not grow with weight size). Code is never bulk: it is never
    /// mapped executable unverified.
    pub fn is_bulk(self) -> bool {
        matches!(self, SectionKind::Weights | SectionKind::State)
    }

    /// Every artifact must have these.
    fn is_required(self) -> bool {
        matches!(self, SectionKind::Meta | SectionKind::Program | SectionKind::Code)
    }

    fn flags(self) -> u32 {
        if self.is_bulk() {
            SECTION_BULK
        } else {
            0
        }
    }
}

impl fmt::Display for SectionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One entry of the section table, as `meshc inspect` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SectionInfo {
    pub kind: SectionKind,
    pub flags: u32,
    /// Byte offset in the file (a multiple of `PAGE`).
    pub offset: u64,
    pub size: u64,
    /// The alignment the section's content needs (a power of two, at most `PAGE`; always
    /// met, since the section starts on a page).
    pub align: u32,
    /// CRC-32 (IEEE, as zlib) of the section's bytes.
    pub checksum: u32,
}

impl SectionInfo {
    pub fn is_bulk(&self) -> bool {
        self.flags & SECTION_BULK != 0
    }

    fn range(&self) -> std::ops::Range<usize> {
        // Validated (or laid out) to lie within the file, whose length is a usize.
        self.offset as usize..(self.offset + self.size) as usize
    }

    fn encode(&self) -> [u8; ENTRY_LEN] {
        let mut e = [0u8; ENTRY_LEN];
        e[0..4].copy_from_slice(&(self.kind as u32).to_le_bytes());
        e[4..8].copy_from_slice(&self.flags.to_le_bytes());
        e[8..16].copy_from_slice(&self.offset.to_le_bytes());
        e[16..24].copy_from_slice(&self.size.to_le_bytes());
        e[24..28].copy_from_slice(&self.align.to_le_bytes());
        e[28..32].copy_from_slice(&self.checksum.to_le_bytes());
        e
    }
}

/// How much of the artifact `Artifact::open_with` checksums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verify {
    /// Every section, weights included.
    All,
    /// Everything except bulk sections (weights), whose checksums are left to
    /// `Artifact::verify_bulk`: one pass over the weights less (they are read either way).
    SkipBulk,
}

fn align_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    (u32_at(b, at) as u64) | ((u32_at(b, at + 4) as u64) << 32)
}

/// The 64-byte header, encoded.
fn encode_header(flags: u32, count: u32, table_crc: u32, file_size: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&flags.to_le_bytes());
    h[16..20].copy_from_slice(&count.to_le_bytes());
    h[20..24].copy_from_slice(&table_crc.to_le_bytes());
    h[24..32].copy_from_slice(&file_size.to_le_bytes());
    let crc = crc32fast::hash(&h[..HEADER_CRC_AT]);
    h[HEADER_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
    h
}

struct Pending<'a> {
    kind: SectionKind,
    align: u32,
    bytes: Cow<'a, [u8]>,
}

/// Builds an artifact from sections handed over as bytes. Sections are laid out in kind
/// order whatever the order they were added in, so the same sections always give the
/// same file.
pub struct Writer<'a> {
    /// Artifact-wide flags, stored in the header; their meaning belongs to the compiler.
    pub flags: u32,
    sections: Vec<Pending<'a>>,
    /// Signs the other sections into a signature section when the artifact is written.
    pub signer: Option<ed25519_dalek::SigningKey>,
}

impl Default for Writer<'_> {
    fn default() -> Self {
        Writer::new()
    }
}

impl<'a> Writer<'a> {
    pub fn new() -> Self {
        Writer { flags: 0, sections: Vec::new(), signer: None }
    }

    /// Adds a section; `bytes` may be owned (`Vec<u8>`) or borrowed (`&[u8]`, not copied).
    /// `align` is the alignment its content needs: a power of two, at most `PAGE`.
    pub fn add_section(&mut self, kind: SectionKind, align: usize, bytes: impl Into<Cow<'a, [u8]>>) -> Result<()> {
        if self.sections.iter().any(|s| s.kind == kind) {
            bail!("artifact: the {kind} section was added twice");
        }
        if !align.is_power_of_two() || align > PAGE {
            bail!("artifact: {kind} section alignment {align} is not a power of two of at most {PAGE}");
        }
        let at = self.sections.partition_point(|s| s.kind < kind);
        self.sections.insert(at, Pending { kind, align: align as u32, bytes: bytes.into() });
        Ok(())
    }

    /// The section table and the file size the sections will be written with.
    fn layout(&self) -> Result<(Vec<SectionInfo>, u64)> {
        if let Some(k) =
            SectionKind::ALL.into_iter().find(|k| k.is_required() && !self.sections.iter().any(|s| s.kind == *k))
        {
            bail!("artifact: no {k} section (meta, program and code are required)");
        }
        let mut end = (HEADER_LEN + ENTRY_LEN * self.sections.len()) as u64;
        let table = self
            .sections
            .iter()
            .map(|s| {
                let offset = align_up(end, PAGE as u64);
                // The file ends where the last section does; an empty last section still
                // sits on its page, so the file reaches that page.
                end = offset + s.bytes.len() as u64;
                SectionInfo {
                    kind: s.kind,
                    flags: s.kind.flags(),
                    offset,
                    size: s.bytes.len() as u64,
                    align: s.align,
                    checksum: crc32fast::hash(&s.bytes),
                }
            })
            .collect();
        Ok((table, end))
    }

    /// Writes the whole artifact to `w`: header, table, then each section after zero
    /// padding up to its offset.
    pub fn write_to(&self, w: &mut (impl Write + ?Sized)) -> Result<()> {
        match &self.signer {
            None => self.write_sections(w),
            Some(key) => {
                if self.sections.iter().any(|s| s.kind == SectionKind::Signature) {
                    bail!("artifact: a signature section and a signer");
                }
                let parts: Vec<Part> = self.sections.iter().map(|s| (s.kind as u32, s.align, &s.bytes[..])).collect();
                let signature = signature::sign(key, self.flags, &parts);
                let mut signed = Writer { flags: self.flags, sections: Vec::new(), signer: None };
                for s in &self.sections {
                    signed.add_section(s.kind, s.align as usize, &s.bytes[..])?;
                }
                signed.add_section(SectionKind::Signature, 8, signature)?;
                signed.write_sections(w)
            }
        }
    }

    fn write_sections(&self, w: &mut (impl Write + ?Sized)) -> Result<()> {
        const ZEROS: [u8; PAGE] = [0; PAGE];
        let (table, file_size) = self.layout()?;
        let table_bytes: Vec<u8> = table.iter().flat_map(SectionInfo::encode).collect();
        w.write_all(&encode_header(self.flags, table.len() as u32, crc32fast::hash(&table_bytes), file_size))?;
        w.write_all(&table_bytes)?;
        let mut pos = (HEADER_LEN + table_bytes.len()) as u64;
        for (info, s) in table.iter().zip(&self.sections) {
            // Padding is less than a page: sections follow each other on the next page.
            w.write_all(&ZEROS[..(info.offset - pos) as usize])?;
            w.write_all(&s.bytes)?;
            pos = info.offset + info.size;
        }
        Ok(())
    }

    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write_to(&mut out)?;
        Ok(out)
    }
}

/// An opened, validated artifact: the whole file read into anonymous memory of its own
/// (page-aligned, then made read-only), sections handed out as slices of it. Nothing maps
/// the file: a run never sees the file change under it, so rewriting or truncating a
/// running artifact (`cp other.mshc running.mshc`) cannot crash it (a mapping would take a
/// SIGBUS), and the bytes a checksum or signature vouched for are the bytes that run.
pub struct Artifact {
    path: PathBuf,
    map: Mmap,
    flags: u32,
    sections: Vec<SectionInfo>,
}

impl Artifact {
    /// Opens with `Verify::SkipBulk`: everything but the weights' checksum is verified.
    pub fn open(path: &Path) -> Result<Artifact> {
        Artifact::open_with(path, Verify::SkipBulk)
    }

    /// Reads `path` into memory and validates it (header, section table, layout, zero
    /// padding, checksums as `verify` says). Every error is one line naming the file.
    pub fn open_with(path: &Path, verify: Verify) -> Result<Artifact> {
        let fail = |msg: String| anyhow!("{}: {msg}", path.display());
        // Checked before opening: opening a FIFO would block.
        let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
        if !meta.is_file() {
            return Err(fail("not a regular file".into()));
        }
        let file = File::open(path).map_err(|e| fail(e.to_string()))?;
        let len = file.metadata().map_err(|e| fail(e.to_string()))?.len();
        let map = read_all(&file, len).map_err(|e| fail(format!("{e:#}")))?;
        let (flags, sections) = validate(&map[..len as usize], verify).map_err(|e| fail(format!("{e:#}")))?;
        Ok(Artifact { path: path.to_path_buf(), map, flags, sections })
    }

    /// The artifact-wide flags from the header.
    pub fn flags(&self) -> u32 {
        self.flags
    }

    /// The section table, in file order.
    pub fn sections(&self) -> &[SectionInfo] {
        &self.sections
    }

    /// The bytes of the section of this kind: a slice of the mapping, nothing copied.
    /// A bulk section's checksum has only been verified if the artifact was opened with
    /// `Verify::All` or `verify_bulk` has succeeded.
    pub fn section(&self, kind: SectionKind) -> Option<&[u8]> {
        self.info(kind).map(|s| self.bytes(s))
    }

    /// The bytes of section `s`, as read when opened.
    fn bytes(&self, s: &SectionInfo) -> &[u8] {
        &self.map[s.range()]
    }

    fn info(&self, kind: SectionKind) -> Option<&SectionInfo> {
        self.sections.iter().find(|s| s.kind == kind)
    }

    /// How the artifact is signed: the signature section checked against every other
    /// section (which hashes them all, weights included).
    pub fn signature(&self) -> Result<Signed> {
        let Some(bytes) = self.section(SectionKind::Signature) else { return Ok(Signed::No) };
        let mut parts: Vec<Part> = self
            .sections
            .iter()
            .filter(|s| s.kind != SectionKind::Signature)
            .map(|s| (s.kind as u32, s.align, self.bytes(s)))
            .collect();
        parts.sort_by_key(|p| p.0);
        signature::verify(bytes, self.flags, &parts).map_err(|e| anyhow!("{}: {e:#}", self.path.display()))
    }

    /// The file's path, as errors name it.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Verifies the checksums `open` skipped (those of bulk sections).
    pub fn verify_bulk(&self) -> Result<()> {
        self.sections
            .iter()
            .filter(|s| s.is_bulk())
            .try_for_each(|s| check_crc(s, &self.map[s.range()]))
            .map_err(|e| anyhow!("{}: {e:#}", self.path.display()))
    }

    /// The code section in anonymous memory of its own, read + execute: the bytes read and
    /// checked when the artifact was opened (and hashed by `signature`), copied while the
    /// memory is writable and only then made executable, never both (W^X).
    pub fn map_code(&self) -> Result<Mmap> {
        let fail = |msg: String| anyhow!("{}: {msg}", self.path.display());
        let info = self.info(SectionKind::Code).ok_or_else(|| fail("no code section".into()))?;
        let code = self.bytes(info);
        let mut map = MmapOptions::new()
            .len(code.len())
            .map_anon()
            .map_err(|e| fail(format!("cannot allocate memory for the code section: {e}")))?;
        map.copy_from_slice(code);
        map.make_exec().map_err(|e| fail(format!("cannot make the code section executable: {e}")))
    }
}

/// The first `len` bytes of `file` (its size when opened) in page-aligned anonymous memory,
/// read with `pread` (a file cut meanwhile is an error, not a SIGBUS), then made read-only.
/// A file that grew meanwhile fails validation (its header's size is not what was read).
fn read_all(file: &File, len: u64) -> Result<Mmap> {
    let n = usize::try_from(len).map_err(|_| anyhow!("{len} bytes do not fit in memory"))?;
    // An empty mapping is refused by the system; an empty file is refused by `validate`.
    // Populated at once: one call allocates every page, rather than a fault per page as
    // `pread` first writes it (a quarter less time for a 256 MiB artifact).
    let mut map = MmapOptions::new()
        .len(n.max(1))
        .populate()
        .map_anon()
        .map_err(|e| anyhow!("cannot allocate {len} bytes to read it into: {e}"))?;
    std::os::unix::fs::FileExt::read_exact_at(file, &mut map[..n], 0).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => anyhow!("file changed while it was read (shorter than {len} bytes)"),
        _ => anyhow!("cannot read: {e}"),
    })?;
    let map = map.make_read_only().map_err(|e| anyhow!("cannot protect the copy read: {e}"))?;
    Ok(map)
}

fn check_crc(s: &SectionInfo, bytes: &[u8]) -> Result<()> {
    if crc32fast::hash(bytes) != s.checksum {
        bail!("section {}: checksum mismatch (corrupted)", s.kind);
    }
    Ok(())
}

/// Checks everything about the file's bytes, in an order that gives the most telling error
/// first (a truncated file says so rather than failing a checksum). Returns the header
/// flags and the section table.
fn validate(b: &[u8], verify: Verify) -> Result<(u32, Vec<SectionInfo>)> {
    let len = b.len() as u64;
    if b.is_empty() {
        bail!("not a meshc artifact (empty file)");
    }
    if b[..b.len().min(MAGIC.len())] != MAGIC[..b.len().min(MAGIC.len())] {
        bail!("not a meshc artifact (bad magic)");
    }
    if b.len() < HEADER_LEN {
        bail!("truncated: {len} bytes, shorter than the {HEADER_LEN}-byte header");
    }
    // Magic and version sit at fixed places in every version; the rest may change with it.
    let version = u32_at(b, 8);
    if version != FORMAT_VERSION {
        bail!("unsupported artifact format version {version} (this build reads version {FORMAT_VERSION})");
    }
    if crc32fast::hash(&b[..HEADER_CRC_AT]) != u32_at(b, HEADER_CRC_AT) {
        bail!("header checksum mismatch (corrupted)");
    }
    let (flags, count, table_crc, file_size) = (u32_at(b, 12), u32_at(b, 16), u32_at(b, 20), u64_at(b, 24));
    if b[32..HEADER_CRC_AT].iter().any(|&x| x != 0) {
        bail!("header: reserved bytes 32..60 are not zero");
    }
    if file_size != len {
        let what = if len < file_size { "truncated" } else { "trailing bytes" };
        bail!("{what}: header says {file_size} bytes, file has {len}");
    }
    let table_end = HEADER_LEN as u64 + count as u64 * ENTRY_LEN as u64;
    if table_end > len {
        bail!("section table ({count} entries, ending at byte {table_end}) extends past the end of the file ({len} bytes)");
    }
    let table = &b[HEADER_LEN..table_end as usize];
    if crc32fast::hash(table) != table_crc {
        bail!("section table checksum mismatch (corrupted)");
    }
    let mut sections = table
        .chunks_exact(ENTRY_LEN)
        .enumerate()
        .map(|(i, e)| decode_entry(i, e, table_end, len))
        .collect::<Result<Vec<_>>>()?;

    sections.sort_by_key(|s| s.kind);
    if let Some(w) = sections.windows(2).find(|w| w[0].kind == w[1].kind) {
        bail!("two {} sections", w[0].kind);
    }
    if let Some(k) = SectionKind::ALL.into_iter().find(|k| k.is_required() && !sections.iter().any(|s| s.kind == *k)) {
        bail!("missing required section {k}");
    }

    // Walk the sections in file order: they must not overlap, and every byte between them
    // (and after the last) is padding that must be zero, so no byte of the file escapes
    // both a checksum and this check.
    let mut by_offset: Vec<&SectionInfo> = sections.iter().collect();
    by_offset.sort_by_key(|s| (s.offset, s.size));
    // Sorted by start, any overlap shows between neighbours.
    if let Some(w) = by_offset.windows(2).find(|w| w[1].offset < w[0].offset + w[0].size) {
        let [p, s] = [w[0], w[1]];
        bail!(
            "sections {} ({}..{}) and {} ({}..{}) overlap",
            p.kind,
            p.offset,
            p.offset + p.size,
            s.kind,
            s.offset,
            s.offset + s.size
        );
    }
    let mut pos = table_end;
    for s in by_offset {
        check_zero(b, pos, s.offset)?;
        pos = s.offset + s.size;
    }
    check_zero(b, pos, len)?;

    sections.iter().filter(|s| verify == Verify::All || !s.is_bulk()).try_for_each(|s| check_crc(s, &b[s.range()]))?;
    // Back to the table's order, which is what `sections()` reports.
    sections.sort_by_key(|s| s.offset);
    Ok((flags, sections))
}

/// Decodes and checks entry `i` of the section table on its own.
fn decode_entry(i: usize, e: &[u8], table_end: u64, len: u64) -> Result<SectionInfo> {
    let raw_kind = u32_at(e, 0);
    let kind = SectionKind::from_u32(raw_kind)
        .ok_or_else(|| anyhow!("section table entry {i}: unknown section kind {raw_kind}"))?;
    let s = SectionInfo {
        kind,
        flags: u32_at(e, 4),
        offset: u64_at(e, 8),
        size: u64_at(e, 16),
        align: u32_at(e, 24),
        checksum: u32_at(e, 28),
    };
    if s.flags != kind.flags() {
        bail!("section {kind}: flags {:#x}, expected {:#x}", s.flags, kind.flags());
    }
    if !s.align.is_power_of_two() || s.align as usize > PAGE {
        bail!("section {kind}: alignment {} is not a power of two of at most {PAGE}", s.align);
    }
    if !s.offset.is_multiple_of(PAGE as u64) {
        bail!("section {kind}: offset {} is not page-aligned ({PAGE})", s.offset);
    }
    if s.offset < table_end {
        bail!("section {kind}: offset {} lies inside the header or section table (which end at {table_end})", s.offset);
    }
    if s.offset.checked_add(s.size).is_none_or(|end| end > len) {
        bail!("section {kind}: {} bytes at offset {} extend past the end of the file ({len} bytes)", s.size, s.offset);
    }
    Ok(s)
}

fn check_zero(b: &[u8], from: u64, to: u64) -> Result<()> {
    match b[from as usize..to as usize].iter().position(|&x| x != 0) {
        Some(at) => bail!("nonzero padding byte at offset {} (corrupted)", from + at as u64),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};

    /// A file in the temp directory, removed when dropped.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new() -> TempFile {
            static N: AtomicUsize = AtomicUsize::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            TempFile(std::env::temp_dir().join(format!("meshc-artifact-test-{}-{n}.mshc", std::process::id())))
        }

        fn with(bytes: &[u8]) -> TempFile {
            let t = TempFile::new();
            std::fs::write(&t.0, bytes).unwrap();
            t
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// x86-64 `mov eax, 42; ret`.
    const RET42: [u8; 6] = [0xB8, 0x2A, 0x00, 0x00, 0x00, 0xC3];

    fn weights(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + 3) as u8).collect()
    }

    fn sample_writer(weights: &[u8]) -> Writer<'_> {
        let mut w = Writer::new();
        w.flags = 0x5;
        // Added out of kind order on purpose: layout must not depend on it.
        w.add_section(SectionKind::Weights, 64, weights).unwrap();
        w.add_section(SectionKind::Code, 16, RET42.to_vec()).unwrap();
        w.add_section(SectionKind::Meta, 1, br#"{"name":"t"}"#.to_vec()).unwrap();
        w.add_section(SectionKind::Program, 8, vec![1u8; 5000]).unwrap();
        w
    }

    /// A small valid artifact, built once.
    fn sample() -> &'static [u8] {
        static S: OnceLock<Vec<u8>> = OnceLock::new();
        S.get_or_init(|| sample_writer(&weights(3000)).to_bytes().unwrap())
    }

    fn open_bytes(bytes: &[u8], verify: Verify) -> Result<Artifact> {
        Artifact::open_with(&TempFile::with(bytes).0, verify)
    }

    fn err(bytes: &[u8], verify: Verify) -> String {
        match open_bytes(bytes, verify) {
            Ok(_) => panic!("opened an invalid artifact"),
            Err(e) => format!("{e:#}"),
        }
    }

    fn entry_at(i: usize) -> usize {
        HEADER_LEN + ENTRY_LEN * i
    }

    fn table_entry(bytes: &[u8], kind: SectionKind) -> usize {
        (0..u32_at(bytes, 16) as usize).map(entry_at).find(|&at| u32_at(bytes, at) == kind as u32).unwrap()
    }

    /// Recomputes the table and header checksums after an edit, so that the structural
    /// checks behind them are what gets tested.
    fn reseal(b: &mut [u8]) {
        let table_end = entry_at(u32_at(b, 16) as usize).min(b.len());
        let crc = crc32fast::hash(&b[HEADER_LEN..table_end]);
        b[20..24].copy_from_slice(&crc.to_le_bytes());
        let crc = crc32fast::hash(&b[..HEADER_CRC_AT]);
        b[HEADER_CRC_AT..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    }

    #[test]
    fn round_trip() {
        let wts = weights(3000);
        let t = TempFile::new();
        std::fs::write(&t.0, sample_writer(&wts).to_bytes().unwrap()).unwrap();
        let a = Artifact::open_with(&t.0, Verify::All).unwrap();
        assert_eq!(a.flags(), 0x5);
        assert_eq!(a.section(SectionKind::Meta).unwrap(), br#"{"name":"t"}"#);
        assert_eq!(a.section(SectionKind::Program).unwrap(), &[1u8; 5000][..]);
        assert_eq!(a.section(SectionKind::Code).unwrap(), &RET42);
        let w = a.section(SectionKind::Weights).unwrap();
        assert_eq!(w, &wts[..]);
        assert_eq!(w.as_ptr() as usize % PAGE, 0, "weights are a page-aligned slice of the mapping");
        let kinds: Vec<_> = a.sections().iter().map(|s| (s.kind, s.offset, s.size, s.align, s.is_bulk())).collect();
        assert_eq!(
            kinds,
            [
                (SectionKind::Meta, 4096, 12, 1, false),
                (SectionKind::Program, 8192, 5000, 8, false),
                (SectionKind::Code, 16384, 6, 16, false),
                (SectionKind::Weights, 20480, 3000, 64, true),
            ]
        );
        assert!(a.sections().iter().all(|s| s.checksum == crc32fast::hash(a.section(s.kind).unwrap())));
        a.verify_bulk().unwrap();
    }

    #[test]
    fn identical_sections_give_identical_files() {
        let wts = weights(3000);
        let mut w = Writer::new();
        w.flags = 0x5;
        w.add_section(SectionKind::Meta, 1, &br#"{"name":"t"}"#[..]).unwrap();
        w.add_section(SectionKind::Program, 8, vec![1u8; 5000]).unwrap();
        w.add_section(SectionKind::Code, 16, &RET42[..]).unwrap();
        w.add_section(SectionKind::Weights, 64, wts.clone()).unwrap();
        assert_eq!(w.to_bytes().unwrap(), sample());
        let t = TempFile::new();
        std::fs::write(&t.0, sample_writer(&wts).to_bytes().unwrap()).unwrap();
        assert_eq!(std::fs::read(&t.0).unwrap(), sample());
        assert_eq!(sample().len(), 20480 + 3000);
    }

    #[test]
    fn writer_refuses_what_the_reader_would() {
        let mut w = Writer::new();
        w.add_section(SectionKind::Meta, 1, vec![]).unwrap();
        assert!(format!("{:#}", w.add_section(SectionKind::Meta, 1, vec![]).unwrap_err()).contains("added twice"));
        assert!(format!("{:#}", w.add_section(SectionKind::Code, 3, vec![]).unwrap_err()).contains("power of two"));
        assert!(format!("{:#}", w.add_section(SectionKind::Code, 8192, vec![]).unwrap_err()).contains("power of two"));
        w.add_section(SectionKind::Code, 1, vec![]).unwrap();
        assert_eq!(
            format!("{:#}", w.to_bytes().unwrap_err()),
            "artifact: no program section (meta, program and code are required)"
        );
    }

    #[test]
    fn empty_sections_are_valid() {
        let mut w = Writer::new();
        for k in [SectionKind::Meta, SectionKind::Program, SectionKind::Code] {
            w.add_section(k, 1, vec![]).unwrap();
        }
        let bytes = w.to_bytes().unwrap();
        assert_eq!(bytes.len(), PAGE, "padding up to the empty sections' page");
        let t = TempFile::with(&bytes);
        let a = Artifact::open_with(&t.0, Verify::All).unwrap();
        assert_eq!(a.section(SectionKind::Code).unwrap(), b"");
        assert_eq!(a.section(SectionKind::Weights), None);
        assert!(a.map_code().unwrap().is_empty());
    }

    #[test]
    fn a_flipped_byte_in_any_section_is_refused() {
        let a = open_bytes(sample(), Verify::All).unwrap();
        for s in a.sections() {
            let mut b = sample().to_vec();
            b[s.offset as usize + s.size as usize / 2] ^= 0x10;
            let expected = format!("section {}: checksum mismatch (corrupted)", s.kind);
            assert!(err(&b, Verify::All).ends_with(&expected), "{}", err(&b, Verify::All));
            if s.is_bulk() {
                let lazy = open_bytes(&b, Verify::SkipBulk).unwrap();
                assert!(format!("{:#}", lazy.verify_bulk().unwrap_err()).ends_with(&expected));
            } else {
                assert!(err(&b, Verify::SkipBulk).ends_with(&expected));
            }
        }
    }

    #[test]
    fn corrupted_header_table_or_padding_is_refused() {
        let cases: [(usize, &str); 5] = [
            (13, "header checksum mismatch (corrupted)"),
            (HEADER_CRC_AT + 1, "header checksum mismatch (corrupted)"),
            (entry_at(1) + 9, "section table checksum mismatch (corrupted)"),
            (entry_at(4) + 1, "nonzero padding byte at offset 193 (corrupted)"),
            (sample().len() - 3000 - 1, "nonzero padding byte at offset 20479 (corrupted)"),
        ];
        for (at, expected) in cases {
            let mut b = sample().to_vec();
            b[at] ^= 1;
            let e = err(&b, Verify::All);
            assert!(e.ends_with(expected), "byte {at}: {e}");
            assert!(e.starts_with(&std::env::temp_dir().display().to_string()), "{e}");
        }
    }

    #[test]
    fn truncated_files_are_refused() {
        let full = sample().len();
        let cases = [
            (0, "not a meshc artifact (empty file)".to_string()),
            (5, "truncated: 5 bytes, shorter than the 64-byte header".to_string()),
            (40, "truncated: 40 bytes, shorter than the 64-byte header".to_string()),
            (entry_at(2) + 3, format!("truncated: header says {full} bytes, file has {}", entry_at(2) + 3)),
            (9000, format!("truncated: header says {full} bytes, file has 9000")),
            (full - 1, format!("truncated: header says {full} bytes, file has {}", full - 1)),
        ];
        for (len, expected) in cases {
            let e = err(&sample()[..len], Verify::All);
            assert!(e.ends_with(&expected), "{len}: {e}");
        }
        let mut longer = sample().to_vec();
        longer.push(0);
        assert!(err(&longer, Verify::All)
            .ends_with(&format!("trailing bytes: header says {full} bytes, file has {}", full + 1)));
    }

    #[test]
    fn foreign_files_and_other_versions_are_refused() {
        assert!(err(b"\x7fELF\x02\x01\x01\0 and so on", Verify::All).ends_with("not a meshc artifact (bad magic)"));
        assert!(err(b"MESHX", Verify::All).ends_with("not a meshc artifact (bad magic)"));
        let mut b = sample().to_vec();
        // Versions 1 (kernels without `part`/`parts`), 2 (without `args`), 3 (weights
        // never in panels: a version-4 program reads some as panels), 4 (matmuls without
        // epilogues: its runner would skip a version-5 one's), 5 (without fused attention:
        // its runner fails on a version-6 program's), 6 (integer matmuls without epilogues:
        // its runner would leave a version-7 one's sums as i32 where f32 is read), 7 (integer
        // matmuls of an i32 `a` only: its runner would read an 8-bit one's bytes as i32), 8
        // (its runner would not check the size-table entries a scaled kernel divides by),
        // and any later one.
        for v in [1u8, 2, 3, 4, 5, 6, 7, 8, 10] {
            b[8] = v;
            let want = format!("unsupported artifact format version {v} (this build reads version 9)");
            assert!(err(&b, Verify::All).ends_with(&want));
        }
        let t = TempFile::new();
        std::fs::create_dir(&t.0).unwrap();
        assert!(err_at(&t.0).ends_with("not a regular file"));
        std::fs::remove_dir(&t.0).unwrap();
        assert!(err_at(&t.0).contains("No such file"));
    }

    fn err_at(path: &Path) -> String {
        format!("{:#}", Artifact::open(path).err().unwrap())
    }

    /// Structural damage behind valid checksums: each check on its own.
    #[test]
    fn bad_layouts_are_refused() {
        let code = table_entry(sample(), SectionKind::Code);
        let prog = table_entry(sample(), SectionKind::Program);
        let set32 = |at: usize, v: u32| move |b: &mut Vec<u8>| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
        let set64 = |at: usize, v: u64| move |b: &mut Vec<u8>| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        type Edit = Box<dyn Fn(&mut Vec<u8>)>;
        let cases: Vec<(Edit, &str)> = vec![
            (Box::new(set32(16, 1000)), "section table (1000 entries, ending at byte 32064) extends past the end of the file (23480 bytes)"),
            (Box::new(set32(40, 1)), "header: reserved bytes 32..60 are not zero"),
            (Box::new(set32(code, 9)), "section table entry 2: unknown section kind 9"),
            (Box::new(set32(code, 2)), "two program sections"),
            (Box::new(set32(code + 4, SECTION_BULK)), "section code: flags 0x1, expected 0x0"),
            (Box::new(set32(code + 24, 12)), "section code: alignment 12 is not a power of two of at most 4096"),
            (Box::new(set64(code + 8, 16384 + 64)), "section code: offset 16448 is not page-aligned (4096)"),
            (Box::new(set64(code + 8, 0)), "section code: offset 0 lies inside the header or section table (which end at 192)"),
            (Box::new(set64(code + 8, 1 << 40)), "section code: 6 bytes at offset 1099511627776 extend past the end of the file (23480 bytes)"),
            (Box::new(set64(code + 16, u64::MAX)), "section code: 18446744073709551615 bytes at offset 16384 extend past the end of the file (23480 bytes)"),
            (Box::new(set64(prog + 16, 8193)), "sections program (8192..16385) and code (16384..16390) overlap"),
            (Box::new(set64(code + 8, 8192)), "sections code (8192..8198) and program (8192..13192) overlap"),
            (
                Box::new(|b: &mut Vec<u8>| {
                    b[16] = 3;
                    b[entry_at(3)..entry_at(4)].fill(0);
                }),
                "nonzero padding byte at offset 20480 (corrupted)",
            ),
            (
                Box::new(move |b: &mut Vec<u8>| b.copy_within(entry_at(3)..entry_at(4), code)),
                "two weights sections",
            ),
        ];
        for (edit, expected) in cases {
            let mut b = sample().to_vec();
            edit(&mut b);
            reseal(&mut b);
            let e = err(&b, Verify::SkipBulk);
            assert!(e.ends_with(expected), "{e}\nexpected: {expected}");
        }
        // A table without code: dropping the last entries of the table leaves meta and program.
        let mut b = sample().to_vec();
        b[16] = 2;
        b[entry_at(2)..entry_at(4)].fill(0);
        b.truncate(16384);
        b[24..32].copy_from_slice(&16384u64.to_le_bytes());
        // Program is then followed by zero padding up to the new end.
        b[13192..].fill(0);
        reseal(&mut b);
        assert!(err(&b, Verify::All).ends_with("missing required section code"));
    }

    #[test]
    fn map_code_gives_the_code_section_executable() {
        let t = TempFile::with(sample());
        let a = Artifact::open(&t.0).unwrap();
        let code = a.map_code().unwrap();
        assert_eq!(&code[..], a.section(SectionKind::Code).unwrap());
        assert_eq!(code.as_ptr() as usize % PAGE, 0);
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: the mapping holds exactly `mov eax, 42; ret`, and is executable.
            let f = unsafe { std::mem::transmute::<*const u8, extern "C" fn() -> u32>(code.as_ptr()) };
            assert_eq!(f(), 42);
        }
    }

    /// Neither code nor weights change (or fault) when the file is rewritten or cut after
    /// `open`: they are the bytes read then.
    #[test]
    fn code_and_weights_written_to_the_file_after_open_are_never_used() {
        let t = TempFile::with(sample());
        let a = Artifact::open(&t.0).unwrap();
        let code = a.section(SectionKind::Code).unwrap().to_vec();
        let weights = a.section(SectionKind::Weights).unwrap().to_vec();
        let mut b = sample().to_vec();
        b[16384] = 0xcc;
        // Rewritten in place (same inode), as a careless tool might; then cut short.
        std::fs::OpenOptions::new().write(true).open(&t.0).unwrap().write_all(&b).unwrap();
        assert_eq!(&a.map_code().unwrap()[..], &code[..]);
        std::fs::OpenOptions::new().write(true).open(&t.0).unwrap().set_len(100).unwrap();
        assert_eq!(&a.map_code().unwrap()[..], &code[..]);
        assert_eq!(a.section(SectionKind::Code).unwrap(), &code[..]);
        assert_eq!(a.section(SectionKind::Weights).unwrap(), &weights[..]);
        a.verify_bulk().unwrap();
    }

    fn median(mut v: Vec<Duration>) -> Duration {
        v.sort();
        v[v.len() / 2]
    }

    /// Load time with and without the bulk checksum (printed; run with --nocapture).
    #[test]
    fn large_weights_open_time() {
        let wts = weights(64 << 20);
        let t = TempFile::new();
        std::fs::write(&t.0, sample_writer(&wts).to_bytes().unwrap()).unwrap();
        drop(wts);
        let time = |verify: Verify| {
            median(
                (0..5)
                    .map(|_| {
                        let start = Instant::now();
                        let a = Artifact::open_with(&t.0, verify).unwrap();
                        let took = start.elapsed();
                        assert_eq!(a.section(SectionKind::Weights).unwrap().len(), 64 << 20);
                        took
                    })
                    .collect(),
            )
        };
        let (skip, all) = (time(Verify::SkipBulk), time(Verify::All));
        println!("open of a 64 MiB-weight artifact: SkipBulk {skip:?}, All {all:?} (median of 5)");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Every changed byte of a valid file is caught (by a checksum or the zero-padding
        /// rule), and nothing panics.
        #[test]
        fn mutated_or_truncated_artifacts_are_refused(
            flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..4),
            cut in proptest::option::of(any::<prop::sample::Index>()),
        ) {
            let mut b = sample().to_vec();
            for (at, x) in &flips {
                let at = at.index(b.len());
                b[at] ^= x;
            }
            if let Some(cut) = cut {
                b.truncate(cut.index(b.len()));
            }
            let result = open_bytes(&b, Verify::All);
            prop_assert_eq!(result.is_ok(), b == sample());
        }

        /// Damage to the header and table behind valid checksums: the structural checks
        /// alone must refuse or accept without panicking, and what they accept is in bounds.
        #[test]
        fn resealed_table_damage_never_panics(
            edits in proptest::collection::vec((0..entry_at(4), any::<u8>()), 1..6),
        ) {
            let mut b = sample().to_vec();
            for (at, v) in edits {
                b[at] = v;
            }
            reseal(&mut b);
            if let Ok(a) = open_bytes(&b, Verify::All) {
                for s in a.sections() {
                    prop_assert_eq!(a.section(s.kind).map(<[u8]>::len), Some(s.size as usize));
                }
            }
        }
    }
}
