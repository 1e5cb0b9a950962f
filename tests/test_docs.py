"""The user docs: README one screen, every relative link resolving, no tracker or diary words, the configuration
reference equal to the schema, and generated tables that the docs command rewrites from a run's result tables."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO
from idunlearn.docs import (BLOCK, configuration_sections, markdown_table, pages, regenerate, regenerate_from_shipped,
                           regenerate_text, render_configuration, shipped_folder)

PAGES = pages(REPO)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)|<img [^>]*src=\"([^\"]+)\"")
TRACKER = re.compile(r"\bissue \d+|(?<![\w/&])#\d+\b|\bsessions?\b|\bstop \d+", re.I)


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m[1]) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [next(g for g in m.groups() if g) for m in LINK.finditer(text)]


def test_readme_is_one_screen_with_a_picture():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    pictures = [target for target in links(REPO / "README.md") if target.endswith(".png")]
    assert pictures and all((REPO / p).stat().st_size > 0 for p in pictures)
    assert "make run" in readme and "make test" in readme


def test_ci_runs_the_readme_test_command():
    assert "make test" in (REPO / ".ci" / "run").read_text()


def broken_links(page: Path) -> list[str]:
    """Relative links of ``page`` whose file does not exist, or whose #anchor names no heading of that page."""
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_broken_links_are_found(tmp_path):
    (tmp_path / "other.md").write_text("# Robust PIU: training against the `attack`\n")
    page = tmp_path / "page.md"
    page.write_text("# Here\n[a](other.md#robust-piu-training-against-the-attack) [b](other.md#nope) [c](gone.md) "
                    "[d](#here) [e](#there) ![f](img.png) [g](https://example.org/x)\n```\n[h](inside-code.md)\n```\n")
    assert broken_links(page) == ["other.md#nope", "gone.md", "#there", "img.png"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_tracker_or_diary_words(page):
    assert [m[0] for m in TRACKER.finditer(page.read_text())] == []


def test_tracker_pattern_catches_what_it_should():
    assert [m[0] for m in TRACKER.finditer("see issue 15, #12 and stop 3 of the session")] == [
        "issue 15", "#12", "stop 3", "session"]
    assert not TRACKER.search("a Markdown heading ## Results, the anchor [x](a.md#results), &#124;")


def test_configuration_reference_matches_the_schema_and_shows_every_section_once():
    shown = []
    for page in PAGES:
        for block in (m for m in BLOCK.finditer(page.read_text()) if m["name"] == "configuration"):
            assert block["body"] == render_configuration(None, block["argument"]), (
                f"{page.name} disagrees with the schema: run `python -m idunlearn docs --results results/`")
            shown += re.findall(r"^### `(\w+)`$", block["body"], re.M)
    assert sorted(shown) == sorted(configuration_sections())


def test_configuration_blocks_name_their_sections_or_the_rest():
    sections = list(configuration_sections())
    assert re.findall(r"^### `(\w+)`$", render_configuration(None, "selection,seed"), re.M) == ["selection", "seed"]
    rest = re.findall(r"^### `(\w+)`$", render_configuration(None, "except=selection,seed"), re.M)
    assert rest == [s for s in sections if s not in ("selection", "seed")]
    with pytest.raises(ValueError, match="nonsense is no top-level section"):
        render_configuration(None, "seed,nonsense")


def test_configuration_reference_lists_every_run_setting_with_its_type_and_default():
    import json

    from idunlearn.config import load_schema

    rows = {line.split(" | ")[0][3:-1]: line.split(" | ") for line in render_configuration().splitlines()
            if line.startswith("| `")}
    defaults = load_schema()["properties"]["unlearning"]["properties"]["defaults"]["properties"]
    for key, node in defaults.items():
        cells = rows[f"unlearning.defaults.{key}"]
        assert cells[2] == (f"`{json.dumps(node['default'])}`" if "default" in node else "(none: absent)")
        assert cells[-1].strip(" |"), f"no reader listed for run setting {key}"
    assert {"seed", "audit.probes.attack.steps", "unlearning.runs.<name>.steps"} <= set(rows)


def test_every_generated_block_names_a_renderer_and_keeps_its_text_without_results(tmp_path):
    for page in PAGES:
        text = page.read_text()
        new, status = regenerate_text(text, tmp_path)
        kept = {name for name, s in status.items() if s.startswith("kept")}
        schema = {name for name in status if name.split(":")[0] == "configuration"}  # rendered from the schema
        assert kept | schema >= set(status)
        if not schema:
            assert new == text


# Generated blocks whose result files are not shipped under docs/results/data/ (each was written before the docs
# command kept them, from a run too long for the suite): the suite cannot render them again. A block leaves this list
# when `python -m idunlearn docs --results <its run's results>` writes it, which also ships its files.
UNSHIPPED = {
    "README.md": {"headline:piu": "the default run (make run)"},
    "docs/results/default-run.md": {"headline:piu": "the default run (make run)"},
    "docs/results/audit.md": {
        "audit.probes:original,piu_100,siss.tuned,uce.tuned,wid.tuned,esd.tuned": "the study audit (84 jobs)",
        "audit.verdicts:piu_100,siss.tuned,uce.tuned,wid.tuned,esd.tuned": "the study audit (84 jobs)",
        "audit.comparisons:siss.tuned,uce.tuned,wid.tuned,esd.tuned": "the study audit (84 jobs)",
        "audit.probes:original,piu": "the default run's audit on every probe"},
    "docs/results/controllable.md": {"controllable.front": "the controllable run"},
    "docs/results/many-people.md": {"many.strategies": "the many stage (hours)"},
    "docs/results/many-people-tables.md": {name: "the many stage (hours)" for name in (
        "many.joint", "many.sequential", "many.merge", "many.comparisons")},
    "docs/results/recognizer.md": {"recognizer.random_subset": "make recognizer",
                                   "recognizer.classwise": "make recognizer"},
    "docs/results/study.md": {name: "the study (config/study.yaml, hours)" for name in (
        "study:table1", "claims:table1", "study:table2", "study:table3", "study:table4", "study:table5",
        "study:table6", "claims:table2,table3,table4,table5,table6")},
}


def block_differences(root: Path, page: Path) -> tuple[list[str], set[str]]:
    """(the generated blocks of ``page`` whose text differs from what the renderer writes from their shipped files,
    the blocks without shipped files)."""
    new, status = regenerate_from_shipped(root, page)
    old_blocks = {m["open"]: m[0] for m in BLOCK.finditer(page.read_text())}
    new_blocks = {m["open"]: m[0] for m in BLOCK.finditer(new)}
    changed = [marker.strip() for marker, block in old_blocks.items() if new_blocks.get(marker) != block]
    return changed, {label for label, s in status.items() if s.startswith("kept")}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_generated_blocks_are_what_the_renderer_writes_from_the_shipped_tables(page):
    name = str(page.relative_to(REPO))
    changed, unshipped = block_differences(REPO, page)
    assert changed == [], (f"{name}: these blocks differ from what the renderer writes from their files under "
                           f"docs/results/data/ (edited by hand, or the renderer changed): rewrite them with "
                           f"`python -m idunlearn docs --results <the run's results>`")
    assert unshipped == set(UNSHIPPED.get(name, {})), (
        f"{name}: blocks without shipped result files {sorted(unshipped)}; listed {sorted(UNSHIPPED.get(name, {}))} "
        "(a block the docs command wrote leaves UNSHIPPED in tests/test_docs.py)")


def test_a_hand_edited_block_is_found_and_a_written_block_ships_its_tables(tmp_path):
    """The docs command keeps the tables a block was rendered from; rendering again from them reproduces the page;
    a number edited by hand inside the block is then a difference."""
    results = tmp_path / "results"
    (results / "tables").mkdir(parents=True)
    rows = [{"run": "piu", "metric": metric, "phase": phase, "mean": mean, "ci_low": mean - 0.01,
             "ci_high": mean + 0.01, "n": 3}
            for metric, means in {"ism_forget": (0.7, 0.1), "ism_retain": (0.7, 0.69), "srk": (1.0, 90.0)}.items()
            for phase, mean in zip(("before", "after"), means)]
    pd.DataFrame(rows).to_csv(results / "tables" / "summary_long.csv", index=False)
    root = tmp_path / "root"
    (root / "docs").mkdir(parents=True)
    page = root / "README.md"
    page.write_text("# x\n\n<!-- generated:headline:piu -->\nold\n<!-- /generated -->\n\nprose\n")
    assert regenerate(root, results)["README.md"]["headline:piu"] == "written"
    assert (shipped_folder(root, page, "headline:piu") / "tables" / "summary_long.csv").is_file()
    assert "| forget ISM | 0.700 (0.690 to 0.710) | 0.100 (0.090 to 0.110) |" in page.read_text()
    assert block_differences(root, page) == ([], set())
    page.write_text(page.read_text().replace("0.100 (0.090", "0.099 (0.090"))
    assert block_differences(root, page) == (["<!-- generated:headline:piu -->"], set())
    page.write_text(page.read_text() + "\n<!-- generated:tuning -->\nx\n<!-- /generated -->\n")
    assert block_differences(root, page)[1] == {"tuning"}


def test_an_unknown_block_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no renderer"):
        regenerate_text("<!-- generated:nonsense -->\nx\n<!-- /generated -->\n", tmp_path)


def test_markdown_table_escapes_pipes():
    assert markdown_table(["a"], [["x | y"]]).splitlines()[2] == "| x \\| y |"


def _table(text: str, start: str) -> pd.DataFrame:
    """The Markdown table of the generated block whose marker starts with ``start``."""
    body = next(m["body"] for m in BLOCK.finditer(text) if f"generated:{m['name']}".startswith(start)
                or f"generated:{m['name']}:{m['argument']}" == start)
    rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in body.splitlines() if line.startswith("|")]
    return pd.DataFrame(rows[2:], columns=rows[0])


@pytest.mark.e2e
@pytest.mark.slow
def test_docs_command_writes_the_run_s_tables(two_runs, tmp_path):
    """The docs command on the suite's small run (one forget identity): the README headline equals summary_long.csv,
    and the default run's audit table equals the mean of the audit's per-identity Parquet."""
    results = two_runs[0][0] / "results"
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    report = regenerate(tmp_path, results)
    assert report["README.md"]["headline:piu"] == "written"
    assert report["docs/results/audit.md"]["audit.probes:original,piu"] == "written"
    assert report["docs/results/study.md"]["study:table1"].startswith("kept")  # no study in this run

    headline = _table((tmp_path / "README.md").read_text(), "generated:headline:piu").set_index("")
    long = pd.read_csv(results / "tables" / "summary_long.csv").set_index(["run", "metric", "phase"])
    forget_after = long.loc[("piu", "ism_forget", "after")]
    assert headline.loc["forget ISM", "after `piu`"] == (
        f"{forget_after['mean']:.3f} ({forget_after['ci_low']:.3f} to {forget_after['ci_high']:.3f})"
        if pd.notna(forget_after["ci_low"]) else f"{forget_after['mean']:.3f}")

    audit = _table((tmp_path / "docs" / "results" / "audit.md").read_text(),
                   "generated:audit.probes:original,piu").set_index("measure")
    rows = pd.read_parquet(results / "tables" / "audit.parquet").set_index(["run", "probe", "setting", "metric"])
    for run, probe, setting, metric, title in [("piu", "evaluation", "forget", "fa", "FA (evaluation)"),
                                               ("original", "leak", "k=2", "leak", "Leak@2"),
                                               ("piu", "attack", "best", "ism", "attack ISM")]:
        # the page shows the mean over the run's identities (one here, unless a test before added another)
        value = rows.loc[[(run, probe, setting, metric)], "value"].mean()
        assert float(audit.loc[title, f"`{run}`"].split(" ")[0]) == pytest.approx(float(value), abs=5e-4)
    # a second run rewrites nothing: the page is a function of the results
    before = {p: p.read_text() for p in pages(tmp_path)}
    regenerate(tmp_path, results)
    assert {p: p.read_text() for p in pages(tmp_path)} == before


def test_an_external_model_is_compared_with_the_original_identity_by_identity(tmp_path):
    from idunlearn.docs import MissingResults, render_external_evaluation

    metrics = {"ism_forget": 0.0, "acc_forget": 0.0, "ism_retain": 0.7, "acc_retain": 1.0, "kd_retain": 10.0,
               "quality_forget": 0.9}
    before = {1: 0.60, 2: 0.70, 3: 0.80}
    retrain = {1: 0.10, 2: 0.30, 3: 0.20}  # differences -0.5, -0.4, -0.6: mean -0.5
    for folder, values in (("before", before), ("external/retrain", retrain)):
        for identity, ism in values.items():
            path = tmp_path / "evaluation" / folder / str(identity) / "metrics.json"
            path.parent.mkdir(parents=True)
            path.write_text(json.dumps({**metrics, "forget_identity": identity, "ism_forget": ism}))
    table = render_external_evaluation(tmp_path, "retrain")
    forget = next(line for line in table.splitlines() if line.startswith("| forget ISM"))
    half = 4.302653 * 0.1 / 3 ** 0.5  # Student-t 97.5% quantile at 2 degrees of freedom x sd / sqrt(n)
    assert forget.split(" | ")[1].startswith("0.700 ") and forget.split(" | ")[2].startswith("0.200 ")
    assert f"-0.500 ({-0.5 - half:.3f} to {-0.5 + half:.3f})" in forget
    assert "same 3 forget identities" in table
    (tmp_path / "evaluation" / "before" / "3" / "metrics.json").unlink()
    with pytest.raises(MissingResults, match=r"identities \[3\]"):
        render_external_evaluation(tmp_path, "retrain")


def test_many_jobs_are_one_line_each_in_forgetting_order(tmp_path):
    from idunlearn.docs import MissingResults, render_many_jobs

    (tmp_path / "tables").mkdir()
    job = {"run": "piu", "strategy": "joint", "order": 0, "size": 2, "ism_retain": 0.6, "ism_retain_before": 0.75,
           "detection_rate_retain": 0.75, "detection_rate_retain_before": 1.0, "srk_pooled": 40.0, "srk_pooled_before": 1.0, "seconds": 300.0, "seconds_total": 1234.4}
    rows = [{**job, "identity": 9, "forgotten_at": 2, "ism_forget": 0.2, "ism_forget_before": 0.7, "fa_forget": 0.25},
            {**job, "identity": 4, "forgotten_at": 1, "ism_forget": 0.05, "ism_forget_before": 0.65, "fa_forget": 0.0}]
    pd.DataFrame(rows).to_csv(tmp_path / "tables" / "many_joint.csv", index=False)
    table = _table("<!-- generated:many.joint -->\n" + render_many_jobs("many_joint.csv")(tmp_path, None)
                   + "<!-- /generated -->\n", "generated:many.joint")
    assert len(table) == 1
    line = table.iloc[0]
    assert line["forget ISM after (before), per identity"] == "4: 0.050 (0.650), 9: 0.200 (0.700)"
    assert line["FA after, per identity"] == "0.000, 0.250" and line["worst FA"] == "0.250"
    assert line["retain ISM after / before"] == "0.600 / 0.750 (0.80 x)"  # 0.6 / 0.75 by hand
    assert line["retain faces detected after (before)"] == "75% (100%)"
    assert line["pooled SRK after (before)"] == "40.0 (1.000)" and line["seconds, every job it took"] == "1,234"
    # a table written before the detection rate existed keeps the block's text, naming what is missing
    pd.DataFrame(rows).drop(columns=["detection_rate_retain"]).to_csv(tmp_path / "tables" / "many_joint.csv",
                                                                      index=False)
    with pytest.raises(MissingResults, match=r"lacks the columns \['detection_rate_retain'\]"):
        render_many_jobs("many_joint.csv")(tmp_path, None)


def test_many_strategies_are_one_line_each_with_intervals_and_orders_meeting_each_target(tmp_path):
    from idunlearn.docs import render_many_strategies
    from idunlearn.many import order_summary, strategy_table

    (tmp_path / "tables").mkdir()
    rows = [{"strategy": "joint", "order": order, "size": 8, "identity": order, "fa_forget": fa, "ism_forget": 0.2,
             "ism_retain": 0.7 * ratio, "ism_retain_before": 0.7, "detection_rate_retain": 1.0, "srk_pooled": 20.0,
             "seconds_total": 800.0 + 100 * order}
            for order, (fa, ratio) in enumerate([(0.0, 0.96), (0.2, 0.97), (0.05, 0.91)])]
    strategy_table(order_summary(pd.DataFrame(rows))).to_csv(tmp_path / "tables" / "many_strategies.csv", index=False)
    table = _table("<!-- generated:many.strategies -->\n" + render_many_strategies(tmp_path, None)
                   + "<!-- /generated -->\n", "generated:many.strategies")
    line = table.iloc[0]
    assert (line["strategy"], line["N"], line["orders"]) == ("joint", "8", "3")
    # worst FA over orders 0, 0.2, 0.05: mean 0.0833 with its t interval; seconds 800, 900, 1000
    assert line["worst FA"].startswith("0.083 (") and line["seconds, every job it took"].startswith("900 (")
    assert line["retain faces detected"] == "1.000 (1.000 to 1.000)"
    # order 0 meets both targets; order 1 misses FA; order 2 has FA 0.05 and retain 0.91: only the 0.9 x target
    assert line["orders with every FA <= 0.1 and retain >= 0.95 x"] == "1 of 3"
    assert line["orders with every FA <= 0.1 and retain >= 0.9 x"] == "2 of 3"


def test_tuning_shows_each_method_s_grid_and_chosen_setting(tmp_path):
    from idunlearn.docs import render_tuning

    folder = tmp_path / "tables" / "tuning"
    folder.mkdir(parents=True)
    points = [{"lr": lr, "eta": eta, "regime": "surgical"} for lr in (1e-4, 3e-4) for eta in (1.0, 1.5)]
    pd.DataFrame({"method": "piu", "point": [json.dumps(p) for p in points], "ism_forget": [0.4, 0.3, 0.2, 0.1],
                  "ism_retain": 0.5, "forget_ratio": 0.5, "retain_ratio": 0.95, "eligible": [True, True, True, False],
                  "forgets": [False, True, True, True], "chosen": [False, False, True, False]}
                 ).to_csv(folder / "grid.csv", index=False)
    row = render_tuning(tmp_path, None).splitlines()[2]
    assert row == ("| piu | lr 0.0001, 0.0003 x eta 1, 1.5 x regime surgical | lr 0.0003, eta 1, regime surgical | "
                   "0.200 (0.50) | 0.500 (0.95) | 3 of 4 |")


# ----- numbers quoted in prose, against the generated table on the page they quote --------------------------------

def _first_number(cell: str) -> float:
    return float(re.match(r"\s*(-?[\d.]+)", cell)[1])


def _prose(page: Path) -> str:
    """The page's text outside generated blocks, line breaks as spaces."""
    return " ".join(BLOCK.sub("", page.read_text()).split())


def test_study_prose_quotes_table1():
    page = REPO / "docs" / "results" / "study.md"
    table = _table(page.read_text(), "generated:study:table1")
    table = table.set_index(table.columns[0])
    retain = {label.split(" (")[0]: _first_number(row["retain ISM"]) for label, row in table.iterrows()}
    before, piu, piu_tuned, esd_tuned = (retain[k] for k in ("before", "PIU", "PIU tuned", "ESD-style tuned"))
    bar = 0.95 * before

    def side(value):
        return "below" if value < bar else "above"

    prose = _prose(page)
    assert (f"({esd_tuned:.3f} against {piu_tuned:.3f}; 0.95 x before is {bar:.3f}, which ESD-style's is "
            f"{side(esd_tuned)} and PIU's {side(piu_tuned)})") in prose
    assert f"pays {piu_tuned / before:.2f} x before in retain ISM ({piu_tuned:.3f} against {piu:.3f})" in prose
    assert f"(retain {piu / before:.2f} x against {retain['ESD-style'] / before:.2f} x before)" in prose


def _ratios(page: Path, block: str, strategy: str, size: str) -> list[str]:
    """The retain ratio ('0.90 x') of each order's row of ``strategy`` at ``size``, in order."""
    table = _table(page.read_text(), block)
    rows = table[(table["strategy"] == strategy) & (table["N or step"] == size)].sort_values("order")
    return [re.search(r"\(([\d.]+ x)\)", cell)[1] for cell in rows["retain ISM after / before"]]


def test_many_people_prose_quotes_the_retain_ratios_of_its_tables():
    page = REPO / "docs" / "results" / "many-people-tables.md"
    prose = _prose(REPO / "docs" / "results" / "many-people.md")
    for block, strategy, intro in (("generated:many.sequential", "sequential/replay", "Retain ISM is"),
                                   ("generated:many.joint", "joint", "Retain ISM"),
                                   ("generated:many.merge", "merge/sum", "Retain")):
        ratios = _ratios(page, block, strategy, "8")
        assert f"{intro} {', '.join(ratios[:-1])} and {ratios[-1]}" in prose, (strategy, ratios)


def test_readme_prose_quotes_the_headline_and_the_robust_audit():
    readme = REPO / "README.md"
    prose = _prose(readme)
    headline = _table(readme.read_text(), "generated:headline:piu").set_index("")
    forget, retain = (headline.loc[row].map(_first_number) for row in ("forget ISM", "retain-validation ISM"))
    assert f"forget ISM {forget.iloc[0]:.2f} -> {forget.iloc[1]:.2f}" in prose
    assert f"({retain.iloc[0]:.3f} -> {retain.iloc[1]:.3f})" in prose

    robust = (REPO / "docs" / "results" / "robust.md").read_text()
    verdicts = next(_table(robust, f"generated:{m['name']}:{m['argument']}") for m in BLOCK.finditer(robust)
                    if m["name"] == "audit.verdicts").set_index("run")
    counts = verdicts.map(lambda cell: int(cell.split(" ")[0]))
    hidden = counts.loc["`piu_100`", [c for c in counts.columns if c.startswith("hidden")]].sum()
    forgot = counts.loc["`piu_100`"].sum() - counts.loc["`piu_100`", "not forgotten"]
    most = counts.drop(index="`retrain`")["removed"].max()
    removed = "is shown to remove any" if most == 0 else f"removes more than {most}"
    assert (f"brings back {hidden} of the {forgot} people PIU forgot under the light probes, and no method tested "
            f"{removed} of the 12 (a generator trained without them: {counts.loc['`retrain`', 'removed']})") in prose
    tables = (REPO / "docs" / "results" / "robust-tables.md").read_text()
    evaluation = next(_table(tables, f"generated:{m['name']}:{m['argument']}") for m in BLOCK.finditer(tables)
                      if m["name"] == "audit.evaluation")
    retrain_forget = evaluation[(evaluation["run"] == "`retrain`") & (evaluation["measure"] == "forget ISM")]
    assert f"(forget ISM {_first_number(retrain_forget['mean (95% interval)'].iloc[0]):.2f})" in prose


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_is_over_350_lines_besides_its_generated_tables(page):
    written = BLOCK.sub("", page.read_text())  # generated blocks (tables from the schema or the results) excepted
    assert len(written.splitlines()) <= 350, f"{page.name}: move long tables to an appendix page"
