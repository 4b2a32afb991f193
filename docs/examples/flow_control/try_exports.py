"""try_exports.py: 12 exports for one tenant and 3 for another, with a worker running."""

from exports import board, export

board.delete("running:acme", "seen:acme", "running:globex", "seen:globex")
results = [export.delay("acme", n) for n in range(12)]
results += [export.delay("globex", n) for n in range(3)]
done = [result.get(timeout=120) for result in results]
most = max(int(count) for count in board.lrange("seen:acme", 0, -1))
print(f"OK: {len(done)} exports, at most {most} of acme's at once")
