cd /workspace/mail/inbox
mkdir -p .
cat > m106.json <<'ORCHARD_EOF'
{
  "id": "m106",
  "from": "kira@acme.test",
  "to": "sam@acme.test",
  "date": "2024-05-13T11:22",
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
  "from": "hana@acme.test",
  "to": "sam@acme.test",
  "date": "2024-05-13T11:44",
  "subject": "Urgent - launch checklist sign-off needed today",
  "body": "The totals in the sheet do not add up, can you check?",
  "labels": [
    "urgent"
  ]
}
ORCHARD_EOF
mkdir -p /workspace/mail/drafts
cat > /workspace/mail/drafts/reply-m108.json <<'ORCHARD_EOF'
{
  "to": "tariq@acme.test",
  "subject": "Re: Hiring plan",
  "in_reply_to": "m108",
  "body": "Hi Tariq,\n\nSure - does Wednesday 15 May at 09:30 work for you?\n\nBest,\nSam"
}
ORCHARD_EOF
mkdir -p /workspace/mail/drafts
cat > /workspace/mail/drafts/reply-m109.json <<'ORCHARD_EOF'
{
  "to": "luis@acme.test",
  "subject": "Re: Hiring plan",
  "in_reply_to": "m109",
  "body": "Hi Luis,\n\nSure - does Wednesday 15 May at 11:30 work for you?\n\nBest,\nSam"
}
ORCHARD_EOF
