-- Take a lock on one node, and read (and, when granted, raise) its fencing bucket.
--
-- KEYS[1]  the lock key (celery_redlock/_layout.py)
-- KEYS[2]  the lock's fencing bucket, shared with other names (celery_redlock/_layout.py)
-- ARGV[1]  value: a LockValue (celery_redlock/_layout.py): token, or token|task_id|where
-- ARGV[2]  ttl_ms: lock time to live, whole milliseconds, 1 to 31536000000 (one year)
-- ARGV[3]  fence_ttl_ms: time to live of the bucket after it is raised, same range
-- ARGV[4]  replaces: optional; a held value ending with this text is taken
--          over as if the key were free (a worker taking over the singleton
--          lock its publisher wrote, "|<task id>|queued"); "" for none
-- ARGV[5]  "<proposal> <ahead_us>": the fencing token the client proposes,
--          decimal digits, 1 to 2^53, and how far past this node's clock
--          (microseconds, 0 to 3600000000) it may be recorded, so that a client
--          whose clock runs fast cannot put tokens ahead of the nodes' clocks.
--          One argument: a connection that has not logged in yet may send at
--          most 10 words per command (Redis refuses more), and an EVALSHA
--          with 2 keys and 5 arguments is 10.
--
-- Returns {1, fence, now_us} when the lock was set, {0, fence, now_us, pttl_ms}
-- when another owner holds the key; integers:
--   fence    the bucket's value before this call; a missing bucket (new,
--            expired, or the node restarted empty) reads as now_us;
--   now_us   this node's clock (TIME) in microseconds;
--   pttl_ms  the holder's remaining time to live (-1: none).
-- (A Lua number becomes an integer reply exactly: every value here is a
-- whole number below 2^53.)
-- When granted and fence < proposal <= now_us + ahead_us, the bucket is set to
-- the proposal.
-- Arguments are checked before anything is written: a bad one is an error
-- reply and leaves the node as it was. So is a bucket (or a clock, for a
-- missing bucket) at or past 2^53: no token could be larger.
local MAX_MS = 31536000000
local MAX_EXACT = 9007199254740992 -- 2^53: larger integers are not exact in Lua

local function whole(text, low, high)
    local number = tonumber(text)
    if number and number == math.floor(number) and number >= low and number <= high then
        return number
    end
    return nil
end

local value = ARGV[1]
local ttl_ms = whole(ARGV[2], 1, MAX_MS)
local fence_ttl_ms = whole(ARGV[3], 1, MAX_MS)
local replaces = ARGV[4] or ''
local proposal_text, ahead_text = string.match(ARGV[5] or '', '^([1-9]%d*) (%d+)$')
local ahead_us = whole(ahead_text, 0, 3600000000)
local proposal = nil
-- Compared as text too: tonumber rounds 2^53 + 1 down to 2^53.
if proposal_text
        and (#proposal_text < 16 or (#proposal_text == 16 and proposal_text <= '9007199254740992')) then
    proposal = whole(proposal_text, 1, MAX_EXACT)
end
if not value or value == '' then
    return redis.error_reply('ERR acquire.lua: empty lock value')
end
if not ttl_ms or not fence_ttl_ms then
    return redis.error_reply('ERR acquire.lua: ttl_ms and fence_ttl_ms must be whole milliseconds from 1 to 31536000000')
end
if not proposal or not ahead_us then
    return redis.error_reply('ERR acquire.lua: expected "<proposal> <ahead_us>", a proposal from 1 to 2^53 and ahead_us from 0 to 3600000000')
end

local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local fence = now_us
local stored = redis.call('GET', KEYS[2]) -- a bucket of another type fails here, before any write
if stored then
    fence = tonumber(stored)
    if not fence then
        return redis.error_reply('ERR acquire.lua: the fencing bucket does not hold a number')
    end
end
if fence >= MAX_EXACT then
    -- No larger token can be issued: a planted or corrupted bucket, or a node
    -- clock past the year 2255. Said as what it is, never as "busy".
    return redis.error_reply('ERR acquire.lua: fencing bucket ' .. KEYS[2] .. ' is at '
        .. string.format('%.0f', fence) .. (stored and '' or ' (this node\'s clock, in microseconds)')
        .. ', at or past 2^53, the largest token there can be; delete it if it was planted, '
        .. 'or fix this node\'s clock')
end

local taken = redis.call('SET', KEYS[1], value, 'NX', 'PX', ttl_ms)
if not taken and replaces ~= '' and redis.call('TYPE', KEYS[1])['ok'] == 'string' then
    local held = redis.call('GET', KEYS[1])
    if string.sub(held, -string.len(replaces)) == replaces then
        taken = redis.call('SET', KEYS[1], value, 'PX', ttl_ms)
    end
end
if taken then
    if proposal > fence and proposal <= now_us + ahead_us then
        redis.call('SET', KEYS[2], proposal_text, 'PX', fence_ttl_ms)
    end
    return {1, fence, now_us}
end
return {0, fence, now_us, redis.call('PTTL', KEYS[1])}
