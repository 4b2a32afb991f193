-- Take back a publish whose message could not be sent: the publish before it
-- is the latest again.
--
-- KEYS[1]  the key's record, a hash (celery_redlock/_layout.py, debounce_record)
-- ARGV[1]  task_id: the id of the copy that was not sent
--
-- Returns 1 when the record named task_id and now names the publish before
-- it (or is gone, when there was none), 0 when a later publish already
-- replaced it (nothing to undo; but that later publish no longer falls
-- back on it). The record's ttl is left as it is.
local task_id = ARGV[1]
if not task_id or task_id == '' then
    return redis.error_reply('ERR debounce_withdraw.lua: empty task id')
end
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then
    return 0
end
local current = redis.call('HMGET', KEYS[1], 'id', 'prev_id', 'prev_seq', 'prev_due')
if current[1] ~= task_id then
    if current[2] == task_id then
        -- The publish after it cannot fall back on it: it was never sent.
        -- With no earlier publish known, withdrawing that one drops the
        -- record, and the copy that comes up first records itself and runs.
        redis.call('HDEL', KEYS[1], 'prev_id', 'prev_seq', 'prev_due')
    end
    return 0
end
if not current[2] then
    redis.call('DEL', KEYS[1])
    return 1
end
-- The sequence stays: a copy published later still gets a larger one.
redis.call('HSET', KEYS[1], 'id', current[2], 'due', current[4])
redis.call('HDEL', KEYS[1], 'prev_id', 'prev_seq', 'prev_due')
return 1
