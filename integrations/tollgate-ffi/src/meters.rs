//! The meters: a per-flow table of three-colour meters (RFC 2697, 2698, 4115) owned by one
//! thread, with a burst call in DPDK's shape (keys, lengths and input colours in, colours out,
//! one clock reading per burst), for a DPDK or VPP poll loop.

use std::sync::TryLockError;

use tollgate::{Clock, Color, DefaultClock, FlowMeters, Meter, Nanos};

use super::handles::{check_array, get, make, out_ptr, slice};
use super::*;

/// The colour of `tollgate_flow_meters_color_burst`'s colours (`uint8_t` values): DPDK's
/// `enum rte_color` values.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum tollgate_color {
    /// Within the committed rate.
    TOLLGATE_GREEN = 0,
    /// Above it, within the excess (srTCM, RFC 4115) or the peak rate (trTCM).
    TOLLGATE_YELLOW = 1,
    /// Beyond both.
    TOLLGATE_RED = 2,
}

/// The time of a burst call that reads the table's clock itself, once for the burst.
pub const TOLLGATE_NOW: u64 = u64::MAX;

/// Flows metered under one meter, `uint64_t` flow keys (a flow's hash or id), owned by one
/// thread at a time (a core's, as DPDK's per-lcore data): a call while another thread is in
/// one is an error (`TOLLGATE_ERROR_HANDLE`), never a race.
pub struct tollgate_flow_meters {
    flows: Mutex<FlowMeters<u64>>,
    clock: DefaultClock,
    origin: Origin,
}

/// Makes a flow table of at least `capacity` flows (rounded up to a power of two) under the
/// meter `meter` (`"srtcm cir=100Mbit/s cbs=16KiB ebs=32KiB"`, `"trtcm cir=... cbs=... pir=...
/// pbs=..."`, `"rfc4115 cir=... cbs=... eir=... ebs=..."`), into `*out`. Its clock starts now.
///
/// # Safety
/// `meter` is null or a NUL-terminated string; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_flow_meters_parse(
    meter: *const c_char,
    capacity: usize,
    out: *mut *mut tollgate_flow_meters,
) -> tollgate_status {
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let text = unsafe { text(meter, "meter")? };
        let meter: Meter = text.parse().map_err(|e| Error::invalid(format!("meter '{text}': {e}")))?;
        let flows = FlowMeters::new(meter, capacity)
            .map_err(|e| Error::invalid(format!("capacity {capacity}: {e}")))?;
        let clock = DefaultClock::default();
        let origin = Origin(clock.now());
        // SAFETY: the caller's contract, passed on.
        unsafe { make(tollgate_flow_meters { flows: Mutex::new(flows), clock, origin }, out) }
    })
}

/// The table's clock now, in nanoseconds since its creation (the burst call's time base),
/// into `*out`.
///
/// # Safety
/// `table` is null or live; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_flow_meters_now(
    table: *const tollgate_flow_meters,
    out: *mut u64,
) -> tollgate_status {
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let (t, out) = unsafe { (get(table, "table")?, out_ptr(out, 1, "out")?) };
        // SAFETY: non-null and aligned (checked), valid for a write by the caller's contract.
        unsafe { out.write(t.origin.since(t.clock.now())) };
        Ok(())
    })
}

/// Colours a burst of `n` packets at `now_ns` (nanoseconds since the table's creation, or
/// `TOLLGATE_NOW` to read its clock once for the burst): packet `i` of flow `keys[i]`,
/// `lens[i]` bytes (the IP packet, as the RFCs count), arriving coloured `colors_in[i]`
/// (colour-aware), or colour-blind when `colors_in` is null, gets `colors_out[i]`. Colours are
/// `tollgate_color` values; an input colour above 2 is an error, and nothing is metered.
/// A new flow that finds no room in the table is red (see `tollgate_flow_meters_stats`).
///
/// # Safety
/// `table` is null or live; `keys`, `lens` and `colors_in` are null or valid for `n` reads;
/// `colors_out` is null or valid for `n` writes, and overlaps no input but `colors_in`, which
// it may be (colouring in place).
#[no_mangle]
pub unsafe extern "C" fn tollgate_flow_meters_color_burst(
    table: *const tollgate_flow_meters,
    now_ns: u64,
    keys: *const u64,
    lens: *const u32,
    colors_in: *const u8,
    colors_out: *mut u8,
    n: usize,
) -> tollgate_status {
    const CHUNK: usize = 32;
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let (t, keys, lens, out) = unsafe {
            (
                get(table, "table")?,
                slice(keys, n, "keys")?,
                slice(lens, n, "lens")?,
                out_ptr(colors_out, n, "colors_out")?,
            )
        };
        // Input colours are read through their pointer, never as a slice, so that `colors_out`
        // may be `colors_in` (colouring in place, as a DPDK loop keeps one colour per mbuf):
        // each chunk's colours are read before any of its outputs is written.
        let inputs = if colors_in.is_null() {
            None
        } else {
            check_array(colors_in, n, "colors_in")?;
            Some(colors_in)
        };
        if let Some(p) = inputs {
            for i in 0..n {
                // SAFETY: valid for `n` reads (the caller's contract; checked non-null, aligned).
                let c = unsafe { p.add(i).read() };
                if c > 2 {
                    return Err(Error::invalid(format!(
                        "colors_in[{i}] is {c}: a colour is 0 (green), 1 (yellow) or 2 (red)"
                    )));
                }
            }
        }
        let mut flows = match t.flows.try_lock() {
            Ok(flows) => flows,
            // A panic inside a call left it: the table itself is consistent (a decision
            // writes a flow's state whole).
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return Err(in_use()),
        };
        let at = if now_ns == TOLLGATE_NOW { t.clock.now() } else { t.origin.at(now_ns) };
        let elapsed = Nanos::new(t.origin.since(at));
        let mut colors = [Color::Red; CHUNK];
        let mut aware = [Color::Red; CHUNK];
        for start in (0..n).step_by(CHUNK) {
            let m = CHUNK.min(n - start);
            let inputs = inputs.map(|p| {
                for (i, a) in aware[..m].iter_mut().enumerate() {
                    // SAFETY: as above; this chunk's outputs are not written yet.
                    *a = Color::from_u8(unsafe { p.add(start + i).read() }).unwrap_or(Color::Red);
                }
                &aware[..m]
            });
            flows.check_burst(
                elapsed,
                &keys[start..start + m],
                &lens[start..start + m],
                inputs,
                &mut colors[..m],
            );
            for (i, c) in colors[..m].iter().enumerate() {
                // SAFETY: `colors_out` is valid for `n` writes (checked non-null and aligned).
                unsafe { out.add(start + i).write(*c as u8) };
            }
        }
        Ok(())
    })
}

/// The flows the table holds, and the packets coloured red because their new flow found no
/// room, into `*flows` and `*table_full` (either may be null: not wanted).
///
/// # Safety
/// `table` is null or live; `flows` and `table_full` are null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tollgate_flow_meters_stats(
    table: *const tollgate_flow_meters,
    flows: *mut u64,
    table_full: *mut u64,
) -> tollgate_status {
    guard(|| {
        // SAFETY: the caller's contract, passed on.
        let t = unsafe { get(table, "table")? };
        let f = match t.flows.try_lock() {
            Ok(f) => f,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return Err(in_use()),
        };
        for (p, v) in [(flows, f.len() as u64), (table_full, f.table_full())] {
            if !p.is_null() {
                let p = out_ptr(p, 1, "stats")?;
                // SAFETY: non-null and aligned (checked), valid for a write by the contract.
                unsafe { p.write(v) };
            }
        }
        Ok(())
    })
}

/// The error for a table another thread is in.
#[cold]
fn in_use() -> Error {
    Error::new(
        tollgate_status::TOLLGATE_ERROR_HANDLE,
        "table is in use by another thread: a flow table belongs to one thread at a time".to_owned(),
    )
}

/// Frees a flow table (see `tollgate_limiter_free`).
///
/// # Safety
/// `table` is null or a handle this library returned, not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn tollgate_flow_meters_free(table: *mut tollgate_flow_meters) -> tollgate_status {
    // SAFETY: the caller's contract, passed on.
    guard(|| unsafe { super::handles::free(table, "table") })
}
