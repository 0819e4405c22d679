//! The exported functions, per handle type, and the registry of live handles that turns a
//! double free into an error.

use std::collections::HashSet;
use std::ffi::c_char;
use std::sync::OnceLock;

use super::*;

/// Addresses of the handles made and not yet freed. Only constructors and `free` touch it
/// (a decision never does), so a second `free` of a handle is an error instead of a double
/// free, unless the allocator has given its address to a new handle meanwhile.
fn live() -> std::sync::MutexGuard<'static, HashSet<usize>> {
    static LIVE: OnceLock<Mutex<HashSet<usize>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(HashSet::new())).lock().unwrap_or_else(PoisonError::into_inner)
}

/// Boxes `value` as a new live handle and writes it to `out`.
///
/// # Safety
/// `out` is null or valid for a write of a pointer.
unsafe fn make<T>(value: T, out: *mut *mut T) -> Result<(), Error> {
    if out.is_null() {
        return Err(Error::null("out"));
    }
    let p = Box::into_raw(Box::new(value));
    live().insert(p as usize);
    // SAFETY: non-null, and valid for writes by the caller's contract.
    unsafe { out.write(p) };
    Ok(())
}

/// Frees a live handle.
///
/// # Safety
/// `p` is null, or a pointer this library returned (freed or not).
unsafe fn free<T>(p: *mut T, what: &str) -> Result<(), Error> {
    if p.is_null() {
        return Err(Error::null(what));
    }
    if !live().remove(&(p as usize)) {
        return Err(Error(
            tollgate_status::TOLLGATE_ERROR_HANDLE,
            format!("{what} {p:p} is not a live handle: freed already, or not made by tollgate"),
        ));
    }
    // SAFETY: made by `make` (a Box) and removed from the registry just now, so freed once.
    drop(unsafe { Box::from_raw(p) });
    Ok(())
}

/// A handle argument as a reference.
///
/// # Safety
/// `p` is null or a live handle.
#[inline(always)]
unsafe fn get<'a, T>(p: *const T, what: &str) -> Result<&'a T, Error> {
    // SAFETY: a live handle is a valid, shared (thread-safe) value.
    unsafe { p.as_ref() }.ok_or_else(|| Error::null(what))
}

/// `len` elements at `p`, which may be null when `len` is 0.
///
/// # Safety
/// `p` is null or valid for reads of `len` elements.
unsafe fn slice<'a, T>(p: *const T, len: usize, what: &str) -> Result<&'a [T], Error> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::null(what));
    }
    // SAFETY: non-null, and valid for `len` reads by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// As [`slice`], for writes.
///
/// # Safety
/// `p` is null or valid for writes of `len` elements.
unsafe fn slice_mut<'a, T>(p: *mut T, len: usize, what: &str) -> Result<&'a mut [T], Error> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(Error::null(what));
    }
    // SAFETY: non-null, and valid for `len` writes by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

// ---- Direct limiters --------------------------------------------------------------------

/// Makes a direct limiter from plain numbers. `*out` is the new handle, to free with
/// `tollgate_limiter_free`.
///
/// # Safety
/// `params` is null or valid for reads; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_limiter_new(
    params: *const tollgate_params,
    out: *mut *mut tollgate_limiter,
) -> tollgate_status {
    // SAFETY: the caller's contract, passed on.
    guard(|| unsafe { make(tollgate_limiter(Direct::new(Config::from_params(params)?)), out) })
}

/// Makes a direct limiter from its configuration string, as tollgate parses it:
/// `algorithm` is `token_bucket` ("10/s burst=20"), `nginx` ("10r/s burst=20 nodelay"),
/// `fixed_window`, `sliding_window` or `sliding_log` ("100/min").
///
/// # Safety
/// `algorithm` and `config` are null or NUL-terminated; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_limiter_parse(
    algorithm: *const c_char,
    config: *const c_char,
    out: *mut *mut tollgate_limiter,
) -> tollgate_status {
    // SAFETY: the caller's contract, passed on.
    guard(|| unsafe { make(tollgate_limiter(Direct::new(Config::parse(algorithm, config)?)), out) })
}

/// Takes one unit now.
///
/// # Safety
/// `limiter` is null or live; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_limiter_check(
    limiter: *const tollgate_limiter,
    out: *mut tollgate_decision,
) -> tollgate_status {
    // SAFETY: the caller's contract, passed on.
    unsafe { tollgate_limiter_check_n(limiter, 1, out) }
}

/// Takes `n` units now, all or none.
///
/// # Safety
/// `limiter` is null or live; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_limiter_check_n(
    limiter: *const tollgate_limiter,
    n: u64,
    out: *mut tollgate_decision,
) -> tollgate_status {
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let l = unsafe { get(limiter, "limiter")? };
        let d = each!(&l.0, l => l.check_n(n));
        // SAFETY: as above.
        unsafe { put(out, tollgate_decision::from(&d), "out") }
    })
}

/// Takes `n` units at `now_ns`, nanoseconds since the limiter's creation on the caller's clock.
///
/// # Safety
/// `limiter` is null or live; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_limiter_check_n_at(
    limiter: *const tollgate_limiter,
    n: u64,
    now_ns: u64,
    out: *mut tollgate_decision,
) -> tollgate_status {
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let l = unsafe { get(limiter, "limiter")? };
        let d = each!(&l.0, l => l.check_n_at(Nanos::new(now_ns), n));
        // SAFETY: as above.
        unsafe { put(out, tollgate_decision::from(&d), "out") }
    })
}

/// What taking `n` units now would answer, taking nothing.
///
/// # Safety
/// `limiter` is null or live; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_limiter_peek_n(
    limiter: *const tollgate_limiter,
    n: u64,
    out: *mut tollgate_decision,
) -> tollgate_status {
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let l = unsafe { get(limiter, "limiter")? };
        let d = each!(&l.0, l => l.peek_n(n));
        // SAFETY: as above.
        unsafe { put(out, tollgate_decision::from(&d), "out") }
    })
}

/// Decides `len` requests in order, the `i`-th costing `costs[i]` units (1 each when `costs`
/// is null), into `out[0..len]`.
///
/// # Safety
/// `limiter` is null or live; `costs` is null or valid for `len` reads; `out` is null or valid
/// for `len` writes.
#[no_mangle]
pub unsafe extern "C" fn tollgate_limiter_check_batch(
    limiter: *const tollgate_limiter,
    costs: *const u64,
    len: usize,
    out: *mut tollgate_decision,
) -> tollgate_status {
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let (l, out) = unsafe { (get(limiter, "limiter")?, slice_mut(out, len, "out")?) };
        // SAFETY: as above.
        let costs = if costs.is_null() { None } else { Some(unsafe { slice(costs, len, "costs")? }) };
        for (i, o) in out.iter_mut().enumerate() {
            let n = costs.map_or(1, |c| c[i]);
            *o = tollgate_decision::from(&each!(&l.0, l => l.check_n(n)));
        }
        Ok(())
    })
}

/// Frees a direct limiter. A second free of the same handle returns `TOLLGATE_ERROR_HANDLE`
/// (unless its address was reused by a newer handle).
///
/// # Safety
/// `limiter` is null or a handle this library returned, not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn tollgate_limiter_free(limiter: *mut tollgate_limiter) -> tollgate_status {
    // SAFETY: the caller's contract, passed on.
    guard(|| unsafe { free(limiter, "limiter") })
}

// ---- Keyed by uint64_t ------------------------------------------------------------------

/// Makes a table keyed by `uint64_t`, holding up to `capacity` keys, from plain numbers.
///
/// # Safety
/// `params` is null or valid for reads; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_new(
    params: *const tollgate_params,
    capacity: usize,
    out: *mut *mut tollgate_keyed,
) -> tollgate_status {
    // SAFETY: the caller's contract, passed on.
    guard(|| unsafe { make(tollgate_keyed(Table::new(Config::from_params(params)?, capacity)?), out) })
}

/// Makes a table keyed by `uint64_t` from a configuration string (see
/// `tollgate_limiter_parse`), holding up to `capacity` keys.
///
/// # Safety
/// `algorithm` and `config` are null or NUL-terminated; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_parse(
    algorithm: *const c_char,
    config: *const c_char,
    capacity: usize,
    out: *mut *mut tollgate_keyed,
) -> tollgate_status {
    // SAFETY: the caller's contract, passed on.
    guard(|| unsafe { make(tollgate_keyed(Table::new(Config::parse(algorithm, config)?, capacity)?), out) })
}

/// Takes one unit from `key`'s limit now.
///
/// # Safety
/// `table` is null or live; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_check(
    table: *const tollgate_keyed,
    key: u64,
    out: *mut tollgate_decision,
) -> tollgate_status {
    // SAFETY: the caller's contract, passed on.
    unsafe { tollgate_keyed_check_n(table, key, 1, out) }
}

/// Takes `n` units from `key`'s limit now, all or none.
///
/// # Safety
/// `table` is null or live; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_check_n(
    table: *const tollgate_keyed,
    key: u64,
    n: u64,
    out: *mut tollgate_decision,
) -> tollgate_status {
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let t = unsafe { get(table, "table")? };
        let d = each_table!(&t.0, t => t.check_n(&key, n));
        // SAFETY: as above.
        unsafe { put(out, tollgate_decision::from(&d), "out") }
    })
}

/// Takes `n` units from `key`'s limit at `now_ns` (nanoseconds since the table's creation).
///
/// # Safety
/// `table` is null or live; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_check_n_at(
    table: *const tollgate_keyed,
    key: u64,
    n: u64,
    now_ns: u64,
    out: *mut tollgate_decision,
) -> tollgate_status {
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let t = unsafe { get(table, "table")? };
        let d = each_table!(&t.0, t => t.check_n_at(&key, Nanos::new(now_ns), n));
        // SAFETY: as above.
        unsafe { put(out, tollgate_decision::from(&d), "out") }
    })
}

/// What taking `n` units from `key`'s limit now would answer, taking nothing.
///
/// # Safety
/// `table` is null or live; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_peek_n(
    table: *const tollgate_keyed,
    key: u64,
    n: u64,
    out: *mut tollgate_decision,
) -> tollgate_status {
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let t = unsafe { get(table, "table")? };
        let d = each_table!(&t.0, t => t.peek_n(&key, n));
        // SAFETY: as above.
        unsafe { put(out, tollgate_decision::from(&d), "out") }
    })
}

/// Decides `len` requests, `keys[i]` costing `costs[i]` (1 each when `costs` is null), into
/// `out[0..len]`, with the table's batch path (the next keys' memory fetched while one is
/// decided).
///
/// # Safety
/// `table` is null or live; `keys` and `costs` are null or valid for `len` reads; `out` is
/// null or valid for `len` writes.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_check_batch(
    table: *const tollgate_keyed,
    keys: *const u64,
    costs: *const u64,
    len: usize,
    out: *mut tollgate_decision,
) -> tollgate_status {
    const CHUNK: usize = 32;
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let (t, keys, out) =
            unsafe { (get(table, "table")?, slice(keys, len, "keys")?, slice_mut(out, len, "out")?) };
        // SAFETY: as above.
        let costs = if costs.is_null() { None } else { Some(unsafe { slice(costs, len, "costs")? }) };
        let mut items = [(0u64, 0u64); CHUNK];
        let mut decisions = [Decision::table_full(); CHUNK];
        for start in (0..len).step_by(CHUNK) {
            let m = CHUNK.min(len - start);
            for (i, item) in items[..m].iter_mut().enumerate() {
                *item = (keys[start + i], costs.map_or(1, |c| c[start + i]));
            }
            each_table!(&t.0, t => t.check_batch(&items[..m], &mut decisions[..m]));
            for (o, d) in out[start..start + m].iter_mut().zip(&decisions[..m]) {
                *o = tollgate_decision::from(d);
            }
        }
        Ok(())
    })
}

/// Keys the table tracks now (approximate while other threads insert), into `*out`.
///
/// # Safety
/// `table` is null or live; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_len(table: *const tollgate_keyed, out: *mut u64) -> tollgate_status {
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let t = unsafe { get(table, "table")? };
        // SAFETY: as above.
        unsafe { put(out, each_table!(&t.0, t => t.len()), "out") }
    })
}

/// Frees a table keyed by `uint64_t` (see `tollgate_limiter_free`).
///
/// # Safety
/// `table` is null or a handle this library returned, not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_free(table: *mut tollgate_keyed) -> tollgate_status {
    // SAFETY: the caller's contract, passed on.
    guard(|| unsafe { free(table, "table") })
}

// ---- Keyed by byte strings --------------------------------------------------------------

/// Makes a table keyed by byte strings, holding up to `capacity` keys, from plain numbers.
///
/// # Safety
/// `params` is null or valid for reads; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_bytes_new(
    params: *const tollgate_params,
    capacity: usize,
    out: *mut *mut tollgate_keyed_bytes,
) -> tollgate_status {
    // SAFETY: the caller's contract, passed on.
    guard(|| unsafe { make(tollgate_keyed_bytes(Table::new(Config::from_params(params)?, capacity)?), out) })
}

/// Makes a table keyed by byte strings from a configuration string (see
/// `tollgate_limiter_parse`), holding up to `capacity` keys.
///
/// # Safety
/// `algorithm` and `config` are null or NUL-terminated; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_bytes_parse(
    algorithm: *const c_char,
    config: *const c_char,
    capacity: usize,
    out: *mut *mut tollgate_keyed_bytes,
) -> tollgate_status {
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        unsafe { make(tollgate_keyed_bytes(Table::new(Config::parse(algorithm, config)?, capacity)?), out) }
    })
}

/// Takes `n` units from the limit of the key `key[0..key_len]` now, all or none. `key` may be
/// null when `key_len` is 0.
///
/// # Safety
/// `table` is null or live; `key` is null or valid for `key_len` reads; `out` is null or valid
/// for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_bytes_check_n(
    table: *const tollgate_keyed_bytes,
    key: *const u8,
    key_len: usize,
    n: u64,
    out: *mut tollgate_decision,
) -> tollgate_status {
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let (t, key) = unsafe { (get(table, "table")?, slice(key, key_len, "key")?) };
        let d = each_table!(&t.0, t => t.check_n(key, n));
        // SAFETY: as above.
        unsafe { put(out, tollgate_decision::from(&d), "out") }
    })
}

/// `tollgate_keyed_bytes_check_n` at `now_ns` (nanoseconds since the table's creation).
///
/// # Safety
/// As `tollgate_keyed_bytes_check_n`.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_bytes_check_n_at(
    table: *const tollgate_keyed_bytes,
    key: *const u8,
    key_len: usize,
    n: u64,
    now_ns: u64,
    out: *mut tollgate_decision,
) -> tollgate_status {
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let (t, key) = unsafe { (get(table, "table")?, slice(key, key_len, "key")?) };
        let d = each_table!(&t.0, t => t.check_n_at(key, Nanos::new(now_ns), n));
        // SAFETY: as above.
        unsafe { put(out, tollgate_decision::from(&d), "out") }
    })
}

/// What taking `n` units from the key's limit now would answer, taking nothing.
///
/// # Safety
/// As `tollgate_keyed_bytes_check_n`.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_bytes_peek_n(
    table: *const tollgate_keyed_bytes,
    key: *const u8,
    key_len: usize,
    n: u64,
    out: *mut tollgate_decision,
) -> tollgate_status {
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let (t, key) = unsafe { (get(table, "table")?, slice(key, key_len, "key")?) };
        let d = each_table!(&t.0, t => t.peek_n(key, n));
        // SAFETY: as above.
        unsafe { put(out, tollgate_decision::from(&d), "out") }
    })
}

/// Decides `len` requests, the key `keys[i][0..lens[i]]` costing `costs[i]` (1 each when
/// `costs` is null), into `out[0..len]`.
///
/// # Safety
/// `table` is null or live; `keys`, `lens` and `costs` are null or valid for `len` reads, each
/// `keys[i]` null or valid for `lens[i]` reads; `out` is null or valid for `len` writes.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_bytes_check_batch(
    table: *const tollgate_keyed_bytes,
    keys: *const *const u8,
    lens: *const usize,
    costs: *const u64,
    len: usize,
    out: *mut tollgate_decision,
) -> tollgate_status {
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let (t, keys, lens, out) = unsafe {
            (
                get(table, "table")?,
                slice(keys, len, "keys")?,
                slice(lens, len, "lens")?,
                slice_mut(out, len, "out")?,
            )
        };
        // SAFETY: as above.
        let costs = if costs.is_null() { None } else { Some(unsafe { slice(costs, len, "costs")? }) };
        for (i, o) in out.iter_mut().enumerate() {
            // SAFETY: as above.
            let key = unsafe { slice(keys[i], lens[i], "keys[i]")? };
            let n = costs.map_or(1, |c| c[i]);
            *o = tollgate_decision::from(&each_table!(&t.0, t => t.check_n(key, n)));
        }
        Ok(())
    })
}

/// Frees a table keyed by byte strings (see `tollgate_limiter_free`).
///
/// # Safety
/// `table` is null or a handle this library returned, not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_bytes_free(table: *mut tollgate_keyed_bytes) -> tollgate_status {
    // SAFETY: the caller's contract, passed on.
    guard(|| unsafe { free(table, "table") })
}
