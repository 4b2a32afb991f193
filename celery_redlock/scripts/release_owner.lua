-- Release a lock on one node on behalf of the task that owns it.
--
-- Used by a worker's main process when a task process died or was killed
-- (hard time limit, revoke with terminate): the lock value written by
-- acquire.lua is "token|task_id|worker", so the owner is found by task id
-- without knowing the token.
--
-- KEYS[1]  the lock key
-- ARGV[1]  task_id: the owner task's id
-- ARGV[2]  channel: pub/sub channel told about the release
--
-- Returns 1 when the key was deleted, 0 when it is absent or owned by
-- another task.
local task_id = ARGV[1]
local channel = ARGV[2]

local value = redis.call('GET', KEYS[1])
if value and string.find(value, '|' .. task_id .. '|', 1, true) then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', channel, '1')
    return 1
end
return 0
