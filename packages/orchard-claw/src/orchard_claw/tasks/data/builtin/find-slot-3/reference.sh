mkdir -p /workspace/calendar
cat > /workspace/calendar/invite.ics <<'ORCHARD_EOF'
BEGIN:VCALENDAR
VERSION:2.0
PRODID:-//orchard-claw//reference//EN
BEGIN:VEVENT
UID:find-slot-3@acme.test
DTSTART:20240620T111500
DTEND:20240620T114500
SUMMARY:Customer prep
ATTENDEE;CN=Priya:mailto:priya@acme.test
ATTENDEE;CN=Ana:mailto:ana@acme.test
END:VEVENT
END:VCALENDAR
ORCHARD_EOF
mkdir -p /workspace/calendar
cat > /workspace/calendar/sam.json <<'ORCHARD_EOF'
{
  "owner": "Sam",
  "email": "sam@acme.test",
  "working_hours": {
    "start": "10:00",
    "end": "16:00"
  },
  "events": [
    {
      "title": "Design review",
      "start": "2024-06-19T08:30",
      "end": "2024-06-19T09:15"
    },
    {
      "title": "Design review",
      "start": "2024-06-19T09:30",
      "end": "2024-06-19T10:15"
    },
    {
      "title": "Focus time",
      "start": "2024-06-19T14:30",
      "end": "2024-06-19T15:30"
    },
    {
      "title": "Budget planning",
      "start": "2024-06-19T16:15",
      "end": "2024-06-19T17:45"
    },
    {
      "title": "Customer prep",
      "start": "2024-06-20T11:15",
      "end": "2024-06-20T11:45"
    },
    {
      "title": "1:1",
      "start": "2024-06-20T12:00",
      "end": "2024-06-20T12:30"
    },
    {
      "title": "Project sync",
      "start": "2024-06-20T14:00",
      "end": "2024-06-20T15:30"
    },
    {
      "title": "1:1",
      "start": "2024-06-20T14:30",
      "end": "2024-06-20T15:30"
    },
    {
      "title": "Retro",
      "start": "2024-06-20T16:30",
      "end": "2024-06-20T18:00"
    }
  ]
}
ORCHARD_EOF
