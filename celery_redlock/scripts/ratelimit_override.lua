-- Set (or replace) the run-time override of one rate limit: the limit and
-- period that ratelimit_hit.lua uses for this key instead of the ones its
-- callers give, until the override expires or is cleared.
--
-- Key layout: celery_redlock/_layout.py (RateKeys.override).
-- KEYS[1]  the override, a hash {limit, period_us, text}
-- ARGV[1]  limit: units per period, > 0 (fractional allowed)
-- ARGV[2]  period_us: the period in microseconds, whole milliseconds, so that
--          every algorithm (fixed windows included) can use it
-- ARGV[3]  text: the rate as the operator wrote it, for display
-- ARGV[4]  ttl_ms: milliseconds the override lasts, 1 to 366 days' worth
--
-- Returns 1. Arguments are checked before anything is written (an error
-- reply otherwise, and nothing changes); the hash always gets its ttl.
local MAX_LIMIT = 1000000000
local MIN_PERIOD_US = 1000
local MAX_PERIOD_US = 366 * 86400 * 1000000
local MIN_INTERVAL_US = 100
local MAX_TTL_MS = 366 * 86400 * 1000

local function finite(x)
    return x ~= nil and x == x and x ~= math.huge and x ~= -math.huge
end

local limit = tonumber(ARGV[1])
local period_us = tonumber(ARGV[2])
local text = ARGV[3]
local ttl_ms = tonumber(ARGV[4])

local function fail(message)
    return redis.error_reply('ERR celery_redlock ratelimit override: ' .. message)
end

if #KEYS ~= 1 or #ARGV ~= 4 then
    return fail('expected 1 key and 4 arguments')
end
if not finite(limit) or limit <= 0 or math.ceil(limit) > MAX_LIMIT then
    return fail('limit out of range')
end
if not finite(period_us) or period_us < MIN_PERIOD_US or period_us > MAX_PERIOD_US
    or period_us % 1000 ~= 0 then
    return fail('period must be whole milliseconds from 1 ms to 366 days')
end
local interval = period_us / limit
if interval < MIN_INTERVAL_US or interval > MAX_PERIOD_US then
    return fail('the rate must be one unit per 100 microseconds to one per 366 days')
end
if not finite(ttl_ms) or ttl_ms < 1 or ttl_ms > MAX_TTL_MS or ttl_ms ~= math.floor(ttl_ms) then
    return fail('ttl_ms must be a whole number from 1 to ' .. MAX_TTL_MS)
end
if string.len(text) > 256 then
    return fail('text is longer than 256 bytes')
end

redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'limit', ARGV[1], 'period_us', ARGV[2], 'text', text)
redis.call('PEXPIRE', KEYS[1], ttl_ms)
return 1
