-- Reset a held lock's time to live, if the caller still owns it.
--
-- An absent key is never set here: the node cannot know whether the others
-- still hold it. The client puts it back (renew.lua, place "1") on the nodes
-- that answered 0, once a majority answered 1.
--
-- KEYS[1]  the lock key (celery_redlock/_layout.py)
-- ARGV[1]  value: the owner's LockValue, exactly as written by acquire.lua
-- ARGV[2]  ttl_ms: the new time to live, whole milliseconds, 1 to 31536000000
--
-- Returns 1 when the ttl was reset; 0 when the key is absent; -1 when another
-- owner holds it (another value, or a key of another type). Another owner's
-- key is never touched. Arguments are checked before anything is written.
local value = ARGV[1]
local ttl_ms = tonumber(ARGV[2])
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
    return 0
end
return -1
