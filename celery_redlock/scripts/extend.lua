-- Reset a held lock's time to live, if the caller still owns it.
--
-- KEYS[1]  the lock key
-- ARGV[1]  value: the owner's token, exactly as written by acquire.lua
-- ARGV[2]  ttl_ms: the new time to live, milliseconds
--
-- Returns 1 when the ttl was reset, 0 when the key is gone or owned by
-- someone else. An expired key is never re-created.
local value = ARGV[1]
local ttl_ms = tonumber(ARGV[2])

if redis.call('GET', KEYS[1]) == value then
    redis.call('PEXPIRE', KEYS[1], ttl_ms)
    return 1
end
return 0
