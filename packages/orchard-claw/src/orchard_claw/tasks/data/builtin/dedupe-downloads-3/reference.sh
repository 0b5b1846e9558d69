cd /workspace/downloads
rm -- 'Copy of cv-draft.zip'
rm -- 'Copy of flight-ticket.tar.gz'
rm -- 'Copy of tax-return-2023.docx'
rm -- 'invoice-march (1).zip'
mkdir -p archives && mv -- backup.tar.gz archives/
mkdir -p archives && mv -- cv-draft.zip archives/
mkdir -p images && mv -- expenses.jpg images/
mkdir -p archives && mv -- 'flight-ticket (2).tar.gz' archives/
mkdir -p archives && mv -- flight-ticket.tar.gz archives/
mkdir -p documents && mv -- holiday-photo.docx documents/
mkdir -p archives && mv -- invoice-march.zip archives/
mkdir -p documents && mv -- logo.txt documents/
mkdir -p data && mv -- screenshot.csv data/
mkdir -p documents && mv -- tax-return-2023.docx documents/
mkdir -p documents && mv -- team-offsite.md documents/
mkdir -p .
cat > cleanup.log <<'ORCHARD_EOF'
Copy of cv-draft.zip
Copy of flight-ticket.tar.gz
Copy of tax-return-2023.docx
invoice-march (1).zip
ORCHARD_EOF
