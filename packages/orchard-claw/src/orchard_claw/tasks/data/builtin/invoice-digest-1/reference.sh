cd /workspace/mail/inbox
mkdir -p .
cat > m203.json <<'ORCHARD_EOF'
{
  "id": "m203",
  "from": "billing@tailspin.test",
  "to": "sam@acme.test",
  "date": "2024-06-03T15:00",
  "subject": "Invoice INV-2024-5190",
  "body": "Dear customer,\n\nplease find attached invoice INV-2024-5190 for our services in May.\nAmount due: EUR 1,524.11\nPayment terms: 30 days.\n\nTailspin Travel",
  "labels": [
    "invoice"
  ]
}
ORCHARD_EOF
mkdir -p .
cat > m204.json <<'ORCHARD_EOF'
{
  "id": "m204",
  "from": "billing@adatum.test",
  "to": "sam@acme.test",
  "date": "2024-06-03T18:20",
  "subject": "Reminder: INV-2024-3869",
  "body": "Friendly reminder that invoice INV-2024-3869 (EUR 4,607.08) is still open.",
  "labels": [
    "invoice"
  ]
}
ORCHARD_EOF
mkdir -p .
cat > m202.json <<'ORCHARD_EOF'
{
  "id": "m202",
  "from": "billing@fabrikam.test",
  "to": "sam@acme.test",
  "date": "2024-06-03T12:21",
  "subject": "Invoice INV-2024-3869",
  "body": "Dear customer,\n\nplease find attached invoice INV-2024-3869 for our services in May.\nAmount due: EUR 4,607.08\nPayment terms: 30 days.\n\nFabrikam IT",
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
  "date": "2024-06-03T09:44",
  "subject": "Invoice INV-2024-4488",
  "body": "Dear customer,\n\nplease find attached invoice INV-2024-4488 for our services in May.\nAmount due: EUR 2,843.80\nPayment terms: 30 days.\n\nAdatum Catering",
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
  "body": "Hi,\n\nthese invoices arrived:\n- INV-2024-3869: EUR 4,607.08\n- INV-2024-4488: EUR 2,843.80\n- INV-2024-5190: EUR 1,524.11\n\nTotal: EUR 8,974.99\n\nSam"
}
ORCHARD_EOF
