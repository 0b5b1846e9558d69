python3 - <<'ORCHARD_PY'
import json, urllib.request
CALLS = [["PATCH", "/contacts/4", {"phone": "+1-555-233-7599"}], ["POST", "/contacts", {"name": "Eli Q.", "email": "eli@newco.test", "phone": "+1-555-926-1469", "company": "NewCo"}], ["PATCH", "/contacts/5", {"phone": "+1-555-477-8131"}], ["POST", "/contacts", {"name": "Rosa Q.", "email": "rosa@newco.test", "phone": "+1-555-886-3386", "company": "NewCo"}], ["POST", "/contacts", {"name": "Uma Q.", "email": "uma@newco.test", "phone": "+1-555-669-7824", "company": "NewCo"}], ["PATCH", "/contacts/6", {"phone": "+1-555-819-8904"}]]
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
    "eli@newco.test",
    "rosa@newco.test",
    "uma@newco.test"
  ],
  "updated": [
    "dana@vandelay.test",
    "jun@soylent.test",
    "luis@vandelay.test"
  ]
}
ORCHARD_EOF
