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

use std::ffi::CString;
use std::os::raw::{c_int, c_void};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_module::key::RedisKeyWritable;
use redis_module::native_types::RedisType;
use redis_module::{
    raw, redis_module, Context, ContextFlags, NotifyEvent, RedisError, RedisResult, RedisString, RedisValue,
    Status,
};
use tollgate::{Decision, TokenBucket};

pub mod state;

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

/// A key's name for an error: at most 64 bytes of it, lossily.
fn shown(name: &RedisString) -> String {
    let bytes = name.as_slice();
    let head = String::from_utf8_lossy(&bytes[..bytes.len().min(64)]).into_owned();
    if bytes.len() > 64 {
        format!("{head}...")
    } else {
        head
    }
}

/// The error for a key of another type: what it holds.
fn wrong_type(name: &RedisString, kind: raw::KeyType) -> RedisError {
    error(format!("WRONGTYPE {} holds {}, not a tollgate state", shown(name), what_it_holds(kind)))
}

/// `state` in the key (of this module's type, or empty): in place, or as a new value.
fn store(key: &RedisKeyWritable, state: State) -> Result<(), RedisError> {
    match key.get_value::<State>(&TOLLGATE_TYPE)? {
        Some(held) => *held = state,
        None => key.set_value(&TOLLGATE_TYPE, state)?,
    }
    Ok(())
}

/// What a key holds, for an error.
fn what_it_holds(key_type: raw::KeyType) -> &'static str {
    match key_type {
        raw::KeyType::Empty => "nothing",
        raw::KeyType::String => "a string",
        raw::KeyType::List => "a list",
        raw::KeyType::Hash => "a hash",
        raw::KeyType::Set => "a set",
        raw::KeyType::ZSet => "a sorted set",
        raw::KeyType::Stream => "a stream",
        raw::KeyType::Module => "another module's value",
    }
}

/// The key's state, read without opening it for writing (so that a peek or a refusal does
/// not touch the key for `WATCH` or client-side caching): `None` for a missing key;
/// redis-cell's string state read as this module's; any other content a `WRONGTYPE` error
/// saying what the key holds.
fn read_state(ctx: &Context, name: &RedisString) -> Result<Option<State>, RedisError> {
    let key = ctx.open_key(name);
    match key.get_value::<State>(&TOLLGATE_TYPE) {
        Ok(state) => return Ok(state.copied()),
        Err(_) if key.key_type() == raw::KeyType::String => {}
        Err(_) => return Err(wrong_type(name, key.key_type())),
    }
    let text = key.read()?.unwrap_or_default();
    match strict_u64(text) {
        Some(tat_ns) => Ok(Some(State::from_redis_cell(tat_ns))),
        None => Err(error(format!(
            "WRONGTYPE {} holds a string of {} bytes that is not a tollgate state (nor redis-cell's decimal TAT)",
            shown(name),
            text.len()
        ))),
    }
}

/// The most milliseconds since the epoch an expiry may be: 2^53 (285,000 years), far inside
/// Redis's signed arithmetic on expiries.
const MAX_PXAT_MS: u64 = 1 << 53;

/// Sets `name`'s expiry to `pxat_ms` (ms since the epoch): absolute where Redis has
/// `RedisModule_SetAbsExpire` (where relative expiries count from a script's or a
/// transaction's start, a relative one would come early), else relative to now.
fn set_expire_at(ctx: &Context, name: &RedisString, pxat_ms: u64, now_ms: u64) -> Result<(), RedisError> {
    let pxat = i64::try_from(pxat_ms.min(MAX_PXAT_MS)).unwrap_or(i64::MAX);
    // SAFETY: the API table is written once, when the module loads, before any command.
    let (abs, open, close) =
        unsafe { (raw::RedisModule_SetAbsExpire, raw::RedisModule_OpenKey, raw::RedisModule_CloseKey) };
    if let (Some(set_abs), Some(open), Some(close)) = (abs, open, close) {
        // SAFETY: the context and the key's name are this command's; the key is opened for
        // writing, used once and closed before returning.
        let status = unsafe {
            let key = open(ctx.ctx, name.inner, raw::REDISMODULE_WRITE as c_int);
            if key.is_null() {
                return Err(RedisError::Str("ERR the key could not be opened to set its expiry"));
            }
            let status = set_abs(key, pxat);
            close(key);
            status
        };
        return if status == raw::REDISMODULE_OK as c_int {
            Ok(())
        } else {
            Err(RedisError::Str("ERR the key's expiry could not be set"))
        };
    }
    let key = ctx.open_key_writable(name);
    key.set_expire(Duration::from_millis(pxat_ms.saturating_sub(now_ms).max(1)))?;
    Ok(())
}

/// Stores `state` in `name` until `expire_ns` (since the epoch: when it is as good as a
/// missing key), and replicates that effect: the state and its absolute expiry.
fn write_state(
    ctx: &Context,
    name: &RedisString,
    state: State,
    expire_ns: u64,
    now: u64,
) -> Result<(), RedisError> {
    let key = ctx.open_key_writable(name);
    if key.key_type() == raw::KeyType::String {
        // redis-cell's value, read as this module's: replaced, on the replicas too.
        key.delete()?;
        ctx.replicate("DEL", &[name.as_slice()][..]);
    }
    store(&key, state)?;
    drop(key);
    // Whole ms, rounded up, and 1 ms more for Redis's millisecond clock: never early.
    let pxat_ms = expire_ns.div_ceil(1_000_000).saturating_add(1).min(MAX_PXAT_MS);
    set_expire_at(ctx, name, pxat_ms, now / 1_000_000)?;
    let (tat, meta, pxat) = (state.tat_ns.to_string(), state.meta.to_string(), pxat_ms.to_string());
    let args: [&[u8]; 5] = [name.as_slice(), tat.as_bytes(), meta.as_bytes(), b"PXAT", pxat.as_bytes()];
    ctx.replicate("TG.RESTORE", &args[..]);
    ctx.notify_keyspace_event(NotifyEvent::MODULE, "tg.take", name);
    Ok(())
}

/// A non-negative decimal integer as Redis reads its own (digits only, no sign, no leading
/// zero but `0` itself).
fn strict_u64(a: &[u8]) -> Option<u64> {
    if a.is_empty() || a.len() > 20 || !a.iter().all(u8::is_ascii_digit) || (a.len() > 1 && a[0] == b'0') {
        return None;
    }
    std::str::from_utf8(a).ok()?.parse().ok()
}

/// Argument `i` of `args` (after the command's name) as a strict integer, or an error naming it.
fn int_arg(args: &[RedisString], i: usize, name: &str) -> Result<u64, RedisError> {
    let a = args[i].as_slice();
    strict_u64(a).ok_or_else(|| {
        let shown = String::from_utf8_lossy(&a[..a.len().min(32)]).into_owned();
        error(format!(
            "ERR {name} must be a non-negative integer (decimal digits, no sign, no leading zero), got '{shown}'"
        ))
    })
}

/// The longest key the commands take: 64 KiB (a limiter's key is a client's name, not data).
const MAX_KEY_BYTES: usize = 1 << 16;

/// A key argument: not empty, at most [`MAX_KEY_BYTES`].
fn key_arg(args: &[RedisString]) -> Result<&RedisString, RedisError> {
    match args[1].as_slice().len() {
        0 => Err(RedisError::Str("ERR the key must not be empty")),
        n if n > MAX_KEY_BYTES => Err(error(format!(
            "ERR the key is {n} bytes, more than the {MAX_KEY_BYTES} a limiter's key may have"
        ))),
        _ => Ok(&args[1]),
    }
}

/// `CL.THROTTLE key max_burst count period [quantity]`, as redis-cell answers it.
fn cl_throttle(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if !(5..=6).contains(&args.len()) {
        return Err(RedisError::WrongArity);
    }
    let name = key_arg(&args)?;
    let (max_burst, count, period) =
        (int_arg(&args, 2, "max_burst")?, int_arg(&args, 3, "count")?, int_arg(&args, 4, "period")?);
    let quantity = if args.len() == 6 { int_arg(&args, 5, "quantity")? } else { 1 };
    if count == 0 || period == 0 {
        return Err(RedisError::Str("ERR Zero rates are not supported"));
    }
    let period = Duration::from_secs(period);
    let quota = TokenBucket::redis_cell(max_burst, count, period)
        .map_err(|e| error(format!("ERR max_burst {max_burst}, count {count}, period {period:?}: {e}")))?;
    let d = decide_on_key(ctx, name, &Limit::Bucket(quota), quantity, true)?;
    let r = d.cl_throttle(&quota);
    Ok(RedisValue::Array(vec![
        RedisValue::Integer(i64::from(r.limited)),
        RedisValue::Integer(i64::try_from(r.limit).unwrap_or(i64::MAX)),
        RedisValue::Integer(i64::try_from(r.remaining).unwrap_or(i64::MAX)),
        RedisValue::Integer(r.retry_after),
        RedisValue::Integer(r.reset_after),
    ]))
}

/// Decides `n` units of `limit` on the key `name` at the server's time, storing what the
/// decision took.
fn decide_on_key(
    ctx: &Context,
    name: &RedisString,
    limit: &Limit,
    n: u64,
    take: bool,
) -> Result<Decision, RedisError> {
    let held = read_state(ctx, name)?;
    let now = now_ns();
    let (decision, next) = state::decide_limit(limit, held, now, n, take)
        .map_err(|state::Mismatch(why)| error(format!("WRONGTYPE {} {why}", shown(name))))?
        .ok_or(RedisError::Str("ERR the engine refused its clock (a bug: please report it)"))?;
    if let Some((next, expire_ns)) = next {
        write_state(ctx, name, next, expire_ns, now)?;
    }
    Ok(decision)
}

/// The limit of a `TG.*` specification (`"10/s burst=20"`, `"sliding 100/min"`), or an
/// error saying what is wrong.
fn spec_arg(args: &[RedisString]) -> Result<Limit, RedisError> {
    let text = std::str::from_utf8(args[2].as_slice())
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

/// `TG.CHECK` and `TG.PEEK`: `key spec [n]`.
fn tg_decide(ctx: &Context, args: Vec<RedisString>, take: bool) -> RedisResult {
    if !(3..=4).contains(&args.len()) {
        return Err(RedisError::WrongArity);
    }
    let name = key_arg(&args)?;
    let limit = spec_arg(&args)?;
    let n = if args.len() == 4 { int_arg(&args, 3, "n")? } else { 1 };
    let d = decide_on_key(ctx, name, &limit, n, take)?;
    let ms = |ns: u64| i64::try_from(ns.div_ceil(1_000_000)).unwrap_or(i64::MAX);
    let retry = match d.retry_after_nanos() {
        Some(wait) if !d.is_allowed() => ms(wait.as_u64()),
        _ => -1,
    };
    let fields = [
        ("allowed", i64::from(d.is_allowed())),
        ("limit", i64::try_from(limit.most_at_once()).unwrap_or(i64::MAX)),
        ("remaining", i64::try_from(d.remaining()).unwrap_or(i64::MAX)),
        ("retry_after_ms", retry),
        ("reset_after_ms", ms(d.reset_after_nanos().as_u64())),
        // nginx's queue without `nodelay`: admitted, to be served this much later.
        ("delay_ms", ms(u64::try_from(d.delay().as_nanos()).unwrap_or(u64::MAX))),
    ];
    Ok(RedisValue::OrderedMap(
        fields
            .into_iter()
            .map(|(k, v)| (redis_module::redisvalue::RedisValueKey::String(k.into()), RedisValue::Integer(v)))
            .collect(),
    ))
}

fn tg_check(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    tg_decide(ctx, args, true)
}

fn tg_peek(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    tg_decide(ctx, args, false)
}

/// `TG.RESET key`: the state removed (as good as missing again). 1 if there was one.
fn tg_reset(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    let name = key_arg(&args)?;
    if read_state(ctx, name)?.is_none() {
        return Ok(RedisValue::Integer(0));
    }
    ctx.open_key_writable(name).delete()?;
    ctx.replicate_verbatim();
    ctx.notify_keyspace_event(NotifyEvent::MODULE, "tg.reset", name);
    Ok(RedisValue::Integer(1))
}

/// `TG.RESTORE key tat meta [PXAT ms]`: a state as a decision wrote it (what replication and
/// the AOF carry). Applied from a primary or an AOF, it is stored as sent, with its absolute
/// expiry, as Redis applies `PEXPIREAT` (a replica's own clock decides nothing); called by a
/// client on a primary with an expiry already past, the key is deleted (and `DEL` replicated).
fn tg_restore(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 4 && args.len() != 6 {
        return Err(RedisError::WrongArity);
    }
    let name = key_arg(&args)?;
    let state = State::from_parts(int_arg(&args, 2, "tat")?, int_arg(&args, 3, "meta")?)
        .ok_or(RedisError::Str("ERR tat and meta are not a tollgate state"))?;
    let pxat = if args.len() == 6 {
        if !args[4].as_slice().eq_ignore_ascii_case(b"PXAT") {
            return Err(RedisError::Str("ERR the fifth argument must be PXAT"));
        }
        let at = int_arg(&args, 5, "PXAT")?;
        if at > MAX_PXAT_MS {
            return Err(error(format!("ERR PXAT {at} is beyond {MAX_PXAT_MS} ms since the epoch")));
        }
        Some(at)
    } else {
        None
    };
    let flags = ctx.get_flags();
    let applied = flags.contains(ContextFlags::REPLICATED) || flags.contains(ContextFlags::LOADING);
    let key = ctx.open_key_writable(name);
    let kind = key.key_type();
    if kind != raw::KeyType::Empty && key.get_value::<State>(&TOLLGATE_TYPE).is_err() {
        if !(applied && kind == raw::KeyType::String) {
            return Err(wrong_type(name, kind));
        }
        // A redis-cell string the primary replaced: replaced here too.
        key.delete()?;
    }
    let now_ms = now_ns() / 1_000_000;
    if !applied && pxat.is_some_and(|at| at <= now_ms) {
        // Already as good as missing: the key is gone, here and on the replicas.
        if key.key_type() != raw::KeyType::Empty {
            key.delete()?;
            ctx.replicate("DEL", &[name.as_slice()][..]);
        }
        return Ok(RedisValue::SimpleStringStatic("OK"));
    }
    store(&key, state)?;
    if pxat.is_none() {
        key.remove_expire()?;
    }
    drop(key);
    if let Some(at) = pxat {
        set_expire_at(ctx, name, at, now_ms)?;
    }
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}

fn init(_ctx: &Context, _args: &[RedisString]) -> Status {
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
    commands: [
        ["cl.throttle", cl_throttle, "write deny-oom", 1, 1, 1, ""],
        ["tg.check", tg_check, "write deny-oom", 1, 1, 1, ""],
        ["tg.peek", tg_peek, "readonly", 1, 1, 1, ""],
        ["tg.reset", tg_reset, "write", 1, 1, 1, ""],
        ["tg.restore", tg_restore, "write deny-oom", 1, 1, 1, ""],
    ],
}
