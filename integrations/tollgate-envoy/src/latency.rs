//! The decision-latency histogram: every `ShouldRateLimit` decision's time counted in a bucket
//! (four a power of two, from 1 ns to 2^40 ns), each bucket one relaxed atomic add; a scrape
//! hands the samples since the last one to the `metrics` facade's histogram.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

/// Buckets: four per power of two of nanoseconds, up to 2^40 ns (18 minutes) and beyond.
const BUCKETS: usize = 4 * 40 + 1;

#[derive(Debug)]
pub(crate) struct Latency {
    counts: Box<[AtomicU64]>,
    /// What the last report handed over, per bucket.
    reported: Mutex<Vec<u64>>,
}

impl Default for Latency {
    fn default() -> Latency {
        Latency {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            reported: Mutex::new(vec![0; BUCKETS]),
        }
    }
}

/// The bucket of `ns`: 4·⌊log2 ns⌋ plus the two bits below the leading one.
fn bucket(ns: u64) -> usize {
    if ns < 4 {
        return usize::try_from(ns).unwrap_or(0);
    }
    let log = 63 - u64::from(ns.leading_zeros());
    let quarter = (ns >> (log - 2)) & 3;
    usize::try_from(4 * log + quarter).unwrap_or(BUCKETS).min(BUCKETS - 1)
}

/// A bucket's value in seconds: the middle of its range.
fn seconds(b: usize) -> f64 {
    if b < 4 {
        return b as f64 * 1e-9;
    }
    let (log, quarter) = (b / 4, b % 4);
    let low = (1u64 << log) as f64 * (1.0 + quarter as f64 / 4.0);
    (low + (1u64 << log) as f64 / 8.0) * 1e-9
}

impl Latency {
    pub(crate) fn record(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        // Relaxed: a statistic; the report reads each bucket on its own.
        self.counts[bucket(ns)].fetch_add(1, Relaxed);
    }

    /// The samples since the last report, into `ratelimit_service_decision_seconds`.
    pub(crate) fn report(&self) {
        let histogram = metrics::histogram!("ratelimit_service_decision_seconds");
        let mut reported = self.reported.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (b, (count, last)) in self.counts.iter().zip(reported.iter_mut()).enumerate() {
            let now = count.load(Relaxed);
            if now > *last {
                histogram.record_many(seconds(b), usize::try_from(now - *last).unwrap_or(usize::MAX));
                *last = now;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{bucket, seconds, BUCKETS};

    #[test]
    fn buckets_are_a_quarter_of_a_power_of_two_wide() {
        assert_eq!((bucket(0), bucket(3), bucket(4), bucket(5), bucket(7), bucket(8)), (0, 3, 8, 9, 11, 12));
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        for ns in [1_000u64, 50_000, 1_234_567, 999_999_999] {
            let s = seconds(bucket(ns)) * 1e9;
            assert!((s - ns as f64).abs() <= ns as f64 / 8.0, "{ns} ns in a bucket of {s}");
        }
    }
}
