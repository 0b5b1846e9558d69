python3 - <<'ORCHARD_PY'
import json, urllib.request
CALLS = [["POST", "/reminders", {"date": "2024-11-09", "city": "Oslo", "text": "Pack an umbrella"}], ["POST", "/reminders", {"date": "2024-11-12", "city": "Vienna", "text": "Pack a warm coat"}], ["POST", "/reminders", {"date": "2024-11-10", "city": "Lisbon", "text": "Pack an umbrella"}]]
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
| Oslo | 2024-11-09 | rain | 14 |
| Vienna | 2024-11-12 | sunny | 4 |
| Munich | 2024-11-11 | cloudy | 17 |
| Lisbon | 2024-11-10 | rain | 13 |
ORCHARD_EOF
