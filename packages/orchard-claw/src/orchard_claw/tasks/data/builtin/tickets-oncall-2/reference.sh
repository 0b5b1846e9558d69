python3 - <<'ORCHARD_PY'
import json, urllib.request
CALLS = [["PATCH", "/tickets/40", {"assignee": "Tariq"}], ["PATCH", "/tickets/43", {"assignee": "Uma"}], ["PATCH", "/tickets/46", {"assignee": "Sven"}], ["PATCH", "/tickets/55", {"assignee": "Farah"}], ["PATCH", "/tickets/58", {"assignee": "Tariq"}], ["PATCH", "/tickets/64", {"assignee": "Sven"}]]
for method, path, body in CALLS:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request('http://127.0.0.1:8765' + path, data=data, method=method,
                                 headers={'Content-Type': 'application/json'})
    urllib.request.urlopen(req, timeout=10).read()
ORCHARD_PY
mkdir -p /workspace/notes
cat > /workspace/notes/assigned.md <<'ORCHARD_EOF'
- #40 Tariq
- #43 Uma
- #46 Sven
- #55 Farah
- #58 Tariq
- #64 Sven
ORCHARD_EOF
