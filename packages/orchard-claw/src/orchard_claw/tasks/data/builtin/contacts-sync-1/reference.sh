python3 - <<'ORCHARD_PY'
import json, urllib.request
CALLS = [["PATCH", "/contacts/5", {"phone": "+1-555-898-1796"}], ["POST", "/contacts", {"name": "Dana Q.", "email": "dana@newco.test", "phone": "+1-555-537-2613", "company": "NewCo"}], ["PATCH", "/contacts/6", {"phone": "+1-555-725-7325"}], ["POST", "/contacts", {"name": "Kira Q.", "email": "kira@newco.test", "phone": "+1-555-515-1456", "company": "NewCo"}], ["PATCH", "/contacts/4", {"phone": "+1-555-875-5957"}], ["POST", "/contacts", {"name": "Ben Q.", "email": "ben@newco.test", "phone": "+1-555-796-7479", "company": "NewCo"}]]
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
    "ben@newco.test",
    "dana@newco.test",
    "kira@newco.test"
  ],
  "updated": [
    "chen@soylent.test",
    "mei@hooli.test",
    "rosa@hooli.test"
  ]
}
ORCHARD_EOF
