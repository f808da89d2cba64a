"""The verifiers' cost at a real vocabulary: Global Resolution, block and traversal verification."""
