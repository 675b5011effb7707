"""The operators' pages: dashboard, frontier, jobs, audit, and the login pages."""
