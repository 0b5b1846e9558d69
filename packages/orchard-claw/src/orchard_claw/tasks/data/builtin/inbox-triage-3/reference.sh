cd /workspace/mail/inbox
mkdir -p .
cat > m106.json <<'ORCHARD_EOF'
{
  "id": "m106",
  "from": "kira@acme.test",
  "to": "sam@acme.test",
  "date": "2024-05-13T11:06",
  "subject": "Board deck",
  "body": "Please send me the board deck by 3pm.",
  "labels": [
    "urgent"
  ]
}
ORCHARD_EOF
mkdir -p .
cat > m107.json <<'ORCHARD_EOF'
{
  "id": "m107",
  "from": "chen@acme.test",
  "to": "sam@acme.test",
  "date": "2024-05-13T12:05",
  "subject": "URGENT: hiring plan numbers wrong",
  "body": "The totals in the sheet do not add up, can you check?",
  "labels": [
    "urgent"
  ]
}
ORCHARD_EOF
mkdir -p /workspace/mail/drafts
cat > /workspace/mail/drafts/reply-m108.json <<'ORCHARD_EOF'
{
  "to": "ivo@acme.test",
  "subject": "Re: Launch checklist",
  "in_reply_to": "m108",
  "body": "Hi Ivo,\n\nSure - does Thursday 16 May at 09:30 work for you?\n\nBest,\nSam"
}
ORCHARD_EOF
mkdir -p /workspace/mail/drafts
cat > /workspace/mail/drafts/reply-m109.json <<'ORCHARD_EOF'
{
  "to": "hana@acme.test",
  "subject": "Re: Launch checklist",
  "in_reply_to": "m109",
  "body": "Hi Hana,\n\nSure - does Thursday 16 May at 10:00 work for you?\n\nBest,\nSam"
}
ORCHARD_EOF
