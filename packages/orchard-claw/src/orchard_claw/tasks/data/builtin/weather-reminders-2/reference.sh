python3 - <<'ORCHARD_PY'
import json, urllib.request
CALLS = [["POST", "/reminders", {"date": "2024-10-25", "city": "Lisbon", "text": "Pack an umbrella"}], ["POST", "/reminders", {"date": "2024-10-26", "city": "Munich", "text": "Pack a warm coat"}], ["POST", "/reminders", {"date": "2024-10-28", "city": "Seville", "text": "Pack an umbrella"}]]
for method, path, body in CALLS:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request('http://127.0.0.1:8765' + path, data=data, method=method,
                                 headers={'Content-Type': 'application/json'})
    urllib.request.urlopen(req, timeout=10).read()
ORCHARD_PY
mkdir -p /workspace
cat > /workspace/trips_weather.md <<'ORCHARD_EOF'
| city | date | condition | high |
|---|---|---|---|
| Lisbon | 2024-10-25 | rain | 14 |
| Munich | 2024-10-26 | sunny | 4 |
| Krakow | 2024-10-25 | cloudy | 17 |
| Seville | 2024-10-28 | showers | 18 |
ORCHARD_EOF
