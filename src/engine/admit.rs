//! Multi-limit admission: one request checked against several limits, all or nothing, with
//! nginx's semantics for several `limit_req` in one location.
//!
//! Lock-free by charging in order and refunding on failure: each limit is charged with its own
//! CAS loop; when one refuses, the ones already charged get their units back, most recent
//! first. Between a charge and its refund another request can see the units as spent and be
//! refused: a request that is itself refused can, for an instant, crowd out another. It can
//! never let one in that the limits would not admit on their own.

use core::fmt;

use crate::{Decision, Nanos, Outcome};

/// What [`Admit::charge`] took, for [`Admit::refund`]. Opaque, and neither `Clone` nor `Copy`:
/// a refund consumes it, so nothing is refunded twice. It names the limit (and key) that issued
/// it; any other limit ignores it.
#[derive(Debug, PartialEq, Eq)]
pub struct Receipt {
    /// The issuing limiter's identity (`sync::next_id`).
    owner: u64,
    /// The key's placement hash, for one key of a keyed limiter; 0 otherwise.
    key: u64,
    /// What each limit needs to give the units back (see each `charge`).
    a: u64,
    b: u64,
    c: u64,
    /// The units taken.
    n: u64,
}

impl Receipt {
    pub(crate) const fn new(owner: u64, key: u64, [a, b, c]: [u64; 3], n: u64) -> Receipt {
        Receipt { owner, key, a, b, c, n }
    }

    /// The receipt's fields, if `owner` and `key` issued it.
    pub(crate) fn take(self, owner: u64, key: u64) -> Option<([u64; 3], u64)> {
        (self.owner == owner && self.key == key).then_some(([self.a, self.b, self.c], self.n))
    }
}

/// A limit that can take part in [`check_all`]: it can take units and give them back.
///
/// Implemented by [`Limiter`](crate::Limiter), by every [`Direct`](crate::Direct) limiter ([`NginxLimiter`],
/// [`FixedWindowLimiter`], [`SlidingWindowLimiter`]), by
/// [`SlidingLogLimiter`](crate::SlidingLogLimiter), and by one key of a
/// [`KeyedLimiter`](crate::KeyedLimiter) ([`KeyedLimiter::limit`](crate::KeyedLimiter::limit));
/// and by a reference, a `Box` or an `Arc` to any of them (or to a `dyn Admit`), which forward
/// every method.
///
/// The trait's methods are named apart from the limiters' own of other signatures
/// (`peek_n(n)` is the limiters' `peek_n(n)`, and no limiter has a method named `charge` or
/// `refund`), so that, with the trait in scope, a call through a `Box` or an `Arc` (whose
/// `Admit` methods method lookup finds before the limiter's) still means what it says:
/// `arc.peek()` is the limiter's one-token peek, `arc.peek_n(n)` the same as the limiter's.
///
/// [`NginxLimiter`]: crate::NginxLimiter
/// [`FixedWindowLimiter`]: crate::FixedWindowLimiter
/// [`SlidingWindowLimiter`]: crate::SlidingWindowLimiter
pub trait Admit {
    /// Takes `n` units now, as a plain `check_n` would; when it took them, also the receipt
    /// that gives them back.
    fn charge(&self, n: u64) -> (Decision, Option<Receipt>);

    /// Gives back the units of `receipt`, as far as they are still owed; a receipt this limit
    /// did not issue is ignored. Never leaves the limit admitting more than it would had the
    /// charge not happened; at the charge's own instant it gives back everything (where a
    /// limit cannot tell, it gives back nothing: see each implementation).
    ///
    /// Refunds assume a clock that is monotone and shared by the threads that decide on the
    /// limit (the TSC, the coarse clock and `StdClock` are): no decision the refund could
    /// overwrite may be dated after the refund's own clock reading. A `ManualClock` set back
    /// between a charge and its refund, a `*_at` decision dated in the future, or TSCs that are
    /// not synchronized across cores (a skew δ), can let a token bucket refund up to that much
    /// time's worth of units that later decisions were already told were spent.
    ///
    /// Refunds of one token bucket (one shard of a keyed table) run one at a time; a refund
    /// that finds another in progress gives nothing back rather than wait, so under heavy
    /// refusal on one bucket some refused requests keep their charge (an error toward refusal).
    fn refund(&self, receipt: Receipt);

    /// What `n` units would get now, taking nothing (the limiters' own `peek_n`).
    fn peek_n(&self, n: u64) -> Decision;
}

/// A limit behind a reference, a `Box` or an `Arc` is the limit itself: every method forwards,
/// so a receipt the owner issued is refunded through any of them. Owned limiters (an
/// `Arc<Limiter>` shared with other threads, a `Box<dyn Admit>` of a list built at run time)
/// then join [`check_all`] as they are: `&[&arc, &boxed]`.
macro_rules! forward_admit {
    ($($pointer:ty),*) => {$(
        impl<T: Admit + ?Sized> Admit for $pointer {
            #[inline]
            fn charge(&self, n: u64) -> (Decision, Option<Receipt>) {
                (**self).charge(n)
            }

            #[inline]
            fn refund(&self, receipt: Receipt) {
                (**self).refund(receipt)
            }

            #[inline]
            fn peek_n(&self, n: u64) -> Decision {
                (**self).peek_n(n)
            }
        }
    )*};
}

forward_admit!(&T, Box<T>, std::sync::Arc<T>);

impl fmt::Debug for dyn Admit + '_ {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("dyn Admit")
    }
}

/// Admits `n` units against every limit in `limits`, all or nothing, as nginx does for several
/// `limit_req` in one location.
///
/// The limits are charged in order. If every one admits, the request is admitted and every
/// limit keeps its charge; the answer is the **largest delay** of them
/// ([`Outcome::Delayed`] if any delays), the **fewest remaining**, and the **latest reset**.
/// If one refuses, the limits charged before it get their units back (most recent first) and
/// the limits after it are not charged: **nothing is spent**. The answer is then that refusal,
/// with `retry_after` the **longest** any limit would ask for the same request (each of the
/// others is peeked, taking nothing), or `None` if any can never admit it.
///
/// No lock, no allocation: the recursion is one frame per limit. An empty slice admits.
///
/// ```
/// use tollgate::{check_all, Admit, Limiter, ManualClock, NginxLimiter, Nginx, TokenBucket};
///
/// let per_client = Limiter::with_clock(TokenBucket::per_second(2)?, ManualClock::new());
/// let per_server = NginxLimiter::with_clock(Nginx::per_second(1)?.burst(5)?, ManualClock::new());
/// let limits: [&dyn Admit; 2] = [&per_client, &per_server];
/// assert!(check_all(&limits, 1).is_allowed());
/// assert!(check_all(&limits, 1).is_allowed()); // delayed 1 s by the server's limit
/// let refused = check_all(&limits, 1); // the client's bucket is empty
/// assert!(!refused.is_allowed());
/// // Nothing was spent on the server's limit by the refused request:
/// assert_eq!(per_server.peek_n(1).delay().as_secs(), 2);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub fn check_all(limits: &[&dyn Admit], n: u64) -> Decision {
    match admit(limits, n) {
        Ok(d) => d,
        Err((i, refused)) => longest_wait(limits, i, refused, n),
    }
}

/// Charges `limits` in order; on a refusal at `i`, refunds the ones before it and returns
/// `(i, refusal)`.
fn admit(limits: &[&dyn Admit], n: u64) -> Result<Decision, (usize, Decision)> {
    let Some((first, rest)) = limits.split_first() else {
        return Ok(Decision::from_nanos(Outcome::Allowed, u32::MAX, Nanos::ZERO, Nanos::ZERO));
    };
    let (d, receipt) = first.charge(n);
    let Some(receipt) = receipt else {
        return if d.is_allowed() && rest.is_empty() {
            Ok(d) // n = 0, or an untracked admission: nothing to give back
        } else if d.is_allowed() {
            admit(rest, n).map(|others| d.merge(&others)).map_err(|(i, r)| (i + 1, r))
        } else {
            Err((0, d))
        };
    };
    if rest.is_empty() {
        return Ok(d);
    }
    match admit(rest, n) {
        Ok(others) => Ok(d.merge(&others)),
        Err((i, refused)) => {
            first.refund(receipt);
            Err((i + 1, refused))
        }
    }
}

/// The refusal from limit `i`, with the longest wait any limit asks for.
fn longest_wait(limits: &[&dyn Admit], i: usize, refused: Decision, n: u64) -> Decision {
    let mut retry = refused.retry_after_nanos();
    for (j, l) in limits.iter().enumerate() {
        if j == i || retry.is_none() {
            continue;
        }
        let d = l.peek_n(n);
        retry = match (retry, d.retry_after_nanos()) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
    }
    refused.with_retry(retry)
}
