mkdir -p /workspace/report
cat > /workspace/report/summary.json <<'ORCHARD_EOF'
{
  "month": "2024-07",
  "orders": 14,
  "total_revenue": 4571.22,
  "revenue_by_region": {
    "East": 746.08,
    "North": 3460.85,
    "West": 364.29
  },
  "top_product": "Water Bottle",
  "top_product_units": 31
}
ORCHARD_EOF
mkdir -p /workspace/report
cat > /workspace/report/summary.md <<'ORCHARD_EOF'
# July 2024 sales

We took 14 orders for 4571.22 in total. Best seller: Water Bottle (31 units).
ORCHARD_EOF
