python3 - <<'ORCHARD_PY'
import json, urllib.request
CALLS = [["PATCH", "/contacts/5", {"phone": "+1-555-681-5071"}], ["POST", "/contacts", {"name": "Dana Q.", "email": "dana@newco.test", "phone": "+1-555-274-1533", "company": "NewCo"}], ["PATCH", "/contacts/4", {"phone": "+1-555-683-2750"}], ["POST", "/contacts", {"name": "Omar Q.", "email": "omar@newco.test", "phone": "+1-555-572-6147", "company": "NewCo"}], ["PATCH", "/contacts/6", {"phone": "+1-555-183-2221"}], ["POST", "/contacts", {"name": "Rosa Q.", "email": "rosa@newco.test", "phone": "+1-555-766-2336", "company": "NewCo"}]]
for method, path, body in CALLS:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request('http://127.0.0.1:8765' + path, data=data, method=method,
                                 headers={'Content-Type': 'application/json'})
    urllib.request.urlopen(req, timeout=10).read()
ORCHARD_PY
mkdir -p /workspace/data
cat > /workspace/data/sync_report.json <<'ORCHARD_EOF'
{
  "created": [
    "dana@newco.test",
    "omar@newco.test",
    "rosa@newco.test"
  ],
  "updated": [
    "ben@globex.test",
    "kira@umbrella.test",
    "priya@umbrella.test"
  ]
}
ORCHARD_EOF
