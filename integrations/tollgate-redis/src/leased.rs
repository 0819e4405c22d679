//! Leased mode: tokens taken from the shared bucket in batches, spent locally.

use std::time::Duration;

use tollgate::Decision;

use crate::lease_table::{nanos, Grant, LeaseTable};
use crate::limiter::{Answer, RedisLimiter};
use crate::Error;

/// A [`RedisLimiter`] that takes tokens from the shared bucket in batches (*leases*), one
/// round trip per batch, and spends them locally: most decisions cost an atomic operation
/// instead of a round trip.
///
/// # Guarantees
///
/// - **Never over-admits against the shared bucket**: every token spent was taken from Redis,
///   by the same exact script as round-trip mode, before it was spent. Over a run that starts
///   with a full bucket, the fleet admits at most `burst + floor(rate·t)` on the server's clock.
/// - A lease lives for the lease TTL (default 50 ms) from just before it was requested; unspent
///   tokens then lapse (counted as *stranded*). A token is spent by a CAS at an instant after
///   its lease was granted and before it lapsed, so tokens spent in any window `[a, b]` were
///   taken from Redis within `[a − ttl, b]`: at most `burst + rate·(b − a + ttl)`.
/// - The cost is **stranded tokens**: taken from Redis but never spent. At any instant they are
///   at most the sum of the outstanding leases, at most `instances × keys in use × max_lease`;
///   under steady demand they are much less (see BENCHMARKS.md). Also stranded: the few tokens
///   left in a live lease when a request needs more than it holds (the next lease covers the
///   request), and a lease Redis granted whose reply came after the timeout or after the
///   caller's future was dropped (taken, never known to this instance: not counted).
/// - A local decision reports the tokens left in the lease as `remaining`, and the shared
///   bucket's reset-after as of the lease: this instance's view, not the fleet's.
///
/// # Lease size
///
/// Adapts per key to the local demand: a lease spent before it lapses doubles the next one (up
/// to `max_lease`, by default a tenth of the burst but at least half of it up to 8: see
/// [`LeasedLimiter::default_max_lease`]), a lease that lapses with tokens left halves
/// it (down to 1). When Redis has fewer tokens than asked, the lease takes what there is; when
/// it has fewer than the request needs, the request is refused with the shared bucket's exact
/// retry-after.
#[derive(Debug)]
pub struct LeasedLimiter {
    redis: RedisLimiter,
    table: LeaseTable,
    ttl: Duration,
    max_lease: u64,
}

/// What a [`LeasedLimiter`] did; [`RedisLimiter::stats`] (through
/// [`LeasedLimiter::redis`]) counts its round trips and failures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseStats {
    /// Decisions served from a lease, without a round trip.
    pub local: u64,
    /// Leases granted by Redis.
    pub leases: u64,
    /// Tokens those leases took from the shared bucket.
    pub leased_tokens: u64,
    /// Tokens that lapsed unspent (taken from Redis, never admitted).
    pub stranded_tokens: u64,
    /// Tokens in leases still outstanding: they may yet be spent, or strand.
    pub outstanding_tokens: u64,
    /// Decisions made by a plain round trip: the lease table was full, or other instances
    /// kept taking the shared bucket's last tokens first.
    pub unleased: u64,
    /// Tokens those decisions admitted. Every token admitted is accounted for:
    /// `admitted = leased_tokens − stranded_tokens − outstanding_tokens + unleased_tokens`.
    pub unleased_tokens: u64,
}

impl LeasedLimiter {
    /// Leased mode over `redis`: leases live `ttl` (default 50 ms) and hold at most `max_lease`
    /// tokens (default [`default_max_lease`](LeasedLimiter::default_max_lease) of the burst);
    /// at most `max_keys` keys hold a lease at once (default 65,536; beyond it, plain round
    /// trips).
    pub fn new(redis: RedisLimiter) -> LeasedLimiter {
        let burst = redis.quota().burst();
        LeasedLimiter {
            redis,
            table: LeaseTable::new(),
            ttl: Duration::from_millis(50),
            max_lease: LeasedLimiter::default_max_lease(burst),
        }
    }

    /// How long a lease's tokens may be spent (see the type's guarantees).
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The largest lease by default for a bucket of `burst` tokens: a tenth of the burst, but
    /// at least half of it up to 8 tokens, and at least 1:
    ///
    /// | burst | 1 | 2 | 4 | 10 | 16 | 100 | 1,000 |
    /// |---|---|---|---|---|---|---|---|
    /// | largest lease | 1 | 1 | 2 | 5 | 8 | 10 | 100 |
    ///
    /// The trade: a lease of `L` tokens serves up to `L − 1` of every `L` decisions without a
    /// round trip, and can strand up to `L` tokens (taken from the shared bucket, refused to
    /// every other instance until they refill) when demand stops. A tenth of the burst keeps
    /// the stranded share small where bursts are large; at small bursts a tenth is one token,
    /// so every decision would be a round trip and the mode would be a slower round trip
    /// mode. Half the burst, up to 8, lets two instances hold leases at once and serves at
    /// least half of a busy key's decisions locally from a burst of 4 up. The adaptation
    /// (doubling while leases are spent, halving when one lapses) keeps quiet keys at
    /// smaller leases whatever the cap. Set your own with [`max_lease`](LeasedLimiter::max_lease).
    pub const fn default_max_lease(burst: u64) -> u64 {
        let tenth = burst / 10;
        let half_up_to_8 = if burst / 2 < 8 { burst / 2 } else { 8 };
        let lease = if tenth > half_up_to_8 { tenth } else { half_up_to_8 };
        if lease == 0 {
            1
        } else {
            lease
        }
    }

    /// The largest lease, in tokens (at most the burst).
    pub fn max_lease(mut self, tokens: u64) -> Self {
        self.max_lease = tokens.clamp(1, self.redis.quota().burst());
        self
    }

    /// The most keys holding a lease at once.
    pub fn max_keys(mut self, keys: usize) -> Self {
        self.table.set_max_keys(keys);
        self
    }

    /// The round-trip limiter underneath.
    pub fn redis(&self) -> &RedisLimiter {
        &self.redis
    }

    /// What the leases did so far.
    pub fn stats(&self) -> LeaseStats {
        self.table.stats()
    }

    /// One token for `key`.
    pub async fn check(&self, key: impl AsRef<[u8]>) -> Result<Decision, Error> {
        self.check_n(key, 1).await
    }

    /// `n` tokens for `key`: from the key's lease when it has them, else from a new lease
    /// (one round trip). `n = 0` and `n > burst` go to Redis as in round-trip mode.
    pub async fn check_n(&self, key: impl AsRef<[u8]>, n: u64) -> Result<Decision, Error> {
        let key = key.as_ref();
        let burst = self.redis.quota().burst();
        if n == 0 || n > burst {
            return self.redis.check_n(key, n).await;
        }
        let Some(lease) = self.table.lease(key) else {
            return self.unleased(key, n).await;
        };
        if let Some(d) = self.table.spend(&lease, n) {
            return Ok(d);
        }
        let _refilling = lease.refill.lock().await;
        // Another caller may have refilled while this one waited.
        if let Some(d) = self.table.spend(&lease, n) {
            return Ok(d);
        }
        // End the old generation: what is left of it (lapsed, or fewer than `n`) strands. A
        // lease spent before it lapsed doubles the next; one that lapsed unspent halves it.
        let (ended, size) = self.table.end(&lease, self.max_lease);
        let mut want = size.max(n).min(burst);
        let mut tries = 0;
        // The lease lives from before its request: its tokens were taken at or after `sent`.
        let sent = self.table.now();
        let (granted, decision) = loop {
            let answer = self.redis.decide_raw(key, want, true, None, n).await?;
            match answer {
                Answer::Policy(d) => return Ok(d),
                Answer::Redis { decision, .. } if decision.is_allowed() => break (want, decision),
                Answer::Redis { stamp, now: clock, decision } => {
                    // Fewer than `want` left: take what there is, if it covers the request;
                    // if not, the request's own refusal at that instant (its exact wait).
                    let q = self.redis.quota();
                    let there = q.peek_stored(stamp, clock, 0).map_or(0, |d| d.remaining());
                    if there < n {
                        return Ok(q.peek_stored(stamp, clock, n).unwrap_or(decision));
                    }
                    tries += 1;
                    if tries == 3 {
                        // Others keep taking the tokens first: decide this request alone.
                        return self.unleased(key, n).await;
                    }
                    want = there;
                }
            }
        };
        // A local decision reports the lease's tokens alone, and the shared bucket's reset as of
        // the lease.
        let reset_at = sent.saturating_add(nanos(decision.reset_after()));
        let expires = sent.saturating_add(nanos(self.ttl));
        self.table.grant(
            &lease,
            ended,
            Grant { taken: granted, units: granted - n, expires, reset_at, shared_left: 0 },
        );
        Ok(Decision::allowed(u32::try_from(granted - n).unwrap_or(u32::MAX), decision.reset_after()))
    }

    /// `n` tokens for `key` in one round trip, without a lease.
    async fn unleased(&self, key: &[u8], n: u64) -> Result<Decision, Error> {
        let d = self.redis.check_n(key, n).await?;
        self.table.unleased(if d.is_allowed() { n } else { 0 });
        Ok(d)
    }
}
