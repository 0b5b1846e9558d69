cd /workspace/downloads
rm -- 'Copy of backup.tar.gz'
rm -- 'Copy of lease-agreement.jpg'
rm -- 'holiday-photo (1).txt'
rm -- 'screenshot (1).csv'
mkdir -p archives && mv -- backup.tar.gz archives/
mkdir -p documents && mv -- expenses.pdf documents/
mkdir -p documents && mv -- holiday-photo.txt documents/
mkdir -p data && mv -- invoice-march.json data/
mkdir -p images && mv -- 'lease-agreement (2).jpg' images/
mkdir -p images && mv -- lease-agreement.jpg images/
mkdir -p documents && mv -- recipes.pdf documents/
mkdir -p data && mv -- screenshot.csv data/
mkdir -p documents && mv -- tax-return-2023.docx documents/
mkdir -p .
cat > cleanup.log <<'ORCHARD_EOF'
Copy of backup.tar.gz
Copy of lease-agreement.jpg
holiday-photo (1).txt
screenshot (1).csv
ORCHARD_EOF
