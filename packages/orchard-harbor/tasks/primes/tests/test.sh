#!/bin/bash
mkdir -p /logs/verifier
python3 - <<'PY'
import pathlib

expected = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73,
            79, 83, 89, 97]
try:
    got = [int(line) for line in pathlib.Path("/app/primes.txt").read_text().split()]
except (OSError, ValueError) as exc:
    got = f"unreadable: {exc}"
ok = got == expected
print("primes:", "ok" if ok else f"got {got}")
pathlib.Path("/logs/verifier/reward.txt").write_text("1\n" if ok else "0\n")
PY
