-- Record a publish of a debounced key as its latest: the one copy that may run.
--
-- KEYS[1]  the key's record, a hash (celery_redlock/_layout.py, debounce_record)
-- ARGV[1]  task_id: the id of the copy being published, non-empty
-- ARGV[2]  delay_ms: whole milliseconds from now until the copy may run, 1 to 31536000000
-- ARGV[3]  ttl_ms: how long the record is kept after this publish, same range
--
-- Returns {seq, due_us}: the publish's sequence number (this node's clock in
-- microseconds, raised to one more than the last publish's when the clock
-- has not moved past it, so it strictly increases per key) and the time on
-- this node's clock from which the copy may run. The record before this
-- publish is kept as prev_* (see debounce_withdraw.lua). Arguments are
-- checked before anything is written.
local MAX_MS = 31536000000

local function whole(text, low, high)
    local number = tonumber(text)
    if number and number == math.floor(number) and number >= low and number <= high then
        return number
    end
    return nil
end

local task_id = ARGV[1]
local delay_ms = whole(ARGV[2], 1, MAX_MS)
local ttl_ms = whole(ARGV[3], 1, MAX_MS)
if not task_id or task_id == '' then
    return redis.error_reply('ERR debounce_publish.lua: empty task id')
end
if not delay_ms or not ttl_ms then
    return redis.error_reply('ERR debounce_publish.lua: delay_ms and ttl_ms must be whole milliseconds from 1 to 31536000000')
end
if redis.call('EXISTS', KEYS[1]) == 1 and redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then
    return redis.error_reply('ERR debounce_publish.lua: the record is not a hash')
end

local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local old = redis.call('HMGET', KEYS[1], 'id', 'seq', 'due')
local seq = now_us
local last = tonumber(old[2])
if last and last >= seq then
    seq = last + 1
end
local due_us = now_us + delay_ms * 1000
redis.call('HSET', KEYS[1], 'id', task_id, 'seq', string.format('%d', seq),
    'due', string.format('%d', due_us))
if old[1] then
    redis.call('HSET', KEYS[1], 'prev_id', old[1], 'prev_seq', old[2] or '0', 'prev_due', old[3] or '0')
else
    redis.call('HDEL', KEYS[1], 'prev_id', 'prev_seq', 'prev_due')
end
redis.call('PEXPIRE', KEYS[1], ttl_ms)
return {seq, due_us}
