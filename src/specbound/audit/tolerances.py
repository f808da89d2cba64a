"""How far a correct engine's next-token laws may differ from the reference's by rounding.

llama.cpp's kernels are not batch-invariant: a row scored alone and the same row scored as
the first of a k-row forward differ. ``benchmarks/results/llamacpp_invariance.json`` (the
embedded pair, T = 0.7, k = 4, 8, 16) measures a mean TV of 0.0064 per row and a largest of
0.043. A speculative engine scores its rows in k-row forwards and the reference scores them
otherwise, so a correct engine's law at a position is within such a TV of the reference's:

- ``TOLERANCE``: the mean per-position TV the pooled test allows (0.01, above the mean);
- ``ROW_TOLERANCE``: one row's TV the shared-context test allows (0.05, above the largest).
"""

TOLERANCE = 0.01
ROW_TOLERANCE = 0.05
