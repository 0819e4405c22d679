//! The module API as the commands call it: their arguments borrowed as Redis passed them, one
//! key handle per command, replies and replication straight through `redismodule.h`.
//!
//! The `redis-module` crate's command path retains every argument as a `RedisString`, collects
//! them in a `Vec`, builds a `RedisValue` tree for each reply and a `CString` for each replicated
//! argument: every Rust allocation a `zmalloc` inside Redis. Under callgrind that made a
//! pipelined `CL.THROTTLE` cost about 4.9× a `SET` (whole server); the decision itself is
//! nanoseconds. Here a command allocates nothing of its own but a new key's 16-byte state.

use std::os::raw::{c_char, c_int, c_long, c_longlong};

use redis_module::{raw, RedisError};

use crate::state::State;
use crate::TOLLGATE_TYPE;

/// The most milliseconds since the epoch an expiry may be: 2^53 (285,000 years), far inside
/// Redis's signed arithmetic on expiries.
pub const MAX_PXAT_MS: u64 = 1 << 53;

/// A command's arguments (its name first), borrowed as Redis passed them: never retained or
/// copied.
pub struct Args<'a> {
    argv: &'a [*mut raw::RedisModuleString],
}

impl std::fmt::Debug for Args<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries((0..self.len()).map(|i| String::from_utf8_lossy(self.bytes(i)))).finish()
    }
}

impl<'a> Args<'a> {
    /// # Safety
    /// `argv` holds `argc` strings that live for `'a` (a command's, for its call).
    pub unsafe fn new(argv: *mut *mut raw::RedisModuleString, argc: c_int) -> Args<'a> {
        let argv = match usize::try_from(argc) {
            // SAFETY: the caller's.
            Ok(n) if !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, n) },
            _ => &[],
        };
        Args { argv }
    }

    pub fn len(&self) -> usize {
        self.argv.len()
    }

    /// Argument `i`'s bytes.
    pub fn bytes(&self, i: usize) -> &'a [u8] {
        let mut len = 0;
        let ptr = raw::string_ptr_len(self.argv[i], &mut len);
        if ptr.is_null() || len == 0 {
            return &[];
        }
        // SAFETY: Redis's string of `len` bytes, alive for the command ('a).
        unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
    }

    /// Argument `i` as Redis's string (a key's name for the API).
    pub fn string(&self, i: usize) -> *mut raw::RedisModuleString {
        self.argv[i]
    }
}

/// A key open for one command, closed when dropped. The module runs with
/// `NO_IMPLICIT_SIGNAL_MODIFIED` (set when it loads), so that a key opened for writing and not
/// written (a refusal) does not invalidate a `WATCH` or a client's cache: [`Key::written`] says
/// when it was.
#[derive(Debug)]
pub struct Key {
    ctx: *mut raw::RedisModuleCtx,
    key: *mut raw::RedisModuleKey,
    name: *mut raw::RedisModuleString,
}

impl Key {
    /// Opens `name` (for writing when `write`). A missing key opened for reading is a null
    /// handle, which the API reads as empty.
    pub fn open(ctx: *mut raw::RedisModuleCtx, name: *mut raw::RedisModuleString, write: bool) -> Key {
        let mode = if write { raw::REDISMODULE_READ | raw::REDISMODULE_WRITE } else { raw::REDISMODULE_READ };
        // SAFETY: the API table is written when the module loads, before any command; the
        // context and the name are the command's.
        let key = unsafe { raw::RedisModule_OpenKey.unwrap()(ctx, name, mode as c_int) };
        Key { ctx, key: key.cast(), name }
    }

    pub fn kind(&self) -> raw::KeyType {
        // SAFETY: a handle of this command (null reads as empty).
        unsafe { raw::RedisModule_KeyType.unwrap()(self.key) }.into()
    }

    /// The module's state in the key; `None` when it holds anything else or nothing.
    fn value(&self) -> Option<*mut State> {
        if self.key.is_null() || self.kind() != raw::KeyType::Module {
            return None;
        }
        // SAFETY: a live handle holding a module value.
        let (ty, value) = unsafe {
            (
                raw::RedisModule_ModuleTypeGetType.unwrap()(self.key),
                raw::RedisModule_ModuleTypeGetValue.unwrap()(self.key),
            )
        };
        // A value of this module's type is a boxed `State`, owned by the key and touched only
        // on Redis's main thread.
        (ty == *TOLLGATE_TYPE.raw_type.borrow() && !value.is_null()).then_some(value.cast())
    }

    /// Whether the key holds this module's state.
    pub fn holds_state(&self) -> bool {
        self.value().is_some()
    }

    /// The state the key holds: `None` for a missing key; redis-cell's string state read as
    /// this module's; any other content a `WRONGTYPE` error saying what the key holds.
    pub fn state(&self) -> Result<Option<State>, RedisError> {
        if let Some(state) = self.value() {
            // SAFETY: the key's live state (see `value`), copied out.
            return Ok(Some(unsafe { *state }));
        }
        match self.kind() {
            raw::KeyType::Empty => Ok(None),
            raw::KeyType::String => {
                let text = self.string_value();
                match crate::strict_u64(text) {
                    Some(tat_ns) => Ok(Some(State::from_redis_cell(tat_ns))),
                    None => Err(crate::error(format!(
                        "WRONGTYPE {} holds a string of {} bytes that is not a tollgate state (nor redis-cell's decimal TAT)",
                        self.shown(),
                        text.len()
                    ))),
                }
            }
            other => Err(self.wrong_type(other)),
        }
    }

    /// A string key's bytes.
    fn string_value(&self) -> &[u8] {
        let mut len = 0;
        // SAFETY: a live handle on a string key, read (not written) through the pointer.
        let ptr = unsafe {
            raw::RedisModule_StringDMA.unwrap()(self.key, &mut len, raw::REDISMODULE_READ as c_int)
        };
        if ptr.is_null() || len == 0 {
            return &[];
        }
        // SAFETY: `len` bytes Redis owns while the handle is open.
        unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
    }

    /// The error for a key of another type: what it holds.
    pub fn wrong_type(&self, kind: raw::KeyType) -> RedisError {
        let holds = match kind {
            raw::KeyType::Empty => "nothing",
            raw::KeyType::String => "a string",
            raw::KeyType::List => "a list",
            raw::KeyType::Hash => "a hash",
            raw::KeyType::Set => "a set",
            raw::KeyType::ZSet => "a sorted set",
            raw::KeyType::Stream => "a stream",
            raw::KeyType::Module => "another module's value",
        };
        crate::error(format!("WRONGTYPE {} holds {holds}, not a tollgate state", self.shown()))
    }

    /// The key's name for an error: at most 64 bytes of it, lossily.
    pub fn shown(&self) -> String {
        let mut len = 0;
        let ptr = raw::string_ptr_len(self.name, &mut len);
        // SAFETY: the command's string of `len` bytes.
        let bytes = if ptr.is_null() {
            &[][..]
        } else {
            unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
        };
        let head = String::from_utf8_lossy(&bytes[..bytes.len().min(64)]).into_owned();
        if bytes.len() > 64 {
            format!("{head}...")
        } else {
            head
        }
    }

    /// Stores `state`: in place in a state the key holds, else as the key's new value (the
    /// key was empty: a string is deleted first).
    pub fn store(&self, state: State) -> Result<(), RedisError> {
        if let Some(held) = self.value() {
            // SAFETY: the key's live state (see `value`), written in place through a handle
            // open for writing; no reference to it is held.
            unsafe { *held = state };
            return Ok(());
        }
        let value = Box::into_raw(Box::new(state));
        // SAFETY: a handle open for writing; on success the key owns the box (the type's
        // `free` drops it), on failure it is dropped here.
        let status = unsafe {
            raw::RedisModule_ModuleTypeSetValue.unwrap()(
                self.key,
                *TOLLGATE_TYPE.raw_type.borrow(),
                value.cast(),
            )
        };
        if status != raw::REDISMODULE_OK as c_int {
            // SAFETY: not taken by the key.
            drop(unsafe { Box::from_raw(value) });
            return Err(RedisError::Str("ERR the key's state could not be stored"));
        }
        Ok(())
    }

    pub fn delete(&self) -> Result<(), RedisError> {
        // SAFETY: a handle of this command.
        if unsafe { raw::RedisModule_DeleteKey.unwrap()(self.key) } != raw::REDISMODULE_OK as c_int {
            return Err(RedisError::Str("ERR the key could not be deleted"));
        }
        Ok(())
    }

    /// Sets the key's expiry to `pxat_ms` (ms since the epoch; `None`: no expiry): absolute
    /// where Redis has `RedisModule_SetAbsExpire` (a relative one counts from a script's or a
    /// transaction's start and would come early), else relative to `now_ms`.
    pub fn expire_at(&self, pxat_ms: Option<u64>, now_ms: u64) -> Result<(), RedisError> {
        const NO_EXPIRE: c_longlong = -1;
        // SAFETY: the API table is written when the module loads; a handle open for writing.
        let status = unsafe {
            match (pxat_ms, raw::RedisModule_SetAbsExpire) {
                (None, _) => raw::RedisModule_SetExpire.unwrap()(self.key, NO_EXPIRE),
                (Some(at), Some(set_abs)) => {
                    set_abs(self.key, i64::try_from(at.min(MAX_PXAT_MS)).unwrap_or(i64::MAX))
                }
                (Some(at), None) => {
                    let ms = at.min(MAX_PXAT_MS).saturating_sub(now_ms).max(1);
                    raw::RedisModule_SetExpire.unwrap()(self.key, i64::try_from(ms).unwrap_or(i64::MAX))
                }
            }
        };
        if status != raw::REDISMODULE_OK as c_int {
            return Err(RedisError::Str("ERR the key's expiry could not be set"));
        }
        Ok(())
    }

    /// Marks the key written: `WATCH`es on it fail, clients' caches of it are invalidated, and
    /// a keyspace event `event` (a C string) fires for it.
    pub fn written(&self, event: &std::ffi::CStr) {
        // SAFETY: the context and the key's name are the command's; `event` is NUL-terminated.
        unsafe {
            raw::RedisModule_SignalModifiedKey.unwrap()(self.ctx, self.name);
            raw::RedisModule_NotifyKeyspaceEvent.unwrap()(
                self.ctx,
                raw::NotifyEvent::MODULE.bits(),
                event.as_ptr(),
                self.name,
            );
        }
    }

    /// Replicates (to the replicas and the AOF) the state just stored and its absolute
    /// expiry, as `TG.RESTORE key tat meta PXAT ms`: the effect, never the command. Nothing
    /// when nothing consumes replication (see [`crate::replication`]).
    pub fn replicate_state(&self, state: State, pxat_ms: u64) {
        if !crate::replication::may_propagate() {
            self.count_write();
            return;
        }
        let (mut tat, mut meta) = ([0; 20], [0; 20]);
        let (tat, meta) = (decimal(state.tat_ns, &mut tat), decimal(state.meta, &mut meta));
        let pxat = c_longlong::try_from(pxat_ms.min(MAX_PXAT_MS)).unwrap_or(c_longlong::MAX);
        // SAFETY: the format names a RedisModuleString, two (pointer, length) buffers, a C
        // string and a long long, as passed; Redis copies them before returning.
        unsafe {
            raw::RedisModule_Replicate.unwrap()(
                self.ctx,
                c"TG.RESTORE".as_ptr(),
                c"sbbcl".as_ptr(),
                self.name,
                tat.as_ptr().cast::<c_char>(),
                tat.len(),
                meta.as_ptr().cast::<c_char>(),
                meta.len(),
                c"PXAT".as_ptr(),
                pxat,
            );
        }
    }

    /// Replicates the key's deletion (`DEL key`), when anything consumes replication.
    pub fn replicate_delete(&self) {
        if !crate::replication::may_propagate() {
            self.count_write();
            return;
        }
        // SAFETY: the format names one RedisModuleString, as passed.
        unsafe { raw::RedisModule_Replicate.unwrap()(self.ctx, c"DEL".as_ptr(), c"s".as_ptr(), self.name) };
    }
}

impl Key {
    /// Counts a write that is not replicated (nothing consumes replication) toward the save
    /// points (`save 60 10000`: Redis's `dirty` counter, which only replication calls move
    /// for a module). `RedisModule_ReplicateVerbatim` moves it at no cost here: Redis
    /// propagates nothing where nothing consumes it (`shouldPropagate`). Between a replica's
    /// `SYNC` and its snapshot's fork (a diskless delay) the command can reach the new
    /// backlog, but only before the replica's starting offset, under a new replication id
    /// that no other replica holds: nothing ever reads it.
    fn count_write(&self) {
        // SAFETY: the context is the command's; the API table is written when the module loads.
        unsafe { raw::RedisModule_ReplicateVerbatim.unwrap()(self.ctx) };
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        // SAFETY: this command's handle, closed once (null is allowed).
        unsafe { raw::RedisModule_CloseKey.unwrap()(self.key) };
    }
}

/// `v` in decimal, in `buf` (two digits a step).
fn decimal(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";
    let mut i = buf.len();
    while v >= 100 {
        let pair = (v % 100) as usize * 2;
        v /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if v >= 10 {
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[v as usize * 2..v as usize * 2 + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + v as u8;
    }
    &buf[i..]
}

/// Replies with an array of `items` integers.
pub fn reply_integers(ctx: *mut raw::RedisModuleCtx, items: &[i64]) {
    raw::reply_with_array(ctx, items.len() as c_long);
    for &v in items {
        raw::reply_with_long_long(ctx, v);
    }
}

/// Replies with a map of integers (an array of field-value pairs before RESP3).
pub fn reply_fields(ctx: *mut raw::RedisModuleCtx, fields: &[(&str, i64)]) {
    raw::reply_with_map(ctx, fields.len() as c_long);
    for &(k, v) in fields {
        raw::reply_with_string_buffer(ctx, k.as_ptr().cast::<c_char>(), k.len());
        raw::reply_with_long_long(ctx, v);
    }
}

/// Replies `+OK`.
pub fn reply_ok(ctx: *mut raw::RedisModuleCtx) {
    raw::reply_with_simple_string(ctx, c"OK".as_ptr());
}

#[cfg(test)]
mod tests {
    #[test]
    fn decimal_writes_every_width() {
        for v in [0, 7, 10, 99, 100, 101, 999, 1_000_000, 10_000_000_000_000_000_000, u64::MAX] {
            let mut buf = [0; 20];
            assert_eq!(super::decimal(v, &mut buf), v.to_string().as_bytes());
        }
    }
}
