//! Decision counters (`src/engine/counters.rs`): a thread counts in a slot it owns with a plain
//! load and store, and hands the slot on through the registry's mutex when it exits. The model
//! drives the registry and the slots as the thread-locals do: two threads that each take a
//! slot, count and give it back (so that, in some interleavings, the second takes the slot the
//! first gave back), and a third that counts in the shared slot with atomic adds, while the
//! main thread reads. No count is lost in any interleaving, and a snapshot never shows more
//! than was counted. Checked against the mutation that gives the slot back before the
//! thread's last count (two writers at once): the model fails it ("every count kept").

#![cfg(tollgate_loom)]

use loom::sync::Arc;
use loom::thread;
use tollgate::{Counters, Outcome, SlotRegistry};

use loom_tests::model;

#[test]
fn a_slot_handed_on_loses_no_count() {
    model(|| {
        let registry = Arc::new(SlotRegistry::new());
        let counters = Arc::new(Counters::new());
        let owner = |outcomes: &'static [Outcome]| {
            let (registry, counters) = (Arc::clone(&registry), Arc::clone(&counters));
            thread::spawn(move || {
                let slot = registry.acquire();
                assert!(slot.is_some(), "two threads, two slots (under loom)");
                for &o in outcomes {
                    counters.loom_record_in(slot, o);
                }
                registry.release(slot.unwrap());
            })
        };
        let a = owner(&[Outcome::Allowed, Outcome::Denied]);
        let b = owner(&[Outcome::Allowed]);
        let shared = {
            let counters = Arc::clone(&counters);
            thread::spawn(move || counters.loom_record_in(None, Outcome::Allowed))
        };
        let seen = counters.snapshot();
        assert!(seen.allowed <= 3 && seen.denied <= 1, "{seen:?}");
        a.join().unwrap();
        b.join().unwrap();
        shared.join().unwrap();
        let all = counters.snapshot();
        assert_eq!((all.allowed, all.denied), (3, 1), "every count kept");
        // Both slots are free again, whichever order they came back in.
        let (x, y) = (registry.acquire(), registry.acquire());
        assert!(x.is_some() && y.is_some() && x != y);
    });
}
