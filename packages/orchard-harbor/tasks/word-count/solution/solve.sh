#!/bin/bash
set -euo pipefail
wc -w < words.txt | tr -d ' ' > count.txt
