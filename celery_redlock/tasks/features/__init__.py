"""One module per user-visible feature of LockedTask.

Singleton, queued singleton, debounce, concurrency limit, rate limit, re-delivery.
"""
