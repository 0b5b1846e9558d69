mkdir -p /workspace/calendar
cat > /workspace/calendar/invite.ics <<'ORCHARD_EOF'
BEGIN:VCALENDAR
VERSION:2.0
PRODID:-//orchard-claw//reference//EN
BEGIN:VEVENT
UID:find-slot-2@acme.test
DTSTART:20240530T113000
DTEND:20240530T121500
SUMMARY:Budget planning
ATTENDEE;CN=Ivo:mailto:ivo@acme.test
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
    "end": "17:00"
  },
  "events": [
    {
      "title": "Retro",
      "start": "2024-05-27T08:30",
      "end": "2024-05-27T09:30"
    },
    {
      "title": "Budget planning",
      "start": "2024-05-27T12:00",
      "end": "2024-05-27T13:00"
    },
    {
      "title": "1:1",
      "start": "2024-05-27T15:45",
      "end": "2024-05-27T16:30"
    },
    {
      "title": "Retro",
      "start": "2024-05-27T16:45",
      "end": "2024-05-27T17:30"
    },
    {
      "title": "Focus time",
      "start": "2024-05-27T17:00",
      "end": "2024-05-27T17:30"
    },
    {
      "title": "Budget planning",
      "start": "2024-05-30T11:00",
      "end": "2024-05-30T11:30"
    },
    {
      "title": "Budget planning",
      "start": "2024-05-30T11:30",
      "end": "2024-05-30T12:15"
    },
    {
      "title": "1:1",
      "start": "2024-05-30T13:15",
      "end": "2024-05-30T14:15"
    },
    {
      "title": "Focus time",
      "start": "2024-05-30T15:45",
      "end": "2024-05-30T16:15"
    }
  ]
}
ORCHARD_EOF
