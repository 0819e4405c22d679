//! Whether anything consumes what a command replicates: a replica, a replication backlog (a
//! replica's partial resynchronisation reads it), or the AOF.
//!
//! Redis itself skips propagation when nothing would consume it (`shouldPropagate`: no
//! backlog, no replica, AOF off), but `RedisModule_Replicate` looks the command up by name and
//! builds its arguments before Redis can skip: a third of a pipelined `CL.THROTTLE`'s
//! instructions on a server without replicas or AOF. The module applies Redis's rule itself:
//!
//! - [`may_propagate`] is true from the start, and whenever one of the events that can bring a
//!   consumer fires: a fork (a replica's full synchronisation and an AOF rewrite both start
//!   with one, in Redis's main thread, and the event reaches the module before the next
//!   command runs), a replica's change, a role change, a persistence event;
//! - once a second a timer sets it to false only when `INFO` says there is no backlog, no
//!   replica and no AOF, and this server is a primary.
//!
//! A command run while it is false is in every later consumer's starting point: a replica's
//! full synchronisation starts from a snapshot forked after it (its backlog is created before
//! that fork, and partial resynchronisation needs a backlog that existed before), an AOF
//! rewrite from a snapshot forked after it.

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::raw;

/// Whether a command's effect must be replicated. Read and written only on Redis's main
/// thread (commands, events, timers), so `Relaxed` orders nothing with anything: the flag is a
/// plain flag kept in an atomic to be a `static`.
static MAY_PROPAGATE: AtomicBool = AtomicBool::new(true);

/// How often the timer asks `INFO` whether anything consumes replication.
const CHECK_MS: i64 = 1_000;

/// Whether a command must replicate its effect now.
pub fn may_propagate() -> bool {
    MAY_PROPAGATE.load(Ordering::Relaxed)
}

/// Subscribes to the events that can bring a consumer and starts the timer. When the server
/// cannot tell the module about one of them, the flag stays true for good.
pub fn start(ctx: *mut raw::RedisModuleCtx) {
    // SAFETY: the API table is written before the module's `init`, which calls this.
    let (subscribe, create_timer) =
        unsafe { (raw::RedisModule_SubscribeToServerEvent, raw::RedisModule_CreateTimer) };
    let (Some(subscribe), Some(create_timer)) = (subscribe, create_timer) else {
        return;
    };
    for id in [
        raw::REDISMODULE_EVENT_FORK_CHILD,
        raw::REDISMODULE_EVENT_REPLICA_CHANGE,
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
        raw::REDISMODULE_EVENT_PERSISTENCE,
    ] {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        // SAFETY: the context is `init`'s; the callback lives as long as the module.
        if unsafe { subscribe(ctx, event, Some(on_event)) } != raw::REDISMODULE_OK as c_int {
            return;
        }
    }
    // SAFETY: as above; the timer's data is unused.
    unsafe { create_timer(ctx, CHECK_MS, Some(on_timer), std::ptr::null_mut()) };
}

/// An event that can bring a consumer: replicate from now on.
extern "C" fn on_event(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _sub: u64,
    _data: *mut c_void,
) {
    MAY_PROPAGATE.store(true, Ordering::Relaxed);
}

/// The timer: asks `INFO` whether anything consumes replication, and runs again.
extern "C" fn on_timer(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    MAY_PROPAGATE.store(!nothing_consumes(ctx), Ordering::Relaxed);
    // SAFETY: the timer's context; the API table is written when the module loads.
    if let Some(create_timer) = unsafe { raw::RedisModule_CreateTimer } {
        // SAFETY: as above.
        unsafe { create_timer(ctx, CHECK_MS, Some(on_timer), std::ptr::null_mut()) };
    }
}

/// True only when `INFO` says: a primary, no replica, no replication backlog, AOF off. Any
/// field missing or unreadable is a consumer.
fn nothing_consumes(ctx: *mut raw::RedisModuleCtx) -> bool {
    let unsigned = |section: &std::ffi::CStr, fields: &[(&std::ffi::CStr, u64)], role: bool| -> bool {
        // SAFETY: the API table is written when the module loads; the context is the timer's;
        // the info data is freed before returning.
        unsafe {
            let (Some(get), Some(field), Some(field_c), Some(free)) = (
                raw::RedisModule_GetServerInfo,
                raw::RedisModule_ServerInfoGetFieldUnsigned,
                raw::RedisModule_ServerInfoGetFieldC,
                raw::RedisModule_FreeServerInfo,
            ) else {
                return false;
            };
            let info = get(ctx, section.as_ptr());
            if info.is_null() {
                return false;
            }
            let mut all = fields.iter().all(|&(name, want)| {
                let mut err: c_int = 0;
                let v = field(info, name.as_ptr(), &mut err);
                err == 0 && v == want
            });
            if role {
                let r = field_c(info, c"role".as_ptr());
                all &= !r.is_null() && std::ffi::CStr::from_ptr(r) == c"master";
            }
            free(ctx, info);
            all
        }
    };
    unsigned(c"replication", &[(c"repl_backlog_active", 0), (c"connected_slaves", 0)], true)
        && unsigned(c"persistence", &[(c"aof_enabled", 0)], false)
}
