-- Record that the service a rate limit protects refused a call ("429 Too Many
-- Requests"): pause the limit's key until the service said to come back, and,
-- for an adaptive limit, lower the rate in force. ratelimit_hit.lua reads both
-- in the call that decides each hit. Also the operator's pause (adapt = 0).
--
-- Key layout: celery_redlock/_layout.py (RateKeys.backoff, RateKeys.state).
-- KEYS[1]  the limit's backoff, a hash:
--            paused_until_us  no hit is admitted before this time (server clock)
--            learned          units per second the last decrease set
--            peak             units per second the service refused then
--            since_us         when it was set
--            steps            increases since then already reported
--            calm_us          refusals before this time lower nothing (one
--                             period after the pause of the last decrease)
-- KEYS[2]  the limit's state under its algorithm (read only: what it admitted)
-- KEYS[3]  the limit's override (read only: when set, its rate is the ceiling)
-- ARGV[1]  pause_us: microseconds to pause from now (0: no pause; -1: one
--          interval of the rate in force)
-- ARGV[2]  adapt: 1 lowers the rate in force (the adaptive law), 0 does not
-- ARGV[3]  algorithm of the limit: "gcra", "sliding" or "fixed"
-- ARGV[4]  limit: the ceiling, units per period (the configured rate, unless
--          an override replaces it); used with adapt = 1 or pause_us = -1
-- ARGV[5]  period_us: the period in microseconds, likewise
-- ARGV[6]  margin_us: microseconds added to a sliding window
--
-- Returns {paused_us, lowered, limit, peak}: microseconds the key stays paused
-- from now, 1 if this call lowered the rate in force, the rate in force after
-- it and the rate the service refused (units per period, as text).
--
-- The adaptive law (docs/rate-limiting.md#adaptive-rates; the same constants
-- as celery_redlock/ratelimit/rate_overrides.py): a refusal at least one period
-- after the pause of the last decrease ended (calm_us) takes M = min(rate in
-- force, units the sliding window admitted, counted only if no pause took part
-- of the window) as the rate the service refused, and sets the rate in force to
-- low = max(FLOOR * limit, DECREASE * M); it climbs back n whole periods later
-- to the rate adapted() gives (ratelimit_hit.lua has the same function).
-- A pause is never shortened. The hash always gets a ttl: until the pause
-- ends or the rate in force is back at the limit, whichever is later.
local DECREASE = 0.75
local PLATEAU = 0.95
local RECOVER = 5
local PROBE = 0.05
local FLOOR = 0.01
local MAX_PAUSE_US = 86400 * 1000000

local call, tonumber, ceil, floor, max, min, format =
    redis.call, tonumber, math.ceil, math.floor, math.max, math.min, string.format

-- The rate in force n whole periods after a decrease from `peak` to `low`
-- (units per period): back to `top`, just under peak, in RECOVER periods on a
-- cubic, then beyond it, slowly at first, on a cubic too.
local function adapted(low, peak, n)
    local top = max(low, min(PLATEAU * peak, ceil(peak) - 1))
    if n < RECOVER then
        return top - (top - low) * (1 - n / RECOVER) ^ 3, top
    end
    return top * (1 + PROBE * (n - RECOVER) ^ 3), top
end

local function fail(message)
    return redis.error_reply('ERR celery_redlock ratelimit refused: ' .. message)
end

local backoff, state, override = KEYS[1], KEYS[2], KEYS[3]
local pause_us = tonumber(ARGV[1])
local adapt = ARGV[2]
local algorithm = ARGV[3]
local limit = tonumber(ARGV[4])
local period_us = tonumber(ARGV[5])
local margin = tonumber(ARGV[6])

if #KEYS ~= 3 or #ARGV ~= 6 then
    return fail('expected 3 keys and 6 arguments')
end
if not pause_us or (pause_us < 0 and pause_us ~= -1) or pause_us > MAX_PAUSE_US then
    return fail('pause_us must be -1 or from 0 to one day')
end
if adapt ~= '0' and adapt ~= '1' then
    return fail('adapt must be 0 or 1')
end
if not limit or limit <= 0 or limit ~= limit or limit == math.huge then
    return fail('limit out of range')
end
if not period_us or period_us < 1000 or period_us > 366 * 86400 * 1000000 then
    return fail('period out of range')
end
if not margin or margin < 0 or margin > 60 * 1000000 then
    return fail('margin_us out of range')
end

local set = call('HMGET', override, 'limit', 'period_us')
if tonumber(set[1]) and tonumber(set[2]) then
    limit, period_us = tonumber(set[1]), tonumber(set[2])
end

local time = call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local b = call('HMGET', backoff, 'paused_until_us', 'learned', 'since_us', 'calm_us', 'peak')
local until_us, learned, since = tonumber(b[1]) or 0, tonumber(b[2]), tonumber(b[3])
local calm = tonumber(b[4]) or 0
local peak = tonumber(b[5]) or (learned and learned / DECREASE)

-- The rate in force now, units per period.
local in_force = limit
if learned and since then
    local steps = max(0, floor((now - since) / period_us))
    in_force = min(limit, (adapted(learned * period_us / 1000000, peak * period_us / 1000000, steps)))
end

local lowered = 0
if adapt == '1' and now >= calm then
    local base = in_force
    local window = period_us + margin
    if algorithm == 'sliding' and until_us <= now - window then
        -- What the window admitted: the fleet's real rate when the refusal came,
        -- unless a pause took part of the window (nothing was admitted then: a
        -- pause extended by later refusals can end after calm_us).
        local newest = call('ZRANGE', state, -1, -1)
        local total = tonumber(newest[1])
        if total then
            local before = tonumber(call('ZREVRANGEBYSCORE', state, format('%.17g', now - window),
                '-inf', 'LIMIT', 0, 1)[1]) or 0
            local admitted = (total - before) * period_us / window
            if admitted > 0 then
                base = min(base, admitted)
            end
        end
    end
    in_force = max(FLOOR * limit, DECREASE * base)
    call('HSET', backoff, 'learned', format('%.17g', in_force * 1000000 / period_us),
        'peak', format('%.17g', base * 1000000 / period_us),
        'since_us', format('%.0f', now), 'steps', 0)
    learned, peak, since, lowered = in_force * 1000000 / period_us, base * 1000000 / period_us, now, 1
end

if pause_us == -1 then
    pause_us = period_us / in_force
end
if pause_us > 0 and now + pause_us > until_us then
    until_us = now + pause_us
    call('HSET', backoff, 'paused_until_us', format('%.0f', until_us))
end
if lowered == 1 then
    -- Calls already on their way when the service refused are refused too,
    -- and so is the first of those let through when the pause ends: one
    -- decrease per refusal episode, as TCP lowers its window once per round trip.
    call('HSET', backoff, 'calm_us', format('%.0f', max(until_us, now) + period_us))
end

-- Keep the hash until the pause ends and the rate is back at the limit.
local ends = until_us
if lowered == 1 then
    -- back at the limit once top * (1 + PROBE * (n - RECOVER) ^ 3) >= limit
    local _, top = adapted(in_force, peak * period_us / 1000000, 0)
    local beyond = ceil(((max(limit / top, 1) - 1) / PROBE) ^ (1 / 3))
    ends = max(ends, since + (RECOVER + beyond) * period_us)
end
local keep_ms = ceil((ends - now) / 1000) + 1
if call('EXISTS', backoff) == 1 and call('PTTL', backoff) < keep_ms then
    call('PEXPIRE', backoff, keep_ms)
end
local refused = peak and peak * period_us / 1000000 or limit
return {ceil(max(until_us - now, 0)), lowered, format('%.17g', in_force), format('%.17g', refused)}
