//! tollgate's engine inside Redis: a module that answers redis-cell's `CL.THROTTLE` reply for
//! reply, and tollgate's own `TG.CHECK`, `TG.PEEK` and `TG.RESET`, each key's state a Redis
//! key of the module's type (`tollgates`): persisted in RDB and AOF, replicated, migrated
//! between Cluster slots, expired and deleted as any key.
//!
//! ```text
//! redis-server --loadmodule /path/to/libtollgate_redis_module.so
//! CL.THROTTLE key max_burst count period [quantity]   → limited, limit, remaining, retry_after, reset_after (s)
//! TG.CHECK key "10/s burst=20" [n]                    → allowed, limit, remaining, retry_after_ms, reset_after_ms
//! TG.PEEK key "10/s burst=20" [n]                     → the same, taking nothing
//! TG.RESET key                                        → 1 if a state was removed (the bucket is full again)
//! ```
//!
//! - Time is the server's clock. **Replication carries the effect**: a decision that takes
//!   tokens replicates `TG.RESTORE key tat meta PXAT ms` (the state it wrote and its absolute
//!   expiry), never the command, so a replica, a failover and an AOF replay hold the bucket the
//!   primary held, whatever their own clocks read.
//! - A key expires when its bucket is full again (its TAT): a missing key is a full bucket.
//! - A key of another type is a `WRONGTYPE` error naming what it holds; a string that holds
//!   redis-cell's state (its TAT, decimal nanoseconds) is read as that state, so that a key
//!   redis-cell wrote carries over when this module replaces it. Nothing panics inside Redis.

#![deny(unsafe_op_in_unsafe_fn)]
// The unit tests (of `state`) build without the module's entry point, which uses the rest.
#![cfg_attr(test, allow(dead_code, unused_imports))]

use std::cell::{Cell, RefCell};
use std::ffi::CString;
use std::os::raw::{c_int, c_void};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_module::native_types::RedisType;
use redis_module::raw::ModuleOptions;
use redis_module::{raw, redis_module, Context, RedisError, RedisString, Status};
use tollgate::{Decision, TokenBucket};

mod api;
mod replication;
pub mod state;

use api::{Args, Key, MAX_PXAT_MS};
use state::{Limit, State};

/// The module's type: one per key, 16 bytes (see [`State`]).
static TOLLGATE_TYPE: RedisType = RedisType::new(
    "tollgates",
    0,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        free: Some(free),
        mem_usage: Some(mem_usage),
        digest: None,
        aux_load: None,
        aux_save: None,
        aux_save2: None,
        aux_save_triggers: 0,
        free_effort: None,
        unlink: None,
        copy: Some(copy),
        defrag: None,
        copy2: None,
        free_effort2: None,
        mem_usage2: None,
        unlink2: None,
    },
);

/// # Safety
/// `value` is a `State` this module boxed (`set_value`, `rdb_load`, `copy`).
unsafe extern "C" fn free(value: *mut c_void) {
    // SAFETY: the caller's.
    drop(unsafe { Box::from_raw(value.cast::<State>()) });
}

unsafe extern "C" fn mem_usage(_value: *const c_void) -> usize {
    std::mem::size_of::<State>()
}

/// # Safety
/// `value` is a live `State`.
unsafe extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    // SAFETY: the caller's.
    let state = unsafe { *value.cast::<State>() };
    Box::into_raw(Box::new(state)).cast()
}

/// # Safety
/// `value` is a live `State`; `rdb` an RDB being written.
unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: the caller's.
    let state = unsafe { *value.cast::<State>() };
    raw::save_unsigned(rdb, state.tat_ns);
    raw::save_unsigned(rdb, state.meta);
}

/// # Safety
/// `rdb` an RDB being read.
unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    if encver != 0 {
        return std::ptr::null_mut();
    }
    let (Ok(tat_ns), Ok(meta)) = (raw::load_unsigned(rdb), raw::load_unsigned(rdb)) else {
        return std::ptr::null_mut();
    };
    match State::from_parts(tat_ns, meta) {
        Some(state) => Box::into_raw(Box::new(state)).cast(),
        None => std::ptr::null_mut(),
    }
}

/// # Safety
/// `value` is a live `State`; `aof` and `key` Redis's.
unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    // SAFETY: the caller's.
    let state = unsafe { *value.cast::<State>() };
    // Decimal text: a window's word reaches 2^63 and more, beyond a long long.
    let (Ok(cmd), Ok(fmt), Ok(tat), Ok(meta)) = (
        CString::new("TG.RESTORE"),
        CString::new("scc"),
        CString::new(state.tat_ns.to_string()),
        CString::new(state.meta.to_string()),
    ) else {
        return;
    };
    // SAFETY: the API table is written once, when the module loads, before any callback.
    if let Some(emit) = unsafe { raw::RedisModule_EmitAOF } {
        // SAFETY: the format names a RedisModuleString and two C strings, as passed. (The
        // key's expiry is rewritten by Redis itself.)
        unsafe { emit(aof, cmd.as_ptr(), fmt.as_ptr(), key, tat.as_ptr(), meta.as_ptr()) };
    }
}

/// Nanoseconds since the Unix epoch on the server's clock.
fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// An error reply of `message`, every character outside printable ASCII escaped (`\u{100}`):
/// the replies carry what clients sent (keys, arguments), and the module API aborts the server
/// on a reply holding a NUL, which a non-ASCII character can turn into.
fn error(message: String) -> RedisError {
    let mut out = String::with_capacity(message.len());
    for c in message.chars() {
        if c == ' ' || c.is_ascii_graphic() {
            out.push(c);
        } else {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        }
    }
    RedisError::String(out)
}

/// A non-negative decimal integer as Redis reads its own (digits only, no sign, no leading
/// zero but `0` itself).
fn strict_u64(a: &[u8]) -> Option<u64> {
    if a.is_empty() || a.len() > 20 || (a.len() > 1 && a[0] == b'0') {
        return None;
    }
    let mut v: u64 = 0;
    for &c in a {
        let digit = c.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(digit))?;
    }
    Some(v)
}

/// Argument `i` as a strict integer, or an error naming it.
fn int_arg(args: &Args, i: usize, name: &str) -> Result<u64, RedisError> {
    let a = args.bytes(i);
    strict_u64(a).ok_or_else(|| {
        let shown = String::from_utf8_lossy(&a[..a.len().min(32)]).into_owned();
        error(format!(
            "ERR {name} must be a non-negative integer (decimal digits, no sign, no leading zero), got '{shown}'"
        ))
    })
}

/// The longest key the commands take: 64 KiB (a limiter's key is a client's name, not data).
const MAX_KEY_BYTES: usize = 1 << 16;

/// Checks the key argument: not empty, at most [`MAX_KEY_BYTES`].
fn key_arg(args: &Args) -> Result<(), RedisError> {
    match args.bytes(1).len() {
        0 => Err(RedisError::Str("ERR the key must not be empty")),
        n if n > MAX_KEY_BYTES => Err(error(format!(
            "ERR the key is {n} bytes, more than the {MAX_KEY_BYTES} a limiter's key may have"
        ))),
        _ => Ok(()),
    }
}

/// `CL.THROTTLE`'s max_burst, count and period.
type ThrottleArgs = (u64, u64, u64);

thread_local! {
    /// The last `CL.THROTTLE` quota and its arguments: a client's calls repeat them, and the
    /// quota's construction (its divisions) costs more than the decision. Commands run on
    /// Redis's main thread.
    static LAST_QUOTA: Cell<Option<(ThrottleArgs, TokenBucket)>> = const { Cell::new(None) };
    /// The last `TG.*` limit and its text, for the same reason.
    static LAST_LIMIT: RefCell<(Vec<u8>, Option<Limit>)> = const { RefCell::new((Vec::new(), None)) };
}

/// `CL.THROTTLE key max_burst count period [quantity]`, as redis-cell answers it.
fn cl_throttle(ctx: *mut raw::RedisModuleCtx, args: &Args) -> Result<(), RedisError> {
    if !(5..=6).contains(&args.len()) {
        return Err(RedisError::WrongArity);
    }
    key_arg(args)?;
    let (max_burst, count, period) =
        (int_arg(args, 2, "max_burst")?, int_arg(args, 3, "count")?, int_arg(args, 4, "period")?);
    let quantity = if args.len() == 6 { int_arg(args, 5, "quantity")? } else { 1 };
    if count == 0 || period == 0 {
        return Err(RedisError::Str("ERR Zero rates are not supported"));
    }
    let quota = match LAST_QUOTA.get() {
        Some((last, quota)) if last == (max_burst, count, period) => quota,
        _ => {
            let quota =
                TokenBucket::redis_cell(max_burst, count, Duration::from_secs(period)).map_err(|e| {
                    error(format!("ERR max_burst {max_burst}, count {count}, period {period}s: {e}"))
                })?;
            LAST_QUOTA.set(Some(((max_burst, count, period), quota)));
            quota
        }
    };
    let d = decide_on_key(ctx, args.string(1), &Limit::Bucket(quota), quantity, true)?;
    let r = d.cl_throttle(&quota);
    let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    api::reply_integers(
        ctx,
        &[i64::from(r.limited), int(r.limit), int(r.remaining), r.retry_after, r.reset_after],
    );
    Ok(())
}

/// Decides `n` units of `limit` on the key `name` at the server's time (taking them when
/// `take`), on one handle: the key is read, and written only when the decision took
/// something, with its expiry, its replication and its signals.
fn decide_on_key(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    limit: &Limit,
    n: u64,
    take: bool,
) -> Result<Decision, RedisError> {
    let key = Key::open(ctx, name, take);
    let held = key.state()?;
    let now = now_ns();
    let (decision, next) = state::decide_limit(limit, held, now, n, take)
        .map_err(|state::Mismatch(why)| error(format!("WRONGTYPE {} {why}", key.shown())))?
        .ok_or(RedisError::Str("ERR the engine refused its clock (a bug: please report it)"))?;
    if let Some((next, expire_ns)) = next {
        if key.kind() == raw::KeyType::String {
            // redis-cell's value, read as this module's: replaced, on the replicas too.
            key.delete()?;
            key.replicate_delete();
        }
        key.store(next)?;
        // Whole ms, rounded up, and 1 ms more for Redis's millisecond clock: never early.
        let pxat_ms = expire_ns.div_ceil(1_000_000).saturating_add(1).min(MAX_PXAT_MS);
        key.expire_at(Some(pxat_ms), now / 1_000_000)?;
        key.replicate_state(next, pxat_ms);
        key.written(c"tg.take");
    }
    Ok(decision)
}

/// The limit of a `TG.*` specification (`"10/s burst=20"`, `"sliding 100/min"`), or an
/// error saying what is wrong.
fn parse_limit(bytes: &[u8]) -> Result<Limit, RedisError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| RedisError::Str("ERR the limit must be text, as \"10/s burst=20\""))?;
    let limit: Limit = text.parse().map_err(|e| error(format!("ERR {e}")))?;
    if let Limit::Bucket(q) = &limit {
        if q.initial() < q.burst() {
            return Err(error(format!(
                "ERR the limit '{text}' starts below its burst: a missing key is a full bucket here"
            )));
        }
    }
    Ok(limit)
}

/// The limit argument of a `TG.*` command: the last one's again when the text is the same.
fn limit_arg(args: &Args) -> Result<Limit, RedisError> {
    let bytes = args.bytes(2);
    LAST_LIMIT.with_borrow_mut(|(text, last)| match last {
        Some(limit) if text[..] == *bytes => Ok(*limit),
        _ => {
            let limit = parse_limit(bytes)?;
            text.clear();
            text.extend_from_slice(bytes);
            *last = Some(limit);
            Ok(limit)
        }
    })
}

/// `TG.CHECK` and `TG.PEEK`: `key spec [n]`.
fn tg_decide(ctx: *mut raw::RedisModuleCtx, args: &Args, take: bool) -> Result<(), RedisError> {
    if !(3..=4).contains(&args.len()) {
        return Err(RedisError::WrongArity);
    }
    key_arg(args)?;
    let limit = limit_arg(args)?;
    let n = if args.len() == 4 { int_arg(args, 3, "n")? } else { 1 };
    let d = decide_on_key(ctx, args.string(1), &limit, n, take)?;
    let ms = |ns: u64| i64::try_from(ns.div_ceil(1_000_000)).unwrap_or(i64::MAX);
    let retry = match d.retry_after_nanos() {
        Some(wait) if !d.is_allowed() => ms(wait.as_u64()),
        _ => -1,
    };
    api::reply_fields(
        ctx,
        &[
            ("allowed", i64::from(d.is_allowed())),
            ("limit", i64::try_from(limit.most_at_once()).unwrap_or(i64::MAX)),
            ("remaining", i64::try_from(d.remaining()).unwrap_or(i64::MAX)),
            ("retry_after_ms", retry),
            ("reset_after_ms", ms(d.reset_after_nanos().as_u64())),
            // nginx's queue without `nodelay`: admitted, to be served this much later.
            ("delay_ms", ms(u64::try_from(d.delay().as_nanos()).unwrap_or(u64::MAX))),
        ],
    );
    Ok(())
}

fn tg_check(ctx: *mut raw::RedisModuleCtx, args: &Args) -> Result<(), RedisError> {
    tg_decide(ctx, args, true)
}

fn tg_peek(ctx: *mut raw::RedisModuleCtx, args: &Args) -> Result<(), RedisError> {
    tg_decide(ctx, args, false)
}

/// `TG.RESET key`: the state removed (as good as missing again), `DEL` replicated. 1 if there
/// was one.
fn tg_reset(ctx: *mut raw::RedisModuleCtx, args: &Args) -> Result<(), RedisError> {
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    key_arg(args)?;
    let key = Key::open(ctx, args.string(1), true);
    if key.state()?.is_none() {
        raw::reply_with_long_long(ctx, 0);
        return Ok(());
    }
    key.delete()?;
    key.replicate_delete();
    key.written(c"tg.reset");
    raw::reply_with_long_long(ctx, 1);
    Ok(())
}

/// `TG.RESTORE key tat meta [PXAT ms]`: a state as a decision wrote it (what replication and
/// the AOF carry). Applied from a primary or an AOF, it is stored as sent, with its absolute
/// expiry, as Redis applies `PEXPIREAT` (a replica's own clock decides nothing); called by a
/// client on a primary with an expiry already past, the key is deleted (and `DEL` replicated).
fn tg_restore(ctx: *mut raw::RedisModuleCtx, args: &Args) -> Result<(), RedisError> {
    if args.len() != 4 && args.len() != 6 {
        return Err(RedisError::WrongArity);
    }
    key_arg(args)?;
    let state = State::from_parts(int_arg(args, 2, "tat")?, int_arg(args, 3, "meta")?)
        .ok_or(RedisError::Str("ERR tat and meta are not a tollgate state"))?;
    let pxat = if args.len() == 6 {
        if !args.bytes(4).eq_ignore_ascii_case(b"PXAT") {
            return Err(RedisError::Str("ERR the fifth argument must be PXAT"));
        }
        let at = int_arg(args, 5, "PXAT")?;
        if at > MAX_PXAT_MS {
            return Err(error(format!("ERR PXAT {at} is beyond {MAX_PXAT_MS} ms since the epoch")));
        }
        Some(at)
    } else {
        None
    };
    // SAFETY: the API table is written when the module loads; the context is the command's.
    let flags = unsafe { raw::RedisModule_GetContextFlags.unwrap()(ctx) } as u32;
    let applied = flags & (raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING) != 0;
    let key = Key::open(ctx, args.string(1), true);
    let kind = key.kind();
    if kind != raw::KeyType::Empty && !key.holds_state() {
        if !(applied && kind == raw::KeyType::String) {
            return Err(key.wrong_type(kind));
        }
        // A redis-cell string the primary replaced: replaced here too.
        key.delete()?;
    }
    let now_ms = now_ns() / 1_000_000;
    if !applied && pxat.is_some_and(|at| at <= now_ms) {
        // Already as good as missing: the key is gone, here and on the replicas.
        if key.kind() != raw::KeyType::Empty {
            key.delete()?;
            key.replicate_delete();
            key.written(c"del");
        }
        api::reply_ok(ctx);
        return Ok(());
    }
    key.store(state)?;
    key.expire_at(pxat, now_ms)?;
    // SAFETY: the context is the command's.
    unsafe { raw::RedisModule_ReplicateVerbatim.unwrap()(ctx) };
    key.written(c"tg.restore");
    api::reply_ok(ctx);
    Ok(())
}

/// Redis's entry point for a command: its arguments borrowed, `handler` run, its error (if
/// any) replied.
macro_rules! entry {
    ($handler:ident) => {{
        extern "C" fn entry(
            ctx: *mut raw::RedisModuleCtx,
            argv: *mut *mut raw::RedisModuleString,
            argc: c_int,
        ) -> c_int {
            // SAFETY: Redis passes `argc` strings that live for the call.
            let args = unsafe { Args::new(argv, argc) };
            match $handler(ctx, &args) {
                Ok(()) => raw::REDISMODULE_OK as c_int,
                Err(e) => Context::new(ctx).reply(Err(e)) as c_int,
            }
        }
        entry
    }};
}

type Entry = extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;

/// The commands: name, entry, flags (their one key is the first argument: Cluster routes on
/// it, ACL key patterns apply to it).
const COMMANDS: [(&std::ffi::CStr, Entry, &std::ffi::CStr); 5] = [
    (c"cl.throttle", entry!(cl_throttle), c"write deny-oom fast"),
    (c"tg.check", entry!(tg_check), c"write deny-oom fast"),
    (c"tg.peek", entry!(tg_peek), c"readonly fast"),
    (c"tg.reset", entry!(tg_reset), c"write fast"),
    (c"tg.restore", entry!(tg_restore), c"write deny-oom"),
];

/// Registers the commands, and asks Redis not to signal a key modified when a handle opened
/// for writing closes: a command signals the keys it writes ([`Key::written`]), so that a
/// refusal leaves `WATCH` and client caches alone.
fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    ctx.set_module_options(ModuleOptions::NO_IMPLICIT_SIGNAL_MODIFIED);
    replication::start(ctx.ctx);
    for (name, entry, flags) in COMMANDS {
        // SAFETY: the API table is written before `init`; the names and flags are C strings.
        let status = unsafe {
            raw::RedisModule_CreateCommand.unwrap()(
                ctx.ctx,
                name.as_ptr(),
                Some(entry),
                flags.as_ptr(),
                1,
                1,
                1,
            )
        };
        if status != raw::REDISMODULE_OK as c_int {
            ctx.log_warning(&format!("tollgate: the command {name:?} could not be registered"));
            return Status::Err;
        }
    }
    Status::Ok
}

// The module's entry point and its allocator (Redis's, so that `INFO memory` counts the states):
// not in the crate's own unit tests, which run outside Redis.
#[cfg(not(test))]
redis_module! {
    name: "tollgate",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [TOLLGATE_TYPE],
    init: init,
    commands: [],
}
