"""Seam's console: the operators' web console, REST API, jobs, review gate and audit trail."""
