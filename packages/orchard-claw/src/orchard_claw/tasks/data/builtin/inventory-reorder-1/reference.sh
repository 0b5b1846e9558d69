mkdir -p /workspace
cat > /workspace/reorder.csv <<'ORCHARD_EOF'
sku,name,quantity,supplier_email
SKU-100,Label tape,56,orders@acme.test
SKU-107,Whiteboard marker,47,orders@paperco.test
SKU-128,HDMI adapter,20,orders@paperco.test
SKU-142,Desk lamp,51,orders@paperco.test
SKU-156,Notebook,24,orders@bright.test
ORCHARD_EOF
mkdir -p /workspace
cat > /workspace/reorder.md <<'ORCHARD_EOF'
5 items to reorder, 198 units in total.
ORCHARD_EOF
