mkdir -p /workspace/report
cat > /workspace/report/summary.json <<'ORCHARD_EOF'
{
  "month": "2024-03",
  "orders": 14,
  "total_revenue": 5388.77,
  "revenue_by_region": {
    "Central": 529.9,
    "East": 1253.8,
    "North": 1123.35,
    "South": 2481.72
  },
  "top_product": "Fleece",
  "top_product_units": 27
}
ORCHARD_EOF
mkdir -p /workspace/report
cat > /workspace/report/summary.md <<'ORCHARD_EOF'
# March 2024 sales

We took 14 orders for 5388.77 in total. Best seller: Fleece (27 units).
ORCHARD_EOF
