"""Per-operation costs behind the work limits: what lets ``accept``, ``bounds``, ``theory``
and the exact verifiers estimate their work and refuse it before it starts
(``checks.within_limit``, ``checks.within_work_limit``).

Each constant is the seconds one operation costs, the upper end over several shapes timed on
a 2-core AMD EPYC. ``benchmarks/bounds/bench_work_limits.py`` times the work behind each
estimate on a machine and prints measured / estimated (its record and figures:
``benchmarks/README.md``). They are constants, not measured on the machine that runs: a faster
machine finishes sooner than estimated, and an estimate only decides whether to start. Memory
is not calibrated: each module counts its own arrays' bytes.

Letters: K draft tuples, V tokens of a row, n drafts, T a chain's horizon, M its drafts.
"""

# bounds.coupling: the optimal-transport LP (scipy's HiGHS), K·V variables, K + V − 1 constraints
LP_SECONDS_FIXED = 0.01
LP_SECONDS_PER_ENTRY = 3e-8  # per constraint × variable: (K + V)·K·V

# tables.bounds: the tables of ``accept`` and ``bounds`` (V up to 151,936, n up to 10⁶)
TABLE_SECONDS_PER_TOKEN = 3e-6  # sorts and scans of every method at one n, per token of a row
TABLE_SECONDS_PER_DRAFT = 5e-6  # one step of the n-step products (α* with replacement, RRS) ...
TABLE_SECONDS_PER_DRAFT_TOKEN = 1.2e-8  # ... and per token of the row
RACE_SECONDS_PER_DRAFT_TOKEN = 2e-6  # α* without replacement, n ≥ 3: × n·(1 + n/40)·(V + 2000)

# verifiers.rrs_exact: RRS without replacement's exact acceptance
RRS_SECONDS_PER_ROW_TOKEN = 1e-7  # a row's sorts and curve, before any pass
RRS_SECONDS_PER_BIN_PAIR = 1.5e-8  # a pair of bins of an n = 3 bracket pass ...
RRS_SECONDS_PER_PASS_TOKEN = 1e-8  # ... and per token of the row
RRS_SECONDS_PER_LEVEL_TOKEN = 1e-4  # one level call of the n ≥ 4 recursion, per token of the vocabulary

# chains.theory: exact costs on Markov chains, T·V² entries
CHAIN_SECONDS_PER_ENTRY = 1e-8  # per entry and per draft (the residual chain) or lookahead step
CHAIN_DRAW_SECONDS_PER_ENTRY = 1.2e-7  # a random chain pair: 2·T·V² Dirichlet coordinates and the checks
IMPROVEMENT_SECONDS_FIXED = 1e-4  # one batch_improvement row: its checks ...
IMPROVEMENT_SECONDS_PER_TOKEN = 3.5e-8  # ... per token ...
IMPROVEMENT_SECONDS_PER_STEP = 4e-6  # ... and M steps of the residual chain ...
IMPROVEMENT_SECONDS_PER_STEP_TOKEN = 5e-9  # ... per token

# chains.simulation: Monte Carlo decoding on Markov chains
SIMULATION_SECONDS_PER_DRAFTED_ENTRY = 5e-9  # per run, draft, position, drafted offset and state
SIMULATION_SECONDS_PER_ROUND = 2e-8  # per run, position and draft: the root's recursive rejection

# tables.chains: the bias/rejection plane of ``theory pareto``
PARETO_SECONDS_PER_POINT_TOKEN = 1e-7  # Loss*(b) and P(reject) of one random vector, per token
PARETO_SECONDS_PER_SWEEP_POINT = 3e-4  # one verifier built and measured ...
PARETO_SECONDS_PER_SWEEP_TOKEN = 1e-7  # ... and per token
