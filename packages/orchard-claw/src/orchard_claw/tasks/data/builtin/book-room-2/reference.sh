mkdir -p /workspace/rooms
cat > /workspace/rooms/bookings.csv <<'ORCHARD_EOF'
room,date,start,end,organiser
Elm,2024-09-12,12:00,13:00,luis
Hazel,2024-09-12,13:00,14:30,jun
Douglas,2024-09-12,11:00,11:30,eli
Birch,2024-09-12,09:00,10:30,mei
Ginkgo,2024-09-12,08:00,09:00,priya
Douglas,2024-09-12,11:30,13:00,ben
Aspen,2024-09-12,15:30,17:30,priya
Hazel,2024-09-12,08:30,10:30,uma
Birch,2024-09-12,15:30,16:30,tariq
Ginkgo,2024-09-12,10:00,11:00,sam
Elm,2024-09-12,10:00,10:30,sam
Hazel,2024-09-12,16:00,17:00,sam
ORCHARD_EOF
mkdir -p /workspace/rooms
cat > /workspace/rooms/confirmations.md <<'ORCHARD_EOF'
- Budget planning: Ginkgo
- Design review: Elm
- Project sync: Hazel
ORCHARD_EOF
