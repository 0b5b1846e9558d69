mkdir -p /workspace/rooms
cat > /workspace/rooms/bookings.csv <<'ORCHARD_EOF'
room,date,start,end,organiser
Fir,2024-09-09,15:00,15:30,nils
Elm,2024-09-09,12:00,13:30,rosa
Hazel,2024-09-09,14:00,15:30,dana
Douglas,2024-09-09,13:30,14:30,luis
Hazel,2024-09-09,09:00,10:30,uma
Elm,2024-09-09,08:00,08:30,chen
Douglas,2024-09-09,11:00,11:30,sam
Fir,2024-09-09,15:30,16:30,sam
Elm,2024-09-09,15:00,16:30,sam
ORCHARD_EOF
mkdir -p /workspace/rooms
cat > /workspace/rooms/confirmations.md <<'ORCHARD_EOF'
- Customer prep: Douglas
- Budget planning: Fir
- Retro: Elm
ORCHARD_EOF
