"""The question bank: schema and cross-field rules, cited topics, links, rendering, export round trip."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import nbformat
import pytest

from servelab.scheduling.batching import Request, chunked_prefill_scenario, simulate_batching, simulate_iterations
from servelab.questions import CHAPTER_SLUGS, CORE_IDS, BankError, load_bank, resolve_code_link
from servelab_instructor.questions.__main__ import main as cli
from servelab.questions.bank import load_raw, validate_raw
from servelab.questions.design import DesignAssumptions, design_rows, solve_design
from servelab_instructor.questions.export import export_assignment, read_markdown, read_notebook
from servelab.questions.render import (
    chapter_link, expand_question_sets, label_defined, question_myst, question_notebook, section_heading,
    tier_heading, tier_myst,
)
from servelab.kv import block_alloc_slots
from servelab.sampling import best_of_n_kv_tokens, softmax, support, top_k_filter, top_p_filter
from servelab.sampling.stop_strings import StopStringBuffer

ROOT = Path(__file__).resolve().parents[1]
BANK = load_bank()
CORE = BANK.select(set_id="core")


def answer_text(qid: str) -> str:
    return " ".join(BANK.question(qid).answer.texts())


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


# ------------------------------------------------------------------------ structure


def test_core_set_is_exactly_q1_to_q25_in_three_tiers():
    assert [q.id for q in CORE] == list(CORE_IDS) == [f"Q{i}" for i in range(1, 26)]
    assert {q.tier for q in CORE} == {"L1", "L2", "L3"} == {t.id for t in BANK.tiers}


def test_every_answer_has_three_parts():
    for q in BANK.questions:
        assert q.answer.framework.strip() and q.answer.key.strip(), q.id
        assert q.answer.mistakes and all(m.strip() for m in q.answer.mistakes), q.id


def test_chapter_slugs_cover_the_book_pages():
    pages = {p.stem for p in (ROOT / "book").glob("*.md") if re.match(r"(ch\d\d|appendix)-", p.stem)}
    assert pages == set(CHAPTER_SLUGS), sorted(pages ^ set(CHAPTER_SLUGS))
    assert len(CHAPTER_SLUGS) == len(set(CHAPTER_SLUGS)) and "ch09-interview" in pages


def test_every_chapter_link_names_a_book_page_and_a_label():
    for q in BANK.questions:
        assert q.chapter_slug in CHAPTER_SLUGS, q.id
        assert re.fullmatch(r"[a-z0-9-]+", q.chapter_label), q.id


@pytest.mark.parametrize("dotted", sorted({q.code for q in BANK.questions}))
def test_every_code_link_imports(dotted):
    assert resolve_code_link(dotted) is not None


def test_resolve_code_link_names_what_is_missing():
    with pytest.raises(ImportError, match="no_such_function"):
        resolve_code_link("servelab.sampling.no_such_function")


def test_pipeline_set_and_design_exercise_are_present():
    pipeline = BANK.select(set_id="pipeline")
    assert len(pipeline) == 15 and all(q.id.startswith("P") for q in pipeline)
    assert [d.id for d in BANK.design_exercises] == ["D1"]


def _pipeline(data: dict) -> list[dict]:
    return [q for q in data["questions"] if q["set"] == "pipeline"]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["questions"].pop(6), "exactly Q1..Q25"),
        (lambda d: d["questions"][0]["answer"].pop("mistakes"), "'mistakes' is a required property"),
        (lambda d: d["questions"][0]["links"].update(chapter="ch99-nowhere#x"), "not a book page slug"),
        (lambda d: d["questions"][0].update(tier="L7"), "tier 'L7'"),
        (lambda d: d["questions"][1].update(id="Q1"), "repeated question/exercise ids"),
        (lambda d: [q.update(tier="L1") for q in d["questions"] if q["tier"] == "L3"], "tiers without a core question"),
        (lambda d: _pipeline(d)[0].update(tier="L2"), "must list its questions tier by tier"),
        (lambda d: _pipeline(d)[4].update(id="P50"), "must number its questions 1..15 in file order"),
    ],
)
def test_validation_rejects_broken_banks(mutate, message):
    data = copy.deepcopy(load_raw())
    mutate(data)
    with pytest.raises(BankError, match=re.escape(message)):
        validate_raw(data)


# ------------------------------------------------------------------------ the topics the seeds cite


def test_q9_goes_beyond_masking():
    text = answer_text("Q9").lower()
    for idea in ("automaton state", "tokenizer", "dead end", "mask"):
        assert idea in text, idea


def test_q11_counterexample_numbers_are_true():
    text = answer_text("Q11")
    probs = [0.45, 0.30, 0.15, 0.10]
    assert "[0.45, 0.30, 0.15, 0.10]" in text
    k_then_p = support(top_p_filter(top_k_filter(probs, 3), 0.8))
    p_then_k = support(top_k_filter(top_p_filter(probs, 0.8), 3))
    assert (k_then_p, p_then_k) == ([0, 1], [0, 1, 2])
    assert r"\{0, 1\}" in text and r"\{0, 1, 2\}" in text


def test_q19_lists_every_sizing_input_and_the_exercise_numbers():
    text = answer_text("Q19").lower()
    for idea in ("arrival rate", "goodput", "slo", "planning utilisation", "n+1", "failure domain", "peak"):
        assert idea in text, idea
    result = solve_design()
    assert f"{result.peak_rate:.2f} req/s" in text
    assert f"{result.plan.serving} + {result.plan.spare} replicas" in text


def test_q21_names_the_three_effects():
    text = answer_text("Q21").lower()
    for idea in ("longer iterations", "occupied capacity", "preemption risk"):
        assert idea in text, idea


def test_q24_best_of_n_numbers_match_the_library():
    text = answer_text("Q24")
    assert best_of_n_kv_tokens(2000, 300, 8) == 4400 and "4400" in text
    assert best_of_n_kv_tokens(2000, 300, 8, shared_prefix=False) == 18_400 and "18,400" in text
    assert "refcount" in text.lower() and "reservation" in text.lower()


def test_worked_examples_in_l1_and_l2_match_the_library():
    assert support(top_p_filter([0.4, 0.3, 0.2, 0.1], 0.65)) == [0, 1]
    assert "tokens 0 and 1 survive" in answer_text("Q6")
    assert block_alloc_slots([1, 5], 4) == (6, 12) and "6 logical but 12 allocated" in answer_text("Q7")
    abc = [Request("A", 0, 1), Request("B", 0, 4), Request("C", 0, 1)]
    continuous, _ = simulate_batching(abc, 2, "continuous")
    static, _ = simulate_batching(abc, 2, "static")
    q8 = squash(answer_text("Q8"))
    assert continuous == {"A": 1, "B": 4, "C": 2} and "A=1, C=2, B=4" in q8
    assert static == {"A": 1, "B": 4, "C": 5} and "A=1, B=4, C=5" in q8
    probs = softmax([4.0, 3.0, 2.0, 1.0])
    assert [round(float(x), 2) for x in probs] == [0.64, 0.24, 0.09, 0.03]
    assert support(top_k_filter(probs, 2)) == support(top_p_filter(probs, 0.8)) == [0, 1]
    assert "[0.64, 0.24, 0.09, 0.03]" in answer_text("P3")
    buffer = StopStringBuffer(["###"])
    assert [buffer.push(c) for c in ("ok #", "#", "# more")] == ["ok ", "", ""]
    assert '"ok #", "#", "# more"' in BANK.question("Q12").question
    scenario = chunked_prefill_scenario()
    whole = simulate_iterations(scenario.requests, scenario.tokens_per_tick)
    chunked = simulate_iterations(scenario.requests, scenario.tokens_per_tick, scenario.chunked_budget)
    gaps = (whole.max_decode_gap(), chunked.max_decode_gap())
    ttfts = (whole.ttft(scenario.long_prompt), chunked.ttft(scenario.long_prompt))
    q15 = squash(answer_text("Q15"))
    assert f"from {gaps[0]} ticks to {gaps[1]}" in q15 and f"from {ttfts[0]} to {ttfts[1]} ticks" in q15


# ------------------------------------------------------------------------ design exercise


def test_design_defaults_reproduce_the_exercise():
    result = solve_design()
    assert round(result.peak_rate, 2) == 14.58
    assert (result.plan.serving, result.plan.total) == (6, 7)
    assert result.kv_gib_per_request == 1.40625
    assert [round(x, 2) for x in (result.hosted.per_1000_requests, result.hosted.per_1000_useful,
                                  result.owned.per_1000_requests)] == [7.82, 8.07, 16.61]
    values = dict((q, v) for q, v, _ in design_rows(result))
    assert values["Total replicas"] == "6 + 1 = 7" and values["Owned, per 1,000 requests"] == "$16.61"


def test_design_assumptions_are_editable():
    slower = solve_design(DesignAssumptions(per_replica_rate=2.0))
    assert slower.plan.serving == 11  # ceil(14.58 / 1.4)
    assert slower.owned.per_1000_requests > solve_design().owned.per_1000_requests
    with pytest.raises(TypeError, match="assumptions"):
        solve_design({"per_replica_rate": 2.0})


def test_design_concurrency_comes_from_arrival_rate_times_service_time():
    result = solve_design()
    assert result.in_flight_peak == pytest.approx(result.peak_rate * 8)  # 8 s mean service time
    assert round(result.in_flight_peak, 1) == 116.7
    assert result.in_flight_per_replica == pytest.approx(32)  # 4 req/s x 8 s
    assert result.in_flight_per_serving_replica == pytest.approx(result.in_flight_peak / 6)
    longer = solve_design(DesignAssumptions(service_time_s=12.0))
    assert longer.in_flight_per_replica == pytest.approx(48) and longer.reservations > result.reservations


def test_design_reservations_memory_are_derived_not_asserted():
    result = solve_design()
    # reservations cover the Poisson(32) count in flight 99 % of the time: 46 (P(N <= 45) < 0.99)
    assert result.reservations == 46
    assert result.reservations > result.in_flight_per_replica  # the mean alone would be short
    assert result.kv_gib_reserved == pytest.approx(46 * 1.40625)
    assert result.memory_gib_per_replica == pytest.approx(70e9 * 2 / 2**30 + 46 * 1.40625)
    values = dict((q, v) for q, v, _ in design_rows(result))
    assert values["KV reservations per replica"] == "46" and values["KV for 46 reservations"] == "64.69 GiB"
    mean_only = solve_design(DesignAssumptions(in_flight_quantile=0.5))
    assert mean_only.reservations == 32  # the median of Poisson(32)


def test_design_hosted_cost_shows_its_token_and_fixed_parts():
    result = solve_design()
    hosted, owned = result.hosted, result.owned
    assert hosted.usage_total == pytest.approx(2205 + 94.5 + 1575)
    assert hosted.fixed_total == owned.fixed_total == 600 + 1500 + 500 * 35
    assert owned.usage_total == 7 * 6 * 720
    rows = {q: (v, how) for q, v, how in design_rows(result)}
    assert rows["Hosted, token bill per month"][0] == "$3,874.50"
    assert rows["Fixed costs per month (either option)"][0] == "$19,600.00"
    assert "tokens $1.29 + fixed $6.53" in rows["Hosted, per 1,000 requests"][1]
    assert not any("allowances" in how for _, _, how in design_rows(result))
    pricier_review = solve_design(DesignAssumptions(review_rate=70.0))
    assert pricier_review.hosted.fixed_total == hosted.fixed_total + 500 * 35


# ------------------------------------------------------------------------ rendering


def test_question_myst_folds_the_answer_in_a_solution_dropdown():
    q = BANK.question("Q9")
    text = question_myst(q, root=None)
    exercise, solution = text.split("````{solution}")
    assert "{exercise} Q9" in exercise and q.question in exercise and q.answer.framework not in exercise
    assert ":class: dropdown" in solution and q.answer.framework in solution and q.code in solution


def test_tier_myst_holds_exactly_that_tier():
    text = tier_myst(BANK, "L3", "core", root=None)
    ids = re.findall(r"\{exercise\} (Q\d+)", text)
    assert ids == [q.id for q in CORE if q.tier == "L3"]


def test_chapter_link_resolves_labels_pages_or_plain_text(tmp_path):
    q = BANK.question("Q6")  # ch03-sampling#ch03-truncation
    assert chapter_link(q, None) == "ch03-sampling"
    (tmp_path / "_toc.yml").write_text("root: book/intro\n")
    (tmp_path / "book").mkdir()
    assert chapter_link(q, tmp_path) == "ch03-sampling"
    page = tmp_path / "book" / "ch03-sampling.md"
    page.write_text("# Sampling\n")
    assert chapter_link(q, tmp_path) == "[ch03-sampling](../book/ch03-sampling.md)"
    page.write_text("# Sampling\n\n(ch03-truncation)=\n## Truncation\n")
    assert chapter_link(q, tmp_path) == "{numref}`§{number} {name} <ch03-truncation>`"


def test_section_heading_numbers_headings_as_the_book_does(tmp_path):
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "ch03-sampling.md").write_text(
        "# Sampling\n\n## One\n\n```python\n## not a heading\n```\n\n(ch03-b)=\n## Two `top-p`\n\n"
        "### Deep\n\n(ch03-c)=\n\n### Deeper {term}`KV cache`\n\n(ch03-d)=\n## Three\n")
    assert str(section_heading(tmp_path, "ch03-sampling", "ch03-b")) == "§3.2 Two top-p"
    assert str(section_heading(tmp_path, "ch03-sampling", "ch03-c")) == "§3.2.2 Deeper KV cache"
    assert str(section_heading(tmp_path, "ch03-sampling", "ch03-d")) == "§3.3 Three"
    assert section_heading(tmp_path, "ch03-sampling", "ch03-missing") is None
    assert section_heading(tmp_path, "ch04-kv-cache", "ch03-b") is None


def test_every_question_links_a_labelled_heading_and_the_key_prints_its_title(tmp_path):
    for q in BANK.questions:
        heading = section_heading(ROOT, q.chapter_slug, q.chapter_label)
        assert heading is not None, (q.id, q.chapter)
        assert heading.number.startswith(q.chapter_slug[2:4].lstrip("0") or "0"), (q.id, heading)
    export_assignment(BANK.select(ids=["Q6"]), tmp_path, formats=["markdown"])
    key = (tmp_path / "answer-key.md").read_text()
    assert f"Read: {section_heading(ROOT, 'ch03-sampling', 'ch03-truncation')} · run:" in key
    assert "ch03-sampling#" not in key


# ------------------------------------------------------------------------ export round trip


def _no_answer_text(raw: str, questions) -> None:
    flat = squash(raw)
    for q in questions:
        for piece in q.answer.texts():
            assert squash(piece)[:50] not in flat, (q.id, piece[:50])
        assert q.code not in flat, q.id


@pytest.mark.parametrize("selection", [{"tiers": ["L1", "L2"]}, {"ids": ["Q1", "Q9", "P3"]}])
def test_export_round_trip_and_student_files_hold_no_answer(tmp_path, selection):
    questions = BANK.select(**selection)
    paths = export_assignment(questions, tmp_path)
    assert sorted(p.name for p in paths) == ["answer-key.ipynb", "answer-key.md", "assignment.ipynb", "assignment.md"]
    for reader, suffix in ((read_markdown, ".md"), (read_notebook, ".ipynb")):
        student = reader(tmp_path / f"assignment{suffix}")
        key = reader(tmp_path / f"answer-key{suffix}")
        for records in (student, key):
            assert [(r.id, r.title, r.question) for r in records] == [(q.id, q.title, q.question) for q in questions]
        assert all(r.answer is None for r in student)
        for record, q in zip(key, questions):
            assert q.answer.framework in record.answer and q.answer.mistakes[-1] in record.answer
            assert q.code in record.answer
            assert all(idea in record.answer for _, idea in q.rubric.ideas)
    _no_answer_text((tmp_path / "assignment.md").read_text(), questions)
    assert not any(idea[:40] in (tmp_path / "assignment.md").read_text() for q in questions for _, idea in q.rubric.ideas)
    nb = nbformat.read(str(tmp_path / "assignment.ipynb"), as_version=4)
    nbformat.validate(nb)
    _no_answer_text("\n".join(c.source for c in nb.cells), questions)
    assert {c.metadata["servelab"]["role"] for c in nb.cells} == {"title", "question", "response"}


def test_export_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="formats"):
        export_assignment(CORE[:1], tmp_path, formats=["pdf"])
    with pytest.raises(ValueError, match="questions"):
        export_assignment([], tmp_path)
    with pytest.raises(ValueError, match="unknown question ids"):
        BANK.select(ids=["Q1", "Q99"])
    with pytest.raises(ValueError, match="tiers"):
        BANK.select(tiers=["L9"])


def test_cli_export(tmp_path, capsys):
    assert cli(["export", "--questions", "Q1,Q9", "--format", "markdown", "--out", str(tmp_path / "a")]) == 0
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["answer-key.md", "assignment.md"]
    assert [r.id for r in read_markdown(tmp_path / "a" / "assignment.md")] == ["Q1", "Q9"]
    assert cli(["export", "--tiers", "L3", "--format", "notebook", "--out", str(tmp_path / "b")]) == 0
    assert [r.id for r in read_notebook(tmp_path / "b" / "assignment.ipynb")] == [f"Q{i}" for i in range(19, 26)]
    assert cli(["export", "--questions", "Q99", "--out", str(tmp_path / "c")]) == 2
    assert "Q99" in capsys.readouterr().err


def test_label_defined_accepts_directive_labels(tmp_path):
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "ch05-scheduling.md").write_text("```{exercise}\n:label: ch05-long-generation-x\n```\n")
    assert not label_defined(tmp_path, "ch05-scheduling", "ch05-long-generation")
    (tmp_path / "book" / "ch05-scheduling.md").write_text("```{figure} a.png\n:name: ch05-long-generation\n```\n")
    assert label_defined(tmp_path, "ch05-scheduling", "ch05-long-generation")


def test_interview_notebook_renders_every_question():
    nb = nbformat.read(str(ROOT / "notebooks" / "ch09-interview.ipynb"), as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    rendered = set(re.findall(r'tier_view\(bank, "(L\d)", "([a-z-]+)", root\)', code))
    assert {(q.tier, q.set) for q in BANK.questions} <= rendered
    myst_cells = [c for c in nb.cells if "tier_view(bank" in c.source or "design_exercise_view(" in c.source]
    assert myst_cells and all(c.metadata["mystnb"]["markdown_format"] == "myst" for c in myst_cells)
    assert "design_exercises[0]" in code


def _ids_under_headings(text: str, question: str) -> list[tuple[str, str]]:
    """(text of the nearest heading above, question id) for every question ``question`` matches."""
    pairs, heading = [], None
    for line in text.splitlines():
        if re.match(r"#{1,6} ", line):
            heading = line.lstrip("#").strip()
        pairs += [(heading, qid) for qid in re.findall(question, line)]
    return pairs


BANK_ORDER = [(tier_heading(BANK.tier(q.tier)), q.id) for q in BANK.questions]


def test_chapter_page_shows_every_question_in_bank_order_under_its_tier_heading():
    page = (ROOT / "book" / "ch09-interview.md").read_text(encoding="utf-8")
    expanded = expand_question_sets(page, BANK, ROOT)
    assert "{servelab-questions}" not in expanded
    assert _ids_under_headings(expanded, r"^````\{exercise\} ([A-Z]\d+) · ") == BANK_ORDER
    # every answer is a solution directive, so SERVELAB_SOLUTIONS=0 (hide_solutions) removes it
    assert expanded.count("````{solution} ch09-") == len(BANK.questions) and "<details>" not in expanded
    assert not re.search(r"^:label: ch09-nb-", expanded, re.MULTILINE)


def test_interview_notebook_shows_every_question_in_bank_order_under_its_tier_heading():
    nb = nbformat.read(str(ROOT / "notebooks" / "ch09-interview.ipynb"), as_version=4)
    shown = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            shown.append(cell.source)
        elif "tier_view(bank" in cell.source:
            shown += [o["data"]["text/markdown"] for o in cell.outputs if "text/markdown" in o.get("data", {})]
    assert _ids_under_headings("\n".join(shown), r"^\*\*([A-Z]\d+) · ") == BANK_ORDER


def test_every_question_has_a_rubric_with_points_per_idea():
    for q in BANK.questions:
        assert len(q.rubric.ideas) >= 2 and q.rubric.max_points >= 3, q.id
        assert q.rubric.mistake_points >= 1 and len(q.answer.mistakes) >= 1, q.id


def test_cli_key_out_puts_the_answer_key_in_its_own_folder(tmp_path):
    assert cli(["export", "--questions", "Q6", "--format", "markdown", "--out", str(tmp_path / "week1"),
                "--key-out", str(tmp_path / "week1-key")]) == 0
    assert sorted(p.name for p in (tmp_path / "week1").iterdir()) == ["assignment.md"]
    key = (tmp_path / "week1-key" / "answer-key.md").read_text()
    assert "**Rubric (5 points).**" in key and "Take off 1 point for each common mistake" in key
    assert cli(["export", "--questions", "Q6", "--out", str(tmp_path / "x"), "--key-out", str(tmp_path / "x")]) == 2


def test_design_states_both_reservation_counts_and_what_each_assumes():
    values = {q: (v, how) for q, v, how in design_rows(solve_design())}
    value, how = values["As stated: KV for 48 reservations"]
    assert value == "67.5 GiB" and "1.5 × the mean" in how and "the derived 46" in how
    assert values["KV for 46 reservations"][0] == "64.69 GiB"
    changed = {q for q, _, _ in design_rows(solve_design(DesignAssumptions(stated_reservations=50)))}
    assert "As stated: KV for 50 reservations" in changed


def test_the_instructor_page_export_commands_run_as_written(tmp_path):
    import subprocess
    import sys

    text = (ROOT / "book" / "instructor.md").read_text(encoding="utf-8")
    block = text[text.index("## Exporting an assignment"):].split("```bash\n", 1)[1].split("```", 1)[0]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib")}
    run = subprocess.run(["bash", "-e", "-c", block.replace("python -m", f"{sys.executable} -m")], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    for out in ("week3", "quiz", "drill"):
        assert not list((tmp_path / out).glob("answer-key.*")) and list((tmp_path / out).glob("assignment.*"))
        assert list((tmp_path / f"{out}-key").glob("answer-key.*"))


# ------------------------------------------------------------------------ course names in the answers

COURSE_NAME = re.compile(r"(?<![\w.])servelab(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
BARE_CODE_NAME = re.compile(r"(?<![\w.])[A-Z][a-z][A-Za-z0-9]*\.[a-z_][A-Za-z0-9_]*")


def _strings(node) -> list[str]:
    """Every string in the raw bank (questions, answers, rubrics, links, design exercises)."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for value in node.values() for s in _strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in _strings(value)]
    return []


def course_names(raw: dict) -> set[str]:
    """Every dotted ``servelab...`` name the bank's text mentions, backticked or not."""
    return {m.group(0) for text in _strings(raw) for m in COURSE_NAME.finditer(text)}


def unresolved_course_names(raw: dict) -> list[str]:
    """The mentioned names that do not import, each with the reason."""
    missing = []
    for name in sorted(course_names(raw)):
        try:
            resolve_code_link(name)
        except ImportError as exc:
            missing.append(f"{name}: {exc}")
    return missing


def test_every_course_name_the_bank_mentions_imports():
    raw = load_raw()
    names = course_names(raw)
    assert {q.code for q in BANK.questions} <= names and len(names) > len({q.code for q in BANK.questions})
    assert unresolved_course_names(raw) == []


def test_the_name_check_reports_a_missing_name():
    raw = copy.deepcopy(load_raw())
    raw["questions"][0]["answer"]["key"] += " See servelab.sampling.no_such_function."
    assert [m.split(":")[0] for m in unresolved_course_names(raw)] == ["servelab.sampling.no_such_function"]


def test_course_code_is_named_by_its_full_dotted_path():
    """A bare ``ClassName.attr`` cannot be checked; the bank writes ``servelab.module.ClassName.attr``."""
    bare = sorted({m.group(0) for text in _strings(load_raw()) for m in BARE_CODE_NAME.finditer(text)})
    assert bare == [], bare


# ------------------------------------------------------------------------ numbers in the corrected and new answers


def test_q3_gives_both_goodput_definitions():
    text = squash(answer_text("Q3"))
    assert "can never exceed the offered load" in text and "DistServe" in text
    assert "servelab.metrics.capacity.sustained_rate" in text


def test_q4_says_long_prompts_are_compute_bound_and_short_tails_are_not():
    text = squash(answer_text("Q4")).lower()
    assert "long prompts are more compute-bound" in text and "uncached tail" in text
    assert "io- or kernel-limited" not in text


def test_q7_and_e4_kv_layouts_match_the_library():
    from servelab.kv import kv_bytes_per_token
    from servelab.kv.footprint import mla_kv_bytes_per_token, sequence_kv_bytes

    q7 = squash(answer_text("Q7"))
    assert "MLA" in q7 and "sliding-window" in q7 and "Mamba" in q7 and "hybrid KV cache manager" in q7
    e4 = squash(answer_text("E4"))
    assert mla_kv_bytes_per_token(61, 512, 64, 2) == 70_272 and "70,272 bytes" in e4
    per_head = 61 * 128 * (192 + 128) * 2  # K 192 and V 128 elements per head, 128 heads
    assert f"{per_head:,}" in e4
    gpt_oss = [128 if i % 2 else None for i in range(36)]
    hybrid, full = (sequence_kv_bytes(131_072, w, 8, 64, 2) / 2**30 for w in (gpt_oss, [None] * 36))
    assert f"{hybrid:.2f} GiB instead of {full:.2f} GiB" in e4
    assert sequence_kv_bytes(10, [None] * 3, 2, 4, 2) == 10 * kv_bytes_per_token(3, 2, 4, 2)


def test_q20_and_e8_quote_the_split_sums():
    import numpy as np

    from servelab.questions.reduction import split_sum

    values = np.random.default_rng(0).standard_normal(4096)
    one, sixteen = split_sum(values, 1), split_sum(values, 16)
    assert one != sixteen
    for qid in ("Q20", "E8"):
        text = squash(answer_text(qid))
        assert f"{one:.6f} and {sixteen:.6f}" in text, qid
        assert "VLLM_BATCH_INVARIANT=1" in text and "--enable-deterministic-inference" in text, qid


def test_q22_counts_two_all_reduces_per_layer():
    text = squash(answer_text("Q22"))
    assert "two all-reduces per layer" in text and "replicates each KV head" in text
    assert "two all-reduces per layer" in " ".join(i for _, i in BANK.question("Q22").rubric.ideas)


def test_q24_names_how_each_engine_shares_the_prompt():
    text = squash(answer_text("Q24"))
    assert "vLLM V1 has no copy-on-write" in text and "SGLang" in text and "child requests" in text
    prompt, generated, n, block = 2000, 300, 8, 16
    v1 = prompt // block * block + n * (prompt % block + generated)
    assert v1 == best_of_n_kv_tokens(prompt, generated, n) == 4400 and "125 full blocks of 16" in text
    ideas = " ".join(i for _, i in BANK.question("Q24").rubric.ideas)
    assert "The first write into a shared partial tail block copies it" not in ideas


def test_e1_budget_example_is_arithmetic_true():
    budget, decodes, prompt = 2048, 100, 5000
    chunks, left = [], prompt
    while left:
        chunks.append(min(budget - decodes, left))
        left -= chunks[-1]
    assert chunks == [1948, 1948, 1104]
    assert "3 steps (1,948 + 1,948 + 1,104)" in squash(answer_text("E1"))


def test_e2_fp8_numbers_match_the_library():
    import torch

    from servelab.kv import kv_bytes_per_token
    from servelab.kv.fp8 import fp8_relative_error

    text = squash(answer_text("E2"))
    bf16, fp8 = kv_bytes_per_token(32, 8, 128, 2), kv_bytes_per_token(32, 8, 128, 1)
    assert f"from {bf16:,} to {fp8:,} bytes per token" in text
    k = torch.randn(4096, 128, generator=torch.Generator().manual_seed(0))
    outlier = k.clone()
    outlier[:, 0] *= 50
    assert f"RMS error of {100 * fp8_relative_error(k):.1f} %" in text
    assert f"({100 * fp8_relative_error(outlier):.1f} % with one channel 50 times larger" in text


def test_e3_moe_numbers_match_the_library():
    from servelab.kv import kv_bytes_per_token
    from servelab.metrics.roofline.moe import MIXTRAL_8X7B as mixtral, QWEN3_30B_A3B as qwen, experts_touched

    text = squash(answer_text("E3"))
    assert f"{qwen.total_params / 1e9:.2f}B total and {qwen.active_params / 1e9:.2f}B active" in text
    assert f"about {qwen.weight_bytes / 1e9:.0f} GB in bf16" in text
    assert f"{mixtral.total_params / 1e9:.1f}B total, {mixtral.active_params / 1e9:.1f}B active" in text
    hit = [experts_touched(128, 8, t) for t in (1, 16, 64)]
    assert f"{hit[0]:.0f} at batch 1 but {hit[1]:.1f} at 16 and {hit[2]:.1f} of 128 at 64" in text
    assert f"{kv_bytes_per_token(48, 4, 128, 2):,} bytes per token" in text


def test_e5_speculation_numbers_match_the_library():
    from servelab.metrics.capacity import breakeven_acceptance, expected_tokens_per_cycle

    text = squash(answer_text("E5"))
    assert f"{expected_tokens_per_cycle(0.8, 3):.3f} for $a = 0.8$, $k = 3$" in text
    assert f"breaks even at $a = {breakeven_acceptance(1.3, 3):.3f}$" in text


def test_e9_transfer_numbers_match_the_library():
    from servelab.kv import kv_bytes_per_token
    from servelab.kv.footprint import kv_transfer_seconds

    text = squash(answer_text("E9"))
    per_token = kv_bytes_per_token(80, 8, 128, 2)
    assert f"{per_token:,} bytes per token" in text
    assert f"8,192 tokens are {8192 * per_token / 1e9:.2f} GB" in text
    assert f"{1000 * kv_transfer_seconds(8192, per_token, 50e9):.1f} ms over a 50 GB/s" in text


def test_engines_set_covers_the_topics_in_three_tiers():
    engines = BANK.select(set_id="engines")
    assert [q.id for q in engines] == [f"E{i}" for i in range(1, 10)]
    assert {q.tier for q in engines} == {"L1", "L2", "L3"} and len(BANK.questions) >= 48
    titles = " ".join(q.title for q in engines)
    for topic in ("vLLM V1", "FP8", "MoE", "EAGLE-3", "Batch-invariant", "Tiered KV", "disaggregation"):
        assert topic in titles, topic


# ------------------------------------------------------------------------ rubric on the page, marking


def test_every_rendered_answer_carries_its_rubric():
    for q in BANK.questions:
        for text in (question_myst(q, root=None), question_notebook(q, root=None)):
            assert f"**Rubric ({q.rubric.max_points} points).** A full answer states every key idea" in text
            assert "**Loses points.** Take off" in text and q.rubric.ideas[-1][1] in text, q.id


def test_the_instructor_pages_worked_marking_adds_up():
    from servelab.questions.marking import mark, marking_rows

    q24 = BANK.question("Q24")
    made = [i for i, m in enumerate(q24.answer.mistakes) if "copy a shared tail block" in m]
    sample = mark(q24, ideas_stated=[0, 2], mistakes_made=made)
    assert (sample.idea_points, sample.deducted, sample.score, sample.max_points) == (3, 1, 2, 5)
    assert marking_rows(sample)[-1] == ("Total (never below 0)", "", "2 / 5")
    assert mark(q24, [], range(len(q24.answer.mistakes))).score == 0
    assert mark(q24, range(len(q24.rubric.ideas)), []).score == q24.rubric.max_points
    page = (ROOT / "book" / "instructor.md").read_text(encoding="utf-8")
    for name in ("ch09_mark_answer", "ch09_mark_ideas", "ch09_mark_deducted", "ch09_mark_score"):
        assert f"ch09-interview.ipynb::{name}" in page, name


@pytest.mark.parametrize("ideas, mistakes, message", [
    ([5], [], "ideas_stated\\[0\\]"), ([0, 0], [], "repeats"), ([], [-1], "mistakes_made\\[0\\]"),
])
def test_mark_rejects_positions_outside_the_rubric(ideas, mistakes, message):
    from servelab.questions.marking import mark

    with pytest.raises(ValueError, match=message):
        mark(BANK.question("Q24"), ideas, mistakes)


def test_e7_offload_numbers_match_the_library():
    from servelab.metrics.capacity import prefill_flops
    from servelab.kv import kv_bytes_per_token
    from servelab.kv.footprint import kv_transfer_seconds

    text = squash(answer_text("E7"))
    per_token, prefix = kv_bytes_per_token(32, 8, 128, 2), 32_768
    assert f"{per_token:,} bytes per token make {prefix * per_token / 1e9:.2f} GB" in text
    assert f"{1000 * kv_transfer_seconds(prefix, per_token, 50e9):.1f} ms from host memory" in text
    assert f"{1000 * kv_transfer_seconds(prefix, per_token, 7e9):.0f} ms from an NVMe SSD" in text
    weights, causal = prefill_flops(8e9, prefix, 32, 32, 128)  # attention counted causal
    quoted = f"costs {weights + causal:.1e} FLOPs (weights {weights:.1e} plus causal attention {causal:.1e}"
    assert quoted.replace("e+", "e") in text
    assert f"{(weights + causal) / 500e12:.1f} s at an assumed 500 TFLOP/s" in text


def test_the_answer_key_export_carries_the_corrections(tmp_path):
    export_assignment(BANK.select(ids=["Q3", "Q4", "Q7", "Q22", "Q24", "E8"]), tmp_path, formats=["markdown"])
    key = squash((tmp_path / "answer-key.md").read_text(encoding="utf-8"))
    for corrected in ("DistServe's goodput is a capacity", "long prompts are more compute-bound",
                      "vLLM V1's hybrid KV cache manager", "two all-reduces per layer",
                      "vLLM V1 has no copy-on-write", "VLLM_BATCH_INVARIANT=1", "**Loses points.**"):
        assert corrected in key, corrected
    assert "very long prompts make prefill attention IO- or kernel-limited" not in key
    assert "The first write into a shared partial tail block copies it" not in key
