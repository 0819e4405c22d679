//! The most each algorithm may admit over a span of clock readings, for the fault and soak
//! tests: one limiter of every algorithm, direct and keyed, behind one interface.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use tollgate::{
    Algorithm, Decision, Direct, FixedWindow, Keyed, KeyedAlgorithm, KeyedBuilder, ManualClock, Nanos, Nginx,
    SlidingLog, SlidingWindow, TokenBucket, WhenFull,
};

/// A limiter of one algorithm, direct or keyed by `u64`, decided at explicit instants.
pub trait Subject: Send + Sync {
    fn check_at(&self, key: u64, at: Nanos) -> Decision;
    /// Keys evicted so far (clean and forced), 0 for a direct limiter.
    fn evictions(&self) -> u64 {
        0
    }
    /// How long after its creation the limiter's time runs, where it says.
    fn lifetime(&self) -> Option<Nanos> {
        None
    }
}

impl<A: Algorithm + Send + Sync> Subject for Direct<A, ManualClock> {
    fn check_at(&self, _: u64, at: Nanos) -> Decision {
        Direct::check_at(self, at)
    }
}

impl<A: KeyedAlgorithm + Send + Sync> Subject for Keyed<A, u64, ManualClock>
where
    Keyed<A, u64, ManualClock>: Send + Sync,
{
    fn check_at(&self, key: u64, at: Nanos) -> Decision {
        Keyed::check_at(self, &key, at)
    }

    fn evictions(&self) -> u64 {
        let s = self.stats();
        s.evictions + s.forced_evictions
    }

    fn lifetime(&self) -> Option<Nanos> {
        Some(Keyed::lifetime(self))
    }
}

/// One algorithm at "`limit` per `window`" and the most it admits per key over a span.
pub struct Algo {
    pub name: &'static str,
    /// Requests per window, and the window in ns.
    limit: u64,
    window: u64,
    /// Admissions beyond `limit` per window the algorithm allows at once (a bucket's burst
    /// above its rate), or 0 for the windows, which allow `limit` per (partial) window.
    burst: u64,
    windowed: bool,
    build: fn(u64, Duration) -> Config,
}

/// An algorithm's configuration, built.
pub enum Config {
    Bucket(TokenBucket),
    Nginx(Nginx),
    Fixed(FixedWindow),
    Sliding(SlidingWindow),
    Log(SlidingLog),
}

impl Algo {
    /// Every algorithm at 20 per `window`: the bucket and nginx with a burst of 5.
    pub fn all(window: Duration) -> Vec<Algo> {
        let algo = |name, burst, windowed, build| Algo {
            name,
            limit: 20,
            window: u64::try_from(window.as_nanos()).unwrap(),
            burst,
            windowed,
            build,
        };
        vec![
            algo("token bucket", 5, false, |l, w| {
                Config::Bucket(TokenBucket::new(tollgate::Rate::per(l, w), 5).unwrap())
            }),
            algo("nginx", 6, false, |l, w| {
                // nginx's rate is per second or per minute: `limit` per `window` as per second,
                // with the window one second long in every caller.
                assert_eq!(w, Duration::from_secs(1));
                Config::Nginx(format!("{l}r/s burst=5 nodelay").parse().unwrap())
            }),
            algo("fixed window", 0, true, |l, w| Config::Fixed(FixedWindow::new(l, w).unwrap())),
            algo("sliding window", 0, true, |l, w| Config::Sliding(SlidingWindow::new(l, w).unwrap())),
            algo("sliding log", 0, true, |l, w| Config::Log(SlidingLog::new(l, w).unwrap())),
        ]
    }

    /// The most one key may be admitted over readings spanning `span` ns: `burst +
    /// floor(limit · span / window)` for the buckets, `limit` for each window the span
    /// touches for the windows (the sliding ones admit at most `limit` per fixed window too).
    pub fn bound(&self, span: u64) -> u128 {
        let per = u128::from(span) * u128::from(self.limit) / u128::from(self.window);
        if self.windowed {
            (u128::from(span) / u128::from(self.window) + 2) * u128::from(self.limit)
        } else {
            u128::from(self.burst) + per
        }
    }

    pub fn direct(&self, clock: &ManualClock) -> Box<dyn Subject> {
        let c = clock.clone();
        match (self.build)(self.limit, Duration::from_nanos(self.window)) {
            Config::Bucket(q) => Box::new(Direct::with_clock(q, c)),
            Config::Nginx(q) => Box::new(Direct::with_clock(q, c)),
            Config::Fixed(q) => Box::new(Direct::with_clock(q, c)),
            Config::Sliding(q) => Box::new(Direct::with_clock(q, c)),
            Config::Log(q) => Box::new(Direct::with_clock(q, c)),
        }
    }

    pub fn keyed(&self, clock: &ManualClock, capacity: usize, when_full: WhenFull) -> Box<dyn Subject> {
        fn build<A: KeyedAlgorithm + Send + Sync + 'static>(
            q: A,
            clock: &ManualClock,
            capacity: usize,
            when_full: WhenFull,
        ) -> Box<dyn Subject>
        where
            Keyed<A, u64, ManualClock>: Send + Sync,
        {
            let b = KeyedBuilder::<A, u64>::new(q).capacity(capacity).when_full(when_full);
            Box::new(b.build_with_clock(clock.clone()).unwrap())
        }
        match (self.build)(self.limit, Duration::from_nanos(self.window)) {
            Config::Bucket(q) => build(q, clock, capacity, when_full),
            Config::Nginx(q) => build(q, clock, capacity, when_full),
            Config::Fixed(q) => build(q, clock, capacity, when_full),
            Config::Sliding(q) => build(q, clock, capacity, when_full),
            Config::Log(q) => build(q, clock, capacity, when_full),
        }
    }
}
