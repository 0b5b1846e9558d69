mkdir -p /workspace
cat > /workspace/reorder.csv <<'ORCHARD_EOF'
sku,name,quantity,supplier_email
SKU-100,USB-C cable,28,orders@bright.test
SKU-107,Keyboard,44,orders@techparts.test
SKU-114,Sticky notes,39,orders@techparts.test
SKU-135,Mouse,47,orders@paperco.test
SKU-142,HDMI adapter,45,orders@bright.test
SKU-156,A4 paper,20,orders@techparts.test
SKU-163,Notebook,25,orders@bright.test
ORCHARD_EOF
mkdir -p /workspace
cat > /workspace/reorder.md <<'ORCHARD_EOF'
7 items to reorder, 248 units in total.
ORCHARD_EOF
