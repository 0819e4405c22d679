//! The large arrays of the keyed tables (slot groups, sliding logs), in memory of their own.
//!
//! A table of a million keys spans tens of megabytes, and with 4 KiB pages nearly every
//! decision on it would miss the TLB as well as the cache. Asking the kernel for transparent
//! huge pages (`madvise(MADV_HUGEPAGE)`) only works on memory not yet touched: when the
//! allocator hands back recycled heap memory (glibc does, for large blocks, once a block of that
//! size has been freed), its pages are already faulted in as 4 KiB pages and the advice does
//! nothing. So on Linux an array of 2 MiB or more gets an anonymous mapping of its own:
//!
//! ```text
//!             start (2 MiB-aligned)                                start + mapped
//!   |- guard -|-- the array, rounded up to whole 2 MiB pages ---------|- guard -|
//!   PROT_NONE    read/write, MADV_HUGEPAGE before the first write      PROT_NONE
//! ```
//!
//! The guard pages keep the kernel from merging the array's area with a neighbour's (so its
//! huge-page figure, read from `/proc/self/smaps`, is its own) and turn an overrun into a
//! fault. Where huge pages are off, the mapping is ordinary memory. Smaller arrays, systems
//! whose base page is not 4 KiB (where huge pages are not 2 MiB), and other systems use the
//! allocator.

use core::ops::{Deref, DerefMut};
use core::ptr::NonNull;

use crate::ConfigError;

/// A huge page on x86-64 and aarch64 Linux with 4 KiB base pages.
#[cfg(all(target_os = "linux", not(tollgate_loom)))]
const HUGE: usize = 2 << 20;
#[cfg(all(target_os = "linux", not(tollgate_loom)))]
const PAGE: usize = 4096;

/// `len` values of `T` in a mapping of their own (see the module docs) or, below 2 MiB or off
/// Linux, in an allocation.
pub(crate) struct Pages<T> {
    ptr: NonNull<T>,
    len: usize,
    /// Bytes mapped at `ptr` (whole huge pages, between two guard pages), or 0 if `ptr` came
    /// from `Box::into_raw`.
    mapped: usize,
}

// SAFETY: `Pages<T>` owns its values as a `Box<[T]>` would: moving or sharing it moves or
// shares access to them, which is sound exactly when it is for `T`.
unsafe impl<T: Send> Send for Pages<T> {}
// SAFETY: as above; `&Pages<T>` gives only `&[T]`.
unsafe impl<T: Sync> Sync for Pages<T> {}

impl<T> Pages<T> {
    /// `len` values from `make`. A refused request (the system is out of memory or address
    /// space, or the size overflows) is an error naming `what`, never an abort.
    pub(crate) fn new(
        len: usize,
        what: &'static str,
        mut make: impl FnMut() -> T,
    ) -> Result<Pages<T>, ConfigError> {
        #[cfg(all(target_os = "linux", not(tollgate_loom)))]
        if let Some(bytes) = mapped_bytes::<T>(len) {
            return map(len, bytes, what, Some(make));
        }
        let mut v: Vec<T> = Vec::new();
        v.try_reserve_exact(len).map_err(|_| out_of_memory::<T>(len, what))?;
        v.extend((0..len).map(|_| make()));
        let boxed = Box::into_raw(v.into_boxed_slice());
        // SAFETY: `Box::into_raw` never returns null.
        let ptr = unsafe { NonNull::new_unchecked(boxed.cast::<T>()) };
        Ok(Pages { ptr, len, mapped: 0 })
    }

    /// Bytes of the array's memory (whole pages where mapped).
    pub(crate) fn bytes(&self) -> usize {
        if self.mapped == 0 {
            self.len * core::mem::size_of::<T>()
        } else {
            self.mapped
        }
    }

    /// The address range of the array's own mapping, if it has one.
    pub(crate) fn mapping(&self) -> Option<(usize, usize)> {
        let start = self.ptr.as_ptr() as usize;
        (self.mapped != 0).then_some((start, start + self.mapped))
    }
}

/// Bytes the kernel backs with huge pages now (`AnonHugePages`) in the given mappings (from
/// [`Pages::mapping`]), from one read of `/proc/self/smaps`: 0 for none, where transparent huge
/// pages are off, or where `/proc` cannot be read.
pub(crate) fn huge_bytes(mappings: impl IntoIterator<Item = Option<(usize, usize)>>) -> u64 {
    let ranges: Vec<(usize, usize)> = mappings.into_iter().flatten().collect();
    if ranges.is_empty() {
        return 0;
    }
    #[cfg(all(target_os = "linux", not(tollgate_loom)))]
    {
        std::fs::read_to_string("/proc/self/smaps")
            .map_or(0, |smaps| ranges.iter().map(|&(lo, hi)| anon_huge_bytes(&smaps, lo, hi)).sum())
    }
    #[cfg(not(all(target_os = "linux", not(tollgate_loom))))]
    0
}

/// The bytes of `len` values of `T`, if they get a mapping of their own: 2 MiB or more, on a
/// system whose base page is 4 KiB (then its transparent huge pages are 2 MiB).
#[cfg(all(target_os = "linux", not(tollgate_loom)))]
fn mapped_bytes<T>(len: usize) -> Option<usize> {
    len.checked_mul(core::mem::size_of::<T>()).filter(|&b| b >= HUGE && base_page_is_4k())
}

/// Whether the system's base page is 4 KiB.
#[cfg(all(target_os = "linux", not(tollgate_loom)))]
fn base_page_is_4k() -> bool {
    // SAFETY: `sysconf` reads a system constant; it has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) == PAGE as libc::c_long }
}

fn out_of_memory<T>(len: usize, what: &'static str) -> ConfigError {
    let bytes = (len as u128 * core::mem::size_of::<T>() as u128).min(u128::from(u64::MAX));
    #[expect(clippy::cast_possible_truncation, reason = "at most u64::MAX")]
    ConfigError::OutOfMemory { what, bytes: bytes as u64 }
}

impl Pages<crate::sync::AtomicU64> {
    /// `len` zeros. A mapped array is left as the kernel gives it (zero pages, not yet
    /// resident): memory that may never be written (a table's ghosts, written only by forced
    /// evictions) then costs no resident memory until it is, and reads of it cost none.
    pub(crate) fn zeroed(len: usize, what: &'static str) -> Result<Self, ConfigError> {
        #[cfg(all(target_os = "linux", not(tollgate_loom)))]
        if let Some(bytes) = mapped_bytes::<crate::sync::AtomicU64>(len) {
            return map(len, bytes, what, None::<fn() -> crate::sync::AtomicU64>);
        }
        Pages::new(len, what, || crate::sync::AtomicU64::new(0))
    }
}

/// The mapped case of [`Pages::new`]: `bytes = len·size_of::<T>() ≥ HUGE`, 4 KiB base pages.
#[cfg(all(target_os = "linux", not(tollgate_loom)))]
fn map<T>(
    len: usize,
    bytes: usize,
    what: &'static str,
    make: Option<impl FnMut() -> T>,
) -> Result<Pages<T>, ConfigError> {
    const { assert!(core::mem::align_of::<T>() <= HUGE) };
    let refused = || out_of_memory::<T>(len, what);
    let mapped = bytes.checked_next_multiple_of(HUGE).ok_or_else(refused)?;
    // Room for a guard page, then a start aligned to a huge page, then the guard page after.
    let reserve = mapped.checked_add(HUGE + PAGE).ok_or_else(refused)?;
    // SAFETY: a new private anonymous mapping at an address of the kernel's choosing: it
    // overlaps nothing of ours. Failure is MAP_FAILED, handled below.
    let base = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            reserve,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(refused());
    }
    let at = base as usize;
    // Page-aligned (a mapping's address), so `start − PAGE ≥ at` and
    // `start + mapped + PAGE ≤ at + reserve`.
    let offset = (at + PAGE).next_multiple_of(HUGE) - at;
    // SAFETY: within the `reserve` bytes just mapped.
    let start = unsafe { base.cast::<u8>().add(offset) };
    let (lead, tail) = (offset - PAGE, reserve - offset - mapped - PAGE);
    // SAFETY: every range below lies inside the mapping just made, which nothing else knows
    // of: what precedes the leading guard page, what follows the trailing one, and the two
    // guard pages. Whole pages of one's own mapping: `munmap` and `mprotect` fail only for
    // ENOMEM (too many areas), which leaves the range as it was, still ours and unused.
    unsafe {
        if lead > 0 {
            libc::munmap(base, lead);
        }
        if tail > 0 {
            libc::munmap(start.add(mapped + PAGE).cast(), tail);
        }
        libc::mprotect(start.sub(PAGE).cast(), PAGE, libc::PROT_NONE);
        libc::mprotect(start.add(mapped).cast(), PAGE, libc::PROT_NONE);
        // Before the first write: the kernel then backs each 2 MiB of it with a huge page
        // when transparent huge pages are in `madvise` or `always` mode (failure, on an old
        // kernel or with THP off, leaves ordinary pages).
        libc::madvise(start.cast(), mapped, libc::MADV_HUGEPAGE);
    }
    let ptr = start.cast::<T>();
    // Without `make`, the values are the mapping's zero bytes (`Pages::zeroed`, for a type
    // whose all-zero bytes are a valid value).
    if let Some(mut make) = make {
        for i in 0..len {
            // SAFETY: `i < len` and `len·size_of::<T>() ≤ mapped`: inside the read/write part
            // of the mapping, aligned (the start is 2 MiB-aligned, and `T`'s alignment divides
            // its size and is at most that), and not yet holding a value. (If `make` panics,
            // the values so far and the mapping leak: nothing is dropped uninitialized.)
            unsafe { ptr.add(i).write(make()) };
        }
    }
    // SAFETY: `start` is inside a mapping, so not null.
    Ok(Pages { ptr: unsafe { NonNull::new_unchecked(ptr) }, len, mapped })
}

/// The `AnonHugePages` of every area of `smaps` that lies within `[start, end)`, in bytes.
#[cfg(all(target_os = "linux", not(tollgate_loom)))]
fn anon_huge_bytes(smaps: &str, start: usize, end: usize) -> u64 {
    let mut inside = false;
    let mut kib = 0u64;
    for line in smaps.lines() {
        // An area's header: `lo-hi perms offset dev inode [path]`, addresses in hex.
        let range = line.split_once(' ').and_then(|(r, _)| r.split_once('-'));
        if let Some((lo, hi)) = range {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)) {
                inside = lo >= start && hi <= end;
                continue;
            }
        }
        if inside {
            if let Some(v) = line.strip_prefix("AnonHugePages:") {
                kib += v.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap_or(0);
            }
        }
    }
    kib * 1024
}

impl<T> core::fmt::Debug for Pages<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Pages").field("len", &self.len).field("mapped", &self.mapped).finish()
    }
}

impl<T> Deref for Pages<T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` holds `len` initialized values, owned by `self` (see `new`).
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> DerefMut for Pages<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` is the only access.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for Pages<T> {
    fn drop(&mut self) {
        let values = core::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
        if self.mapped == 0 {
            // SAFETY: `ptr` and `len` came from `Box::into_raw` of a boxed slice (`new`), and
            // nothing else frees it.
            drop(unsafe { Box::from_raw(values) });
            return;
        }
        #[cfg(all(target_os = "linux", not(tollgate_loom)))]
        // SAFETY: the values are initialized and dropped once; then the mapping (the array's
        // pages and the guard page on each side) is ours to unmap, and nothing refers to it.
        unsafe {
            core::ptr::drop_in_place(values);
            libc::munmap(self.ptr.as_ptr().cast::<u8>().sub(PAGE).cast(), self.mapped + 2 * PAGE);
        }
    }
}

#[cfg(all(test, target_os = "linux", not(tollgate_loom)))]
mod tests {
    use super::*;

    #[test]
    fn small_arrays_are_allocated_and_large_ones_mapped() {
        let small = Pages::new(1000, "small", || 7u64).unwrap();
        assert_eq!((small.len(), small.mapped, small[999]), (1000, 0, 7));
        let mut large = Pages::new(HUGE / 8 + 1, "large", || 1u64).unwrap();
        assert_eq!(large.mapped, 2 * HUGE, "rounded up to whole huge pages");
        assert_eq!(large.as_ptr() as usize % HUGE, 0, "aligned to a huge page");
        assert!(large.iter().all(|&v| v == 1));
        large[HUGE / 8] = 2;
        assert_eq!(large.iter().sum::<u64>(), (HUGE / 8 + 2) as u64);
    }

    #[test]
    fn zeroed_arrays_read_zero_and_take_writes() {
        use crate::sync::{AtomicU64, Ordering::Relaxed};
        let z = Pages::<AtomicU64>::zeroed(HUGE / 8 * 3, "zeros").unwrap();
        assert_eq!(z.mapped, 3 * HUGE);
        assert!(z.iter().all(|v| v.load(Relaxed) == 0));
        z[HUGE / 8].store(5, Relaxed);
        assert_eq!(z.iter().map(|v| v.load(Relaxed)).sum::<u64>(), 5);
        let small = Pages::<AtomicU64>::zeroed(10, "zeros").unwrap();
        assert!(small.iter().all(|v| v.load(Relaxed) == 0));
    }

    #[test]
    fn values_are_dropped_once() {
        use std::cell::Cell;
        use std::rc::Rc;
        let count = Rc::new(Cell::new(0usize));
        // 64 bytes, so that the array passes 2 MiB with few values.
        struct Counted(Rc<Cell<usize>>, #[expect(dead_code, reason = "size only")] [u8; 56]);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.set(self.0.get() + 1);
            }
        }
        let len = HUGE / 64 + 3;
        drop(Pages::new(len, "counted", || Counted(Rc::clone(&count), [0; 56])).unwrap());
        assert_eq!(count.get(), len);
    }

    #[test]
    fn impossible_sizes_are_errors() {
        let e = Pages::new(usize::MAX / 8, "the test's array", || 0u64).err().unwrap();
        assert!(matches!(e, ConfigError::OutOfMemory { what: "the test's array", .. }), "{e}");
        let e = Pages::new(1 << 50, "the test's array", || 0u64).err().unwrap();
        assert!(matches!(e, ConfigError::OutOfMemory { .. }), "{e}");
    }

    #[test]
    fn smaps_areas_are_summed_within_the_range() {
        let smaps = "\
7f0000000000-7f0000400000 rw-p 00000000 00:00 0
Size:               4096 kB
AnonHugePages:      4096 kB
7f0000400000-7f0000401000 ---p 00000000 00:00 0
AnonHugePages:         0 kB
7f0000401000-7f0000800000 rw-p 00000000 00:00 0
AnonHugePages:      2048 kB
";
        let start = 0x7f00_0000_0000;
        assert_eq!(anon_huge_bytes(smaps, start, start + 0x40_0000), 4 << 20);
        assert_eq!(anon_huge_bytes(smaps, start + 0x40_1000, start + 0x80_0000), 2 << 20);
        assert_eq!(anon_huge_bytes(smaps, 0x1000, 0x2000), 0);
    }
}
