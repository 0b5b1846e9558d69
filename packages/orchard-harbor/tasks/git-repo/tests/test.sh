#!/bin/bash
mkdir -p /logs/verifier
reward=0
if cd /app/repo 2>/dev/null \
  && [ "$(git rev-list --count main 2>/dev/null)" = "1" ] \
  && [ "$(git log -1 --format=%s main)" = "initial import" ] \
  && [ "$(git log -1 --format='%an <%ae>' main)" = "Orchard Bot <bot@orchard.invalid>" ] \
  && [ "$(git show main:README.md)" = "# Orchard" ]; then
  reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
