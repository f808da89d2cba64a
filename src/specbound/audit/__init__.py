"""The auditor: whether a speculative engine's tokens have its target's law (``audit``).

    from specbound.audit import audit
    result = audit(sampler, reference, prompts, temperature=0.7, max_new_tokens=32, samples=512)
    result.verdict, result.p_value, result.detectable_tv, result.rounding, result.to_json()

``audit.auditor`` runs it, ``audit.pit`` holds its tests and their proofs, ``audit.reference``
scores with the reference model, ``audit.samplers`` wraps engines as samplers,
``audit.tolerances`` says how far a correct engine's rows may round and how the auditor
measures it, and ``audit.zoo`` reproduces published bugs as samplers. The names below load on
first use: the command line reads the tolerances without loading torch.
"""

from specbound.lazy import lazy_attributes

_HOMES = {
    "AuditResult": "specbound.audit.auditor",
    "MeasuredRounding": "specbound.audit.tolerances",
    "PositionStat": "specbound.audit.auditor",
    "audit": "specbound.audit.auditor",
    "samples_to_detect": "specbound.audit.auditor",
    "strict_json": "specbound.audit.auditor",
    "ROW_TOLERANCE": "specbound.audit.tolerances",
    "TOLERANCE": "specbound.audit.tolerances",
}

__all__ = sorted(_HOMES)
__getattr__ = lazy_attributes(__name__, _HOMES)
