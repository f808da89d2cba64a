"""Bounds and work limits: the optimum's cost and the work-limit estimates against the clock."""
