-- Raise a node's fencing counter to at least a given value.
--
-- Used after an acquisition whose nodes disagreed about the counter (a node
-- restarted empty, say): the issued token is written back to a majority
-- before it is handed out, so every later majority sees it.
--
-- KEYS[1]  the fencing counter
-- ARGV[1]  floor: the token about to be issued
-- ARGV[2]  fence_ttl_ms: how long an unused fencing counter is kept, milliseconds
--
-- Returns the counter's value afterwards (>= floor).
local floor = tonumber(ARGV[1])
local fence_ttl_ms = tonumber(ARGV[2])

local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < floor then
    redis.call('SET', KEYS[1], floor)
    current = floor
end
redis.call('PEXPIRE', KEYS[1], fence_ttl_ms)
return current
