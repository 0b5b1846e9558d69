mkdir -p /workspace/calendar
cat > /workspace/calendar/invite.ics <<'ORCHARD_EOF'
BEGIN:VCALENDAR
VERSION:2.0
PRODID:-//orchard-claw//reference//EN
BEGIN:VEVENT
UID:find-slot-1@acme.test
DTSTART:20240520T104500
DTEND:20240520T111500
SUMMARY:Project sync
ATTENDEE;CN=Sven:mailto:sven@acme.test
ATTENDEE;CN=Mei:mailto:mei@acme.test
END:VEVENT
END:VCALENDAR
ORCHARD_EOF
mkdir -p /workspace/calendar
cat > /workspace/calendar/sam.json <<'ORCHARD_EOF'
{
  "owner": "Sam",
  "email": "sam@acme.test",
  "working_hours": {
    "start": "08:30",
    "end": "15:30"
  },
  "events": [
    {
      "title": "1:1",
      "start": "2024-05-20T10:00",
      "end": "2024-05-20T10:45"
    },
    {
      "title": "Design review",
      "start": "2024-05-20T10:00",
      "end": "2024-05-20T10:45"
    },
    {
      "title": "Project sync",
      "start": "2024-05-20T10:45",
      "end": "2024-05-20T11:15"
    },
    {
      "title": "Retro",
      "start": "2024-05-20T16:15",
      "end": "2024-05-20T17:00"
    },
    {
      "title": "Retro",
      "start": "2024-05-23T12:00",
      "end": "2024-05-23T12:45"
    },
    {
      "title": "Project sync",
      "start": "2024-05-23T12:45",
      "end": "2024-05-23T13:45"
    },
    {
      "title": "1:1",
      "start": "2024-05-23T14:00",
      "end": "2024-05-23T14:30"
    },
    {
      "title": "Lunch",
      "start": "2024-05-23T16:45",
      "end": "2024-05-23T17:45"
    },
    {
      "title": "1:1",
      "start": "2024-05-23T17:00",
      "end": "2024-05-23T18:00"
    }
  ]
}
ORCHARD_EOF
