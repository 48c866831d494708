//! Signed artifacts. An artifact is native code: `compile --sign KEY` adds a signature
//! section, and `run --require-signature PUBKEY` refuses an artifact that is unsigned or
//! signed by another key before any of its code is mapped executable.
//!
//! The section holds the signer's Ed25519 public key (32 bytes) and the signature (64
//! bytes) of a message that binds every other section: a domain tag, the header flags,
//! and per section in kind order its kind, alignment, size and SHA-512 digest. Hashing
//! first keeps the signed message small whatever the weights' size.
//!
//! Key files are one line of text: `meshc-ed25519-secret-key HEX` (the 32-byte seed) or
//! `meshc-ed25519-public-key HEX`.

use std::path::Path;

use anyhow::{anyhow, bail, Result};
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use sha2::{Digest, Sha512};

/// A section as it is signed: kind (its number in the format), alignment and bytes.
pub type Part<'a> = (u32, u32, &'a [u8]);

const DOMAIN: &[u8] = b"meshc-artifact-signature/1\0";
const SECRET_TAG: &str = "meshc-ed25519-secret-key";
const PUBLIC_TAG: &str = "meshc-ed25519-public-key";
/// Public key then signature.
const SECTION_LEN: usize = 32 + 64;

/// What is signed: `flags` and the sections `parts` (kind, alignment, bytes) in kind order.
fn message(flags: u32, parts: &[Part]) -> Vec<u8> {
    let mut m = DOMAIN.to_vec();
    m.extend_from_slice(&flags.to_le_bytes());
    for (kind, align, bytes) in parts {
        m.extend_from_slice(&kind.to_le_bytes());
        m.extend_from_slice(&align.to_le_bytes());
        m.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        m.extend_from_slice(&Sha512::digest(bytes));
    }
    m
}

/// The signature section's bytes for these parts.
pub fn sign(key: &SigningKey, flags: u32, parts: &[Part]) -> Vec<u8> {
    let mut out = key.verifying_key().to_bytes().to_vec();
    out.extend_from_slice(&key.sign(&message(flags, parts)).to_bytes());
    out
}

/// How an artifact is signed, as `inspect` reports it.
pub enum Signed {
    No,
    /// By this key, and whether the signature matches the sections.
    By(VerifyingKey, bool),
}

/// Checks a signature section's `bytes` against what it signs (hashing every part).
pub fn verify(bytes: &[u8], flags: u32, parts: &[Part]) -> Result<Signed> {
    let bytes: &[u8; SECTION_LEN] =
        bytes.try_into().map_err(|_| anyhow!("signature section of {} bytes, expected {SECTION_LEN}", bytes.len()))?;
    let key = VerifyingKey::from_bytes(bytes[..32].try_into().expect("32 bytes"))
        .map_err(|_| anyhow!("the signature section holds no valid public key"))?;
    let signature = Signature::from_bytes(bytes[32..].try_into().expect("64 bytes"));
    Ok(Signed::By(key, key.verify(&message(flags, parts), &signature).is_ok()))
}

/// Refuses the artifact `file` (signed as `signed` says) unless `key` signed it and the
/// signature matches every section.
pub fn require(signed: Signed, key: &VerifyingKey, file: &str) -> Result<()> {
    match signed {
        Signed::No => bail!("{file}: not signed (--require-signature)"),
        Signed::By(signer, _) if signer != *key => {
            bail!("{file}: signed by {}, not by the required key {}", hex(signer.as_bytes()), hex(key.as_bytes()))
        }
        Signed::By(_, false) => bail!("{file}: the signature does not match its contents (modified after signing)"),
        Signed::By(_, true) => Ok(()),
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    let s = s.as_bytes();
    if s.len() != 64 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; 32];
    for (i, pair) in s.chunks(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// The 32 bytes after `tag` in a key file.
fn read_key(path: &Path, tag: &str) -> Result<[u8; 32]> {
    let text = meshc_ir::file::read(path, 4096, "key file").map_err(|e| anyhow!("{}: {}", path.display(), e.msg))?;
    let text = String::from_utf8_lossy(&text);
    text.trim().strip_prefix(tag).and_then(|rest| unhex(rest.trim())).ok_or_else(|| {
        anyhow!("{}: not a key file (expected one line: {tag} followed by 64 hex digits)", path.display())
    })
}

pub fn read_signing_key(path: &Path) -> Result<SigningKey> {
    Ok(SigningKey::from_bytes(&read_key(path, SECRET_TAG)?))
}

pub fn read_public_key(path: &Path) -> Result<VerifyingKey> {
    VerifyingKey::from_bytes(&read_key(path, PUBLIC_TAG)?)
        .map_err(|_| anyhow!("{}: not a valid Ed25519 public key", path.display()))
}

/// A new key pair from the OS's randomness, as the texts of the secret and public key files.
pub fn generate() -> Result<(String, String)> {
    let mut seed = [0u8; 32];
    getrandom::getrandom(&mut seed).map_err(|e| anyhow!("no randomness for a new key: {e}"))?;
    let key = SigningKey::from_bytes(&seed);
    Ok((format!("{SECRET_TAG} {}\n", hex(&seed)), format!("{PUBLIC_TAG} {}\n", hex(key.verifying_key().as_bytes()))))
}
