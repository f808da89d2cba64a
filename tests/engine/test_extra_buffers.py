"""llama.cpp's extra weight buffers (``engine.backends.llamacpp_amx``): the child-process probe of a
build's AMX kernels, its kept verdict, and models that AMX takes forwarding many tokens.

On an AMX CPU whose llama-cpp-python was built by GCC 12.2 a forward of two or more tokens
on AMX-eligible weights dies by SIGILL; ``test_a_model_amx_takes_forwards_many_tokens`` runs
such a forward through ``LlamaCppModel`` in a child process, so on that machine it fails
(the child killed) without the probe, and passes everywhere with it.
"""

import json
import subprocess
import sys

import numpy as np
import pytest

from specbound.engine.backends import llamacpp_amx as extra_buffers, llamacpp

if not llamacpp.llama_cpp_available():
    pytest.skip("llama-cpp-python is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def probe_model(tmp_path_factory):
    return extra_buffers.write_probe_model(tmp_path_factory.mktemp("probe") / "probe.gguf")


def test_the_probe_model_forwards_on_plain_buffers(probe_model):
    first = extra_buffers.probe_logits(probe_model, extra_buffers=False)
    again = extra_buffers.probe_logits(probe_model, extra_buffers=False)
    assert first.shape == (extra_buffers.PROBE_TOKENS, extra_buffers.VOCAB)
    assert np.all(np.isfinite(first)) and np.std(first) > 0.1
    assert np.array_equal(first, again)
    assert not np.allclose(first[0], first[1])  # every position has its own row


def test_a_model_amx_takes_forwards_many_tokens(probe_model):
    script = (
        "import sys\n"
        "from specbound.engine.backends.llamacpp import LlamaCppModel, LlamaCppLM\n"
        "from specbound.engine.backends.llamacpp_amx import PROBE_TOKENS, VOCAB\n"
        "lm = LlamaCppLM(LlamaCppModel(sys.argv[1], threads=2), context_cells=256)\n"
        "logits = lm.prefill(0, [(5 * i + 1) % VOCAB for i in range(PROBE_TOKENS)], last_only=False)\n"
        "print(tuple(logits.shape))\n"
    )
    child = subprocess.run([sys.executable, "-c", script, str(probe_model)], capture_output=True, text=True,
                           timeout=300)  # the verdict from the user's cache: probed once per build, as in use
    assert child.returncode == 0, f"the forward died ({child.returncode}): {child.stderr[-500:]}"
    assert child.stdout.strip().splitlines()[-1] == f"({extra_buffers.PROBE_TOKENS}, {extra_buffers.VOCAB})"


def test_a_child_killed_by_a_signal_is_a_failing_verdict(monkeypatch):
    monkeypatch.setattr(extra_buffers.subprocess, "run",
                        lambda *args, **kwargs: subprocess.CompletedProcess(args, -4, "", ""))
    verdict = extra_buffers.run_probe()
    assert verdict == {"works": False, "detail": "a 32-token forward was killed by SIGILL"}


def test_a_child_that_fails_otherwise_is_a_failing_verdict(monkeypatch):
    monkeypatch.setattr(extra_buffers.subprocess, "run",
                        lambda *args, **kwargs: subprocess.CompletedProcess(args, 1, "", "Traceback: boom"))
    verdict = extra_buffers.run_probe()
    assert not verdict["works"] and "exited 1" in verdict["detail"] and "boom" in verdict["detail"]


@pytest.mark.parametrize("offset, works", [(0.0, True), (0.5e-2, True), (2e-2, False), (np.nan, False)])
def test_the_verdict_compares_the_logits_with_the_plain_buffers(monkeypatch, tmp_path, offset, works):
    plain = np.random.default_rng(0).standard_normal((extra_buffers.PROBE_TOKENS, extra_buffers.VOCAB))

    def logits(path, extra_buffers):
        if not extra_buffers:
            return plain
        moved = plain.copy()
        moved[3, 7] += offset * np.std(plain)  # one entry off by this share of the spread
        return moved

    monkeypatch.setattr(extra_buffers, "probe_logits", logits)
    assert extra_buffers._probe(str(tmp_path))["works"] is works


def test_the_verdict_is_kept_per_build(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(extra_buffers, "run_probe", lambda: calls.append(1) or {"works": False, "detail": "x"})
    monkeypatch.setattr(extra_buffers, "build_key", lambda: "build-a")
    assert extra_buffers.probe_verdict(tmp_path) == {"works": False, "detail": "x"}
    assert extra_buffers.probe_verdict(tmp_path) == {"works": False, "detail": "x"}
    assert len(calls) == 1
    monkeypatch.setattr(extra_buffers, "build_key", lambda: "build-b")
    extra_buffers.probe_verdict(tmp_path)
    assert len(calls) == 2
    assert set(json.loads((tmp_path / "extra_buffers.json").read_text())) == {"build-a", "build-b"}


def test_no_probe_runs_where_the_cpu_offers_no_amx_buffer(monkeypatch, tmp_path):
    monkeypatch.setattr(extra_buffers, "cpu_extra_buffer_types", lambda: ["CPU_REPACK"])
    monkeypatch.setattr(extra_buffers, "probe_verdict", lambda cache_dir=None: pytest.fail("probed"))
    assert extra_buffers.use_extra_buffers.__wrapped__(tmp_path) is True


def test_a_failing_verdict_loads_without_extra_buffers_and_says_why(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(extra_buffers, "cpu_extra_buffer_types", lambda: ["AMX", "CPU_REPACK"])
    monkeypatch.setattr(extra_buffers, "probe_verdict", lambda cache_dir=None: {"works": False, "detail": "why"})
    assert extra_buffers.use_extra_buffers.__wrapped__(tmp_path) is False
    message = capsys.readouterr().err
    assert "AMX" in message and "(why)" in message


def test_the_cpu_backend_names_the_extra_buffer_types_its_build_reports():
    """The names read through ggml's device API agree with llama.cpp's own system line: the
    repacked layouts where the build has them, AMX only where it was compiled in."""
    import llama_cpp

    system = llama_cpp.llama_print_system_info().decode()
    names = extra_buffers.cpu_extra_buffer_types()
    assert len(set(names)) == len(names)
    assert ("CPU_REPACK" in names) == ("REPACK = 1" in system)
    if "AMX" in names:
        assert "AMX_INT8 = 1" in system


def test_the_cost_book_keeps_each_kernel_choice_apart(probe_model):
    from specbound.engine.cost_book import cost_key

    model = llamacpp.LlamaCppModel(probe_model, threads=1)
    keys = set()
    for extra in (True, False):
        model.extra_buffers = extra
        keys.add(cost_key(model, "as-loaded"))
    assert len(keys) == 2
