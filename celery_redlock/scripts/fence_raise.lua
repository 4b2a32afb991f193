-- Raise a node's fencing bucket to at least a given value.
--
-- The second round of an acquisition whose first round did not show every
-- answering node below the proposed token: the token is recorded on a
-- majority before it is handed out, so that every later majority sees it.
--
-- KEYS[1]  the fencing bucket (celery_redlock/_layout.py)
-- ARGV[1]  floor: the token about to be issued, decimal digits, 1 to 2^53
-- ARGV[2]  fence_ttl_ms: time to live of the bucket, whole milliseconds, 1 to 31536000000
--
-- Returns the bucket's value afterwards (>= floor), decimal digits. A missing
-- bucket reads as this node's clock (TIME) in microseconds, and is written
-- with the larger of that and the floor. Arguments are checked before
-- anything is written. A bucket (or clock) at or past 2^53 is an error reply:
-- no token could be larger.
local MAX_MS = 31536000000
local MAX_EXACT = 9007199254740992 -- 2^53

local floor_text = ARGV[1]
local floor = nil
-- Compared as text too: tonumber rounds 2^53 + 1 down to 2^53.
if floor_text and string.match(floor_text, '^[1-9]%d*$')
        and (#floor_text < 16 or (#floor_text == 16 and floor_text <= '9007199254740992')) then
    floor = tonumber(floor_text)
    if floor > MAX_EXACT then
        floor = nil
    end
end
local fence_ttl_ms = tonumber(ARGV[2])
if not floor then
    return redis.error_reply('ERR fence_raise.lua: floor must be decimal digits from 1 to 2^53')
end
if not fence_ttl_ms or fence_ttl_ms ~= math.floor(fence_ttl_ms) or fence_ttl_ms < 1 or fence_ttl_ms > MAX_MS then
    return redis.error_reply('ERR fence_raise.lua: fence_ttl_ms must be whole milliseconds from 1 to 31536000000')
end

local stored = redis.call('GET', KEYS[1])
local current
if stored then
    current = tonumber(stored)
    if not current then
        return redis.error_reply('ERR fence_raise.lua: the fencing bucket does not hold a number')
    end
else
    local time = redis.call('TIME')
    current = tonumber(time[1]) * 1000000 + tonumber(time[2])
end
if current >= MAX_EXACT then
    return redis.error_reply('ERR fence_raise.lua: fencing bucket ' .. KEYS[1] .. ' is at '
        .. string.format('%.0f', current) .. (stored and '' or ' (this node\'s clock, in microseconds)')
        .. ', at or past 2^53, the largest token there can be; delete it if it was planted, '
        .. 'or fix this node\'s clock')
end
if current < floor then
    redis.call('SET', KEYS[1], floor_text, 'PX', fence_ttl_ms)
    return floor_text
end
local current_text = string.format('%.0f', current)
if not stored then
    redis.call('SET', KEYS[1], current_text, 'PX', fence_ttl_ms)
end
return current_text
