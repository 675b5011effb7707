"""The audit trail: append-only, hash-chained events of every change Seam makes."""
