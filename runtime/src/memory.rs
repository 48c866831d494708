//! Aligned memory the runtime owns: device arenas, weights compiled in memory, and the
//! fabric's shared collective buffers, all at the alignment kernels and the artifact
//! promise (`program::ALIGN`).

use anyhow::{bail, Result};

use crate::program::ALIGN;

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
            return Ok(AlignedBuf { ptr: std::ptr::null_mut(), len: 0 });
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
        if self.len == 0 {
            return &[];
        }
        // SAFETY: ptr points to len initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
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
