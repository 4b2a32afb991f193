-- Decide one hit (or peek) against one or more rate limits, atomically: the hit
-- is counted in every limit only if every limit admits it, so no limit spends a
-- unit when another refuses. Times come from the server's TIME, in microseconds.
--
-- Key layout: celery_redlock/_layout.py (RateKeys). Four keys per limit i,
-- for n limits (1 <= n <= 16):
-- KEYS[4i-3]  the limit's state under its algorithm:
--               gcra     a string "B O": the theoretical arrival time is B + O
--                        microseconds (B whole, O the part after it, so that
--                        fractional intervals keep their precision)
--               sliding  a sorted set, one member per bucket of admitted units:
--                        score = the bucket's end (microseconds), member = the
--                        units admitted up to and including that bucket
--               fixed    a string: the units admitted in the current window
-- KEYS[4i-2]  the pace of a fixed or sliding limit whose count is not whole
--             ("2.5/s"): a string "B O" as for gcra
-- KEYS[4i-1]  the limit's override, a hash {limit, period_us, text} that an
--             operator set at run time (ratelimit_override.lua); only read here
-- KEYS[4i]    the limit's backoff, a hash {paused_until_us, learned, peak,
--             since_us, steps} written by ratelimit_refused.lua: a pause (no hit is
--             admitted before paused_until_us) and the adaptive rate in force
--             (see ADAPTIVE below). Read here; `steps` is written when the
--             rate in force rises a step, so that one decision reports it.
--
-- ARGV[1]  cost: units this hit takes, a whole number >= 1
-- ARGV[2]  consume: 1 counts an admitted hit, 0 only looks (peek)
-- ARGV[3]  margin_us: microseconds added to every gcra and sliding window
-- ARGV[3 + 3i - 2]  algorithm of limit i: "gcra", "sliding" or "fixed"
-- ARGV[3 + 3i - 1]  limit: units per period, > 0 (fractional allowed)
-- ARGV[3 + 3i]      period_us: the period in microseconds (fractional allowed)
--
-- Returns one array per limit:
--   {allowed, remaining, retry_after_us, reset_after_us, limit, period_us, flags}
--   allowed         1 if this limit admits the hit, else 0 (the hit is counted
--                   only if every limit admits it)
--   remaining       units the limit still has room for after this call
--   retry_after_us  0 if allowed, else microseconds until this limit admits it
--   reset_after_us  microseconds until the limit holds no state
--   limit, period_us  the limit and period in force (an override's, or lowered
--                   by the adaptive law), as text
--   flags           the sum of 1 (an override replaced the given rate), 2 (the
--                   adaptive law lowered it), 4 (the key is paused), 8 (this
--                   decision found the adaptive rate one or more steps higher)
--
-- Every argument and every override is checked before anything is written;
-- a bad one is an error reply and nothing changes. Every key written gets a
-- ttl.
--
-- State is judged against the limit in force (the override, or the given
-- limit once the override is cleared or has lapsed): no state keeps a hit
-- waiting longer than the limit in force could have made it wait. State left
-- by a longer window is cut down to what the limit in force could have written
-- itself, and rewritten so: a gcra or pace arrival time to at most ceil(limit)
-- intervals ahead of now, a sliding bucket to end no later than the current
-- bucket, a fixed window to end within one period.
-- State that no limit could have written (not a whole count, not an exact
-- time) is an error naming its key, as a bad override is; the key is given a
-- ttl of at most one window, so the limit works again after it at the latest.
--
-- Work is O(1) per gcra or fixed limit and O(log n) per sliding limit,
-- n being the members of its log (at most one per bucket: 1,001 in the window,
-- plus a tail trimmed by at most 16 per admitted hit); the retry_after of a refused
-- sliding hit takes a binary search, O(log^2 n).

local MAX_LIMITS = 16
local MAX_LIMIT = 1000000000
local MIN_PERIOD_US = 1000
local MAX_PERIOD_US = 366 * 86400 * 1000000
local MAX_UNITS_PER_US = 1            -- 1,000,000 units per second
local MIN_GCRA_INTERVAL_US = 100
local MIN_PACE_INTERVAL_US = 1
local MAX_MARGIN_US = 60 * 1000000
local BUCKETS = 1000
local TRIM_PER_CALL = 16
-- Float noise allowed when comparing sums of intervals, microseconds.
local EPSILON_US = 1e-6
-- Stored counts and times beyond this (2^53) are not exact: no limit writes them.
local MAX_EXACT = 9007199254740992
-- ADAPTIVE: the rate in force after a refusal of `peak` units per second
-- lowered it to `learned` units per second at since_us is adapted() below
-- (n: whole periods since since_us), at most the limit, never below the hit's
-- cost. Same law and constants as ratelimit_refused.lua and
-- celery_redlock/ratelimit/rate_overrides.py.
local DECREASE = 0.75
local PLATEAU = 0.95
local RECOVER = 5
local PROBE = 0.05
-- Periods from the floor (1 % of the limit) back to the limit, at most.
local RECOVERY_PERIODS = RECOVER + 13

-- Globals read once: a local is cheaper than a global lookup on every use.
local call, tonumber, ceil, floor, max, min, huge, format =
    redis.call, tonumber, math.ceil, math.floor, math.max, math.min, math.huge, string.format

local function adapted(low, peak, n)
    local top = math.max(low, math.min(PLATEAU * peak, math.ceil(peak) - 1))
    if n < RECOVER then
        return top - (top - low) * (1 - n / RECOVER) ^ 3
    end
    return top * (1 + PROBE * (n - RECOVER) ^ 3)
end

local function finite(x)
    return x ~= nil and x == x and x ~= huge and x ~= -huge
end

local function whole(x)
    return x == floor(x)
end

-- Numbers go to redis.call as text formatted here: Lua's own conversion keeps
-- only 14 digits, too few for microsecond timestamps.
local function int_text(x)
    return format('%.0f', x)
end

local function num_text(x)
    return format('%.17g', x)
end

-- Why (limit, period_us) cannot be used with `algorithm`, or nil.
local function bad_rate(algorithm, limit, period_us)
    if not finite(limit) or limit <= 0 or ceil(limit) > MAX_LIMIT then
        return 'limit out of range'
    end
    if not finite(period_us) or period_us < MIN_PERIOD_US or period_us > MAX_PERIOD_US then
        return 'period out of range'
    end
    if limit / period_us > MAX_UNITS_PER_US then
        return 'more than 1000000 units per second'
    end
    local interval = period_us / limit
    if interval > MAX_PERIOD_US then
        return 'less than one unit per 366 days'
    end
    if algorithm == 'gcra' then
        if interval < MIN_GCRA_INTERVAL_US then
            return 'gcra needs at least 100 microseconds per unit'
        end
    elseif algorithm == 'sliding' or algorithm == 'fixed' then
        if not whole(limit) and interval < MIN_PACE_INTERVAL_US then
            return 'a fractional limit needs at least 1 microsecond per unit'
        end
        if algorithm == 'fixed' and period_us % 1000 ~= 0 then
            return 'fixed windows are whole milliseconds'
        end
    else
        return 'unknown algorithm'
    end
    return nil
end

-- Milliseconds for PEXPIRE to keep a key `us` microseconds: rounded up, plus
-- one, since Redis may count the ttl from the start of the current millisecond.
local function keep_ms(us)
    return ceil(us / 1000) + 1
end

-- A count or time as stored: a number from 0 to MAX_EXACT (whole, for a count).
local function stored(x, count)
    return finite(x) and x >= 0 and x <= MAX_EXACT and (not count or whole(x))
end

-- The reason a limit's state cannot be used, after giving its key a ttl of at
-- most `keep` microseconds: the limit works again once it expires.
local function bad_state(key, keep, what)
    local ttl = call('PTTL', key)
    if ttl == -1 or ttl > keep_ms(keep) then
        call('PEXPIRE', key, keep_ms(keep))
    end
    return 'the state in ' .. key .. ' is not ' .. what .. '; reset the limit, or wait ' ..
        keep_ms(keep) .. ' ms for it to expire'
end

-- "B O" -> (time from now to B + O in microseconds, at most `most`; true if it
-- was cut down to `most`), nil when absent, or nil and the reason it is unusable.
local function ahead_of(key, now, most)
    local value = redis.pcall('GET', key)
    if not value then
        return nil
    end
    local b, o
    if type(value) == 'string' then
        b, o = string.match(value, '^(%d+) (%S+)$')
    end
    b, o = tonumber(b), tonumber(o)
    if not stored(b, true) or not stored(o) then
        return nil, nil, bad_state(key, most, 'an arrival time')
    end
    local ahead = (b - now) + o
    if ahead > most + EPSILON_US then
        return most, true
    end
    return ahead, false
end

-- Store a time `ahead` microseconds from now, kept for `keep` microseconds.
local function store_ahead(key, now, ahead, keep)
    call('SET', key, int_text(now) .. ' ' .. num_text(ahead), 'PX', keep_ms(keep))
end

local function fail(message)
    return redis.error_reply('ERR celery_redlock ratelimit: ' .. message)
end

-- 1. Check every argument.
local cost = tonumber(ARGV[1])
local consume = ARGV[2]
local margin = tonumber(ARGV[3])
local n = #KEYS / 4
if not finite(cost) or cost < 1 or cost > MAX_LIMIT or not whole(cost) then
    return fail('cost must be a whole number from 1 to ' .. MAX_LIMIT)
end
if consume ~= '0' and consume ~= '1' then
    return fail('consume must be 0 or 1')
end
if not finite(margin) or margin < 0 or margin > MAX_MARGIN_US then
    return fail('margin_us out of range')
end
if n < 1 or n > MAX_LIMITS or not whole(n) or #ARGV ~= 3 + 3 * n then
    return fail('expected 4 keys and 3 arguments per limit, for 1 to ' .. MAX_LIMITS .. ' limits')
end
local seen = {}
for i = 1, 4 * n do
    if seen[KEYS[i]] then
        return fail('key ' .. KEYS[i] .. ' is given twice')
    end
    seen[KEYS[i]] = true
end

local limits = {}
for i = 1, n do
    local algorithm = ARGV[3 + 3 * i - 2]
    local limit = tonumber(ARGV[3 + 3 * i - 1])
    local period_us = tonumber(ARGV[3 + 3 * i])
    local why = bad_rate(algorithm, limit, period_us)
    if why then
        return fail('limit ' .. i .. ' (' .. KEYS[4 * i - 3] .. '): ' .. why)
    end
    if cost > ceil(limit) then
        return fail('limit ' .. i .. ' (' .. KEYS[4 * i - 3] .. '): cost is more than the limit')
    end
    limits[i] = {
        algorithm = algorithm, limit = limit, period_us = period_us,
        state = KEYS[4 * i - 3], pace = KEYS[4 * i - 2], override = KEYS[4 * i - 1],
        backoff = KEYS[4 * i], flags = 0,
    }
end

-- 2. Overrides replace the given limit and period; a bad one is an error.
for _, l in ipairs(limits) do
    local set = call('HMGET', l.override, 'limit', 'period_us')
    if set[1] or set[2] then
        local limit, period_us = tonumber(set[1]), tonumber(set[2])
        local why = bad_rate(l.algorithm, limit, period_us)
        if why then
            return fail('the override in ' .. l.override .. ' cannot be used (' .. why ..
                '); set it again or clear it')
        end
        l.limit, l.period_us, l.flags = limit, period_us, 1
    end
end

local time = call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

-- 2b. A pause refuses the hit; an adaptive rate lowers the limit in force.
for _, l in ipairs(limits) do
    local b = call('HMGET', l.backoff, 'paused_until_us', 'learned', 'since_us', 'steps', 'peak')
    local until_us, learned, since = tonumber(b[1]), tonumber(b[2]), tonumber(b[3])
    if until_us and until_us > now then
        l.paused_us = until_us - now
        l.flags = l.flags + 4
    end
    if learned and since and learned > 0 then
        local steps = max(0, floor((now - since) / l.period_us))
        local ceiling = l.limit
        local peak = tonumber(b[5]) or learned / DECREASE
        local in_force = min(ceiling, max(cost, adapted(learned * l.period_us / 1000000,
            peak * l.period_us / 1000000, steps)))
        if in_force < ceiling and not bad_rate(l.algorithm, in_force, l.period_us) then
            l.limit = in_force
            l.flags = l.flags + 2
        end
        if consume == '1' and steps > (tonumber(b[4]) or 0) then
            call('HSET', l.backoff, 'steps', steps)
            l.flags = l.flags + 8
        end
    end
    if (b[1] or b[2]) and call('PTTL', l.backoff) == -1 then
        -- a backoff without a ttl (PERSIST by hand) would never end
        call('PEXPIRE', l.backoff, keep_ms(max(l.paused_us or 0, l.period_us * RECOVERY_PERIODS)))
    end
end

-- 3. Evaluate every limit, reading only.
local function evaluate_pace(l, window)
    -- A token bucket of ceil(limit) units refilled at limit per window: the
    -- long-run average of a fractional limit.
    local interval = window / l.limit
    local burst = ceil(l.limit) * interval
    local ahead, stale, problem = ahead_of(l.pace, now, burst)
    if problem then
        return problem
    end
    local start = max(ahead or 0, 0)
    local after = start + cost * interval
    local ok = after <= burst + EPSILON_US
    l.pace_after, l.pace_stale = after, stale
    l.pace_ok = ok
    l.pace_retry = ok and 0 or (after - burst)
    l.pace_reset = start
    l.pace_room = floor((burst - start) / interval + EPSILON_US)
    l.pace_interval = interval
    return nil
end

local function evaluate(l)
    local window_limit = ceil(l.limit)
    if l.algorithm == 'gcra' then
        local window = l.period_us + margin
        local interval = window / l.limit
        local ahead, stale, problem = ahead_of(l.state, now, window_limit * interval)
        if problem then
            return problem
        end
        l.interval, l.window, l.stale = interval, window, stale
        -- A hit of cost c is admitted c - 1 slots after the theoretical
        -- arrival time: the units before it then leave room for its c units
        -- in every window of one period that holds it.
        local wait = (ahead or -huge) + (cost - 1) * interval
        l.ok = wait <= EPSILON_US
        l.retry = l.ok and 0 or wait
        -- The state matters until a hit of the largest cost needs no wait.
        l.reset = ahead and max(ahead + (window_limit - 1) * interval, 0) or 0
        -- The units still ahead of now take the first slots of the window.
        l.room = window_limit - ceil(max(ahead or 0, 0) / interval - EPSILON_US)
    elseif l.algorithm == 'sliding' then
        local window = l.period_us + margin
        local width = max(1, floor(window / BUCKETS))
        -- Buckets ending after the current one (left by a longer window, or
        -- a clock stepped back) count as ending with it; written so below.
        local current_end = (floor(now / width) + 1) * width
        l.window, l.current_end = window, current_end
        local newest = redis.pcall('ZRANGE', l.state, -1, -1, 'WITHSCORES')
        local total, newest_end = 0, nil
        local used = 0
        local not_log = 'a log of running totals'
        if newest.err then
            return bad_state(l.state, window, not_log)
        end
        if newest[1] then
            total, newest_end = tonumber(newest[1]), tonumber(newest[2])
            local base = call('ZREVRANGEBYSCORE', l.state, num_text(now - window), '-inf', 'LIMIT', 0, 1)
            local before = base[1] and tonumber(base[1]) or 0
            if not stored(total, true) or not stored(before, true) or before > total then
                return bad_state(l.state, window, not_log)
            end
            used = total - before
            if newest_end > current_end then
                newest_end, l.stale = current_end, true
            end
        end
        l.total, l.newest_member, l.newest_end = total, newest[1], newest_end
        l.ok = used + cost <= window_limit
        l.used = used
        l.reset = (used > 0) and (newest_end + window - now) or 0
        l.room = window_limit - used
        l.retry = 0
        if not l.ok and cost <= window_limit then
            -- The hit fits once the buckets up to the one where the running
            -- total reaches `target` have left the window: the first such
            -- bucket, by binary search over ranks (running totals grow with rank).
            local target = total + cost - window_limit
            -- Most often the oldest bucket in the window is enough (always for cost 1).
            local leaving = call('ZRANGEBYSCORE', l.state, '(' .. num_text(now - window), '+inf',
                'WITHSCORES', 'LIMIT', 0, 1)
            if tonumber(leaving[1]) < target then
                local lo, hi = 0, call('ZCARD', l.state) - 1
                while lo < hi do
                    local mid = floor((lo + hi) / 2)
                    local running = tonumber(call('ZRANGE', l.state, mid, mid)[1])
                    if not stored(running, true) then
                        return bad_state(l.state, window, not_log)
                    end
                    if running >= target then
                        hi = mid
                    else
                        lo = mid + 1
                    end
                end
                leaving = call('ZRANGE', l.state, lo, lo, 'WITHSCORES')
            end
            l.retry = min(tonumber(leaving[2]), current_end) + window - now
        end
    else -- fixed
        local value = redis.pcall('GET', l.state)
        local count = 0
        if value then
            count = tonumber(value)
            if type(value) ~= 'string' or not stored(count, true) then
                return bad_state(l.state, l.period_us, 'a counter')
            end
        end
        local ttl_us = 0
        if count > 0 then
            local ttl = call('PTTL', l.state)
            ttl_us = (ttl > 0) and ttl * 1000 or 0
            if ttl == -1 or ttl_us > l.period_us then
                -- a window without a ttl would never end, and one longer than
                -- the period in force is another limit's: it ends within one period
                l.stale = true
                ttl_us = l.period_us
            end
        end
        l.count = count
        l.ok = count + cost <= window_limit
        l.retry = l.ok and 0 or ttl_us
        l.reset = ttl_us
        l.room = window_limit - count
    end
    if l.algorithm ~= 'gcra' and not whole(l.limit) then
        local problem = evaluate_pace(l, l.window or l.period_us)
        if problem then
            return problem
        end
        if not l.pace_ok then
            l.ok = false
        end
        l.retry = max(l.ok and 0 or l.retry, l.pace_retry)
        l.reset = max(l.reset, l.pace_reset)
        l.room = min(l.room, l.pace_room)
    end
    if l.flags % 2 == 1 and cost > window_limit then
        -- Never admitted while the override lasts: retry once it lapses.
        l.ok = false
        l.retry = max(l.retry, max(call('PTTL', l.override), 0) * 1000)
    end
    return nil
end

local all_ok = true
for _, l in ipairs(limits) do
    local problem = evaluate(l)
    if problem then
        return fail(problem)
    end
    if l.paused_us then
        l.ok = false
        l.retry = max(l.retry, l.paused_us)
    end
    all_ok = all_ok and l.ok
end

-- 4. Count the hit everywhere, or nowhere.
local commit = consume == '1' and all_ok
for _, l in ipairs(limits) do
    if commit then
        if l.algorithm == 'gcra' then
            l.reset = (cost + ceil(l.limit) - 1) * l.interval
            store_ahead(l.state, now, cost * l.interval, l.reset)
            l.room = ceil(l.limit) - cost
        elseif l.algorithm == 'sliding' then
            local bucket_end = l.current_end
            if l.stale then
                call('ZREMRANGEBYSCORE', l.state, '(' .. int_text(bucket_end), '+inf')
            end
            if l.newest_end and bucket_end <= l.newest_end then
                -- The same bucket (or the clock stepped back): add to the newest.
                call('ZREM', l.state, l.newest_member)
                bucket_end = l.newest_end
            end
            call('ZADD', l.state, int_text(bucket_end), int_text(l.total + cost))
            l.reset = bucket_end + l.window - now
            call('PEXPIRE', l.state, keep_ms(l.reset))
            l.room = l.room - cost
        else -- fixed
            call('INCRBY', l.state, cost)
            if l.count == 0 or l.stale then
                call('PEXPIRE', l.state, l.period_us / 1000)
                l.reset = l.period_us
            end
            l.room = l.room - cost
        end
        if l.pace_interval then
            store_ahead(l.pace, now, l.pace_after, l.pace_after)
            l.reset = max(l.reset, l.pace_after)
            l.room = min(l.room, floor((ceil(l.limit) * l.pace_interval - l.pace_after) / l.pace_interval + EPSILON_US))
        end
    else
        -- Nothing counted. Write back state cut down to the limit in force, and
        -- give back a ttl to state something else left without one.
        if l.stale and l.algorithm == 'fixed' then
            call('PEXPIRE', l.state, l.period_us / 1000)
        elseif l.stale and l.algorithm == 'gcra' then
            store_ahead(l.state, now, ceil(l.limit) * l.interval, l.reset)
        elseif l.stale then
            call('ZREMRANGEBYSCORE', l.state, '(' .. int_text(l.current_end), '+inf')
            call('ZADD', l.state, int_text(l.current_end), l.newest_member)
            call('PEXPIRE', l.state, keep_ms(l.reset))
        elseif call('PTTL', l.state) == -1 then
            if l.reset > 0 then
                call('PEXPIRE', l.state, keep_ms(l.reset))
            else
                call('DEL', l.state)
            end
        end
        if l.pace_stale then
            store_ahead(l.pace, now, l.pace_reset, l.pace_reset)
        elseif l.pace_interval and call('PTTL', l.pace) == -1 then
            if l.pace_reset > 0 then
                call('PEXPIRE', l.pace, keep_ms(l.pace_reset))
            else
                call('DEL', l.pace)
            end
        end
    end
    if commit and l.algorithm == 'sliding' then
        -- Drop buckets that left the window, keeping the newest of them (its
        -- running total is the base of the window), at most TRIM_PER_CALL per call.
        local gone = call('ZCOUNT', l.state, '-inf', num_text(now - l.window))
        if gone >= 2 then
            call('ZREMRANGEBYRANK', l.state, 0, min(gone - 2, TRIM_PER_CALL - 1))
        end
    end
end

local replies = {}
for i, l in ipairs(limits) do
    replies[i] = {l.ok and 1 or 0, max(0, l.room), ceil(max(l.retry, 0)), ceil(max(l.reset, 0)),
        num_text(l.limit), num_text(l.period_us), l.flags}
end
return replies
