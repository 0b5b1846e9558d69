#!/bin/bash
mkdir -p /logs/verifier
a=$(python3 mean.py 1 2 3 2>&1)
b=$(python3 mean.py 10 20 2>&1)
c=$(python3 mean.py 7 2>&1)
if [ "$a" = "2.0" ] && [ "$b" = "15.0" ] && [ "$c" = "7.0" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "got: $a / $b / $c" >&2
  echo 0 > /logs/verifier/reward.txt
fi
