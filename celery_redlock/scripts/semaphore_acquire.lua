-- Take one numbered slot of a semaphore on one node, waiters served in ticket order.
--
-- Key layout: celery_redlock/_layout.py (SemaphoreKeys). Every key written
-- here gets a time to live that covers the latest expiry it holds.
-- KEYS[1]  holders: hash, slot number -> holder's LockValue (token|task_id|where)
-- KEYS[2]  expiry: sorted set, slot number -> expiry, this node's time in ms
-- KEYS[3]  queue: sorted set, waiter id -> ticket (the order waiters are served in)
-- KEYS[4]  waiting: sorted set, waiter id -> when its queue entry lapses (ms)
-- ARGV[1]  value: the holder's LockValue, non-empty
-- ARGV[2]  ttl_ms: the slot's time to live, whole milliseconds, 1 to 31536000000
-- ARGV[3]  limit: slots 0 .. limit-1 may be taken, 1 to 100000
-- ARGV[4]  want: the slot to take, or -1 for the lowest free slot
-- ARGV[5]  waiter: the waiter id ('' for a caller that does not queue)
-- ARGV[6]  ticket: the waiter's ticket, decimal ('' for "this node's time in µs")
-- ARGV[7]  wait_ms: how long the waiter's queue entry lasts unless renewed (1 or more)
--
-- A caller is granted a slot when one is free and fewer waiters are ahead
-- of it in the queue than there are free slots (a caller with no waiter id
-- queues behind everyone). A refused caller with a waiter id is queued, or
-- its entry renewed. Expired slots and lapsed queue entries are removed first.
--
-- Returns {slot, retry_ms, ticket, free}: slot is the slot taken or
-- -1; retry_ms, for a refusal, the time until the earliest slot expires
-- (-1: none held, or granted);
-- ticket the waiter's ticket on this node (0 without a waiter id); free, up
-- to 16 of the free slots the caller could have had, lowest first (empty when
-- it was refused). Arguments are checked before anything is written.
local MAX_MS = 31536000000
local MAX_LIMIT = 100000

local holders, expiry, queue, waiting = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local value = ARGV[1]
local ttl_ms = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local waiter = ARGV[5] or ''
local ticket = tonumber(ARGV[6] or '')
local wait_ms = tonumber(ARGV[7])

local function whole(x, low, high)
    return x ~= nil and x == math.floor(x) and x >= low and x <= high
end

if #KEYS ~= 4 or #ARGV ~= 7 then
    return redis.error_reply('ERR semaphore_acquire.lua: expected 4 keys and 7 arguments')
end
if not value or value == '' then
    return redis.error_reply('ERR semaphore_acquire.lua: empty holder value')
end
if not whole(ttl_ms, 1, MAX_MS) or not whole(wait_ms, 1, MAX_MS) then
    return redis.error_reply('ERR semaphore_acquire.lua: ttl_ms and wait_ms must be whole milliseconds from 1 to 31536000000')
end
if not whole(limit, 1, MAX_LIMIT) or not whole(want, -1, limit - 1) then
    return redis.error_reply('ERR semaphore_acquire.lua: limit must be 1 to 100000, want -1 or a slot below it')
end
if ARGV[6] ~= '' and not whole(ticket, 0, 9007199254740992) then
    return redis.error_reply('ERR semaphore_acquire.lua: ticket must be decimal digits')
end

local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local now = math.floor(now_us / 1000)

-- Expired slots and lapsed waiters go first.
local expired = redis.call('ZRANGEBYSCORE', expiry, '-inf', now)
if #expired > 0 then
    redis.call('HDEL', holders, unpack(expired))
    redis.call('ZREMRANGEBYSCORE', expiry, '-inf', now)
end
local lapsed = redis.call('ZRANGEBYSCORE', waiting, '-inf', now)
if #lapsed > 0 then
    redis.call('ZREM', queue, unpack(lapsed))
    redis.call('ZREMRANGEBYSCORE', waiting, '-inf', now)
end

-- The free slots: the count, and the lowest 16. Only the slots held and
-- the first free ones are looked at, whatever the limit.
local taken = {}
local held_below = 0
for _, slot in ipairs(redis.call('HKEYS', holders)) do
    local number = tonumber(slot)
    if number then
        taken[number] = true
        if number < limit then
            held_below = held_below + 1
        end
    end
end
local free_count = limit - held_below
local free = {}
local slot = 0
while #free < 16 and #free < free_count do
    if not taken[slot] then
        free[#free + 1] = slot
    end
    slot = slot + 1
end

-- How many waiters are ahead of the caller.
local ahead
if waiter ~= '' then
    if ticket then
        redis.call('ZADD', queue, ticket, waiter)
    elseif not redis.call('ZSCORE', queue, waiter) then
        redis.call('ZADD', queue, now_us, waiter)
    end
    ticket = tonumber(redis.call('ZSCORE', queue, waiter))
    ahead = redis.call('ZRANK', queue, waiter)
else
    ticket = 0
    ahead = redis.call('ZCARD', queue)
end

local granted = -1
if ahead < free_count then
    if want >= 0 then
        if not taken[want] then
            granted = want
        end
    else
        granted = free[1]
    end
end

local function keep(keys, score_key)
    -- The keys live as long as the latest score they hold.
    local last = redis.call('ZRANGE', score_key, -1, -1, 'WITHSCORES')
    for _, key in ipairs(keys) do
        if last[2] then
            redis.call('PEXPIRE', key, math.max(1, tonumber(last[2]) - now + 1))
        else
            redis.call('DEL', key)
        end
    end
end

local retry = -1
if granted >= 0 then
    redis.call('HSET', holders, granted, value)
    redis.call('ZADD', expiry, now + ttl_ms, granted)
    keep({holders, expiry}, expiry)
    if waiter ~= '' then
        redis.call('ZREM', queue, waiter)
        redis.call('ZREM', waiting, waiter)
        keep({queue, waiting}, waiting)
    end
else
    free = {}
    if waiter ~= '' then
        redis.call('ZADD', waiting, now + wait_ms, waiter)
        keep({queue, waiting}, waiting)
    end
    local first = redis.call('ZRANGE', expiry, 0, 0, 'WITHSCORES')
    if first[2] then
        retry = math.max(0, tonumber(first[2]) - now)
    end
end
return {granted, retry, ticket, free}
