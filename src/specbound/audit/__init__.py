"""The auditor: whether a speculative engine's tokens have its target's law (``audit``).

    from specbound.audit import audit
    result = audit(sampler, reference, prompts, temperature=0.7, max_new_tokens=32, samples=512)
    result.passed, result.p_value, result.detectable_tv, result.positions

``audit.auditor`` runs it, ``audit.pit`` holds its tests and their proofs, ``audit.reference``
scores with the reference model, ``audit.samplers`` wraps engines as samplers.
"""

from specbound.audit.auditor import ROW_TOLERANCE, TOLERANCE, AuditResult, PositionStat, audit

__all__ = ["audit", "AuditResult", "PositionStat", "TOLERANCE", "ROW_TOLERANCE"]
