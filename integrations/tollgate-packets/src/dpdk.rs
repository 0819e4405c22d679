//! DPDK's `rte_meter` (Debian's `libdpdk-dev`), one meter per [`DpdkMeter`], through the C shim
//! in `dpdk/shim.c`: DPDK's checks are inline functions of `rte_meter.h`.
//!
//! DPDK converts rates to TSC cycles with the frequency its EAL measures, so the EAL must run
//! first ([`start_eal`]: `--no-huge --no-pci`, one core, no shared configuration; as root). A
//! meter's clock starts at 0 cycles, and [`DpdkMeter::check`] takes cycles since then.

use std::ffi::{c_char, c_int, c_void, CString};
use std::ptr::NonNull;
use std::sync::OnceLock;

use tollgate::{Color, Meter, MeterKind};

extern "C" {
    fn tg_dpdk_init(argc: c_int, argv: *mut *mut c_char) -> c_int;
    fn tg_dpdk_hz() -> u64;
    fn tg_dpdk_meter_new(kind: c_int, cir: u64, cbs: u64, r2: u64, s2: u64, err: *mut c_int) -> *mut c_void;
    fn tg_dpdk_meter_free(m: *mut c_void);
    fn tg_dpdk_meter_periods(m: *const c_void, out: *mut u64);
    fn tg_dpdk_meter_check(m: *mut c_void, time: u64, len: u32, color: c_int) -> c_int;
    fn tg_dpdk_meter_levels(m: *const c_void, out: *mut u64);
}

/// Starts DPDK's EAL once for the process (later calls return the first's answer): the TSC
/// frequency it measured, in Hz, or why it could not start.
pub fn start_eal() -> Result<u64, String> {
    static EAL: OnceLock<Result<u64, String>> = OnceLock::new();
    EAL.get_or_init(|| {
        let args = [
            "tollgate-packets",
            "--no-huge",
            "--no-pci",
            "-l",
            "0",
            "--no-shconf",
            "--no-telemetry",
            "--log-level",
            "lib.eal:error",
        ];
        let owned: Vec<CString> = args.iter().map(|a| CString::new(*a).expect("no NUL")).collect();
        let mut argv: Vec<*mut c_char> = owned.iter().map(|a| a.as_ptr().cast_mut()).collect();
        let argc = c_int::try_from(argv.len()).expect("a few arguments");
        // SAFETY: argv holds argc NUL-terminated strings that outlive the call (DPDK may
        // permute the pointers, not the strings).
        let rc = unsafe { tg_dpdk_init(argc, argv.as_mut_ptr()) };
        if rc < 0 {
            return Err(format!("rte_eal_init failed ({rc}): DPDK's EAL needs root here"));
        }
        // SAFETY: the EAL is started.
        match unsafe { tg_dpdk_hz() } {
            0 => Err("DPDK measured no TSC frequency".to_owned()),
            hz => Ok(hz),
        }
    })
    .clone()
}

/// One DPDK meter, both buckets full, its clock at 0 cycles.
#[derive(Debug)]
pub struct DpdkMeter {
    ptr: NonNull<c_void>,
}

impl DpdkMeter {
    /// DPDK's meter for tollgate's profile `meter` (the EAL must be started), or DPDK's error
    /// code where it refuses the profile (trTCM with PIR below CIR, say).
    pub fn new(meter: &Meter) -> Result<DpdkMeter, i32> {
        let kind = match meter.kind() {
            MeterKind::SrTcm => 0,
            MeterKind::TrTcm => 1,
            MeterKind::Rfc4115 => 2,
        };
        let ((cir, cbs), (r2, s2)) = (meter.committed(), meter.second());
        let mut err: c_int = 0;
        // SAFETY: plain values in, a pointer the shim allocated (or NULL with err) out.
        let ptr = unsafe { tg_dpdk_meter_new(kind, cir, cbs, r2, s2, &mut err) };
        NonNull::new(ptr).map(|ptr| DpdkMeter { ptr }).ok_or(err)
    }

    /// The colour of a packet of `len` bytes at `cycles` since the meter's clock's 0, colour-blind
    /// (`input` `None`) or colour-aware.
    pub fn check(&mut self, cycles: u64, len: u32, input: Option<Color>) -> Color {
        let color = input.map_or(-1, |c| c as c_int);
        // SAFETY: a live meter of this handle, used by one thread at a time (`&mut`).
        let c = unsafe { tg_dpdk_meter_check(self.ptr.as_ptr(), cycles, len, color) };
        u8::try_from(c).ok().and_then(Color::from_u8).unwrap_or(Color::Red)
    }

    /// DPDK's periods (cycles) and bytes per period: committed, then the second bucket's.
    pub fn periods(&self) -> [u64; 4] {
        let mut out = [0; 4];
        // SAFETY: a live meter; `out` has the four slots the shim writes.
        unsafe { tg_dpdk_meter_periods(self.ptr.as_ptr(), out.as_mut_ptr()) };
        out
    }

    /// The buckets' levels in bytes: committed, second.
    pub fn levels(&self) -> [u64; 2] {
        let mut out = [0; 2];
        // SAFETY: a live meter; `out` has the two slots the shim writes.
        unsafe { tg_dpdk_meter_levels(self.ptr.as_ptr(), out.as_mut_ptr()) };
        out
    }
}

impl Drop for DpdkMeter {
    fn drop(&mut self) {
        // SAFETY: the shim's allocation, freed once.
        unsafe { tg_dpdk_meter_free(self.ptr.as_ptr()) };
    }
}

// SAFETY: the meter is plain memory the shim allocated, owned by this handle alone.
unsafe impl Send for DpdkMeter {}

extern "C" {
    fn tg_dpdk_flows_new(cir: u64, cbs: u64, pir: u64, pbs: u64, n: usize) -> *mut c_void;
    fn tg_dpdk_flows_free(f: *mut c_void);
    fn tg_dpdk_flows_burst(
        f: *mut c_void,
        idx: *const u32,
        lens: *const u32,
        n: u32,
        time: u64,
        colors: *mut u8,
    );
    fn tg_dpdk_tsc() -> u64;
    fn tg_dpdk_trtcm_runtime_size() -> usize;
    fn tg_dpdk_trtcm_burst(
        f: *const c_void,
        runtimes: *const *mut u64,
        lens: *const u32,
        n: u32,
        time: u64,
        colors: *mut u8,
    );
}

/// A trTCM runtime as DPDK lays it out (`struct rte_meter_trtcm`: the C and P buckets' last
/// update times in TSC cycles, then their levels in bytes), for a table of the caller's own.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default)]
pub struct TrTcmRuntime {
    /// `time_tc`, `time_tp`, `tc`, `tp`.
    pub words: [u64; 4],
}

impl TrTcmRuntime {
    /// Both buckets full at `tsc` (as `rte_meter_trtcm_config` leaves a runtime).
    pub fn full(cbs: u64, pbs: u64, tsc: u64) -> TrTcmRuntime {
        // SAFETY: reads a constant.
        assert_eq!(unsafe { tg_dpdk_trtcm_runtime_size() }, std::mem::size_of::<TrTcmRuntime>());
        TrTcmRuntime { words: [tsc, tsc, cbs, pbs] }
    }
}

/// DPDK's trTCM runtimes for `n` flows under one profile (for the benchmark): the caller keeps
/// the flow-to-index table; a burst is metered in C, at one TSC reading, as DPDK's qos_meter
/// sample meters it.
#[derive(Debug)]
pub struct DpdkFlows {
    ptr: NonNull<c_void>,
    n: usize,
}

impl DpdkFlows {
    /// `n` trTCM meters (rates in bytes/s, sizes in bytes), both buckets full; `None` where
    /// DPDK refuses the profile, `n` is 0 or more than memory holds, or memory runs out. The
    /// EAL must be started.
    pub fn new(cir: u64, cbs: u64, pir: u64, pbs: u64, n: usize) -> Option<DpdkFlows> {
        // SAFETY: plain values in, the shim's allocation (or NULL) out.
        NonNull::new(unsafe { tg_dpdk_flows_new(cir, cbs, pir, pbs, n) }).map(|ptr| DpdkFlows { ptr, n })
    }

    /// Colours a burst at `tsc`: packet `i` of the flow at `idx[i]` (below `n`: checked) and
    /// `lens[i]` bytes into `colors[i]` (DPDK's values).
    pub fn burst(&mut self, idx: &[u32], lens: &[u32], tsc: u64, colors: &mut [u8]) {
        let n = idx.len().min(lens.len()).min(colors.len());
        assert!(idx[..n].iter().all(|&i| (i as usize) < self.n), "a flow index out of range");
        let n32 = u32::try_from(n).expect("a burst of fewer than 2^32 packets");
        // SAFETY: every index is in range (checked); the slices hold `n` elements.
        unsafe {
            tg_dpdk_flows_burst(self.ptr.as_ptr(), idx.as_ptr(), lens.as_ptr(), n32, tsc, colors.as_mut_ptr())
        };
    }
}

impl DpdkFlows {
    /// Colours a burst at `tsc` on runtimes of the caller's table: packet `i` on `runtimes[i]`
    /// and `lens[i]` bytes into `colors[i]`, under this object's profile.
    ///
    /// # Safety
    /// Every pointer in `runtimes` is a live `TrTcmRuntime` that nothing else reads or writes
    /// during the call (the same one may appear several times).
    pub unsafe fn burst_on(&self, runtimes: &[*mut TrTcmRuntime], lens: &[u32], tsc: u64, colors: &mut [u8]) {
        let n = runtimes.len().min(lens.len()).min(colors.len());
        let n32 = u32::try_from(n).expect("a burst of fewer than 2^32 packets");
        // SAFETY: each pointer is a live runtime (the caller's contract), checked one after
        // another in C; the slices hold `n` elements.
        unsafe {
            tg_dpdk_trtcm_burst(
                self.ptr.as_ptr(),
                runtimes.as_ptr().cast(),
                lens.as_ptr(),
                n32,
                tsc,
                colors.as_mut_ptr(),
            )
        };
    }
}

impl Drop for DpdkFlows {
    fn drop(&mut self) {
        // SAFETY: the shim's allocation, freed once.
        unsafe { tg_dpdk_flows_free(self.ptr.as_ptr()) };
    }
}

/// The TSC now (DPDK's `rte_rdtsc`).
pub fn tsc() -> u64 {
    // SAFETY: reads a counter.
    unsafe { tg_dpdk_tsc() }
}
