//! Waiting until an instant on a limiter's clock: on a thread (a sleep for the bulk, a spin for
//! the end) or on tokio's timer, cancel-safely. Whatever is waited for (a reservation, a
//! pacer's slot) is the caller's; only its due instant is read here.

use core::time::Duration;

use crate::{Clock, Nanos};

/// The last stretch of a wait that [`sleep_until`] spins instead of sleeping: a sleep
/// overshoots by the timer slack (50 µs by default on Linux) and the scheduler's latency.
const SPIN_NANOS: u64 = 100_000;

/// Blocks until `clock` reads `due` or later: sleeps until [`SPIN_NANOS`] before it, then spins.
pub(crate) fn sleep_until<C: Clock + ?Sized>(clock: &C, due: Nanos) {
    loop {
        let now = clock.now();
        if now >= due {
            return;
        }
        let left = due.as_u64() - now.as_u64();
        if left > SPIN_NANOS {
            std::thread::sleep(Duration::from_nanos(left - SPIN_NANOS));
        } else {
            core::hint::spin_loop();
        }
    }
}

/// Waits on tokio's timer until `clock` reads `due`, and returns `due`; `held` (a reservation
/// due then) goes to `cancel` if the future is dropped before (cancel-safety, for direct and
/// keyed waits alike), and is dropped unused once due.
#[cfg(feature = "tokio")]
pub(crate) async fn wait_until_due<C: Clock + ?Sized, R>(
    clock: &C,
    due: Nanos,
    held: R,
    cancel: impl FnOnce(R),
) -> Nanos {
    let mut pending = CancelOnDrop { cancel: Some(cancel), held: Some(held) };
    loop {
        let now = clock.now();
        if now >= due {
            break;
        }
        // tokio sleeps at least this long (rounded up to its timer's millisecond); the loop
        // covers a limiter clock that runs behind tokio's.
        tokio::time::sleep(Duration::from_nanos(due.as_u64() - now.as_u64())).await;
    }
    // Due: what was held is the caller's now; nothing to give back.
    pending.held = None;
    due
}

/// Hands what it holds to `cancel` when dropped, unless it was used: what makes the waits
/// cancel-safe.
#[cfg(feature = "tokio")]
struct CancelOnDrop<R, F: FnOnce(R)> {
    cancel: Option<F>,
    held: Option<R>,
}

#[cfg(feature = "tokio")]
impl<R, F: FnOnce(R)> Drop for CancelOnDrop<R, F> {
    fn drop(&mut self) {
        if let (Some(held), Some(cancel)) = (self.held.take(), self.cancel.take()) {
            cancel(held);
        }
    }
}
