-- Release a lock on one node on behalf of one exact run of a task.
--
-- Used by a worker's main process when a task process died or was killed
-- (hard time limit, revoke with terminate): the lock value written by
-- acquire.lua is "token|task_id|where" (celery_redlock/_layout.py), where
-- "where" is the host:pid of the process that ran the task. The run is found
-- by everything after the token, without knowing the token, so a later run
-- of the same task id (a re-delivered copy, another process) is never freed.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the lock's argument preview, "<KEYS[1]>:args" (LockKeys.args), deleted with
--          the lock as release.lua does: a killed run leaves no preview behind
-- ARGV[1]  owner: what follows the token in the run's value ("|task_id|where")
-- ARGV[2]  channel: pub/sub channel told about the release
--
-- Returns 1 when the key was deleted (and the preview with it), 0 when it is
-- absent or held by anyone else; both keys are then left untouched.
local owner = ARGV[1]
local channel = ARGV[2]
if not owner or string.sub(owner, 1, 1) ~= '|' or #owner < 3 then
    return redis.error_reply('ERR release_owner.lua: owner must be |task_id|where')
end

if redis.call('TYPE', KEYS[1])['ok'] ~= 'string' then
    return 0
end
local value = redis.call('GET', KEYS[1])
local bar = string.find(value, '|', 1, true)
if bar and string.sub(value, bar) == owner then
    redis.call('DEL', KEYS[1], KEYS[2])
    redis.call('PUBLISH', channel, '1')
    return 1
end
return 0
