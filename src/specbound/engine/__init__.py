"""The decoding engine: speculative decoding of causal LMs (SPEC.md §6).

Data flows one way: model logits → ``Processing`` (shared by target and draft) → a
drafter's tree (``drafters``) → one target call (a backend's language model,
``backends``) → the registry's verifiers (``decode``) → tokens and ``RunStats``. A
``Method`` (``methods``) says which tree and which verifier at each depth; the ``Planner``
(``planner``) chooses one step by step. ``assembly.assemble`` builds a ``ModelPair``'s
(``pair``) decoder and schedule.

**The words of a step**, each meant this way everywhere in the engine (p = target, q = draft,
as in SPEC.md):

- *target*: the model whose law the output has, p(·|prefix); *draft* (model): a cheaper
  model proposing tokens from its law q; the *pair* (``ModelPair``): both, with the
  vocabulary they share and the backend that runs them.
- *drafter* (``decode.Drafter``): what builds a step's draft trees — the draft model
  (``ModelDrafter``), prompt lookup, suffix decoding, or a choice among them; *drafts*: the
  tokens it proposes; a *draft scheme* (``specbound.drafts``): how a node's drafts are drawn
  from q.
- *step*: one round of draft → one target call → verification → commit, for every sequence
  of a batch at once (``Decoder.step``).
- *draft tree* (``tree.DraftTree``): one step's drafts for one sequence; node 0, the *root*,
  is the sequence's last committed token, every other node a drafted token; an *internal*
  node carries q and its drafts, a *leaf* none. With the target's rows p at its nodes it is
  the *scored tree* the verifiers read (``verifiers.tree.ScoredTree``, ``DraftTree.scored``).
- *method* (``methods.Method``): a tree's *shape* (drafts per node by depth, ``Levels``, or
  against a node budget, ``Budget``), the draft scheme and verifier at each depth (or one
  verifier of the whole tree), and which drafter drafts; *schedule* (``methods.Schedule``):
  the method of each step — a fixed ``Method``, or the *planner* (``planner.Planner``,
  ``auto``), which chooses each step's method from measured forward costs (``costs``) and
  the acceptance it observes.
- *verified node* (or position): an internal node the walk reached, where a verifier decides
  between p, q and the node's drafts; the verifier *accepts* a draft (the walk descends into
  its child) or emits a *residual* token (vLLM: *recovered*) drawn from the residual law and
  ends the step: one *rejection*. A reached leaf adds a *bonus* token drawn from p. A step
  emits its *accepted* drafts (the *accepted path*) plus that one token.
- *entries* (``backends.Entries``): the new tokens of one row for one forward, each with its
  parent (the row's last committed token or an earlier pending entry): tree attention. A
  row's entries are *pending* until ``commit`` keeps one path of them (*committed*) and
  drops the rest (rollback); *prefill*: the forward over a prompt.
- *row*: a sequence's index in the language models' batch (their caches and scores);
  ``decode.RowStep``: one sequence's part of a step (its row, its draft tree, the entry of its
  root, the target rows of its nodes once read).
- ``decode.Sequence``: one sequence while it decodes (prompt, new tokens, generator, its
  processing); ``decode.Batch``: the sequences decoded together, one step at a time, which
  sequences join (``add``) and leave; ``decode.Generation``: what a finished sequence returns.
- ``Sampling``: a request's temperature, top-k and top-p, checked once; ``Processing``: a
  sampling applied to logits over the pair's vocabulary — the one place logits become
  probabilities, for target and draft alike.

The names below load on first use: importing ``specbound.engine.precisions`` or
``specbound.engine.backends`` (what the command line builds its parser from) loads no torch.
"""

from specbound.lazy import lazy_attributes

_HOMES = {
    "assemble": "specbound.engine.assembly",
    "CausalLM": "specbound.engine.backends.torch",
    "Decoder": "specbound.engine.decode",
    "Generation": "specbound.engine.decode",
    "METHODS": "specbound.engine.methods",
    "Method": "specbound.engine.methods",
    "ModelDrafter": "specbound.engine.drafters",
    "ModelPair": "specbound.engine.pair",
    "Processing": "specbound.engine.processing",
    "PromptLookupDrafter": "specbound.engine.drafters",
    "RunStats": "specbound.engine.stats",
    "Sampling": "specbound.engine.processing",
    "build_method": "specbound.engine.methods",
}

__all__ = sorted(_HOMES)
__getattr__ = lazy_attributes(__name__, _HOMES)
