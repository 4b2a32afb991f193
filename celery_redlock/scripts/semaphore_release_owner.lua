-- Give up, on one node, every semaphore slot held by one exact run of a task.
--
-- Used by a worker's main process when a task process died or was killed,
-- as release_owner.lua is for locks: a slot's value is "token|task_id|where"
-- (celery_redlock/_layout.py); the run is found by everything after the
-- token, so a later run of the same task id elsewhere is never freed.
--
-- KEYS[1]  holders: hash, slot number -> holder's LockValue
-- KEYS[2]  expiry: sorted set, slot number -> expiry (ms)
-- ARGV[1]  owner: what follows the token in the run's value ("|task_id|where")
-- ARGV[2]  channel: pub/sub channel told about the release
--
-- Returns the number of slots given up.
local owner = ARGV[1]
local channel = ARGV[2]
if #KEYS ~= 2 or not owner or string.sub(owner, 1, 1) ~= '|' or #owner < 3 or not channel then
    return redis.error_reply('ERR semaphore_release_owner.lua: expected 2 keys, owner |task_id|where and a channel')
end
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then
    return 0
end
local found = redis.call('HGETALL', KEYS[1])
local freed = 0
for i = 1, #found, 2 do
    local value = found[i + 1]
    local bar = string.find(value, '|', 1, true)
    if bar and string.sub(value, bar) == owner then
        redis.call('HDEL', KEYS[1], found[i])
        redis.call('ZREM', KEYS[2], found[i])
        freed = freed + 1
    end
end
if redis.call('ZCARD', KEYS[2]) == 0 then
    redis.call('DEL', KEYS[1], KEYS[2])
end
if freed > 0 then
    redis.call('PUBLISH', channel, '1')
end
return freed
