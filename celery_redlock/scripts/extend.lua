-- Reset a held lock's time to live, if the caller still owns it; optionally
-- place it where it is missing.
--
-- KEYS[1]  the lock key (celery_redlock/_layout.py)
-- ARGV[1]  value: the owner's LockValue, exactly as written by acquire.lua
-- ARGV[2]  ttl_ms: the new time to live, whole milliseconds, 1 to 31536000000
-- ARGV[3]  place: "1" to set the key (SET NX) when it is absent, "0" not to.
--          The client asks for it only while its lock is valid, so a majority
--          holds the key; this restores the copies of nodes that lack it (a
--          node that was down when the lock was taken, or came back empty).
--
-- Returns 1 when the ttl was reset; 2 when the key was absent and has been
-- placed; 0 when it is absent (and not placed); -1 when another owner holds
-- it (another value, or a key of another type). Another owner's key is never
-- touched. Arguments are checked before anything is written.
local value = ARGV[1]
local ttl_ms = tonumber(ARGV[2])
local place = ARGV[3] == '1'
if not value or value == '' then
    return redis.error_reply('ERR extend.lua: empty lock value')
end
if not ttl_ms or ttl_ms ~= math.floor(ttl_ms) or ttl_ms < 1 or ttl_ms > 31536000000 then
    return redis.error_reply('ERR extend.lua: ttl_ms must be whole milliseconds from 1 to 31536000000')
end

-- pcall: a key of another type is an error reply here (a table), not an abort.
local held = redis.pcall('GET', KEYS[1])
if held == value then
    redis.call('PEXPIRE', KEYS[1], ttl_ms)
    return 1
end
if held == false then
    if place then
        redis.call('SET', KEYS[1], value, 'NX', 'PX', ttl_ms)
        return 2
    end
    return 0
end
return -1
