cd /workspace/downloads
rm -- 'Copy of logo.tar.gz'
rm -- lease-agreement-copy.pdf
rm -- 'meeting-notes (1).json'
rm -- 'team-offsite (1).csv'
mkdir -p documents && mv -- budget.md documents/
mkdir -p images && mv -- expenses.png images/
mkdir -p images && mv -- holiday-photo.png images/
mkdir -p documents && mv -- invoice-march.md documents/
mkdir -p documents && mv -- lease-agreement.pdf documents/
mkdir -p archives && mv -- logo.tar.gz archives/
mkdir -p data && mv -- 'meeting-notes (2).json' data/
mkdir -p data && mv -- meeting-notes.json data/
mkdir -p data && mv -- team-offsite.csv data/
mkdir -p .
cat > cleanup.log <<'ORCHARD_EOF'
Copy of logo.tar.gz
lease-agreement-copy.pdf
meeting-notes (1).json
team-offsite (1).csv
ORCHARD_EOF
