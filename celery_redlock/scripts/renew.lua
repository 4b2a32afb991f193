-- Renew many held locks on one node at once; or place those that are missing.
--
-- The heartbeat's batch: one call per few hundred locks, so that a process
-- holding thousands of locks sends one pipeline per node per round and
-- reads back one short string per call.
--
-- KEYS[1..n]  lock keys (celery_redlock/_layout.py), at most 1000
-- ARGV[1]     ttl_ms: the new time to live of every one, whole milliseconds, 1 to 31536000000
-- ARGV[2]     place: "0" for a renewal, which never writes an absent key: this
--             node cannot know whether the others still hold it (a lock freed
--             on every node must stay freed). "1" to set an absent key (SET NX
--             PX): the client sends it in a second call, only for locks a
--             majority has just renewed, only to the nodes that answered "0",
--             so as to restore their copies (lost in a restart, or taken while
--             the node was down)
-- ARGV[2+i]   value of KEYS[i]: its owner's LockValue, exactly as written by acquire.lua
--
-- Returns a string of n characters, one per key: "1" ttl reset, "2" absent
-- and placed, "0" absent, "-" held by another owner (another value, or a key
-- of another type; never touched). Arguments are checked before anything is
-- written.
local ttl_ms = tonumber(ARGV[1])
local place = ARGV[2] == '1'
local count = #KEYS
if not ttl_ms or ttl_ms ~= math.floor(ttl_ms) or ttl_ms < 1 or ttl_ms > 31536000000 then
    return redis.error_reply('ERR renew.lua: ttl_ms must be whole milliseconds from 1 to 31536000000')
end
if count > 1000 or #ARGV ~= count + 2 then
    return redis.error_reply('ERR renew.lua: expected up to 1000 keys and one value per key')
end
for i = 1, count do
    if ARGV[i + 2] == '' then
        return redis.error_reply('ERR renew.lua: empty lock value')
    end
end

local codes = {}
for i = 1, count do
    local key, value = KEYS[i], ARGV[i + 2]
    -- pcall: a key of another type is an error reply here (a table), not an abort.
    local held = redis.pcall('GET', key)
    if held == value then
        redis.call('PEXPIRE', key, ttl_ms)
        codes[i] = '1'
    elseif held == false then
        if place then
            redis.call('SET', key, value, 'NX', 'PX', ttl_ms)
            codes[i] = '2'
        else
            codes[i] = '0'
        end
    else
        codes[i] = '-'
    end
end
return table.concat(codes)
