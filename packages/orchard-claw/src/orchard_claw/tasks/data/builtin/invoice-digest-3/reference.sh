cd /workspace/mail/inbox
mkdir -p .
cat > m203.json <<'ORCHARD_EOF'
{
  "id": "m203",
  "from": "billing@litware.test",
  "to": "sam@acme.test",
  "date": "2024-06-03T15:57",
  "subject": "Invoice INV-2024-5732",
  "body": "Dear customer,\n\nplease find attached invoice INV-2024-5732 for our services in May.\nAmount due: EUR 4,235.94\nPayment terms: 30 days.\n\nLitware Print",
  "labels": [
    "invoice"
  ]
}
ORCHARD_EOF
mkdir -p .
cat > m204.json <<'ORCHARD_EOF'
{
  "id": "m204",
  "from": "billing@contoso.test",
  "to": "sam@acme.test",
  "date": "2024-06-03T18:19",
  "subject": "Reminder: INV-2024-4342",
  "body": "Friendly reminder that invoice INV-2024-4342 (EUR 803.59) is still open.",
  "labels": [
    "invoice"
  ]
}
ORCHARD_EOF
mkdir -p .
cat > m201.json <<'ORCHARD_EOF'
{
  "id": "m201",
  "from": "billing@contoso.test",
  "to": "sam@acme.test",
  "date": "2024-06-03T09:59",
  "subject": "Invoice INV-2024-7390",
  "body": "Dear customer,\n\nplease find attached invoice INV-2024-7390 for our services in May.\nAmount due: EUR 2,148.65\nPayment terms: 30 days.\n\nContoso Cleaning",
  "labels": [
    "invoice"
  ]
}
ORCHARD_EOF
mkdir -p .
cat > m202.json <<'ORCHARD_EOF'
{
  "id": "m202",
  "from": "billing@northwind.test",
  "to": "sam@acme.test",
  "date": "2024-06-03T12:16",
  "subject": "Invoice INV-2024-4342",
  "body": "Dear customer,\n\nplease find attached invoice INV-2024-4342 for our services in May.\nAmount due: EUR 803.59\nPayment terms: 30 days.\n\nNorthwind Supplies",
  "labels": [
    "invoice"
  ]
}
ORCHARD_EOF
mkdir -p /workspace/mail/outbox
cat > /workspace/mail/outbox/invoices.json <<'ORCHARD_EOF'
{
  "to": "accounting@acme.test",
  "subject": "Open invoices",
  "body": "Hi,\n\nthese invoices arrived:\n- INV-2024-4342: EUR 803.59\n- INV-2024-5732: EUR 4,235.94\n- INV-2024-7390: EUR 2,148.65\n\nTotal: EUR 7,188.18\n\nSam"
}
ORCHARD_EOF
