//! The leased mode's lease word (`integrations/tollgate-redis/src/lease_word.rs`, compiled here
//! against loom's atomics): spenders racing a refill that ends a lapsed generation and grants
//! the next. Every token spent belongs to a generation that was live at the spender's clock
//! reading, and every generation's tokens are conserved (spent + stranded or left = granted).

#![cfg(tollgate_loom)]

#[allow(dead_code)]
#[path = "../../integrations/tollgate-redis/src/lease_word.rs"]
mod lease_word;

use lease_word::LeaseWord;
use loom::sync::atomic::{AtomicU64, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;
use loom_tests::model;

/// Generation 1 holds 2 tokens until the clock reads 10; the clock reads 0. A refiller moves the
/// clock to 20 (generation 1 has lapsed), ends generation 1 and grants generation 2 three tokens
/// until 30. Two spenders take one token each, reading the shared clock.
#[test]
fn spenders_racing_a_refill_take_only_live_tokens_of_the_generation_they_checked() {
    model(|| {
        let lease = Arc::new(LeaseWord::new());
        let ended = lease.end(0);
        lease.grant(ended, 2, 10);
        let clock = Arc::new(AtomicU64::new(0));

        let refiller = {
            let (lease, clock) = (Arc::clone(&lease), Arc::clone(&clock));
            thread::spawn(move || {
                clock.store(20, SeqCst);
                let ended = lease.end(20);
                assert!(ended.lapsed);
                lease.grant(ended, 3, 30);
                ended.left
            })
        };
        let spenders: Vec<_> = (0..2)
            .map(|_| {
                let (lease, clock) = (Arc::clone(&lease), Arc::clone(&clock));
                thread::spawn(move || lease.spend(1, || clock.load(SeqCst)))
            })
            .collect();
        let stranded = refiller.join().unwrap();
        let spent: Vec<u64> =
            spenders.into_iter().filter_map(|s| s.join().unwrap()).map(|(_, now)| now).collect();
        // A token spent at clock 0 is generation 1's (live until 10); at 20, generation 2's.
        let first = spent.iter().filter(|&&now| now == 0).count() as u64;
        let second = spent.iter().filter(|&&now| now == 20).count() as u64;
        assert_eq!(first + second, spent.len() as u64, "a spend at another instant: {spent:?}");
        assert_eq!(first + stranded, 2, "generation 1: spent {first}, stranded {stranded}");
        let (left, lapsed) = lease.current(20);
        assert!(!lapsed);
        assert_eq!(second + left, 3, "generation 2: spent {second}, left {left}");
    });
}

/// A spender that read its generation's expiry and then lost the CAS to a refill retries on
/// the new generation, and never takes more than a generation holds: two spenders of two
/// tokens each against a generation of three, with the refill granting one more.
#[test]
fn no_generation_gives_more_than_it_holds() {
    model(|| {
        let lease = Arc::new(LeaseWord::new());
        let ended = lease.end(0);
        lease.grant(ended, 3, 100);
        let refiller = {
            let lease = Arc::clone(&lease);
            thread::spawn(move || {
                let ended = lease.end(0);
                assert!(!ended.lapsed);
                lease.grant(ended, 1, 100);
                ended.left
            })
        };
        let spenders: Vec<_> = (0..2)
            .map(|_| {
                let lease = Arc::clone(&lease);
                thread::spawn(move || lease.spend(2, || 0).is_some())
            })
            .collect();
        let stranded = refiller.join().unwrap();
        let spent = spenders.into_iter().map(|s| u64::from(s.join().unwrap()) * 2).sum::<u64>();
        let (left, _) = lease.current(0);
        // Generation 2 holds 1 < 2: every spend came from generation 1.
        assert_eq!(left, 1);
        assert_eq!(spent + stranded, 3, "spent {spent}, stranded {stranded}");
    });
}
