#!/bin/bash
# The verifier: reward 1 when /app/hello.txt holds exactly "Hello, Orchard!\n", else 0.
mkdir -p /logs/verifier
if [ "$(cat /app/hello.txt 2>/dev/null; echo x)" = "$(printf 'Hello, Orchard!\nx')" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "wrong or missing /app/hello.txt" >&2
  echo 0 > /logs/verifier/reward.txt
fi
