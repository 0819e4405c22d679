//! Leased windows: units taken from shared fixed windows in batches, spent locally.

use std::sync::Arc;
use std::time::Duration;

use tollgate::Decision;

use crate::lease_table::{nanos, Grant, Lease, LeaseTable};
use crate::lease_word::Ended;
use crate::windows::{refuse_repeats, Check, RedisWindows, WindowCheck};
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
    table: LeaseTable,
    ttl: Duration,
}

impl LeasedWindows {
    /// Leases over `windows`: each lives at most `ttl` (default 50 ms) and no longer than its
    /// window; at most `max_keys` keys hold a lease at once (default 65,536; beyond it, plain
    /// round trips).
    pub fn new(windows: RedisWindows) -> LeasedWindows {
        LeasedWindows { windows, table: LeaseTable::new(), ttl: Duration::from_millis(50) }
    }

    /// How long a lease's units may be spent, at most (its window's end comes first if sooner).
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The most keys holding a lease at once.
    pub fn max_keys(mut self, keys: usize) -> Self {
        self.table.set_max_keys(keys);
        self
    }

    /// The windows underneath (their [`stats`](RedisWindows::stats) count the round trips).
    pub fn windows(&self) -> &RedisWindows {
        &self.windows
    }

    /// What the leases did so far (in units: `leased_tokens` are units taken by leases).
    pub fn stats(&self) -> LeaseStats {
        self.table.stats()
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
        refuse_repeats(checks.iter().map(Check::key))?;
        let mut out: Vec<Option<Decision>> = vec![None; checks.len()];
        let mut leases: Vec<Option<Arc<Lease>>> = vec![None; checks.len()];
        for (i, c) in checks.iter().enumerate() {
            let Some(c) = leasable(c) else { continue };
            let Some(lease) = self.table.lease(c.key) else { continue };
            match self.table.spend(&lease, c.n) {
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
            if let Some(d) = self.table.spend(lease, n) {
                out[i] = Some(d);
            }
        }
        let wanted: Vec<usize> = (0..checks.len()).filter(|&i| out[i].is_none()).collect();
        if wanted.is_empty() {
            return Ok(out.into_iter().map(|d| d.expect("every check decided")).collect());
        }
        // End each refilled lease's generation (what is left of it strands) and size the next.
        let mut ended: Vec<Option<Ended>> = vec![None; checks.len()];
        let mut batch = Vec::with_capacity(wanted.len());
        for &i in &wanted {
            let (c, lease) = match (&checks[i], &leases[i]) {
                (Check::Window(c), Some(lease)) => (c, lease),
                // A window check without a lease (the table full, or a window that counts
                // refusals) takes exactly its units: sent with its `up_to`, the script would
                // lease units nobody spends.
                (Check::Window(c), None) => {
                    batch.push(Check::Window(WindowCheck { up_to: 0, ..*c }));
                    continue;
                }
                (c, None) => {
                    batch.push(*c);
                    continue;
                }
                (_, Some(_)) => unreachable!("only window checks lease"),
            };
            let (e, size) = self.table.end(lease, c.up_to);
            ended[i] = Some(e);
            let up_to = size.max(c.n);
            batch.push(Check::Window(WindowCheck { up_to, ..*c }));
        }
        // A lease lives from before it was asked for: its units were taken at or after `sent`.
        let sent = self.table.now();
        let taken = self.windows.decide_all(&batch).await?;
        for (&i, t) in wanted.iter().zip(taken) {
            let (Check::Window(c), Some(lease), Some(e)) = (&checks[i], &leases[i], ended[i]) else {
                self.table.unleased(t.units);
                out[i] = Some(t.decision);
                continue;
            };
            if !t.decision.is_allowed() {
                out[i] = Some(t.decision);
                continue;
            }
            // The lease lapses at its TTL or when its window ends, whichever is sooner; a local
            // decision reports the window's end and what Redis had left plus the lease's.
            let to_end = nanos(t.decision.reset_after());
            let left = t.units - c.n;
            let expires = sent.saturating_add(to_end.min(nanos(self.ttl)));
            let reset_at = sent.saturating_add(to_end);
            let shared_left = t.decision.remaining();
            self.table.grant(lease, e, Grant { taken: t.units, units: left, expires, reset_at, shared_left });
            let remaining = t.decision.remaining().saturating_add(left);
            out[i] = Some(Decision::allowed(
                u32::try_from(remaining).unwrap_or(u32::MAX),
                t.decision.reset_after(),
            ));
        }
        drop(guards);
        Ok(out.into_iter().map(|d| d.expect("every check decided")).collect())
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
