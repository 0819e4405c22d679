//! Instructions per decision, counted by callgrind (which a shared, noisy host does not disturb,
//! where it moves wall time): a loop of one kind of decision, in a function of its own that
//! callgrind counts alone, divided by the iterations.
//!
//! ```sh
//! cargo build --release --example instructions
//! for s in keyed_allow keyed_deny verdict_allow verdict_deny coarse_allow nginx_allow \
//!     direct_allow direct_deny counted_allow counted_deny reserve_deny floor; do
//!     valgrind --tool=callgrind --toggle-collect="*${s%_*}_loop*" --callgrind-out-file=/dev/null \
//!         target/release/examples/instructions "$s" 20000 2>&1 | grep -o 'Collected : [0-9]*'
//! done    # divide each by 20000
//! ```
//!
//! Subjects: `keyed_allow` / `keyed_deny` (`KeyedLimiter<u64>::check` over 1,024 keys),
//! `verdict_*` (the same, read only by `is_allowed`: what the rest of the decision costs is
//! then never spent), `coarse_allow` (`keyed_allow` on the `CoarseClock`), `nginx_allow` (a
//! keyed nginx `limit_req`, as a policy's path), the
//! same for `direct_*` (`Limiter::check`), `counted_*` (`direct_*` with decision counters, the
//! metrics' source), `reserve_deny` (a refused `reserve_n(1)`), and
//! `floor` (a TSC read, an ahash of the key and a CAS on a slot: the keyed floor). Each loop
//! keeps its decision by reference (`black_box(&d)`), as the benchmark suite does: by value,
//! the copy itself costs a failed store forward no caller pays. The counts include the loop's
//! own few instructions.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tollgate::{
    Clock, CoarseClock, Keyed, KeyedLimiter, Limiter, Nginx, ReserveError, TokenBucket, TscClock,
};

/// Keys the keyed loops cycle through (a power of two: the index is one mask).
const KEYS: usize = 1024;

#[inline(never)]
fn keyed_loop(l: &KeyedLimiter<u64>, keys: &[u64], iters: usize) {
    for i in 0..iters {
        let d = l.check(&keys[i & (KEYS - 1)]);
        black_box(&d);
    }
}

/// A caller that reads only the verdict (`if l.check(&key).is_allowed()`): what the decision
/// costs when the rest of it is never asked for.
#[inline(never)]
fn verdict_loop(l: &KeyedLimiter<u64>, keys: &[u64], iters: usize) {
    for i in 0..iters {
        black_box(l.check(&keys[i & (KEYS - 1)]).is_allowed());
    }
}

#[inline(never)]
fn coarse_loop(l: &KeyedLimiter<u64, CoarseClock>, keys: &[u64], iters: usize) {
    for i in 0..iters {
        let d = l.check(&keys[i & (KEYS - 1)]);
        black_box(&d);
    }
}

#[inline(never)]
fn nginx_loop(l: &Keyed<Nginx, u64>, keys: &[u64], iters: usize) {
    for i in 0..iters {
        let d = l.check(&keys[i & (KEYS - 1)]);
        black_box(&d);
    }
}

#[inline(never)]
fn direct_loop(l: &Limiter, iters: usize) {
    for _ in 0..iters {
        let d = l.check();
        black_box(&d);
    }
}

/// `direct_loop` on a limiter with decision counters (the metrics' source).
#[inline(never)]
fn counted_loop(l: &Limiter, iters: usize) {
    // Not `direct_loop`'s body exactly, which the compiler would merge into one function.
    let l = black_box(l);
    for _ in 0..iters {
        let d = l.check();
        black_box(&d);
    }
}

#[inline(never)]
fn reserve_loop(l: &Limiter, iters: usize) {
    for _ in 0..iters {
        let wait = match l.reserve_n(1) {
            Ok(r) => r.delay(),
            Err(ReserveError::TooLate { wait, .. }) => wait,
            Err(_) => Duration::MAX,
        };
        black_box(&wait);
    }
}

#[inline(never)]
fn floor_loop(c: &TscClock, h: &ahash::RandomState, slots: &[AtomicU64], keys: &[u64], iters: usize) {
    for i in 0..iters {
        let now = c.now().as_u64();
        #[expect(clippy::cast_possible_truncation, reason = "masked to the slot count")]
        let w = &slots[h.hash_one(keys[i & (KEYS - 1)]) as usize & (slots.len() - 1)];
        let cur = w.load(Relaxed);
        let _ = black_box(w.compare_exchange(cur, cur.wrapping_add(now | 1), Relaxed, Relaxed));
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let which = args.get(1).map_or("keyed_allow", String::as_str);
    let iters: usize = args.get(2).map_or(Ok(20_000), |s| s.parse())?;
    let keys: Vec<u64> = (0..KEYS as u64).map(|k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
    // Never refused: a billion a second with a large burst. Always refused: one an hour, spent.
    let allowing = || TokenBucket::per_second(1_000_000_000).and_then(|q| q.with_burst(1 << 30));
    let refusing = || TokenBucket::per_hour(1);
    match which {
        "keyed_allow" | "keyed_deny" | "verdict_allow" | "verdict_deny" => {
            let allow = which.ends_with("allow");
            let l = KeyedLimiter::<u64>::builder(if allow { allowing()? } else { refusing()? }).capacity(4096).build()?;
            for k in &keys {
                let _ = l.check(k);
            }
            if which.starts_with("keyed") {
                keyed_loop(&l, &keys, iters);
            } else {
                verdict_loop(&l, &keys, iters);
            }
        }
        "coarse_allow" => {
            let l = KeyedLimiter::<u64>::builder(allowing()?).capacity(4096).build_with_clock(CoarseClock::new()?)?;
            for k in &keys {
                let _ = l.check(k);
            }
            coarse_loop(&l, &keys, iters);
        }
        "nginx_allow" => {
            // nginx `limit_req`, never refused: a billion a second, a burst of 16,776, nodelay.
            let p = Nginx::per_second(1_000_000_000)?.burst(16_776)?.nodelay();
            let l = Keyed::<_, u64>::builder(p).capacity(4096).build()?;
            for k in &keys {
                let _ = l.check(k);
            }
            nginx_loop(&l, &keys, iters);
        }
        "direct_allow" | "direct_deny" => {
            let l = Limiter::new(if which == "direct_allow" { allowing()? } else { refusing()? });
            let _ = l.check();
            direct_loop(&l, iters);
        }
        "counted_allow" | "counted_deny" => {
            let l = Limiter::new(if which == "counted_allow" { allowing()? } else { refusing()? }).with_counters();
            let _ = l.check();
            counted_loop(&l, iters);
        }
        "reserve_deny" => {
            let l = Limiter::new(refusing()?);
            let _ = l.reserve_n(1);
            reserve_loop(&l, iters);
        }
        "floor" => {
            let slots: Vec<AtomicU64> = (0..4096).map(|_| AtomicU64::new(0)).collect();
            floor_loop(&TscClock::new(), &ahash::RandomState::with_seeds(1, 2, 3, 4), &slots, &keys, iters);
        }
        other => return Err(format!("unknown subject {other:?}: keyed_allow, keyed_deny, verdict_allow, verdict_deny, coarse_allow, nginx_allow, direct_allow, direct_deny, reserve_deny, floor").into()),
    }
    Ok(())
}
