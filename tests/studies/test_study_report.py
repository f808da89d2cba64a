"""``specbound report`` renders a small results directory: every study's section, tables,
and PNG figures that exist and are referenced by both the Markdown and the HTML file."""

import re

import pytest
import torch

from specbound.cli import main
from specbound.studies.acceptance import AcceptanceStudy
from specbound.studies.bias import BiasStudy
from specbound.studies.rejections import RejectionsStudy
from specbound.studies.report import write_report
from specbound.studies.runner import run_study
from specbound.models.tiny import tiny_pair, tiny_prompts

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("results")
    pair, prompts = tiny_pair(), tiny_prompts(2)
    studies = [
        AcceptanceStudy(temperatures=(0.4, 0.7), num_drafts=(2, 3), max_new_tokens=5),
        RejectionsStudy(max_new_tokens=5, lookaheads=[None, 2], batch_sizes=[2]),
        BiasStudy(epsilons=(0.1, 0.4), gamma=2, max_new_tokens=5),
    ]
    for study in studies:
        run_study(study, pair, prompts, root / study.name / "toy", "toy", progress=False)
    run_study(AcceptanceStudy(temperatures=(0.7,), num_drafts=(3,), max_new_tokens=5), pair,
              tiny_prompts(2, "other"), root / "acceptance" / "other", "other", progress=False)
    torch.set_num_threads(threads)
    return root


def test_report_has_every_study_with_tables_and_figures(results_dir):
    markdown_path = write_report(results_dir)
    markdown = markdown_path.read_text()
    html = markdown_path.with_suffix(".html").read_text()
    for heading in ("Models, settings and run time", "Acceptance study", "Theory vs practice: rejections",
                    "Bias vs rejections: Decoding-OPT and Decoding-UNO"):
        assert heading in markdown and heading in html
    assert "| method | other (T=0.7, n=3) | toy (T=0.7, n=3) |" in markdown  # method × dataset
    assert "per-token averages" in markdown and "reward models" in markdown
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    assert len(images) >= 5  # acceptance vs T and vs n, rejections, bias front, speed
    assert sorted(images) == sorted(re.findall(r'<img src="([^"]+)"', html))
    for image in images:
        data = (markdown_path.parent / image).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000
    assert html.count("<table>") == len(re.findall(r"^\|(---\|)+$", markdown, flags=re.MULTILINE)) > 5


def test_report_command_writes_both_files_and_refuses_an_empty_folder(results_dir, tmp_path, capsys):
    assert main(["report", str(results_dir)]) == 0
    assert "report.html" in capsys.readouterr().out
    assert main(["report", str(tmp_path)]) == 2
    assert "no study results" in capsys.readouterr().err


def test_a_llama_cpp_pair_is_described_by_its_backend_and_files_not_a_missing_dtype():
    from specbound.studies.report import weights_description

    models = {"backend": "llama.cpp", "threads": 2, "target_file": "t.gguf: qwen2 1.5B Q4_K - Medium",
              "draft_file": "d.gguf: qwen2 1B Q4_K - Medium"}
    assert weights_description(models) == ("llama.cpp backend, 2 threads (t.gguf: qwen2 1.5B Q4_K - Medium, "
                                           "d.gguf: qwen2 1B Q4_K - Medium)")
    assert weights_description(models, files=False) == "llama.cpp backend, 2 threads"
    assert weights_description({"dtype": "bfloat16", "backend": "torch"}) == "bfloat16"
    assert "None" not in weights_description({})
