python3 - <<'ORCHARD_PY'
import json, urllib.request
CALLS = [["PATCH", "/tickets/40", {"assignee": "Chen"}], ["PATCH", "/tickets/43", {"assignee": "Nils"}], ["PATCH", "/tickets/46", {"assignee": "Chen", "priority": "high"}], ["PATCH", "/tickets/55", {"assignee": "Chen"}], ["PATCH", "/tickets/58", {"assignee": "Hana"}], ["PATCH", "/tickets/64", {"assignee": "Goran"}]]
for method, path, body in CALLS:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request('http://127.0.0.1:8765' + path, data=data, method=method,
                                 headers={'Content-Type': 'application/json'})
    urllib.request.urlopen(req, timeout=10).read()
ORCHARD_PY
mkdir -p /workspace/notes
cat > /workspace/notes/assigned.md <<'ORCHARD_EOF'
- #40 Chen
- #43 Nils
- #46 Chen
- #55 Chen
- #58 Hana
- #64 Goran
ORCHARD_EOF
