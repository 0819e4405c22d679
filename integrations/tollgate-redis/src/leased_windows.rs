//! Leased windows: units taken from shared fixed windows in batches, spent locally.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate::Decision;

use crate::lease_word::{Ended, LeaseWord};
use crate::windows::{Check, RedisWindows, WindowCheck};
use crate::{Error, LeaseStats};

/// [`RedisWindows`] whose hot keys take their window's units in batches (*leases*), one round
/// trip per batch, and spend them locally: most checks of a busy key cost an atomic operation
/// instead of a round trip.
///
/// A window check leases when its [`up_to`](WindowCheck::up_to) is above its `n` (the largest
/// lease, in units) and its window does not count refused units; the others (token buckets
/// among them) go to Redis as with [`RedisWindows::decide_all`]. A batch's checks that no
/// lease covers go in one [`decide_all`](RedisWindows::decide_all) call, refills included.
///
/// # Guarantees
///
/// - **A window never admits more than its limit, fleet-wide**: every unit spent was taken
///   from the window in Redis, by the window's script, before it was spent, and a lease lapses
///   no later than the window it was taken from ends (its expiry is the instant just before
///   the lease was asked for plus the server's time to the window's end, or plus the lease
///   TTL, whichever is sooner; the local monotonic clock against the server's, up to their
///   drift over one TTL).
/// - The cost is **stranded units**: taken from the window but never spent, because the lease
///   lapsed (its TTL, or the window's end) or a check needed more than it held. They are at
///   most the outstanding leases, `instances × hot keys × largest lease`, and under steady
///   demand far fewer ([`LeaseStats`] counts them).
/// - A local decision reports as `remaining` what the window had left in Redis when the lease
///   was granted plus what the lease still holds (this instance's view, not the fleet's), and
///   the time to the window's end.
///
/// # Lease size
///
/// Per key, adapted to the local demand as [`LeasedLimiter`](crate::LeasedLimiter)'s: the
/// first lease is 1 unit, a lease spent before it lapsed doubles the next (up to `up_to`), a
/// lease that lapsed with units left halves it. A lease takes what the window has when it has
/// fewer than asked (and at least the check's `n`); when it has fewer than `n`, the check is
/// refused with the window's exact answer.
#[derive(Debug)]
pub struct LeasedWindows {
    windows: RedisWindows,
    leases: Mutex<HashMap<Vec<u8>, Arc<Lease>>>,
    ttl: Duration,
    max_keys: usize,
    start: Instant,
    counters: Counters,
}

#[derive(Debug, Default)]
struct Counters {
    local: AtomicU64,
    leases: AtomicU64,
    leased: AtomicU64,
    stranded: AtomicU64,
    unleased: AtomicU64,
    unleased_units: AtomicU64,
}

/// One key's lease.
#[derive(Debug)]
struct Lease {
    /// The generation, its units and expiries: the lock-free part (`lease_word.rs`).
    word: LeaseWord,
    /// The next lease's size.
    size: AtomicU64,
    /// What the window had left in Redis just after the lease was taken.
    shared_left: AtomicU64,
    /// When the window ends, on this instance's clock (ns since `start`).
    window_end: AtomicU64,
    /// One refill at a time per key; the others wait for it and spend from it.
    refill: tokio::sync::Mutex<()>,
}

impl LeasedWindows {
    /// Leases over `windows`: each lives at most `ttl` (default 50 ms) and no longer than its
    /// window; at most `max_keys` keys hold a lease at once (default 65,536; beyond it, plain
    /// round trips).
    pub fn new(windows: RedisWindows) -> LeasedWindows {
        LeasedWindows {
            windows,
            leases: Mutex::new(HashMap::new()),
            ttl: Duration::from_millis(50),
            max_keys: 1 << 16,
            start: Instant::now(),
            counters: Counters::default(),
        }
    }

    /// How long a lease's units may be spent, at most (its window's end comes first if sooner).
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The most keys holding a lease at once.
    pub fn max_keys(mut self, keys: usize) -> Self {
        self.max_keys = keys.max(1);
        self
    }

    /// The windows underneath (their [`stats`](RedisWindows::stats) count the round trips).
    pub fn windows(&self) -> &RedisWindows {
        &self.windows
    }

    /// What the leases did so far (in units: `leased_tokens` are units taken by leases).
    pub fn stats(&self) -> LeaseStats {
        let c = &self.counters;
        let now = self.now();
        let (mut outstanding, mut lapsed) = (0u64, 0u64);
        for l in self.leases.lock().unwrap_or_else(std::sync::PoisonError::into_inner).values() {
            match l.word.current(now) {
                (units, false) => outstanding = outstanding.saturating_add(units),
                (units, true) => lapsed = lapsed.saturating_add(units),
            }
        }
        LeaseStats {
            local: c.local.load(Relaxed),
            leases: c.leases.load(Relaxed),
            leased_tokens: c.leased.load(Relaxed),
            stranded_tokens: c.stranded.load(Relaxed).saturating_add(lapsed),
            outstanding_tokens: outstanding,
            unleased: c.unleased.load(Relaxed),
            unleased_tokens: c.unleased_units.load(Relaxed),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Decides every window check of `checks`: from its key's lease when it has the units,
    /// else in one [`decide_all`](RedisWindows::decide_all) call for all the others
    /// (refills included); the decisions in the checks' order. A batch naming one key twice
    /// is refused before anything is sent.
    pub async fn check_all(&self, checks: &[WindowCheck<'_>]) -> Result<Vec<Decision>, Error> {
        let checks: Vec<Check<'_>> = checks.iter().map(|&c| Check::Window(c)).collect();
        self.decide_all(&checks).await
    }

    /// [`check_all`](LeasedWindows::check_all) for windows and token buckets together (a
    /// bucket never leases).
    pub async fn decide_all(&self, checks: &[Check<'_>]) -> Result<Vec<Decision>, Error> {
        let mut sorted: Vec<&[u8]> = checks.iter().map(Check::key).collect();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::Batch {
                reason: format!("the key {:?} is named twice in one batch", String::from_utf8_lossy(w[0])),
            });
        }
        let mut out: Vec<Option<Decision>> = vec![None; checks.len()];
        let mut leases: Vec<Option<Arc<Lease>>> = vec![None; checks.len()];
        for (i, c) in checks.iter().enumerate() {
            let Some(c) = leasable(c) else { continue };
            let Some(lease) = self.lease(c.key) else { continue };
            match self.spend(&lease, c.n) {
                Some(d) => out[i] = Some(d),
                None => leases[i] = Some(lease),
            }
        }
        // One refill at a time per key: the refill locks are taken in key order (no two
        // batches wait on each other), and a check whose lease another batch refilled
        // meanwhile spends from it.
        let mut order: Vec<usize> = (0..checks.len()).filter(|&i| leases[i].is_some()).collect();
        order.sort_unstable_by_key(|&i| checks[i].key());
        let mut guards = Vec::with_capacity(order.len());
        for &i in &order {
            let lease = leases[i].as_ref().expect("filtered above");
            guards.push(lease.refill.lock().await);
            let n = leasable(&checks[i]).expect("only leasable checks have leases").n;
            if let Some(d) = self.spend(lease, n) {
                out[i] = Some(d);
            }
        }
        let wanted: Vec<usize> = (0..checks.len()).filter(|&i| out[i].is_none()).collect();
        if wanted.is_empty() {
            return Ok(out.into_iter().map(|d| d.expect("every check decided")).collect());
        }
        // End each refilled lease's generation (what is left of it strands) and size the next.
        let now = self.now();
        let mut ended: Vec<Option<Ended>> = vec![None; checks.len()];
        let mut batch = Vec::with_capacity(wanted.len());
        for &i in &wanted {
            let (c, lease) = match (&checks[i], &leases[i]) {
                (Check::Window(c), Some(lease)) => (c, lease),
                (c, _) => {
                    batch.push(*c);
                    continue;
                }
            };
            let e = lease.word.end(now);
            self.counters.stranded.fetch_add(e.left, Relaxed);
            let size = match lease.size.load(Relaxed) {
                0 => 1,
                s if !e.lapsed => s.saturating_mul(2).min(c.up_to),
                s if e.left > 0 => (s / 2).max(1),
                s => s,
            };
            lease.size.store(size, Relaxed);
            ended[i] = Some(e);
            let up_to = size.max(c.n);
            batch.push(Check::Window(WindowCheck { up_to, ..*c }));
        }
        // A lease lives from before it was asked for: its units were taken at or after `sent`.
        let sent = self.now();
        let taken = self.windows.decide_all(&batch).await?;
        for (&i, t) in wanted.iter().zip(taken) {
            let (Check::Window(c), Some(lease), Some(e)) = (&checks[i], &leases[i], ended[i]) else {
                self.counters.unleased.fetch_add(1, Relaxed);
                self.counters.unleased_units.fetch_add(t.units, Relaxed);
                out[i] = Some(t.decision);
                continue;
            };
            if !t.decision.is_allowed() {
                out[i] = Some(t.decision);
                continue;
            }
            let to_end = nanos(t.decision.reset_after());
            let left = t.units - c.n;
            self.counters.leases.fetch_add(1, Relaxed);
            self.counters.leased.fetch_add(t.units, Relaxed);
            lease.shared_left.store(t.decision.remaining(), Relaxed);
            lease.window_end.store(sent.saturating_add(to_end), Relaxed);
            lease.word.grant(e, left, sent.saturating_add(to_end.min(nanos(self.ttl))));
            let remaining = t.decision.remaining().saturating_add(left);
            out[i] = Some(Decision::allowed(
                u32::try_from(remaining).unwrap_or(u32::MAX),
                t.decision.reset_after(),
            ));
        }
        drop(guards);
        Ok(out.into_iter().map(|d| d.expect("every check decided")).collect())
    }

    /// `n` units from `lease`, if its current generation holds them and has not lapsed.
    fn spend(&self, lease: &Lease, n: u64) -> Option<Decision> {
        let (left, now) = lease.word.spend(n, || self.now())?;
        self.counters.local.fetch_add(1, Relaxed);
        let remaining = lease.shared_left.load(Relaxed).saturating_add(left);
        let to_end = lease.window_end.load(Relaxed).saturating_sub(now);
        Some(Decision::allowed(u32::try_from(remaining).unwrap_or(u32::MAX), Duration::from_nanos(to_end)))
    }

    /// `key`'s lease, made if there is room; `None` when the table is full of live leases.
    fn lease(&self, key: &[u8]) -> Option<Arc<Lease>> {
        let mut leases = self.leases.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(l) = leases.get(key) {
            return Some(Arc::clone(l));
        }
        if leases.len() >= self.max_keys {
            // Lapsed leases make room; their units strand.
            let now = self.now();
            let stranded = &self.counters.stranded;
            leases.retain(|_, l| {
                let (units, lapsed) = l.word.current(now);
                let live = !lapsed || Arc::strong_count(l) > 1;
                if !live {
                    stranded.fetch_add(units, Relaxed);
                }
                live
            });
            if leases.len() >= self.max_keys {
                return None;
            }
        }
        let lease = Arc::new(Lease {
            word: LeaseWord::new(),
            size: AtomicU64::new(0),
            shared_left: AtomicU64::new(0),
            window_end: AtomicU64::new(0),
            refill: tokio::sync::Mutex::new(()),
        });
        leases.insert(key.to_vec(), Arc::clone(&lease));
        Some(lease)
    }
}

/// The window check, if it may lease: a largest lease above its units, units to take, and a
/// window whose refusals take nothing (a counted refusal must reach Redis).
fn leasable<'c, 'a>(c: &'c Check<'a>) -> Option<&'c WindowCheck<'a>> {
    match c {
        Check::Window(w) if w.up_to > w.n && w.n > 0 && !w.window.charges_refusals() => Some(w),
        _ => None,
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
