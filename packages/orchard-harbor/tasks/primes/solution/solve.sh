#!/bin/bash
set -euo pipefail
mkdir -p /app
python3 - <<'PY'
primes = [n for n in range(2, 100) if all(n % d for d in range(2, int(n**0.5) + 1))]
with open("/app/primes.txt", "w") as out:
    out.write("".join(f"{p}\n" for p in primes))
PY
