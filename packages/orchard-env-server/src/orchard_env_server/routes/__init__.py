"""HTTP routes, one module per capability; none of them knows which backend serves it."""
