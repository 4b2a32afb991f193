-- Take a lock on one node and issue its fencing counter.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the fencing counter of that lock (same hash tag)
-- ARGV[1]  value: the owner's random token (plus owner description)
-- ARGV[2]  ttl_ms: lock time to live, milliseconds
-- ARGV[3]  fence_ttl_ms: how long an unused fencing counter is kept, milliseconds
-- ARGV[4]  replaces: optional; a held value ending with this text is taken
--          over as if the key were free (a worker taking over the singleton
--          lock its publisher wrote, "|<task id>|queued"); "" for none
--
-- Returns {1, counter} when the lock was set (counter = this node's fencing
-- counter after the increment), or {0, pttl_ms} when another owner holds the
-- key (pttl_ms = the holder's remaining time to live, -1 if it has none).
local value = ARGV[1]
local ttl_ms = tonumber(ARGV[2])
local fence_ttl_ms = tonumber(ARGV[3])
local replaces = ARGV[4] or ''

local taken = redis.call('SET', KEYS[1], value, 'NX', 'PX', ttl_ms)
if not taken and replaces ~= '' then
    local held = redis.call('GET', KEYS[1])
    if held and string.sub(held, -string.len(replaces)) == replaces then
        taken = redis.call('SET', KEYS[1], value, 'PX', ttl_ms)
    end
end
if taken then
    local counter = redis.call('INCR', KEYS[2])
    redis.call('PEXPIRE', KEYS[2], fence_ttl_ms)
    return {1, counter}
end
return {0, redis.call('PTTL', KEYS[1])}
