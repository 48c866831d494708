//! Aligned memory the runtime owns: device arenas, weights compiled in memory, and the
//! fabric's shared collective buffers, all at the alignment kernels and the artifact
//! promise (`program::ALIGN`).

use anyhow::{bail, Result};

use crate::format::program::ALIGN;

/// A zeroed, 64-byte aligned block (the arena, and weights compiled in memory): from the
/// heap, or mapped when large.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    /// The anonymous mapping `ptr` points into, for a block of `MAPPED_FROM` bytes or more.
    mapped: Option<memmap2::MmapMut>,
}

/// Blocks from this size on are mapped anonymously: the kernel hands out zero pages as
/// they are first touched, where the allocator's zeroing of an aligned block writes every
/// byte. An arena planned for the upper bounds of symbolic dims was resident in full
/// however small the call: a run peaked at 104 MB resident for MiniLM-L3 compiled for batch ≤ 32,
/// seq ≤ 256, called at 2×13, against 30 MB for the artifact compiled for 2×13.
const MAPPED_FROM: usize = 1 << 20;

// SAFETY: AlignedBuf owns its allocation like a Vec<u8> does.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn zeroed(len: usize) -> Result<AlignedBuf> {
        if len == 0 {
            // No allocation, but an address: the runner makes (empty) f32 slices of empty
            // buffers, and a slice needs a non-null, aligned pointer even then.
            return Ok(AlignedBuf { ptr: std::ptr::without_provenance_mut(ALIGN), len: 0, mapped: None });
        }
        if len >= MAPPED_FROM {
            // Page-aligned, so aligned for ALIGN.
            let mut map =
                memmap2::MmapMut::map_anon(len).map_err(|e| anyhow::anyhow!("cannot map {len} bytes: {e}"))?;
            return Ok(AlignedBuf { ptr: map.as_mut_ptr(), len, mapped: Some(map) });
        }
        let layout = std::alloc::Layout::from_size_align(len, ALIGN)?;
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            bail!("cannot allocate {len} bytes");
        }
        Ok(AlignedBuf { ptr, len, mapped: None })
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<AlignedBuf> {
        let mut b = AlignedBuf::zeroed(bytes.len())?;
        b.as_mut_slice().copy_from_slice(bytes);
        Ok(b)
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr points to len initialised bytes owned by self (non-null and aligned
        // when len is 0).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len > 0 && self.mapped.is_none() {
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { std::alloc::dealloc(self.ptr, std::alloc::Layout::from_size_align_unchecked(self.len, ALIGN)) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mapped block is zeroed, aligned and writable to its last byte, as a heap one is.
    #[test]
    fn large_blocks_are_mapped_zeroed_and_aligned() {
        for len in [MAPPED_FROM - 1, MAPPED_FROM, 3 * MAPPED_FROM + 5] {
            let mut b = AlignedBuf::zeroed(len).unwrap();
            assert_eq!(b.mapped.is_some(), len >= MAPPED_FROM);
            assert!((b.as_slice().as_ptr() as usize).is_multiple_of(ALIGN));
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice()[len - 1] = 7;
            assert_eq!(b.as_slice()[len - 1], 7);
        }
    }

    /// An empty arena's f32 view (an empty matmul operand of the library GEMM) needs a
    /// non-null, aligned address: a null one was undefined behaviour, caught by the debug
    /// checks of `slice::from_raw_parts`.
    #[test]
    fn an_empty_buffer_has_an_aligned_address() {
        let mut b = AlignedBuf::zeroed(0).unwrap();
        for p in [b.as_slice().as_ptr() as usize, b.as_mut_slice().as_mut_ptr() as usize] {
            assert!(p != 0 && p.is_multiple_of(ALIGN), "{p:#x}");
        }
    }
}
