//! Aligned memory the runtime owns: device arenas, weights compiled in memory, and the
//! fabric's shared collective buffers, all at the alignment kernels and the artifact
//! promise (`program::ALIGN`).

use anyhow::{bail, Result};

use crate::format::program::ALIGN;

/// A zeroed, 64-byte aligned heap block (the arena, and weights compiled in memory).
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation like a Vec<u8> does.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn zeroed(len: usize) -> Result<AlignedBuf> {
        if len == 0 {
            // No allocation, but an address: the runner makes (empty) f32 slices of empty
            // buffers, and a slice needs a non-null, aligned pointer even then.
            return Ok(AlignedBuf { ptr: std::ptr::without_provenance_mut(ALIGN), len: 0 });
        }
        let layout = std::alloc::Layout::from_size_align(len, ALIGN)?;
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            bail!("cannot allocate {len} bytes");
        }
        Ok(AlignedBuf { ptr, len })
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
        if self.len > 0 {
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { std::alloc::dealloc(self.ptr, std::alloc::Layout::from_size_align_unchecked(self.len, ALIGN)) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
