-- Admit a hit if the units admitted in the last `period` leave room for it
-- (a sliding window log: one sorted-set member per admitted unit, scored with
-- the server's clock in microseconds, so clients' clocks do not matter).
--
-- KEYS[1]  the log (a sorted set)
-- ARGV[1]  limit: units admitted in any window of one period
-- ARGV[2]  period_ms: window length, milliseconds
-- ARGV[3]  cost: units this hit takes (1 <= cost <= limit)
-- ARGV[4]  consume: 1 records the hit if it is admitted, 0 only looks (peek)
--
-- Returns {allowed, count, retry_after_ms, reset_after_ms}:
--   allowed         1 if the hit fits, else 0
--   count           units in the window (now - period, now] after this call
--   retry_after_ms  0 when allowed, else milliseconds until enough units
--                   leave the window for this hit to fit
--   reset_after_ms  milliseconds until the window is empty; 0 when it is
--
-- A unit admitted at time s counts until now >= s + period. A hit is admitted
-- only if count + cost <= limit, so no window of one period ever holds more
-- than `limit` units. Refused hits are not recorded.
local limit = tonumber(ARGV[1])
local period_ms = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local consume = ARGV[4] == '1'
local key = KEYS[1]
local period_us = period_ms * 1000

local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
local newest_us = nil
if newest[2] then
    newest_us = tonumber(newest[2])
    -- Never behind the newest entry (the server clock stepped back): scores
    -- stay ordered, and the members written below stay unique.
    if newest_us > now_us then
        now_us = newest_us
    end
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', now_us - period_us)
local count = redis.call('ZCARD', key)

if count + cost <= limit then
    if consume then
        -- Members "<now_us>:<position>" are unique: entries scored now_us are
        -- never trimmed while the clock reads now_us, so positions only grow.
        for i = 1, cost do
            redis.call('ZADD', key, now_us, string.format('%.0f:%d', now_us, count + i))
        end
        count = count + cost
        redis.call('PEXPIRE', key, period_ms)
        return {1, count, 0, period_ms}
    end
    if count == 0 then
        return {1, 0, 0, 0}
    end
end

local reset_after_ms = math.ceil((newest_us + period_us - now_us) / 1000)
if redis.call('PTTL', key) == -1 then
    -- a log without a ttl would never go away
    redis.call('PEXPIRE', key, reset_after_ms)
end
if count + cost <= limit then
    return {1, count, 0, reset_after_ms}
end
-- The hit fits once the (count + cost - limit) oldest units have left.
local leaving = redis.call('ZRANGE', key, count + cost - limit - 1, count + cost - limit - 1, 'WITHSCORES')
local retry_after_ms = math.ceil((tonumber(leaving[2]) + period_us - now_us) / 1000)
return {0, count, retry_after_ms, reset_after_ms}
