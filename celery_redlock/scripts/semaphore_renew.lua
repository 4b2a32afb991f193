-- Renew many held semaphore slots on one node at once; or place those that are missing.
--
-- The heartbeat's batch for semaphores (renew.lua's counterpart), also used
-- by Semaphore.extend() for one slot.
--
-- Key layout: celery_redlock/_layout.py (SemaphoreKeys).
-- KEYS[2i-1]  holders hash of the i-th slot's semaphore (slot number -> LockValue)
-- KEYS[2i]    expiry sorted set of the same semaphore (slot number -> expiry, ms)
-- ARGV[1]     ttl_ms: the new time to live of every slot, whole milliseconds, 1 to 31536000000
-- ARGV[2]     place: "0" for a renewal, which never takes a free slot (see
--             renew.lua). "1" to take a slot that is free on this node: the
--             client sends it in a second call, only for slots a majority has
--             just renewed, only to the nodes that answered "0"
-- ARGV[2i+1]  the i-th slot number (0 or more)
-- ARGV[2i+2]  the i-th holder value, exactly as written by semaphore_acquire.lua
--
-- Returns a string of one character per slot: "1" ttl reset, "2" free and
-- placed, "0" free (not placed), "-" held by another value (never touched).
-- At most 500 slots per call. Arguments are checked before anything is written.
local ttl_ms = tonumber(ARGV[1])
local place = ARGV[2] == '1'
local count = #KEYS / 2
if not ttl_ms or ttl_ms ~= math.floor(ttl_ms) or ttl_ms < 1 or ttl_ms > 31536000000 then
    return redis.error_reply('ERR semaphore_renew.lua: ttl_ms must be whole milliseconds from 1 to 31536000000')
end
if count ~= math.floor(count) or count > 500 or #ARGV ~= 2 * count + 2 then
    return redis.error_reply('ERR semaphore_renew.lua: expected up to 500 key pairs and a slot and value per pair')
end
for i = 1, count do
    local slot = tonumber(ARGV[2 * i + 1])
    if not slot or slot ~= math.floor(slot) or slot < 0 or ARGV[2 * i + 2] == '' then
        return redis.error_reply('ERR semaphore_renew.lua: bad slot number or empty value')
    end
end

local time = redis.call('TIME')
local now = math.floor((tonumber(time[1]) * 1000000 + tonumber(time[2])) / 1000)
local codes = {}
for i = 1, count do
    local holders, expiry = KEYS[2 * i - 1], KEYS[2 * i]
    local slot, value = ARGV[2 * i + 1], ARGV[2 * i + 2]
    -- An expired slot is free, whoever it was: drop it before looking.
    -- pcall: keys of another type are an error reply here (a table), not an abort.
    local until_ms = redis.pcall('ZSCORE', expiry, slot)
    local held = redis.pcall('HGET', holders, slot)
    if type(until_ms) == 'table' or type(held) == 'table' then
        held = {}
    elseif until_ms and tonumber(until_ms) <= now then
        redis.call('HDEL', holders, slot)
        redis.call('ZREM', expiry, slot)
        held = false
    end
    local write = false
    if held == value then
        codes[i] = '1'
        write = true
    elseif held == false then
        if place then
            codes[i] = '2'
            redis.call('HSET', holders, slot, value)
            write = true
        else
            codes[i] = '0'
        end
    else
        codes[i] = '-'
    end
    if write then
        redis.call('ZADD', expiry, now + ttl_ms, slot)
        local last = redis.call('ZRANGE', expiry, -1, -1, 'WITHSCORES')
        local keep = math.max(1, tonumber(last[2]) - now + 1)
        redis.call('PEXPIRE', holders, keep)
        redis.call('PEXPIRE', expiry, keep)
    end
end
return table.concat(codes)
