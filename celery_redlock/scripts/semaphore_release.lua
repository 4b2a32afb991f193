-- Give up a semaphore slot on one node if, and only if, the caller holds it;
-- optionally leave the waiters' queue.
--
-- Key layout: celery_redlock/_layout.py (SemaphoreKeys).
-- KEYS[1]  holders: hash, slot number -> holder's LockValue
-- KEYS[2]  expiry: sorted set, slot number -> expiry (ms, this node's time)
-- KEYS[3]  queue: sorted set, waiter id -> ticket
-- KEYS[4]  waiting: sorted set, waiter id -> when its entry lapses
-- ARGV[1]  slot: the slot to give up, or -1 for every slot that holds value
--          (an attempt that read no answer from this node does not know which
--          slot it granted, nor whether a renewal placed another there since)
-- ARGV[2]  value: the holder's LockValue exactly as written ('' to give up nothing)
-- ARGV[3]  channel: pub/sub channel told about the release ('' = tell nobody)
-- ARGV[4]  waiter: a waiter id to remove from the queue ('' for none)
--
-- Returns 1 when a slot was given up; 0 when the value held none; -1 when
-- the slot is held by another value (left untouched). A release is
-- announced on this node either way (a waiter listens on one node only).
local holders, expiry, queue, waiting = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local slot = tonumber(ARGV[1])
local value = ARGV[2] or ''
local channel = ARGV[3] or ''
local waiter = ARGV[4] or ''
if #KEYS ~= 4 or #ARGV ~= 4 or not slot or slot ~= math.floor(slot) or slot < -1 then
    return redis.error_reply('ERR semaphore_release.lua: expected 4 keys, and a slot of -1 or more')
end

local released = 0
if value ~= '' then
    if slot < 0 then
        local found = redis.call('HGETALL', holders)
        for i = 1, #found, 2 do
            if found[i + 1] == value then
                redis.call('HDEL', holders, found[i])
                redis.call('ZREM', expiry, found[i])
                released = 1
            end
        end
    else
        local held = redis.call('HGET', holders, slot)
        if held == value then
            redis.call('HDEL', holders, slot)
            redis.call('ZREM', expiry, slot)
            released = 1
        elseif held then
            released = -1
        end
    end
end
if waiter ~= '' then
    redis.call('ZREM', queue, waiter)
    redis.call('ZREM', waiting, waiter)
end
-- Deleting members never needs a longer time to live; Redis deletes a key
-- left empty.
if channel ~= '' then
    redis.call('PUBLISH', channel, '1')
end
return released
