mkdir -p /workspace/report
cat > /workspace/report/summary.json <<'ORCHARD_EOF'
{
  "month": "2024-10",
  "orders": 12,
  "total_revenue": 6267.59,
  "revenue_by_region": {
    "Central": 1283.34,
    "East": 1091.4,
    "North": 1828.35,
    "West": 2064.5
  },
  "top_product": "Day Pack",
  "top_product_units": 30
}
ORCHARD_EOF
mkdir -p /workspace/report
cat > /workspace/report/summary.md <<'ORCHARD_EOF'
# October 2024 sales

We took 12 orders for 6267.59 in total. Best seller: Day Pack (30 units).
ORCHARD_EOF
