//! Three-colour meters: RFC 2697's single-rate (srTCM), RFC 2698's two-rate (trTCM) and
//! RFC 4115's, colour-blind and colour-aware, in bytes, as DPDK's `rte_meter`, VPP's policer and
//! `tc police` run them.
//!
//! # Semantics
//!
//! A meter has two buckets, both full at its origin. Its rates credit **whole bytes**: a bucket
//! of rate `r` bytes/s receives its `k`-th byte at `k / r` seconds after the origin (the RFCs'
//! "incremented `r` times per second", and DPDK's stepwise credit). srTCM's two buckets share
//! the CIR, a byte going to C until C is full, then to E; trTCM's (P at PIR, C at CIR) and
//! RFC 4115's (C at CIR, E at EIR) fill independently. A packet of `B` bytes:
//!
//! | meter | colour-blind | colour-aware (input colour `c`) |
//! |---|---|---|
//! | srTCM | green if `Tc ≥ B` (`Tc −= B`); else yellow if `Te ≥ B` (`Te −= B`); else red | green if `c` green and `Tc ≥ B`; else yellow if `c` not red and `Te ≥ B`; else red |
//! | trTCM | red if `Tp < B`; else yellow if `Tc < B` (`Tp −= B`); else green (`Tp −= B`, `Tc −= B`) | red if `c` red or `Tp < B`; else yellow if `c` yellow or `Tc < B`; else green |
//! | RFC 4115 | green if `Tc ≥ B` (`Tc −= B`); else yellow if `Te ≥ B` (`Te −= B`); else red | green if `c` green and `Tc ≥ B`; else yellow if `c` not red and `Te ≥ B`; else red |
//!
//! RFC 4115's text compares `Tc(t−) − B > 0` where its figure (and RFCs 2697 and 2698, and
//! DPDK) use `B ≤ Tc`: here `B ≤ Tc`, as everywhere else.
//!
//! # State
//!
//! A flow's state is two words: for each bucket, the byte-tick of its rate at which it is full
//! again (`F`; a bucket is full at tick `k` when `F ≤ k`, and holds `size − (F − k)` bytes
//! otherwise). Taking `B` bytes moves `F` to `max(F, k) + B`; refilling is the clock moving.
//! srTCM's E fills only once C is full: E is full at `F_e`, counted from `max(F_c, k)`, and
//! a green packet that moves C's full tick moves E's by as much. The integers are exact: no
//! rate is rounded, no byte credited early. Ticks are counted from the origin in 64 bits, up
//! to 2^63 bytes of a rate (23 years at 100 Gbit/s, 2.3 at 1 Tbit/s); past that a meter's
//! clock stands still and its buckets no longer refill (toward red).

use core::fmt;
use core::str::FromStr;

use crate::sync::{AtomicPair, Ordering::Relaxed};
use crate::{ConfigError, Nanos, ParseError};

/// A packet's colour, as the RFCs (and DPDK's `enum rte_color`: green 0, yellow 1, red 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Color {
    /// Within the committed rate.
    Green = 0,
    /// Above the committed rate, within the excess (srTCM, RFC 4115) or peak (trTCM).
    Yellow = 1,
    /// Beyond both.
    Red = 2,
}

impl Color {
    /// The colour of DPDK's value (`0`, `1`, `2`); `None` for any other.
    pub const fn from_u8(v: u8) -> Option<Color> {
        match v {
            0 => Some(Color::Green),
            1 => Some(Color::Yellow),
            2 => Some(Color::Red),
            _ => None,
        }
    }

    /// The colour's name: `"green"`, `"yellow"`, `"red"`.
    pub const fn name(self) -> &'static str {
        match self {
            Color::Green => "green",
            Color::Yellow => "yellow",
            Color::Red => "red",
        }
    }
}

impl fmt::Display for Color {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which of the three meters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MeterKind {
    /// RFC 2697: CIR, CBS, EBS (E filled by C's overflow).
    SrTcm,
    /// RFC 2698: CIR, CBS, PIR, PBS.
    TrTcm,
    /// RFC 4115: CIR, CBS, EIR, EBS (filled independently).
    Rfc4115,
}

/// [`MeterKind::code`]s, for decisions specialized to one kind.
pub(crate) const SRTCM: u8 = 0;
pub(crate) const TRTCM: u8 = 1;
pub(crate) const RFC4115: u8 = 2;

impl MeterKind {
    /// The kind as a number: [`SRTCM`], [`TRTCM`], [`RFC4115`].
    pub(crate) const fn code(self) -> u8 {
        match self {
            MeterKind::SrTcm => SRTCM,
            MeterKind::TrTcm => TRTCM,
            MeterKind::Rfc4115 => RFC4115,
        }
    }

    /// The name in a meter's string form: `"srtcm"`, `"trtcm"`, `"rfc4115"`.
    pub const fn name(self) -> &'static str {
        match self {
            MeterKind::SrTcm => "srtcm",
            MeterKind::TrTcm => "trtcm",
            MeterKind::Rfc4115 => "rfc4115",
        }
    }
}

/// A meter's profile: its kind, rates (bytes per second) and bucket sizes (bytes). Shared by
/// every flow it meters; each flow keeps a [`MeterState`].
///
/// ```
/// use tollgate::{Color, Meter, MeterState, Nanos};
///
/// let m: Meter = "srtcm cir=100Mbit/s cbs=16KiB ebs=32KiB".parse()?;
/// let mut flow = MeterState::new();
/// assert_eq!(flow.check(&m, Nanos::ZERO, 1_500), Color::Green);
/// // Colour-aware: a packet marked yellow upstream is never green here.
/// assert_eq!(flow.check_aware(&m, Nanos::ZERO, 1_500, Color::Yellow), Color::Yellow);
/// # Ok::<(), tollgate::ParseError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meter {
    kind: MeterKind,
    /// C: the committed bucket (every meter's first).
    committed: Bucket,
    /// E (srTCM, RFC 4115) or P (trTCM).
    second: Bucket,
}

/// One bucket of a profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Bucket {
    /// Bytes per second.
    rate: u64,
    /// Bytes.
    size: u64,
}

impl Bucket {
    /// The whole bytes this bucket's rate has credited by `elapsed` since the origin: byte `k`
    /// arrives at `k / rate` s, so `⌊elapsed · rate / 10^9⌋`, held at [`MAX_TICK`].
    ///
    /// In 64-bit arithmetic (a 128-bit division is a library call of some 50 cycles, twice a
    /// burst): with `rate = q·10^9 + m` and `elapsed = a·10^9 + b`,
    /// `elapsed · rate / 10^9 = elapsed·q + a·m + ⌊b·m / 10^9⌋` exactly (the first two terms are
    /// whole), and `b·m < 10^18` fits. A sum past 64 bits is past `MAX_TICK` too.
    #[inline]
    fn tick(&self, elapsed: Nanos) -> u64 {
        const G: u64 = 1_000_000_000;
        let e = elapsed.as_u64();
        let (a, b) = (e / G, e % G);
        let (q, m) = (self.rate / G, self.rate % G);
        e.checked_mul(q)
            .and_then(|k| k.checked_add(a.checked_mul(m)?))
            .and_then(|k| k.checked_add(b * m / G))
            .map_or(MAX_TICK, |k| k.min(MAX_TICK))
    }

    /// The bytes the bucket holds at tick `k` if it is full at `full`.
    #[inline]
    fn level(&self, full: u64, k: u64) -> u64 {
        self.size - full.saturating_sub(k).min(self.size)
    }

    /// Whether `bytes` fit in the bucket at tick `k`.
    #[inline(always)]
    fn fits(&self, full: u64, k: u64, bytes: u64) -> bool {
        self.level(full, k) >= bytes
    }
}

/// The last byte-tick a meter counts: 2^63 (see the module's docs).
const MAX_TICK: u64 = 1 << 63;

impl Meter {
    /// The fastest rate: 2^37 bytes/s (1.1 Tbit/s).
    pub const MAX_RATE: u64 = 1 << 37;
    /// The largest bucket: 2^40 bytes (1 TiB).
    pub const MAX_SIZE: u64 = 1 << 40;

    /// RFC 2697's single-rate three-colour marker: `cir` bytes/s, buckets of `cbs` and `ebs`
    /// bytes. `ebs` may be 0 (no yellow); `cbs` may not.
    pub fn srtcm(cir: u64, cbs: u64, ebs: u64) -> Result<Meter, ConfigError> {
        Meter::build(MeterKind::SrTcm, (cir, cbs), (cir, ebs), ("cir", "cbs"), ("cir", "ebs"))
    }

    /// RFC 2698's two-rate three-colour marker: committed `cir`/`cbs`, peak `pir`/`pbs`
    /// (bytes/s, bytes). RFC 2698 asks for `pir ≥ cir`; a lower PIR is allowed, as DPDK allows it
    /// (green then needs both buckets, as always).
    pub fn trtcm(cir: u64, cbs: u64, pir: u64, pbs: u64) -> Result<Meter, ConfigError> {
        Meter::build(MeterKind::TrTcm, (cir, cbs), (pir, pbs), ("cir", "cbs"), ("pir", "pbs"))
    }

    /// RFC 4115's two-rate marker: committed `cir`/`cbs` and excess `eir`/`ebs`, filled
    /// independently (bytes/s, bytes). `eir` and `ebs` may both be 0 (no yellow); `ebs`
    /// without `eir` is refused (a bucket that would never refill).
    pub fn rfc4115(cir: u64, cbs: u64, eir: u64, ebs: u64) -> Result<Meter, ConfigError> {
        if eir == 0 && ebs > 0 {
            // An excess bucket that never refills: a flow that once used it would never be
            // full again (and never leave a table).
            return Err(ConfigError::MeterTooLarge {
                meter: "rfc4115",
                what: "ebs (with eir 0)",
                value: ebs,
                max: 0,
            });
        }
        Meter::build(MeterKind::Rfc4115, (cir, cbs), (eir, ebs), ("cir", "cbs"), ("eir", "ebs"))
    }

    fn build(
        kind: MeterKind,
        (rate_a, size_a): (u64, u64),
        (rate_b, size_b): (u64, u64),
        (rate_a_name, size_a_name): (&'static str, &'static str),
        (rate_b_name, size_b_name): (&'static str, &'static str),
    ) -> Result<Meter, ConfigError> {
        let meter = kind.name();
        // The committed bucket must be able to pass something; the second may be empty for the
        // meters whose second bucket only adds yellow (srTCM's E, RFC 4115's E), never for
        // trTCM's P, which every non-red packet needs.
        let second_may_be_empty = kind != MeterKind::TrTcm;
        for (what, value, max, may_be_zero) in [
            (rate_a_name, rate_a, Meter::MAX_RATE, false),
            (size_a_name, size_a, Meter::MAX_SIZE, false),
            (rate_b_name, rate_b, Meter::MAX_RATE, second_may_be_empty),
            (size_b_name, size_b, Meter::MAX_SIZE, second_may_be_empty),
        ] {
            if value == 0 && !may_be_zero {
                return Err(ConfigError::MeterZero { meter, what });
            }
            if value > max {
                return Err(ConfigError::MeterTooLarge { meter, what, value, max });
            }
        }
        Ok(Meter {
            kind,
            committed: Bucket { rate: rate_a, size: size_a },
            second: Bucket { rate: rate_b, size: size_b },
        })
    }

    /// Which meter.
    pub const fn kind(&self) -> MeterKind {
        self.kind
    }

    /// The committed rate and bucket: CIR (bytes/s) and CBS (bytes).
    pub const fn committed(&self) -> (u64, u64) {
        (self.committed.rate, self.committed.size)
    }

    /// The second rate and bucket (bytes/s, bytes): srTCM's CIR and EBS, trTCM's PIR and PBS,
    /// RFC 4115's EIR and EBS.
    pub const fn second(&self) -> (u64, u64) {
        (self.second.rate, self.second.size)
    }

    /// Both buckets' byte-ticks at `elapsed` since the origin: what a burst of packets
    /// metered at one instant shares (srTCM's second is its first: one rate).
    #[inline]
    pub(crate) fn ticks(&self, elapsed: Nanos) -> [u64; 2] {
        let kc = self.committed.tick(elapsed);
        match self.kind {
            MeterKind::SrTcm => [kc, kc],
            MeterKind::TrTcm | MeterKind::Rfc4115 => [kc, self.second.tick(elapsed)],
        }
    }

    /// The colour of `bytes` at the byte-ticks `[kc, k2]` ([`Meter::ticks`]) on the state
    /// `[F_c, F_2]` (the committed bucket's full tick, the second's), given the packet's colour
    /// on arrival (`None`: colour-blind): the colour and the state to keep. Pure (no clock, no
    /// atomic), so that every form a meter takes decides through it.
    #[inline]
    pub(crate) fn decide(
        &self,
        full: [u64; 2],
        ticks: [u64; 2],
        bytes: u64,
        input: Option<Color>,
    ) -> ([u64; 2], Color) {
        match self.kind {
            MeterKind::SrTcm => self.decide_as::<SRTCM>(full, ticks, bytes, input),
            MeterKind::TrTcm => self.decide_as::<TRTCM>(full, ticks, bytes, input),
            MeterKind::Rfc4115 => self.decide_as::<RFC4115>(full, ticks, bytes, input),
        }
    }

    /// [`decide`](Meter::decide) for a meter of kind `KIND` ([`MeterKind::code`]), which it
    /// must be: a loop over many packets of one meter picks its kind once, not per packet.
    #[inline(always)]
    pub(crate) fn decide_as<const KIND: u8>(
        &self,
        [fc, f2]: [u64; 2],
        [kc, k2]: [u64; 2],
        bytes: u64,
        input: Option<Color>,
    ) -> ([u64; 2], Color) {
        debug_assert_eq!(self.kind.code(), KIND);
        let (green_ok, yellow_ok) = match input {
            None | Some(Color::Green) => (true, true),
            Some(Color::Yellow) => (false, true),
            Some(Color::Red) => (false, false),
        };
        let (c, second) = (&self.committed, &self.second);
        match KIND {
            SRTCM => {
                // E's ticks are C's (one rate); E fills from the tick C is full.
                let c_full = fc.max(kc);
                let e_deficit = f2.saturating_sub(c_full);
                if green_ok && c.fits(fc, kc, bytes) {
                    let fc = c_full + bytes;
                    ([fc, fc + e_deficit], Color::Green)
                } else if yellow_ok && second.size - e_deficit.min(second.size) >= bytes {
                    ([fc, c_full + e_deficit + bytes], Color::Yellow)
                } else {
                    ([fc, f2], Color::Red)
                }
            }
            TRTCM => {
                if !yellow_ok || !second.fits(f2, k2, bytes) {
                    ([fc, f2], Color::Red)
                } else if !green_ok || !c.fits(fc, kc, bytes) {
                    ([fc, f2.max(k2) + bytes], Color::Yellow)
                } else {
                    ([fc.max(kc) + bytes, f2.max(k2) + bytes], Color::Green)
                }
            }
            _ => {
                if green_ok && c.fits(fc, kc, bytes) {
                    ([fc.max(kc) + bytes, f2], Color::Green)
                } else if yellow_ok && second.fits(f2, k2, bytes) {
                    ([fc, f2.max(k2) + bytes], Color::Yellow)
                } else {
                    ([fc, f2], Color::Red)
                }
            }
        }
    }

    /// [`decide_as`](Meter::decide_as) without a branch: every bucket's new full tick and the
    /// colour computed, then picked by conditional moves. For tables in cache, where a
    /// mispredicted colour (one a few packets) costs more than the decision; a table in memory
    /// decides with [`decide_as`](Meter::decide_as), whose predicted branches let a core run
    /// ahead to the next packets' misses.
    ///
    /// Equal to [`decide_as`](Meter::decide_as) on every state its decisions leave at byte-ticks
    /// no earlier than theirs (each bucket full at most its size past the ticks: `F ≤ k + size`,
    /// so that `level ≥ bytes` is `max(F, k) + bytes ≤ k + size`), for packets of at most
    /// 2^32 − 1 bytes (no sum overflows: `F ≤ 2^63 + 2^41`). The one-core flow table, whose
    /// clock never goes back, holds only such states.
    #[inline(always)]
    pub(crate) fn decide_flat<const KIND: u8>(
        &self,
        [fc, f2]: [u64; 2],
        [kc, k2]: [u64; 2],
        bytes: u32,
        input: Option<Color>,
    ) -> ([u64; 2], Color) {
        debug_assert_eq!(self.kind.code(), KIND);
        let b = u64::from(bytes);
        let (green_ok, yellow_ok) = match input {
            None | Some(Color::Green) => (true, true),
            Some(Color::Yellow) => (false, true),
            Some(Color::Red) => (false, false),
        };
        let (c, second) = (&self.committed, &self.second);
        let c_at = max(fc, kc) + b;
        // The colour as DPDK numbers it (green 0, yellow 1, red 2): 2 less one for each bucket
        // the packet passes (trTCM's C only after P), or 2 for green and 1 for yellow.
        let (code, next) = match KIND {
            SRTCM => {
                // E's ticks are C's; its deficit counts from the tick C is full.
                let c_full = c_at - b;
                let e_deficit = f2.saturating_sub(c_full);
                let green = green_ok & (c_at <= kc + c.size);
                let e_short = select(e_deficit < second.size, e_deficit, second.size);
                let yellow = !green & yellow_ok & (e_short + b <= second.size);
                let f2 = select(green | yellow, c_at + e_deficit, f2);
                (2 - 2 * u8::from(green) - u8::from(yellow), [select(green, c_at, fc), f2])
            }
            TRTCM => {
                let p_at = max(f2, k2) + b;
                let yellow_or_green = yellow_ok & (p_at <= k2 + second.size);
                let green = yellow_or_green & green_ok & (c_at <= kc + c.size);
                let next = [select(green, c_at, fc), select(yellow_or_green, p_at, f2)];
                (2 - u8::from(yellow_or_green) - u8::from(green), next)
            }
            _ => {
                let e_at = max(f2, k2) + b;
                let green = green_ok & (c_at <= kc + c.size);
                let yellow = !green & yellow_ok & (e_at <= k2 + second.size);
                (
                    2 - 2 * u8::from(green) - u8::from(yellow),
                    [select(green, c_at, fc), select(yellow, e_at, f2)],
                )
            }
        };
        (next, Color::from_u8(code).unwrap_or(Color::Red))
    }

    /// Whether both buckets of `state` are full at the byte-ticks `t`: the state is then a
    /// fresh flow's, now and later.
    #[inline]
    pub(crate) fn is_full(&self, state: &MeterState, [kc, k2]: [u64; 2]) -> bool {
        let [fc, f2] = state.full;
        fc <= kc && f2 <= if self.kind == MeterKind::SrTcm { kc } else { k2 }
    }

    /// The bytes each bucket holds on `state` at `elapsed`: (committed, second).
    pub fn levels(&self, state: &MeterState, elapsed: Nanos) -> (u64, u64) {
        let [fc, f2] = state.full;
        let kc = self.committed.tick(elapsed);
        let second = match self.kind {
            MeterKind::SrTcm => {
                let deficit = f2.saturating_sub(fc.max(kc));
                self.second.size - deficit.min(self.second.size)
            }
            MeterKind::TrTcm | MeterKind::Rfc4115 => self.second.level(f2, self.second.tick(elapsed)),
        };
        (self.committed.level(fc, kc), second)
    }
}

/// `if c { a } else { b }` by a conditional move, never a branch: compilers turn a select
/// into a branch where they guess it predictable, and a meter's colours are not.
#[inline(always)]
fn select(c: bool, a: u64, b: u64) -> u64 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        let mut r = b;
        // SAFETY: two register instructions on the values given: no memory, no stack, no
        // flags the compiler relies on across the block (`asm!` clobbers them by default).
        unsafe {
            core::arch::asm!(
                "test {c}, {c}",
                "cmovnz {r}, {a}",
                c = in(reg_byte) u8::from(c),
                a = in(reg) a,
                r = inout(reg) r,
                options(pure, nomem, nostack),
            );
        }
        r
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    if c {
        a
    } else {
        b
    }
}

/// The larger of `a` and `b` by a compare and a conditional move, never a branch.
#[inline(always)]
fn max(a: u64, b: u64) -> u64 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        let mut r = a;
        // SAFETY: two register instructions on the values given: no memory, no stack; the
        // flags are clobbered (the default).
        unsafe {
            core::arch::asm!(
                "cmp {r}, {b}",
                "cmovb {r}, {b}",
                b = in(reg) b,
                r = inout(reg) r,
                options(pure, nomem, nostack),
            );
        }
        r
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    a.max(b)
}

/// One flow's state under a [`Meter`]: two words, both buckets full when new. Owned by one
/// thread (a flow pinned to a core), it is updated with no atomic at all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MeterState {
    full: [u64; 2],
}

impl MeterState {
    /// Both buckets full.
    pub const fn new() -> MeterState {
        MeterState { full: [0; 2] }
    }

    /// Colour-blind: the colour of a packet of `bytes` at `elapsed` since the meter's origin,
    /// taking its bytes from the buckets its colour takes them from. A time earlier than one
    /// already seen finds the buckets as full as they were then, less than later: a clock
    /// that steps back never refills a meter (DPDK's refills it completely).
    #[inline]
    pub fn check(&mut self, meter: &Meter, elapsed: Nanos, bytes: u64) -> Color {
        self.check_at(meter, meter.ticks(elapsed), bytes, None)
    }

    /// Colour-aware: as [`check`](MeterState::check), for a packet that arrives coloured
    /// `input` (it never leaves greener than it came).
    #[inline]
    pub fn check_aware(&mut self, meter: &Meter, elapsed: Nanos, bytes: u64, input: Color) -> Color {
        self.check_at(meter, meter.ticks(elapsed), bytes, Some(input))
    }
}

impl MeterState {
    /// The state of two words a shared form holds.
    #[inline]
    pub(crate) const fn from_words(full: [u64; 2]) -> MeterState {
        MeterState { full }
    }

    /// The two words, for a shared form to store.
    #[inline]
    pub(crate) const fn words(&self) -> [u64; 2] {
        self.full
    }

    /// The decision at precomputed byte-ticks (one clock reading for a burst).
    #[inline]
    pub(crate) fn check_at(
        &mut self,
        meter: &Meter,
        ticks: [u64; 2],
        bytes: u64,
        input: Option<Color>,
    ) -> Color {
        let (next, color) = meter.decide(self.full, ticks, bytes, input);
        self.full = next;
        color
    }

    /// [`check_at`](MeterState::check_at) for a meter of kind `KIND`.
    #[inline(always)]
    pub(crate) fn check_as<const KIND: u8>(
        &mut self,
        meter: &Meter,
        ticks: [u64; 2],
        bytes: u64,
        input: Option<Color>,
    ) -> Color {
        let (next, color) = meter.decide_as::<KIND>(self.full, ticks, bytes, input);
        self.full = next;
        color
    }
}

/// A meter every thread may use at once: one flow (or one aggregate) metered from every
/// core, its two buckets committed together by a 16-byte compare-and-swap.
///
/// Each decision loads both words at one instant, decides as [`MeterState`] does, and
/// commits with one compare-and-swap of both (a red packet, which takes nothing, commits
/// nothing); a failed one hands back the words another thread stored, and the decision is
/// made again on them. Lock-free where the CPU swaps 16 bytes at once (x86_64 with
/// `cmpxchg16b`, found at run time; aarch64), under a lock elsewhere:
/// [`SharedMeter::is_lock_free`] says which. The protocol is modelled under loom
/// (`loom-tests/tests/meter.rs`). Its state is 16 bytes, not padded to a cache line: pad it
/// (crossbeam's `CachePadded`) where it would share a line with other hot data; leave it
/// compact in a table of many.
///
/// ```
/// use std::sync::Arc;
/// use tollgate::{Color, Meter, Nanos, SharedMeter};
///
/// let m = Arc::new(SharedMeter::new("srtcm cir=1Mbit/s cbs=3000 ebs=3000".parse()?));
/// let threads: Vec<_> = (0..2)
///     .map(|_| {
///         let m = Arc::clone(&m);
///         std::thread::spawn(move || (0..4).filter(|_| m.check(Nanos::ZERO, 1_000) == Color::Green).count())
///     })
///     .collect();
/// let green: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
/// assert_eq!(green, 3); // C holds 3,000 bytes: three of the eight 1,000-byte packets
/// # Ok::<(), tollgate::ParseError>(())
/// ```
pub struct SharedMeter {
    meter: Meter,
    state: AtomicPair,
}

impl fmt::Debug for SharedMeter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedMeter").field("meter", &self.meter).field("state", &self.state).finish()
    }
}

impl SharedMeter {
    /// Both buckets full.
    pub fn new(meter: Meter) -> SharedMeter {
        SharedMeter { meter, state: AtomicPair::new([0; 2]) }
    }

    /// The profile.
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// Whether this machine commits the two buckets without a lock.
    pub fn is_lock_free() -> bool {
        AtomicPair::is_lock_free()
    }

    /// Colour-blind: as [`MeterState::check`].
    #[inline]
    pub fn check(&self, elapsed: Nanos, bytes: u64) -> Color {
        self.commit(self.meter.ticks(elapsed), bytes, None)
    }

    /// Colour-aware: as [`MeterState::check_aware`].
    #[inline]
    pub fn check_aware(&self, elapsed: Nanos, bytes: u64, input: Color) -> Color {
        self.commit(self.meter.ticks(elapsed), bytes, Some(input))
    }

    /// The bytes each bucket holds at `elapsed`: (committed, second).
    pub fn levels(&self, elapsed: Nanos) -> (u64, u64) {
        // Relaxed: the words are self-contained (see `commit`).
        self.meter.levels(&MeterState { full: self.state.load(Relaxed) }, elapsed)
    }

    /// The compare-and-swap loop (`keyed/shared_meters.rs`'s `commit`, which says its
    /// orderings).
    #[inline]
    fn commit(&self, ticks: [u64; 2], bytes: u64, input: Option<Color>) -> Color {
        crate::keyed::shared_commit(&self.meter, &self.state, ticks, bytes, input)
    }
}

impl fmt::Display for Meter {
    /// The string form [`FromStr`] reads: `"srtcm cir=12500000B/s cbs=16384B ebs=32768B"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (r2, s2) = match self.kind {
            MeterKind::SrTcm => ("", "ebs"),
            MeterKind::TrTcm => ("pir", "pbs"),
            MeterKind::Rfc4115 => ("eir", "ebs"),
        };
        write!(f, "{} cir={}B/s cbs={}B", self.kind.name(), self.committed.rate, self.committed.size)?;
        if !r2.is_empty() {
            write!(f, " {r2}={}B/s", self.second.rate)?;
        }
        write!(f, " {s2}={}B", self.second.size)
    }
}

/// A rate in bytes per second: `"100Mbit/s"`, `"12500000B/s"`, `"10MB/s"`, `"8kbit/s"` (whole
/// numbers only: not `"1.5Gbit/s"`). Bit rates must be whole bytes per second.
fn parse_rate(what: &'static str, text: &str) -> Result<u64, ParseError> {
    let bad = || ParseError::BadNumber { what, number: text.to_owned() };
    let per_second =
        text.strip_suffix("/s").ok_or_else(|| ParseError::BadMeterUnit { what, value: text.to_owned() })?;
    let split = per_second.find(|c: char| !c.is_ascii_digit()).unwrap_or(per_second.len());
    let (digits, unit) = per_second.split_at(split);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let (scale, bits) = match unit {
        "B" | "Bps" => (1, false),
        "kB" => (1_000, false),
        "MB" => (1_000_000, false),
        "GB" => (1_000_000_000, false),
        "KiB" => (1 << 10, false),
        "MiB" => (1 << 20, false),
        "GiB" => (1 << 30, false),
        "bit" | "b" => (1, true),
        "kbit" | "Kbit" => (1_000, true),
        "Mbit" => (1_000_000, true),
        "Gbit" => (1_000_000_000, true),
        "Tbit" => (1_000_000_000_000, true),
        _ => return Err(ParseError::BadMeterUnit { what, value: text.to_owned() }),
    };
    let scaled = n.checked_mul(scale).ok_or_else(bad)?;
    if bits {
        if scaled % 8 != 0 {
            return Err(ParseError::BadMeterUnit { what, value: text.to_owned() });
        }
        Ok(scaled / 8)
    } else {
        Ok(scaled)
    }
}

/// A size in bytes: `"16KiB"`, `"2048"`, `"2048B"`, `"1MB"`, `"64kB"`, `"1TiB"`.
fn parse_size(what: &'static str, text: &str) -> Result<u64, ParseError> {
    let bad = || ParseError::BadNumber { what, number: text.to_owned() };
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let scale: u64 = match unit {
        "" | "B" => 1,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return Err(ParseError::BadMeterUnit { what, value: text.to_owned() }),
    };
    n.checked_mul(scale).ok_or_else(bad)
}

impl FromStr for Meter {
    type Err = ParseError;

    /// `"srtcm cir=100Mbit/s cbs=16KiB ebs=32KiB"`, `"trtcm cir=… cbs=… pir=… pbs=…"`,
    /// `"rfc4115 cir=… cbs=… eir=… ebs=…"`: rates in bit/s or B/s (k, M, G, T: powers of 1000;
    /// KiB, MiB, GiB: of 1024), sizes in bytes, each option once, in any order.
    fn from_str(text: &str) -> Result<Meter, ParseError> {
        let mut words = text.split_whitespace();
        let name = words.next().ok_or(ParseError::Empty)?;
        let (kind, wanted): (MeterKind, [&'static str; 4]) = match name {
            "srtcm" => (MeterKind::SrTcm, ["cir", "cbs", "ebs", ""]),
            "trtcm" => (MeterKind::TrTcm, ["cir", "cbs", "pir", "pbs"]),
            "rfc4115" => (MeterKind::Rfc4115, ["cir", "cbs", "eir", "ebs"]),
            _ => return Err(ParseError::UnknownMeter { meter: name.to_owned() }),
        };
        let algorithm = kind.name();
        let mut values: [Option<u64>; 4] = [None; 4];
        for word in words {
            let (option, value) = word.split_once('=').unwrap_or((word, ""));
            let Some(i) = wanted.iter().position(|w| !w.is_empty() && *w == option) else {
                return Err(ParseError::UnknownOption { option: option.to_owned(), algorithm });
            };
            if values[i].is_some() {
                return Err(ParseError::DuplicateOption { option: option.to_owned() });
            }
            let what = wanted[i];
            values[i] =
                Some(if what.ends_with("ir") { parse_rate(what, value)? } else { parse_size(what, value)? });
        }
        let get = |i: usize| values[i].ok_or(ParseError::MissingOption { option: wanted[i], algorithm });
        Ok(match kind {
            MeterKind::SrTcm => Meter::srtcm(get(0)?, get(1)?, get(2)?)?,
            MeterKind::TrTcm => Meter::trtcm(get(0)?, get(1)?, get(2)?, get(3)?)?,
            MeterKind::Rfc4115 => Meter::rfc4115(get(0)?, get(1)?, get(2)?, get(3)?)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn parses_the_three_forms_and_says_what_is_wrong() {
        let m: Meter = "srtcm cir=100Mbit/s cbs=16KiB ebs=32KiB".parse().unwrap();
        assert_eq!(
            (m.kind(), m.committed(), m.second()),
            (MeterKind::SrTcm, (12_500_000, 16_384), (12_500_000, 32_768))
        );
        let m: Meter = "trtcm pbs=4096 pir=69000000B/s cbs=2048 cir=46000000B/s".parse().unwrap();
        assert_eq!((m.committed(), m.second()), ((46_000_000, 2_048), (69_000_000, 4_096)));
        let m: Meter = "rfc4115 cir=1Gbit/s cbs=1MB eir=0B/s ebs=0".parse().unwrap();
        assert_eq!((m.committed(), m.second()), ((125_000_000, 1_000_000), (0, 0)));
        assert_eq!(m.to_string().parse::<Meter>().unwrap(), m);
        for (text, want) in [
            ("", "empty"),
            ("srtcm cir=1Mbit/s cbs=1KiB", "needs the option `ebs=`"),
            ("srtcm cir=1Mbit/s cbs=1KiB ebs=1 pir=2", "unknown option `pir`"),
            ("srtcm cir=1Mbit/s cir=2Mbit/s cbs=1 ebs=1", "given twice"),
            ("srtcm cir=1Mbit cbs=1 ebs=1", "`1Mbit`"),
            ("srtcm cir=1furlong/s cbs=1 ebs=1", "`1furlong/s`"),
            ("srtcm cir=1bit/s cbs=1 ebs=1", "`1bit/s`"),
            ("srtcm cir=0B/s cbs=1 ebs=1", "cir"),
            ("srtcm cir=1B/s cbs=0 ebs=1", "cbs"),
            ("trtcm cir=1B/s cbs=1 pir=0B/s pbs=1", "pir"),
            ("srtcm cir=2Tbit/s cbs=1 ebs=1", "exceeds"),
            ("meter cir=1B/s", "unknown meter `meter`"),
            ("srtcm cir=100Mbps cbs=1 ebs=1", "`100Mbps`"),
            ("rfc4115 cir=1B/s cbs=1 eir=0B/s ebs=5", "ebs (with eir 0)"),
            ("srtcm cir=1B/s cbs=99999999999999999999 ebs=1", "`99999999999999999999`"),
        ] {
            let e = text.parse::<Meter>().unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    /// RFC 2697 by hand: CIR 1,000 B/s, CBS 1,500, EBS 3,000.
    #[test]
    fn srtcm_by_hand() {
        let m = Meter::srtcm(1_000, 1_500, 3_000).unwrap();
        let mut s = MeterState::new();
        let at = |ms: u64| Nanos::new(ms * MS);
        assert_eq!(s.check(&m, at(0), 1_500), Color::Green); // C empties
        assert_eq!(s.check(&m, at(0), 1), Color::Yellow); // E: 2,999 left
        assert_eq!(s.check(&m, at(0), 3_000), Color::Red); // more than E holds
        assert_eq!(s.check(&m, at(0), 2_999), Color::Yellow); // E empties
        assert_eq!(s.check(&m, at(0), 1), Color::Red);
        // 1.499 s later C holds 1,499 bytes (whole bytes, one a ms): 1,500 is not green yet.
        assert_eq!(s.check(&m, at(1_499), 1_500), Color::Red);
        assert_eq!(s.check(&m, at(1_500), 1_500), Color::Green);
        // E fills only once C is full: 1.5 s to fill C, then 1 byte of E a ms.
        assert_eq!(m.levels(&s, at(3_000)), (1_500, 0));
        assert_eq!(m.levels(&s, at(3_010)), (1_500, 10));
        assert_eq!(m.levels(&s, at(9_000)), (1_500, 3_000));
        // Colour-aware: a yellow packet never takes from C, a red one is red.
        assert_eq!(s.check_aware(&m, at(9_000), 100, Color::Yellow), Color::Yellow);
        assert_eq!(m.levels(&s, at(9_000)), (1_500, 2_900));
        assert_eq!(s.check_aware(&m, at(9_000), 1, Color::Red), Color::Red);
        assert_eq!(s.check_aware(&m, at(9_000), 1_500, Color::Green), Color::Green);
        // A green packet with C short falls to E when its colour allows.
        assert_eq!(s.check_aware(&m, at(9_000), 10, Color::Green), Color::Yellow);
        // A green packet empties C part way: E's deficit waits for C to refill first.
        assert_eq!(m.levels(&s, at(9_000)), (0, 2_890));
        assert_eq!(m.levels(&s, at(10_500)), (1_500, 2_890));
        assert_eq!(m.levels(&s, at(10_610)), (1_500, 3_000));
    }

    /// RFC 2698 by hand: CIR 1,000 B/s, CBS 1,000; PIR 2,000 B/s, PBS 2,000.
    #[test]
    fn trtcm_by_hand() {
        let m = Meter::trtcm(1_000, 1_000, 2_000, 2_000).unwrap();
        let mut s = MeterState::new();
        let at = |ms: u64| Nanos::new(ms * MS);
        assert_eq!(s.check(&m, at(0), 1_000), Color::Green); // both: C 0, P 1,000
        assert_eq!(s.check(&m, at(0), 1_000), Color::Yellow); // P only: P 0
        assert_eq!(s.check(&m, at(0), 1), Color::Red);
        assert_eq!(m.levels(&s, at(250)), (250, 500));
        assert_eq!(s.check(&m, at(250), 400), Color::Yellow); // C short, P enough: P 100
        assert_eq!(s.check(&m, at(250), 200), Color::Red); // P short, whatever C holds
        assert_eq!(s.check(&m, at(250), 100), Color::Green); // C 250, P 100: C 150, P 0
        assert_eq!(s.check(&m, at(250), 1), Color::Red);
        assert_eq!(s.check_aware(&m, at(5_000), 10, Color::Yellow), Color::Yellow);
        assert_eq!(s.check_aware(&m, at(5_000), 10, Color::Red), Color::Red);
        assert_eq!(m.levels(&s, at(5_000)), (1_000, 1_990));
    }

    /// RFC 4115 by hand: CIR 1,000 B/s, CBS 1,000; EIR 500 B/s, EBS 500, independent.
    #[test]
    fn rfc4115_by_hand() {
        let m = Meter::rfc4115(1_000, 1_000, 500, 500).unwrap();
        let mut s = MeterState::new();
        let at = |ms: u64| Nanos::new(ms * MS);
        assert_eq!(s.check(&m, at(0), 1_000), Color::Green);
        assert_eq!(s.check(&m, at(0), 500), Color::Yellow);
        assert_eq!(s.check(&m, at(0), 1), Color::Red);
        // Independent: E refills while C is not full.
        assert_eq!(m.levels(&s, at(100)), (100, 50));
        assert_eq!(s.check_aware(&m, at(100), 50, Color::Yellow), Color::Yellow);
        assert_eq!(s.check_aware(&m, at(100), 100, Color::Green), Color::Green);
        assert_eq!(s.check_aware(&m, at(100), 1, Color::Green), Color::Red);
        // No yellow at all with an empty E.
        let no_e = Meter::rfc4115(1_000, 1_000, 0, 0).unwrap();
        assert!(Meter::rfc4115(1_000, 1_000, 0, 1).is_err(), "an E that never refills");
        assert_eq!("srtcm cir=1B/s cbs=1TiB ebs=0".parse::<Meter>().unwrap().committed().1, Meter::MAX_SIZE);
        let mut s = MeterState::new();
        assert_eq!(s.check(&no_e, at(0), 1_000), Color::Green);
        assert_eq!(s.check(&no_e, at(0), 1), Color::Red);
        assert_eq!(s.check(&no_e, at(1_000_000), 1), Color::Green);
    }

    /// DPDK's `app/test/test_meter.c` boundaries: CIR 46,000,000 B/s, CBS 2,048, EBS/PBS 4,096,
    /// PIR/EIR 69,000,000; packets of CBS ± 1 and EBS ± 1 on fresh flows.
    #[test]
    fn dpdks_boundaries() {
        let sr = Meter::srtcm(46_000_000, 2_048, 4_096).unwrap();
        let tr = Meter::trtcm(46_000_000, 2_048, 69_000_000, 4_096).unwrap();
        let rfc = Meter::rfc4115(46_000_000, 2_048, 69_000_000, 4_096).unwrap();
        let fresh = |m: &Meter, bytes: u64| MeterState::new().check(m, Nanos::ZERO, bytes);
        let aware = |m: &Meter, bytes: u64, c: Color| MeterState::new().check_aware(m, Nanos::ZERO, bytes, c);
        for (m, cbs, second) in [(&sr, 2_048, 4_096), (&tr, 2_048, 4_096), (&rfc, 2_048, 4_096)] {
            assert_eq!(fresh(m, cbs - 1), Color::Green, "{m}");
            assert_eq!(fresh(m, cbs), Color::Green, "{m}");
            assert_eq!(fresh(m, cbs + 1), Color::Yellow, "{m}");
            assert_eq!(fresh(m, second), Color::Yellow, "{m}");
            assert_eq!(fresh(m, second + 1), Color::Red, "{m}");
            assert_eq!(aware(m, cbs - 1, Color::Yellow), Color::Yellow, "{m}");
            assert_eq!(aware(m, cbs - 1, Color::Red), Color::Red, "{m}");
            assert_eq!(aware(m, second + 1, Color::Green), Color::Red, "{m}");
        }
    }

    #[test]
    fn a_clock_that_steps_back_refills_nothing() {
        let m = Meter::trtcm(1_000, 1_000, 2_000, 2_000).unwrap();
        let mut s = MeterState::new();
        assert_eq!(s.check(&m, Nanos::new(10_000 * MS), 2_000), Color::Yellow);
        assert_eq!(s.check(&m, Nanos::new(5_000 * MS), 1), Color::Red);
        assert_eq!(s.check(&m, Nanos::ZERO, 1), Color::Red);
        assert_eq!(s.check(&m, Nanos::new(10_001 * MS), 2), Color::Green);
    }

    /// The branch-free decision equals the branching one on every state decisions leave,
    /// for every kind, blind and aware, at ticks that never go back.
    #[test]
    fn the_flat_decision_is_the_decision() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // The fastest rate's ticks end (are held) at 2^26 s.
        let end = 67_108_864_000_000_000u64;
        for round in 0..400 {
            // The last hundred rounds: the largest rates and buckets, up to and past the end.
            let big = round >= 300;
            let (r1, r2, s1, s2) = if big {
                let near = |max: u64, x: u64| max - x % 1_000;
                (
                    near(Meter::MAX_RATE, next()),
                    near(Meter::MAX_RATE, next()),
                    near(Meter::MAX_SIZE, next()),
                    near(Meter::MAX_SIZE, next()),
                )
            } else {
                (1 + next() % 100_000, 1 + next() % 100_000, 1 + next() % 20_000, next() % 20_000)
            };
            let m = match round % 3 {
                0 => Meter::srtcm(r1, s1, s2).unwrap(),
                1 => Meter::trtcm(r1, s1, r2, s2.max(1)).unwrap(),
                _ => Meter::rfc4115(r1, s1, r2, s2).unwrap(),
            };
            let (mut a, mut b) = (MeterState::new(), MeterState::new());
            let mut t = if big { end - next() % 100_000 } else { 0 };
            for step in 0..400 {
                t += if big { next() % 1_000 } else { next() % 3_000_000 };
                let ticks = m.ticks(Nanos::new(t));
                // Often a bucket's level exactly, or one byte either side of it.
                let (lc, l2) = m.levels(&a, Nanos::new(t));
                let edge = [lc, l2][(next() % 2) as usize] + next() % 3;
                let bytes = match next() % 8 {
                    0 => 0,
                    1 => u32::MAX,
                    2..=4 => u32::try_from(edge.saturating_sub(1)).unwrap_or(u32::MAX),
                    _ => (next() % 25_000) as u32,
                };
                let input =
                    [None, Some(Color::Green), Some(Color::Yellow), Some(Color::Red)][(next() % 4) as usize];
                let want = a.check_at(&m, ticks, u64::from(bytes), input);
                let (next_words, got) = match m.kind() {
                    MeterKind::SrTcm => m.decide_flat::<SRTCM>(b.words(), ticks, bytes, input),
                    MeterKind::TrTcm => m.decide_flat::<TRTCM>(b.words(), ticks, bytes, input),
                    MeterKind::Rfc4115 => m.decide_flat::<RFC4115>(b.words(), ticks, bytes, input),
                };
                b = MeterState::from_words(next_words);
                assert_eq!((got, b), (want, a), "{m}, step {step}, {bytes} bytes, {input:?}");
            }
        }
    }

    /// The 64-bit byte-ticks equal the 128-bit `⌊elapsed · rate / 10^9⌋` (held at `MAX_TICK`),
    /// at the ends of both ranges and between.
    #[test]
    fn ticks_are_the_exact_quotient() {
        let exact = |e: u64, r: u64| {
            let k = (u128::from(e) * u128::from(r) / 1_000_000_000).min(u128::from(MAX_TICK));
            u64::try_from(k).unwrap()
        };
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut rates = vec![1, 2, 999_999_999, 1_000_000_000, 1_000_000_001, 12_500_000, Meter::MAX_RATE];
        let mut times =
            vec![0, 1, 999_999_999, 1_000_000_000, 1_000_000_001, u64::MAX, u64::MAX - 1, 1 << 63];
        for _ in 0..200 {
            rates.push(1 + next() % Meter::MAX_RATE);
            times.push(next() >> (next() % 64));
        }
        // Around the end of the ticks, for the fastest rate: 2^63 / 2^37 s = 2^26 s.
        let end = 67_108_864_000_000_000u64;
        times.extend([end - 1, end, end + 1]);
        for &r in &rates {
            let b = Bucket { rate: r, size: 1 };
            for &e in &times {
                assert_eq!(b.tick(Nanos::new(e)), exact(e, r), "rate {r}, elapsed {e}");
            }
        }
    }

    #[test]
    fn the_fastest_rate_and_largest_buckets_stay_exact() {
        let m = Meter::trtcm(Meter::MAX_RATE, Meter::MAX_SIZE, Meter::MAX_RATE, Meter::MAX_SIZE).unwrap();
        let mut s = MeterState::new();
        assert_eq!(s.check(&m, Nanos::ZERO, Meter::MAX_SIZE), Color::Green);
        assert_eq!(s.check(&m, Nanos::ZERO, 1), Color::Red);
        // 1 ns credits ⌊2^37 / 10^9⌋ = 137 bytes.
        assert_eq!(m.levels(&s, Nanos::new(1)), (137, 137));
        // Past the ticks' end the clock stands still: nothing refills, nothing overflows.
        let late = Nanos::new(u64::MAX);
        let mut s = MeterState::new();
        assert_eq!(s.check(&m, late, Meter::MAX_SIZE), Color::Green);
        assert_eq!(s.check(&m, late, 1), Color::Red);
    }
}
