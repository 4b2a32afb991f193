-- Count a hit in a fixed window that opens with the key's first hit.
--
-- KEYS[1]  the window's counter (a string holding an integer)
-- ARGV[1]  limit: units admitted per window
-- ARGV[2]  period_ms: window length, milliseconds
-- ARGV[3]  cost: units this hit takes (1 <= cost <= limit)
-- ARGV[4]  consume: 1 counts the hit if it is admitted, 0 only looks (peek)
--
-- Returns {allowed, count, retry_after_ms, reset_after_ms}:
--   allowed         1 if the hit fits in the current window, else 0
--   count           units counted in the current window after this call
--   retry_after_ms  0 when allowed, else milliseconds until the window resets
--   reset_after_ms  milliseconds until the counter expires; 0 when there is none
--
-- INCRBY first and look at the result: no GET-then-INCR race. A refused hit is
-- taken back with DECRBY in the same script, so refusals consume nothing: the
-- counter never stays above the limit, `count` stays true, and a smaller hit
-- that still fits is admitted after a larger one was refused. Hits never move
-- the window's expiry, so a flood of refusals cannot delay the next window.
local limit = tonumber(ARGV[1])
local period_ms = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local consume = ARGV[4] == '1'
local key = KEYS[1]

if not consume then
    local count = tonumber(redis.call('GET', key) or '0') or 0
    if count == 0 then
        return {1, 0, 0, 0}
    end
    local ttl_ms = redis.call('PTTL', key)
    if ttl_ms < 0 then
        -- a counter without a ttl would never reset
        redis.call('PEXPIRE', key, period_ms)
        ttl_ms = period_ms
    end
    if count + cost <= limit then
        return {1, count, 0, ttl_ms}
    end
    return {0, count, ttl_ms, ttl_ms}
end

local count = redis.call('INCRBY', key, cost)
local ttl_ms
if count == cost then
    -- first hit: the window opens now
    redis.call('PEXPIRE', key, period_ms)
    ttl_ms = period_ms
else
    ttl_ms = redis.call('PTTL', key)
    if ttl_ms < 0 then
        -- a counter without a ttl (written by something else) would never reset
        redis.call('PEXPIRE', key, period_ms)
        ttl_ms = period_ms
    end
end
if count > limit then
    count = redis.call('DECRBY', key, cost)
    return {0, count, ttl_ms, ttl_ms}
end
return {1, count, 0, ttl_ms}
