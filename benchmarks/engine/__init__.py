"""The torch engine: forward costs by rows, steps, decoding against transformers, the planner on GPU costs."""
