"""try_it.py: run beside a worker (celery -A tasks worker) to see the three cases at work."""

import time

from tasks import fetch_price, nightly, sync_user

# 1. Six syncs of one user run one after another, each holding the user's lock;
#    each hold gets a fencing token larger than every earlier one. Those that find
#    the lock busy are re-queued until it is free: all six succeed.
results = [sync_user.delay(42) for _ in range(6)]
tokens = [result.get(timeout=120) for result in results]
print("each sync of user 42 held its lock, fencing tokens:", sorted(tokens))

# 2. Publishing the queued nightly report again returns the copy already queued.
first = nightly.delay("2026-11-24")
again = nightly.delay("2026-11-24")
print("second publish returned the queued task:", again.id == first.id)
print(first.get(timeout=60))

# 3. Six prices asked at once are spread over the 2/s limit, none lost.
started = time.monotonic()
prices = [result.get(timeout=60) for result in [fetch_price.delay("ACME") for _ in range(6)]]
print(f"{len(prices)} prices within the 2/s limit in {time.monotonic() - started:.1f} s")
