"""``bench/RESULTS.md`` and README's benchmark figures are exactly the rendering of the committed raw
data (``bench/results/``, named by its ``manifest.json``) and notes (``bench/RESULTS-notes.md``): a
hand edit of either file, or a regeneration that drops a note, fails here. No benchmark runs."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path
from typing import Any

import pytest

from bench import results_document as document
from bench import thread_policy
from tools import run_bench


@pytest.fixture(scope="module")
def committed() -> tuple[document.Data, list[document.Note]]:
    data = document.load(document.RESULTS_DIR)
    return data, document.parse_notes(document.NOTES.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def rendered(committed: tuple[document.Data, list[document.Note]]) -> str:
    return document.render(*committed)


def _readme_block() -> str:
    text = document.README.read_text(encoding="utf-8")
    start = text.index(document.README_BEGIN)
    return text[start : text.index(document.README_END, start) + len(document.README_END)]


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_results_md_is_the_rendering_of_the_committed_data_and_notes(rendered: str) -> None:
    assert document.RESULTS_MD.read_text(encoding="utf-8") == rendered, (
        "bench/RESULTS.md differs from the rendering of bench/results/ and bench/RESULTS-notes.md: "
        "put notes in the notes file and run python tools/run_bench.py --render-only"
    )


def test_every_note_appears_under_its_section(
    committed: tuple[document.Data, list[document.Note]], rendered: str
) -> None:
    _, notes = committed
    assert {n.section for n in notes} >= {"targets", "grpo", "family", "readme", "sampler"}
    headings = [i for i, line in enumerate(rendered.splitlines()) if line.startswith("## ")]
    lines = rendered.splitlines()
    titles = {
        "targets": "## Targets",
        "grpo": "## Critic-free iteration",
        "family": "## PPO-family ops",
        "threads": "## The ppo-ref command's thread policy",
        "sampler": "## Sampler modes",
    }
    for note in notes:
        if note.section == "readme":
            assert _flat(note.text) in _flat(_readme_block())
            continue
        at = rendered.index(note.text)
        line = rendered[:at].count("\n")
        section_start = max(i for i in headings if i <= line)
        assert lines[section_start].startswith(titles[note.section]), (note.section, lines[section_start])


def test_without_the_notes_the_rendering_differs_and_lacks_them(
    committed: tuple[document.Data, list[document.Note]], rendered: str
) -> None:
    data, notes = committed
    bare = document.render(data, [])
    assert bare != rendered
    assert not any(n.text in bare for n in notes)


def test_readme_figures_are_the_rendering(committed: tuple[document.Data, list[document.Note]]) -> None:
    block = document.readme_block(*committed)
    assert _readme_block() == block
    grpo = document.report.grpo_results(committed[0].first("grpo") or {})
    for result in grpo:  # the figures the README quotes are the GRPO section's
        assert f"{result['ratio']:.2f}x (beta {result['beta']:g})" in block
        assert f"**{result['ratio']:.2f}x**" in document.RESULTS_MD.read_text(encoding="utf-8")


def test_render_only_command_rebuilds_the_committed_file(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    assert run_bench.main(["--render-only", "--output", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == document.RESULTS_MD.read_text(encoding="utf-8")


def test_the_committed_file_is_one_run_and_each_section_names_its_commit(
    committed: tuple[document.Data, list[document.Note]], rendered: str
) -> None:
    data, notes = committed
    assert data.header is not None
    commit = document.provenance(*data.header).commit
    assert "Every section comes from one run at one commit: `python tools/run_bench.py` on" in rendered
    assert document.render(data, notes, require_one_commit=True) == rendered
    for text in rendered.split("\n## ")[1:]:
        title = text.splitlines()[0]
        if title.startswith(("How it is measured", "Notes about sections")):
            continue  # no data: the method
        assert commit in text, title


def test_whole_mode_refuses_data_from_another_commit(
    committed: tuple[document.Data, list[document.Note]],
) -> None:
    data, notes = committed
    assert data.header is not None
    headless = document.Data(data.results_dir, None, data.sources)
    with pytest.raises(ValueError, match="no header run"):
        document.render(headless, notes, require_one_commit=True)
    # the GRPO section from the committed run of 2026-12-01 (commit d5ba771), the rest from the header's
    older = json.loads((document.RESULTS_DIR / "run-trainer-grpo.json").read_text(encoding="utf-8"))
    mixed = document.Data(
        data.results_dir, data.header, {**data.sources, "grpo": [("run-trainer-grpo.json", older)]}
    )
    header_commit = document.provenance(*data.header).commit
    with pytest.raises(ValueError, match="grpo from d5ba771"):
        document.render(mixed, notes, require_one_commit=True)
    marked = document.render(mixed, notes)
    assert (
        f"**Not the header's run: this section's data is from commit d5ba771, not {header_commit}.**"
        in marked
    )


def _one_run(tmp_path: Path) -> Path:
    """A results directory whose every measurement is the committed --only trainer grpo run."""
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(document.RESULTS_DIR / "run-trainer-grpo.json", results / "run.json")
    document.write_manifest(results, {"trainer": ["run.json"], "grpo": ["run.json"]}, header="run.json")
    return results


def test_one_run_renders_each_fact_once(tmp_path: Path) -> None:
    data = document.load(_one_run(tmp_path))
    text = document.render(data, [], require_one_commit=True)
    assert "Every section comes from one run at one commit" in text and "d5ba771" in text
    # The PPO overhead is the trainer section's; the GRPO section does not repeat it.
    assert "### PPO iteration over its bare compute" not in text
    assert "In process CPU seconds" in text and "(target <= 1.05, issue 12)" in text
    # A note whose section has no data here is listed at the end, not dropped.
    with_note = document.render(data, [document.Note("memory", None, "A memory note.")])
    assert with_note.endswith(
        "## Notes about sections without data in this file\n\n"
        "From `bench/RESULTS-notes.md`, section `memory`:\n\nA memory note.\n"
    )


def test_a_note_about_another_commit_is_marked_not_dropped(tmp_path: Path) -> None:
    data = document.load(_one_run(tmp_path))
    notes = document.parse_notes("preface\n\n## grpo (data of commit 0123456)\n\nAn old remark.\n")
    text = document.render(data, notes)
    assert "An old remark." in text
    assert "*Note written about the data of commit 0123456; the data here is from d5ba771" in text
    current = document.parse_notes("## grpo (data of commit d5ba771)\n\nA remark.\n")
    assert "Note written about" not in document.render(data, current)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("## grop\n\ntext\n", "bad heading"),
        ("## grpo (commit abc1234)\n\ntext\n", "bad heading"),
        ("## grpo\n\n\n## family\n\n- x\n", "no text under it"),
    ],
)
def test_bad_notes_are_refused(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        document.parse_notes(text)


def test_bad_manifests_are_refused(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"header": None, "sections": {"gpu": ["x.json"]}}))
    with pytest.raises(ValueError, match="unknown sections"):
        document.load(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"header": None, "sections": {"grpo": ["x.json"]}}))
    with pytest.raises(ValueError, match=r"x\.json, which is missing"):
        document.load(tmp_path)
    shutil.copy(document.RESULTS_DIR / "run-trainer-grpo.json", tmp_path / "x.json")
    (tmp_path / "manifest.json").write_text(json.dumps({"header": None, "sections": {"memory": ["x.json"]}}))
    with pytest.raises(ValueError, match="which has no 'memory'"):
        document.load(tmp_path)
    with pytest.raises(ValueError, match=r"no manifest\.json"):
        document.load(tmp_path / "nowhere")


def test_a_new_measurement_drops_the_header_and_a_rerendering_keeps_it(tmp_path: Path) -> None:
    results = _one_run(tmp_path)
    document.write_manifest(results, {"grpo": ["run.json"]}, header=None, new_data=False)
    assert json.loads((results / "manifest.json").read_text())["header"] == "run.json"
    document.write_manifest(results, {"grpo": ["run.json"]}, header=None)
    manifest = json.loads((results / "manifest.json").read_text())
    assert manifest == {"header": None, "sections": {"trainer": ["run.json"], "grpo": ["run.json"]}}


def _thread_data() -> dict[str, Any]:
    times = {
        "default": {"idle": [24.0, 26.0], "loaded": [40.0, 44.0]},
        "two-spinning": {"idle": [24.0, 24.0], "loaded": [75.0, 80.0]},
        "two-passive": {"idle": [47.0, 47.0], "loaded": [58.0, 58.0]},
    }
    return {
        "times": times,
        "loadavg": [[0.5, 0.4, 0.3], [2.1, 1.0, 0.6], [2.3, 1.2, 0.7]],
        "command": "python bench/thread_policy.py",
        "started_utc": "2026-12-03 09:00",
        "commit": "abcdef1",
        "cpu": "AMD EPYC",
        "cores": 2,
        "quick": False,
    }


def test_thread_policy_section_from_its_json(tmp_path: Path) -> None:
    (tmp_path / "thread-policy.json").write_text(json.dumps(_thread_data()))
    document.write_manifest(tmp_path, {"threads": ["thread-policy.json"]}, header=None)
    text = document.render(document.load(tmp_path), [])
    summary = thread_policy.summarise(_thread_data())
    assert "## The ppo-ref command's thread policy: idle and beside a two-thread job" in text
    assert "from `python bench/thread_policy.py` on 2026-12-03 09:00 UTC at commit abcdef1" in text
    row = summary["default"]
    assert (
        f"| {row['idle_s']:.1f} | {row['loaded_s']:.1f} | {row['loaded_over_idle']:.2f}x | "
        f"{row['idle_over_two_spinning_idle']:.2f}x |" in text
    )
    assert "beside the job within 2x of idle: 1.68x (met)" in text
    assert "(`two-spinning` idle): 1.04x (met)" in text
    assert "| `--threads 2`, `OMP_WAIT_POLICY=PASSIVE` |" in text


def test_thread_policy_section_marks_stopped_runs_as_lower_bounds(tmp_path: Path) -> None:
    data = _thread_data()
    data["limit"] = 75.0
    data["times"]["two-spinning"]["loaded"] = [75.0, 75.0]
    data["stopped"] = {
        p: {"idle": [False, False], "loaded": [p == "two-spinning"] * 2} for p in data["times"]
    }
    (tmp_path / "thread-policy.json").write_text(json.dumps(data))
    document.write_manifest(tmp_path, {"threads": ["thread-policy.json"]}, header=None)
    text = document.render(document.load(tmp_path), [])
    assert "A run still going after 75 s was stopped and counted at that limit" in text
    assert "| 24.0 | >= 75.0 (2 stopped) | >= 3.12x | 1.00x |" in text
    assert "beside the job within 2x of idle: 1.68x (met)" in text  # default's own runs all finished


def test_thread_policy_section_without_its_json(tmp_path: Path) -> None:
    document.write_manifest(tmp_path, {"threads": ["thread-policy.json"]}, header=None)
    text = document.render(document.load(tmp_path), [])
    assert "Not measured yet: `python bench/thread_policy.py`" in text


def _sampler_beta(beta: float) -> dict[str, Any]:
    from bench import sampler_compare

    rounds = [
        {
            "loadavg_1min": load,
            "dynamic": [0.080, 0.084],
            "static-compiled": [0.060, 0.062],
            "trl": [0.093, 0.095] if load < 1 else [0.092, 0.094],
            "decode": {"generate": 0.060, "dynamic": 0.050, "static": 0.051, "static-compiled": decode},
        }
        for load, decode in ((0.5, 0.033), (1.5, 0.035))
    ]
    for record in rounds:
        record["trl_over_static_compiled"] = statistics.median(record["trl"]) / 0.061
        record["trl_over_dynamic"] = statistics.median(record["trl"]) / 0.082
    compiled = {"stage_seconds_median": {"seconds_forward": 0.0, "seconds_update": 0.027}}
    return {
        "beta": beta,
        "rounds": rounds,
        "median_ratios": {
            k: statistics.median(r[k] for r in rounds)
            for k in ("trl_over_static_compiled", "trl_over_dynamic")
        },
        "ready": {
            "dynamic": {"peak_rss_bytes": 400 * 2**20, "build_seconds": 2.0},
            "static-compiled": {"peak_rss_bytes": 500 * 2**20, "build_seconds": 64.0},
            "trl": {"peak_rss_bytes": 550 * 2**20},
            "decode": {
                "first_call_seconds": {"static-compiled": 60.034},
                "same_tokens_as_dynamic": {"dynamic": True, "static": True, "static-compiled": True},
            },
        },
        "floor": sampler_compare._floor(rounds, compiled),
    }


def _smollm2_run(generate: float) -> dict[str, Any]:
    iteration = {"seconds_generate": generate, "seconds_forward": 4.4, "seconds_update": 21.9}
    iterations = [{**iteration, "seconds_iteration": sum(iteration.values()) + 0.3} for _ in range(3)]
    iterations[0] = {**iterations[0], "seconds_iteration": 80.0}
    return {
        "command": "ppo-ref train --task smollm2-sentiment --iterations 3 --sampler dynamic",
        "wall_seconds": 200.0,
        "peak_rss_bytes": 2400 * 2**20,
        "iterations": iterations,
    }


def test_sampler_floor_is_the_compiled_decode_and_the_trainers_stages() -> None:
    floor = _sampler_beta(0.0)["floor"]
    assert floor["decode_seconds"] == pytest.approx(0.034)  # median of the rounds' compiled decodes
    assert floor["seconds"] == pytest.approx(0.034 + 0.0 + 0.027)
    assert floor["trl_seconds"] == pytest.approx(0.0935)  # median of every TRL iteration
    assert floor["trl_over_floor"] == pytest.approx(0.0935 / 0.061)


def test_sampler_section_from_its_json(tmp_path: Path) -> None:
    results = _one_run(tmp_path)
    data = {
        "command": "python bench/sampler_compare.py",
        "started_utc": "2026-12-07 20:00",
        "commit": "abcdef1",
        "cpu": "Intel Xeon",
        "cores": 2,
        "settings": {"rounds": 2, "block": 2, "warmup": 2, "threads": 2},
        "loadavg": [[0.4, 0.3, 0.2], [1.0, 0.5, 0.3], [1.2, 0.6, 0.4], [1.1, 0.8, 0.5]],
        "betas": [_sampler_beta(0.0), _sampler_beta(0.04)],
        "smollm2": {"dynamic": _smollm2_run(4.0), "static-compiled": _smollm2_run(2.0)},
    }
    (results / "sampler.json").write_text(json.dumps(data))
    document.write_manifest(results, {"sampler": ["sampler.json"]}, header=None)
    text = document.render(document.load(results), [])
    section = text[text.index("## Sampler modes") :]
    assert "`bench/results/sampler.json`" not in section  # a tmp results dir is named as it is
    assert "from `python bench/sampler_compare.py` on 2026-12-07 20:00 UTC at commit abcdef1" in section
    assert "| beta = 0 | beta = 0.04 |" in section
    assert (
        "| decode s: `model.generate`; `dynamic`; `static`; `static-compiled` | 0.060; 0.050; 0.051; 0.034 |"
        in section
    )
    ratio = statistics.median([0.094 / 0.061, 0.093 / 0.061])
    assert f"| **{ratio:.2f}x** (met) |" in section
    assert "| 0.061 = 0.034 + 0.000 + 0.027 |" in section
    assert "| 60 |" in section  # compile: the first compiled call minus a steady one
    assert "| 400 MiB; 500 MiB; 550 MiB (met) |" in section
    # The PPO floor comes from the trainer section's data in the same file.
    trainer = document.load(results).first("trainer")
    assert trainer is not None
    stages = document.report.trainer_summary(trainer["trainer"])["stages"]
    rest = stages["seconds_forward"] + stages["seconds_update"]
    assert f"= {rest:.3f} s" in section
    # SmolLM2: the steady iterations (the first, which compiles, apart), and the halving target.
    assert "| first iteration, s | 80.0 | 80.0 |" in section
    assert "| of which generation | 4.0 | 2.0 |" in section
    assert "takes 28.6 s, 0.93x of `dynamic`'s 30.6 s (**missed**)" in section
    assert "Its forwards and update alone take 26.3 s, above the target" in section


def test_sampler_section_without_its_json(tmp_path: Path) -> None:
    document.write_manifest(tmp_path, {"sampler": ["sampler.json"]}, header=None)
    text = document.render(document.load(tmp_path), [])
    assert "Not measured yet: `python bench/sampler_compare.py` writes `bench/results/sampler.json`" in text
