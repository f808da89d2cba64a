"""The auditor: who passes, what it detects, its tolerances, its cost."""
