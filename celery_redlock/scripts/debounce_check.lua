-- Decide whether a copy of a debounced task may run now.
--
-- KEYS[1]  the key's record, a hash (celery_redlock/_layout.py, debounce_record)
-- ARGV[1]  task_id: the id of the copy about to run, non-empty
-- ARGV[2]  seq: the sequence number its publish got (debounce_publish.lua),
--          decimal digits; "0" when unknown
-- ARGV[3]  ttl_ms: how long a record written here is kept, 1 to 31536000000
--
-- Returns one of:
--   {1}             run: the copy is the key's latest and its due time has passed
--   {2, wait_ms}    the copy is the latest but due only in wait_ms (> 0) milliseconds
--   {0, latest_id}  superseded: a later publish (latest_id) is the one to run
-- When the record is gone (expired, or the node lost it) or names a publish
-- older than this copy (the record was lost and re-written by an older
-- copy), this copy becomes the latest, due now, and may run: a newer
-- publish is never superseded by an older one.
local MAX_MS = 31536000000
local task_id = ARGV[1]
local seq = tonumber(ARGV[2])
local ttl_ms = tonumber(ARGV[3])
if not task_id or task_id == '' then
    return redis.error_reply('ERR debounce_check.lua: empty task id')
end
if not seq or seq < 0 or seq ~= math.floor(seq) then
    return redis.error_reply('ERR debounce_check.lua: seq must be decimal digits')
end
if not ttl_ms or ttl_ms < 1 or ttl_ms > MAX_MS or ttl_ms ~= math.floor(ttl_ms) then
    return redis.error_reply('ERR debounce_check.lua: ttl_ms must be whole milliseconds from 1 to 31536000000')
end
if redis.call('EXISTS', KEYS[1]) == 1 and redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then
    return redis.error_reply('ERR debounce_check.lua: the record is not a hash')
end

local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local record = redis.call('HMGET', KEYS[1], 'id', 'seq', 'due')
local latest = record[1]
if latest == task_id then
    local due = tonumber(record[3]) or 0
    if now_us < due then
        return {2, math.ceil((due - now_us) / 1000)}
    end
    return {1}
end
if latest and seq <= (tonumber(record[2]) or 0) then
    return {0, latest}
end
redis.call('HSET', KEYS[1], 'id', task_id, 'seq', ARGV[2], 'due', string.format('%d', now_us))
redis.call('HDEL', KEYS[1], 'prev_id', 'prev_seq', 'prev_due')
redis.call('PEXPIRE', KEYS[1], ttl_ms)
return {1}
