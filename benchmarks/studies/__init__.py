"""The studies: a unit's forwards, scoring, exact part and batching; Ray's overhead."""
