#!/bin/bash
# Runs from the working directory, where the task's environment/ files were uploaded.
mkdir -p /logs/verifier
expected=13
if [ -f words.txt ] && [ "$(cat count.txt 2>/dev/null)" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "count.txt should hold $expected" >&2
  echo 0 > /logs/verifier/reward.txt
fi
