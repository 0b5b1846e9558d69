cd /workspace/mail/inbox
mkdir -p .
cat > m204.json <<'ORCHARD_EOF'
{
  "id": "m204",
  "from": "billing@adatum.test",
  "to": "sam@acme.test",
  "date": "2024-06-03T18:26",
  "subject": "Reminder: INV-2024-6423",
  "body": "Friendly reminder that invoice INV-2024-6423 (EUR 1,681.59) is still open.",
  "labels": [
    "invoice"
  ]
}
ORCHARD_EOF
mkdir -p .
cat > m201.json <<'ORCHARD_EOF'
{
  "id": "m201",
  "from": "billing@adatum.test",
  "to": "sam@acme.test",
  "date": "2024-06-03T09:15",
  "subject": "Invoice INV-2024-8363",
  "body": "Dear customer,\n\nplease find attached invoice INV-2024-8363 for our services in May.\nAmount due: EUR 4,623.21\nPayment terms: 30 days.\n\nAdatum Catering",
  "labels": [
    "invoice"
  ]
}
ORCHARD_EOF
mkdir -p .
cat > m203.json <<'ORCHARD_EOF'
{
  "id": "m203",
  "from": "billing@northwind.test",
  "to": "sam@acme.test",
  "date": "2024-06-03T15:08",
  "subject": "Invoice INV-2024-0285",
  "body": "Dear customer,\n\nplease find attached invoice INV-2024-0285 for our services in May.\nAmount due: EUR 4,159.34\nPayment terms: 30 days.\n\nNorthwind Supplies",
  "labels": [
    "invoice"
  ]
}
ORCHARD_EOF
mkdir -p .
cat > m202.json <<'ORCHARD_EOF'
{
  "id": "m202",
  "from": "billing@contoso.test",
  "to": "sam@acme.test",
  "date": "2024-06-03T12:31",
  "subject": "Invoice INV-2024-6423",
  "body": "Dear customer,\n\nplease find attached invoice INV-2024-6423 for our services in May.\nAmount due: EUR 1,681.59\nPayment terms: 30 days.\n\nContoso Cleaning",
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
  "body": "Hi,\n\nthese invoices arrived:\n- INV-2024-0285: EUR 4,159.34\n- INV-2024-6423: EUR 1,681.59\n- INV-2024-8363: EUR 4,623.21\n\nTotal: EUR 10,464.14\n\nSam"
}
ORCHARD_EOF
