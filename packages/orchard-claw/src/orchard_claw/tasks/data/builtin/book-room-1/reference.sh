mkdir -p /workspace/rooms
cat > /workspace/rooms/bookings.csv <<'ORCHARD_EOF'
room,date,start,end,organiser
Douglas,2024-09-06,09:30,10:30,farah
Fir,2024-09-06,14:30,15:00,nils
Hazel,2024-09-06,08:00,10:00,farah
Cedar,2024-09-06,09:30,10:30,mei
Birch,2024-09-06,09:30,11:00,rosa
Hazel,2024-09-06,10:30,11:30,omar
Aspen,2024-09-06,12:30,13:30,sam
Cedar,2024-09-06,12:00,13:00,sam
Aspen,2024-09-06,11:30,12:00,sam
ORCHARD_EOF
mkdir -p /workspace/rooms
cat > /workspace/rooms/confirmations.md <<'ORCHARD_EOF'
- Retro: Aspen
- Project sync: Cedar
- Design review: Aspen
ORCHARD_EOF
