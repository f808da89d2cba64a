"""Speculative decoding as a Markov chain [YIN] (SPEC.md §1, §2): the exact expected cost of
(batch) speculative decoding on Markov-chain pairs (``theory``) and a Monte Carlo
simulator of the algorithm itself (``simulation``)."""
