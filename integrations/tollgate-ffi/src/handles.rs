//! The exported functions, per handle type, and the registry of live handles that turns a
//! double free, or a free through the wrong type's function, into an error.

use std::any::TypeId;
use std::collections::BTreeMap;
use std::ffi::c_char;

use super::*;

/// The handles made and not yet freed, by address, with their type. Only constructors and
/// `free` touch it (a decision never does), so a second `free` of a handle, or a `free` of the
/// wrong type, is an error instead of undefined behaviour, unless the allocator has given the
/// address to a new handle of that type meanwhile (allocators reuse freed addresses soon:
/// this is a safety net, not a licence to free twice).
///
/// A `BTreeMap` in a plain static, not a `HashMap`: the map lives as long as the process, and
/// valgrind, which cannot know that, reports a block reached only through a pointer into its
/// middle as "possibly lost", an error under `--leak-check=full`. A `HashMap`'s table is
/// reached so (through its control bytes, past the buckets); a B-tree's nodes are reached
/// through their starts, "still reachable", which valgrind's defaults do not count.
fn live() -> std::sync::MutexGuard<'static, BTreeMap<usize, TypeId>> {
    static LIVE: Mutex<BTreeMap<usize, TypeId>> = Mutex::new(BTreeMap::new());
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Boxes `value` as a new live handle and writes it to `out`.
///
/// # Safety
/// `out` is null or valid for a write of a pointer.
pub(crate) unsafe fn make<T: 'static>(value: T, out: *mut *mut T) -> Result<(), Error> {
    let out = out_ptr(out, 1, "out")?;
    let p = Box::into_raw(Box::new(value));
    live().insert(p as usize, TypeId::of::<T>());
    // SAFETY: non-null and aligned (checked), valid for writes by the caller's contract.
    unsafe { out.write(p) };
    Ok(())
}

/// Frees a live handle of type `T`.
///
/// # Safety
/// `p` is null, or a pointer this library returned (freed or not), not in use elsewhere.
pub(crate) unsafe fn free<T: 'static>(p: *mut T, what: &str) -> Result<(), Error> {
    if p.is_null() {
        return Err(Error::null(what));
    }
    {
        let mut live = live();
        match live.get(&(p as usize)) {
            Some(&t) if t == TypeId::of::<T>() => {
                live.remove(&(p as usize));
            }
            Some(_) => {
                return Err(Error::new(
                    tollgate_status::TOLLGATE_ERROR_HANDLE,
                    format!("{what} {p:p} is a live handle of another type: free it with its own function"),
                ))
            }
            None => {
                return Err(Error::new(
                    tollgate_status::TOLLGATE_ERROR_HANDLE,
                    format!("{what} {p:p} is not a live handle: freed already, or not made by tollgate"),
                ))
            }
        }
    }
    // SAFETY: made by `make::<T>` (a `Box<T>`: the registry recorded its type) and removed
    // from the registry just now, under its lock, so freed once.
    drop(unsafe { Box::from_raw(p) });
    Ok(())
}

/// A handle argument as a reference.
///
/// # Safety
/// `p` is null or a live handle.
#[inline(always)]
pub(crate) unsafe fn get<'a, T>(p: *const T, what: &str) -> Result<&'a T, Error> {
    // SAFETY: a live handle is a valid value, `Send + Sync` (asserted in lib.rs), so shared
    // references to it from any thread are sound.
    unsafe { p.as_ref() }.ok_or_else(|| Error::null(what))
}

/// Checks an array argument of `len` elements: null only when empty, aligned for `T`, and
/// small enough to be one object.
#[inline(always)]
pub(crate) fn check_array<T>(p: *const T, len: usize, what: &str) -> Result<(), Error> {
    if len == 0 {
        return Ok(());
    }
    if p.is_null() {
        return Err(Error::null(what));
    }
    if !p.is_aligned() {
        return Err(misaligned(p.cast(), std::mem::align_of::<T>(), what));
    }
    match len.checked_mul(std::mem::size_of::<T>()) {
        Some(bytes) if isize::try_from(bytes).is_ok() => Ok(()),
        _ => Err(Error::invalid(format!("{what}: {len} elements are more than memory holds"))),
    }
}

/// The error for a misaligned pointer: out of line, so that the fast path does not prepare
/// its message's arguments.
#[cold]
#[inline(never)]
fn misaligned(p: *const u8, align: usize, what: &str) -> Error {
    Error::invalid(format!("{what} {p:p} is not aligned to {align} bytes"))
}

/// `len` elements at `p`, which may be null when `len` is 0.
///
/// # Safety
/// `p` is null or valid for reads of `len` elements, not written while the slice lives.
pub(crate) unsafe fn slice<'a, T>(p: *const T, len: usize, what: &str) -> Result<&'a [T], Error> {
    check_array(p, len, what)?;
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: non-null, aligned and at most isize::MAX bytes (checked); valid for `len`
    // reads by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// An out-pointer for `len` elements, checked as [`check_array`] does (null only when `len`
/// is 0). Written element by element with `write`: its memory may be uninitialised, so no
/// reference to it is made.
#[inline(always)]
pub(crate) fn out_ptr<T>(p: *mut T, len: usize, what: &str) -> Result<*mut T, Error> {
    check_array(p.cast_const(), len, what).map(|()| p)
}

/// Writes a decision through an out-pointer that [`out_ptr`] checked before the decision was
/// made (so that a bad `out` takes nothing).
///
/// # Safety
/// `out` is non-null, aligned, and valid for a write.
#[inline(always)]
unsafe fn put_decision(out: *mut tollgate_decision, d: &Decision) {
    // SAFETY: the caller's contract.
    unsafe { out.write(tollgate_decision::from(d)) };
}

/// Checks a `_try` function's optional wait out-pointer (null: not wanted) before it decides,
/// so that an error takes nothing.
#[inline(always)]
fn wait_ptr(wait: *mut u64) -> Result<*mut u64, Error> {
    if wait.is_null() {
        Ok(wait)
    } else {
        out_ptr(wait, 1, "wait_ns")
    }
}

/// Writes the wait through a pointer [`wait_ptr`] checked, unless it is null.
///
/// # Safety
/// `wait` is null or (checked by [`wait_ptr`]) aligned and valid for a write.
#[inline(always)]
unsafe fn put_wait(wait: *mut u64, ns: u64) {
    if !wait.is_null() {
        // SAFETY: the caller's contract.
        unsafe { wait.write(ns) };
    }
}

/// What a `_try` function returns of a decision: the outcome and the one wait.
#[inline(always)]
fn verdict(d: &Decision) -> (tollgate_outcome, u64) {
    (tollgate_outcome::of(d), wait_ns(d))
}

/// A direct limiter's `_try` decision: the bucket inline, by one compare (no second call, no
/// jump table: a table of five here cost the bucket four instructions more), the others out
/// of line, so that the exported function stays small.
#[inline(always)]
fn try_direct(l: &Direct, n: u64) -> (tollgate_outcome, u64) {
    if let Direct::Bucket(l) = l {
        return verdict(&l.check_n(n));
    }
    try_other(l, n)
}

/// [`try_direct`] for the algorithms other than the bucket: out of line, returned in two
/// registers.
#[inline(never)]
fn try_other(l: &Direct, n: u64) -> (tollgate_outcome, u64) {
    each!(l, l => verdict(&l.check_n(n)))
}

/// [`try_direct`] for a table.
#[inline(always)]
fn try_table<K, Q>(t: &Table<K>, key: &Q, n: u64) -> (tollgate_outcome, u64)
where
    K: tollgate::Key + Eq + std::borrow::Borrow<Q> + 'static,
    Q: tollgate::Key<Words = K::Words> + ?Sized,
{
    if let Table::Bucket(t) = t {
        return verdict(&t.check_n(key, n));
    }
    try_other_key(t, key, n)
}

/// [`try_other`] for a table.
#[inline(never)]
fn try_other_key<K, Q>(t: &Table<K>, key: &Q, n: u64) -> (tollgate_outcome, u64)
where
    K: tollgate::Key + Eq + std::borrow::Borrow<Q> + 'static,
    Q: tollgate::Key<Words = K::Words> + ?Sized,
{
    each_table!(t, t => verdict(&t.check_n(key, n)))
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
    guard(|| unsafe { make(Direct::handle(Config::from_params(params)?), out) })
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
    guard(|| unsafe { make(Direct::handle(Config::parse(algorithm, config)?), out) })
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
        let (l, out) = unsafe { (get(limiter, "limiter")?, out_ptr(out, 1, "out")?) };
        let d = each!(&l.0, l => l.check_n(n));
        // SAFETY: `out` checked before deciding; valid for a write by the caller's contract.
        unsafe { put_decision(out, &d) };
        Ok(())
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
        let (l, out) = unsafe { (get(limiter, "limiter")?, out_ptr(out, 1, "out")?) };
        let d = each!(&l.0, d => d.check_n_at(l.1.at(now_ns), n));
        // SAFETY: `out` checked before deciding; valid for a write by the caller's contract.
        unsafe { put_decision(out, &d) };
        Ok(())
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
        let (l, out) = unsafe { (get(limiter, "limiter")?, out_ptr(out, 1, "out")?) };
        let d = each!(&l.0, l => l.peek_n(n));
        // SAFETY: `out` checked before deciding; valid for a write by the caller's contract.
        unsafe { put_decision(out, &d) };
        Ok(())
    })
}

/// The hot path: takes `n` units now, all or none, and returns the outcome (a
/// `tollgate_outcome`, 0 or more) instead of a status. When `wait_ns` is not null it gets the
/// nanoseconds to wait: the retry-after when refused (`UINT64_MAX` when no wait helps), the
/// delay when `TOLLGATE_DELAYED`, 0 when the request may be served now. On an error it returns
/// minus the `tollgate_status` (below 0), with `tollgate_last_error()` set, and takes nothing.
///
/// # Safety
/// `limiter` is null or live; `wait_ns` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_limiter_try_n(
    limiter: *const tollgate_limiter,
    n: u64,
    wait_ns: *mut u64,
) -> i32 {
    // SAFETY: the caller's contract, passed on.
    unsafe { limiter_try(limiter, || n, wait_ns) }
}

/// `tollgate_limiter_try_n` for one unit: the outcome (0 or more) or minus a status. Its own
/// function rather than a call with `n = 1`, so that the one unit is a constant the decision
/// folds in.
///
/// # Safety
/// `limiter` is null or live; `wait_ns` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_limiter_try(limiter: *const tollgate_limiter, wait_ns: *mut u64) -> i32 {
    // SAFETY: the caller's contract, passed on.
    unsafe { limiter_try(limiter, || 1, wait_ns) }
}

/// The body of `tollgate_limiter_try_n` and `tollgate_limiter_try`, inlined into each. `n` is
/// a closure so that each caller instantiates its own copy (one caller each, the panic guard's
/// call is inlined; shared, it was not), with `n` a constant in `tollgate_limiter_try`.
///
/// # Safety
/// As `tollgate_limiter_try_n`.
#[inline(always)]
unsafe fn limiter_try(limiter: *const tollgate_limiter, n: impl FnOnce() -> u64, wait_ns: *mut u64) -> i32 {
    guard_try(|| {
        // SAFETY: the caller's contract, passed on.
        let l = unsafe { get(limiter, "limiter")? };
        let wait_ns = wait_ptr(wait_ns)?;
        let (outcome, wait) = try_direct(&l.0, n());
        // SAFETY: checked by `wait_ptr`; valid for a write by the caller's contract.
        unsafe { put_wait(wait_ns, wait) };
        Ok(outcome)
    })
}

/// The limiter's clock now, in nanoseconds since its creation: the time base of the `_at`
/// functions, into `*out`.
///
/// # Safety
/// `limiter` is null or live; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_limiter_now(
    limiter: *const tollgate_limiter,
    out: *mut u64,
) -> tollgate_status {
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let (l, out) = unsafe { (get(limiter, "limiter")?, out_ptr(out, 1, "out")?) };
        let now = each!(&l.0, d => d.now());
        // SAFETY: non-null and aligned (checked), valid for a write by the caller's contract.
        unsafe { out.write(l.1.since(now)) };
        Ok(())
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
        let (l, out) = unsafe { (get(limiter, "limiter")?, out_ptr(out, len, "out")?) };
        // SAFETY: as above.
        let costs = if costs.is_null() { None } else { Some(unsafe { slice(costs, len, "costs")? }) };
        for i in 0..len {
            let n = costs.map_or(1, |c| c[i]);
            let d = tollgate_decision::from(&each!(&l.0, l => l.check_n(n)));
            // SAFETY: `out` is valid for `len` writes (checked non-null and aligned when
            // `len > 0`; the caller's contract for the rest).
            unsafe { out.add(i).write(d) };
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
    guard(|| unsafe {
        {
            let (t, origin) = Table::with_origin(Config::from_params(params)?, capacity)?;
            make(tollgate_keyed(t, origin), out)
        }
    })
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
    guard(|| unsafe {
        {
            let (t, origin) = Table::with_origin(Config::parse(algorithm, config)?, capacity)?;
            make(tollgate_keyed(t, origin), out)
        }
    })
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
        let (t, out) = unsafe { (get(table, "table")?, out_ptr(out, 1, "out")?) };
        let d = each_table!(&t.0, t => t.check_n(&key, n));
        // SAFETY: `out` checked before deciding; valid for a write by the caller's contract.
        unsafe { put_decision(out, &d) };
        Ok(())
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
        let (t, out) = unsafe { (get(table, "table")?, out_ptr(out, 1, "out")?) };
        let d = each_table!(&t.0, k => k.check_n_at(&key, t.1.at(now_ns), n));
        // SAFETY: `out` checked before deciding; valid for a write by the caller's contract.
        unsafe { put_decision(out, &d) };
        Ok(())
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
        let (t, out) = unsafe { (get(table, "table")?, out_ptr(out, 1, "out")?) };
        let d = each_table!(&t.0, t => t.peek_n(&key, n));
        // SAFETY: `out` checked before deciding; valid for a write by the caller's contract.
        unsafe { put_decision(out, &d) };
        Ok(())
    })
}

/// `tollgate_limiter_try_n` for `key`'s limit: the outcome (0 or more) or minus a status.
///
/// # Safety
/// `table` is null or live; `wait_ns` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_try_n(
    table: *const tollgate_keyed,
    key: u64,
    n: u64,
    wait_ns: *mut u64,
) -> i32 {
    // SAFETY: the caller's contract, passed on.
    unsafe { keyed_try(table, key, || n, wait_ns) }
}

/// `tollgate_keyed_try_n` for one unit (as `tollgate_limiter_try`).
///
/// # Safety
/// `table` is null or live; `wait_ns` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_try(
    table: *const tollgate_keyed,
    key: u64,
    wait_ns: *mut u64,
) -> i32 {
    // SAFETY: the caller's contract, passed on.
    unsafe { keyed_try(table, key, || 1, wait_ns) }
}

/// The body of `tollgate_keyed_try_n` and `tollgate_keyed_try` (`n` as in `limiter_try`).
///
/// # Safety
/// As `tollgate_keyed_try_n`.
#[inline(always)]
unsafe fn keyed_try(
    table: *const tollgate_keyed,
    key: u64,
    n: impl FnOnce() -> u64,
    wait_ns: *mut u64,
) -> i32 {
    guard_try(|| {
        // SAFETY: the caller's contract, passed on.
        let t = unsafe { get(table, "table")? };
        let wait_ns = wait_ptr(wait_ns)?;
        let (outcome, wait) = try_table(&t.0, &key, n());
        // SAFETY: checked by `wait_ptr`; valid for a write by the caller's contract.
        unsafe { put_wait(wait_ns, wait) };
        Ok(outcome)
    })
}

/// The table's clock now, in nanoseconds since its creation (the `_at` functions' time base),
/// into `*out`.
///
/// # Safety
/// `table` is null or live; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_now(table: *const tollgate_keyed, out: *mut u64) -> tollgate_status {
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let (t, out) = unsafe { (get(table, "table")?, out_ptr(out, 1, "out")?) };
        let now = each_table!(&t.0, k => k.now());
        // SAFETY: non-null and aligned (checked), valid for a write by the caller's contract.
        unsafe { out.write(t.1.since(now)) };
        Ok(())
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
            unsafe { (get(table, "table")?, slice(keys, len, "keys")?, out_ptr(out, len, "out")?) };
        // SAFETY: as above.
        let costs = if costs.is_null() { None } else { Some(unsafe { slice(costs, len, "costs")? }) };
        let mut items = [(0u64, 0u64); CHUNK];
        let mut decisions = [Decision::table_full(); CHUNK];
        for start in (0..len).step_by(CHUNK) {
            let m = CHUNK.min(len - start);
            for (i, item) in items[..m].iter_mut().enumerate() {
                *item = (keys[start + i], costs.map_or(1, |c| c[start + i]));
            }
            let done = each_table!(&t.0, t => t.check_batch(&items[..m], &mut decisions[..m]));
            // The batch path decides them all; any it left are decided one by one.
            for (i, &(key, n)) in items[..m].iter().enumerate().skip(done) {
                decisions[i] = each_table!(&t.0, t => t.check_n(&key, n));
            }
            for (i, d) in decisions[..m].iter().enumerate() {
                // SAFETY: `out` is valid for `len` writes, as in `tollgate_limiter_check_batch`.
                unsafe { out.add(start + i).write(tollgate_decision::from(d)) };
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
        let out = out_ptr(out, 1, "out")?;
        // SAFETY: non-null and aligned (checked), valid for a write by the caller's contract.
        unsafe { out.write(each_table!(&t.0, t => t.len())) };
        Ok(())
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
    guard(|| unsafe {
        {
            let (t, origin) = Table::with_origin(Config::from_params(params)?, capacity)?;
            make(tollgate_keyed_bytes(t, origin), out)
        }
    })
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
        unsafe {
            {
                let (t, origin) = Table::with_origin(Config::parse(algorithm, config)?, capacity)?;
                make(tollgate_keyed_bytes(t, origin), out)
            }
        }
    })
}

/// Takes one unit from the limit of the key `key[0..key_len]` now. `key` may be null when
/// `key_len` is 0.
///
/// # Safety
/// `table` is null or live; `key` is null or valid for `key_len` reads; `out` is null or valid
/// for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_bytes_check(
    table: *const tollgate_keyed_bytes,
    key: *const u8,
    key_len: usize,
    out: *mut tollgate_decision,
) -> tollgate_status {
    // SAFETY: the caller's contract, passed on.
    unsafe { tollgate_keyed_bytes_check_n(table, key, key_len, 1, out) }
}

/// `tollgate_limiter_try_n` for the limit of the key `key[0..key_len]`: the outcome (0 or
/// more) or minus a status.
///
/// # Safety
/// `table` is null or live; `key` is null or valid for `key_len` reads; `wait_ns` is null or
/// valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_bytes_try_n(
    table: *const tollgate_keyed_bytes,
    key: *const u8,
    key_len: usize,
    n: u64,
    wait_ns: *mut u64,
) -> i32 {
    // SAFETY: the caller's contract, passed on.
    unsafe { keyed_bytes_try(table, key, key_len, || n, wait_ns) }
}

/// `tollgate_keyed_bytes_try_n` for one unit (as `tollgate_limiter_try`).
///
/// # Safety
/// `table` is null or live; `key` is null or valid for `key_len` reads; `wait_ns` is null or
/// valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_bytes_try(
    table: *const tollgate_keyed_bytes,
    key: *const u8,
    key_len: usize,
    wait_ns: *mut u64,
) -> i32 {
    // SAFETY: the caller's contract, passed on.
    unsafe { keyed_bytes_try(table, key, key_len, || 1, wait_ns) }
}

/// The body of `tollgate_keyed_bytes_try_n` and `tollgate_keyed_bytes_try` (`n` as in
/// `limiter_try`).
///
/// # Safety
/// As `tollgate_keyed_bytes_try_n`.
#[inline(always)]
unsafe fn keyed_bytes_try(
    table: *const tollgate_keyed_bytes,
    key: *const u8,
    key_len: usize,
    n: impl FnOnce() -> u64,
    wait_ns: *mut u64,
) -> i32 {
    guard_try(|| {
        // SAFETY: the caller's contract, passed on.
        let (t, key) = unsafe { (get(table, "table")?, slice(key, key_len, "key")?) };
        let wait_ns = wait_ptr(wait_ns)?;
        let (outcome, wait) = try_table(&t.0, key, n());
        // SAFETY: checked by `wait_ptr`; valid for a write by the caller's contract.
        unsafe { put_wait(wait_ns, wait) };
        Ok(outcome)
    })
}

/// The table's clock now, in nanoseconds since its creation (the `_at` functions' time base),
/// into `*out`.
///
/// # Safety
/// `table` is null or live; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_keyed_bytes_now(
    table: *const tollgate_keyed_bytes,
    out: *mut u64,
) -> tollgate_status {
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let (t, out) = unsafe { (get(table, "table")?, out_ptr(out, 1, "out")?) };
        let now = each_table!(&t.0, k => k.now());
        // SAFETY: non-null and aligned (checked), valid for a write by the caller's contract.
        unsafe { out.write(t.1.since(now)) };
        Ok(())
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
        let (t, key, out) =
            unsafe { (get(table, "table")?, slice(key, key_len, "key")?, out_ptr(out, 1, "out")?) };
        let d = each_table!(&t.0, t => t.check_n(key, n));
        // SAFETY: `out` checked before deciding; valid for a write by the caller's contract.
        unsafe { put_decision(out, &d) };
        Ok(())
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
        let (t, key, out) =
            unsafe { (get(table, "table")?, slice(key, key_len, "key")?, out_ptr(out, 1, "out")?) };
        let d = each_table!(&t.0, k => k.check_n_at(key, t.1.at(now_ns), n));
        // SAFETY: `out` checked before deciding; valid for a write by the caller's contract.
        unsafe { put_decision(out, &d) };
        Ok(())
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
        let (t, key, out) =
            unsafe { (get(table, "table")?, slice(key, key_len, "key")?, out_ptr(out, 1, "out")?) };
        let d = each_table!(&t.0, t => t.peek_n(key, n));
        // SAFETY: `out` checked before deciding; valid for a write by the caller's contract.
        unsafe { put_decision(out, &d) };
        Ok(())
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
                out_ptr(out, len, "out")?,
            )
        };
        // SAFETY: as above.
        let costs = if costs.is_null() { None } else { Some(unsafe { slice(costs, len, "costs")? }) };
        // Every key checked before any is decided: an error takes nothing.
        for (i, (&k, &l)) in keys.iter().zip(lens).enumerate() {
            check_array(k, l, &format!("keys[{i}]"))?;
        }
        for i in 0..len {
            // SAFETY: checked above; valid for `lens[i]` reads by the caller's contract.
            let key = unsafe { slice(keys[i], lens[i], "keys[i]")? };
            let n = costs.map_or(1, |c| c[i]);
            let d = tollgate_decision::from(&each_table!(&t.0, t => t.check_n(key, n)));
            // SAFETY: `out` is valid for `len` writes, as in `tollgate_limiter_check_batch`.
            unsafe { out.add(i).write(d) };
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
