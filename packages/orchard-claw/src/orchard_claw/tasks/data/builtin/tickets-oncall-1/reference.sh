python3 - <<'ORCHARD_PY'
import json, urllib.request
CALLS = [["PATCH", "/tickets/40", {"assignee": "Dana"}], ["PATCH", "/tickets/43", {"assignee": "Luis"}], ["PATCH", "/tickets/46", {"assignee": "Dana"}], ["PATCH", "/tickets/55", {"assignee": "Mei"}], ["PATCH", "/tickets/58", {"assignee": "Mei"}], ["PATCH", "/tickets/64", {"assignee": "Mei", "priority": "high"}]]
for method, path, body in CALLS:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request('http://127.0.0.1:8765' + path, data=data, method=method,
                                 headers={'Content-Type': 'application/json'})
    urllib.request.urlopen(req, timeout=10).read()
ORCHARD_PY
mkdir -p /workspace/notes
cat > /workspace/notes/assigned.md <<'ORCHARD_EOF'
- #40 Dana
- #43 Luis
- #46 Dana
- #55 Mei
- #58 Mei
- #64 Mei
ORCHARD_EOF
