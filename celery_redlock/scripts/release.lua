-- Release a lock on one node if, and only if, the caller still owns it.
--
-- KEYS[1]  the lock key (celery_redlock/_layout.py)
-- KEYS[2]  the lock's argument preview, "<KEYS[1]>:args" (celery_redlock/_layout.py,
--          LockKeys.args): written for a singleton by its holder, deleted with the
--          lock so that no preview outlives its holder's run
-- ARGV[1]  value: the owner's LockValue, exactly as written by acquire.lua
-- ARGV[2]  channel: pub/sub channel told about the release ('' = tell nobody)
--
-- Returns 1 when the key was deleted (and the preview with it); 0 when it was
-- absent; -1 when another owner holds it (another value, or a key of another
-- type). Unless 1, both keys are left untouched: the preview may be another
-- holder's. The release is announced on this node either way: a lock
-- is held by a majority, not always by every node, and a waiter listens on
-- one node only, perhaps one this owner never held. A spare wake-up costs a
-- waiter one attempt; a missed one costs it a retry delay.
local value = ARGV[1]
local channel = ARGV[2] or ''

-- pcall: a key of another type is an error reply here (a table), not an abort.
local held = redis.pcall('GET', KEYS[1])
local released = -1
if held == value then
    redis.call('DEL', KEYS[1], KEYS[2])
    released = 1
elseif held == false then
    released = 0
end
if channel ~= '' then
    redis.call('PUBLISH', channel, '1')
end
return released
