#!/bin/bash
set -euo pipefail
mkdir -p /app
printf 'Hello, Orchard!\n' > /app/hello.txt
