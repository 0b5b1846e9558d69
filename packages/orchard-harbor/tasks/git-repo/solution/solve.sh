#!/bin/bash
set -euo pipefail
mkdir -p /app/repo
cd /app/repo
git init -q -b main .
echo '# Orchard' > README.md
git add README.md
git -c user.name='Orchard Bot' -c user.email='bot@orchard.invalid' commit -q -m 'initial import'
