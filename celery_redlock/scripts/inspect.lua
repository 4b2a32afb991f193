-- Read a lock's value and remaining time to live on one node.
--
-- KEYS[1]  the lock key
--
-- Returns {value, pttl_ms}; value is false when the key is absent.
local value = redis.call('GET', KEYS[1])
return {value, redis.call('PTTL', KEYS[1])}
