mkdir -p /workspace
cat > /workspace/reorder.csv <<'ORCHARD_EOF'
sku,name,quantity,supplier_email
SKU-100,Keyboard,19,orders@bright.test
SKU-107,Mouse,67,orders@acme.test
SKU-121,Desk lamp,52,orders@techparts.test
SKU-135,Sticky notes,55,orders@bright.test
SKU-142,A4 paper,49,orders@acme.test
SKU-149,Printer toner,72,orders@acme.test
ORCHARD_EOF
mkdir -p /workspace
cat > /workspace/reorder.md <<'ORCHARD_EOF'
6 items to reorder, 314 units in total.
ORCHARD_EOF
