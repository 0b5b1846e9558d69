python3 - <<'ORCHARD_PY'
import json, urllib.request
CALLS = [["POST", "/reminders", {"date": "2024-12-04", "city": "Munich", "text": "Pack an umbrella"}], ["POST", "/reminders", {"date": "2024-12-05", "city": "Lisbon", "text": "Pack a warm coat"}], ["POST", "/reminders", {"date": "2024-12-03", "city": "Seville", "text": "Pack a warm coat"}]]
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
| Munich | 2024-12-04 | rain | 14 |
| Lisbon | 2024-12-05 | sunny | 4 |
| Krakow | 2024-12-06 | cloudy | 17 |
| Seville | 2024-12-03 | showers | 4 |
ORCHARD_EOF
