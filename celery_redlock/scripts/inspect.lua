-- Read a lock's value and remaining time to live on one node.
--
-- KEYS[1]  the lock key (celery_redlock/_layout.py)
--
-- Returns {value, pttl_ms}; value (a LockValue, read by _layout.LockValue.parse)
-- is false when the key is absent.
local value = redis.call('GET', KEYS[1])
return {value, redis.call('PTTL', KEYS[1])}
