"""Every command the docs show runs in the test world: each shell line of a fenced ``sh`` / ``bash`` / ``console`` /
``shell`` block of README.md and docs/**/*.md, and each command written as inline code (a table's command column, a
sentence naming one), is extracted and checked by what it is:

- ``snakemake``: a dry run (``-n``) of exactly its targets, configs, ``--config`` values and profiles against the
  repository's Snakefile and config files, in a scratch folder that links the repository's config/, profiles/,
  data/shipped/ and the asset cache (one in-process Snakemake per distinct command, all in one subprocess);
- ``python -m idunlearn ...`` and ``python -m idunlearn.<module> ...``: its arguments parsed by the command's own
  argument parser (nothing runs: most verbs train, sample or download); ``docs`` also runs, on a scratch copy of the
  pages with no results;
- ``make X``: the target resolved by ``make -n X`` (with the command's variables);
- commands that need the network or root (``hf download``, ``pip install``, ``git clone``, ``apt-get``): their syntax
  and flags only, against ``hf download --help`` for the Hub (see ``OFFLINE``).

A command one can copy (a fenced line, a table cell) must also be written as it runs from a fresh clone:
``.venv/bin/snakemake`` / ``.venv/bin/python`` and, for a Snakemake run, ``--cores`` (Snakemake 9 stops without it)
or a profile. Each check is a test named by page and line, so a failing command names where it is written."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ASSET_CACHE, REPO
from idunlearn.docs import pages

SHELL_FENCES = {"sh", "bash", "console", "shell"}
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w-]*)")
INLINE = re.compile(r"`([^`]+)`")
# an inline code span is a command when it starts like one
COMMAND_START = re.compile(r"^(\.venv/bin/|snakemake |python3? -m idunlearn|make |CONFIG=\S+ make |hf |"
                           r"huggingface-cli |pip |apt-get |git clone )")
# commands checked for syntax and flags only, and why they cannot run here
OFFLINE = {"hf": "downloads from the Hugging Face Hub (network)",
           "pip": "installs from a package index (network)",
           "git": "clones a repository (network)",
           "apt-get": "installs Debian packages (root, network)"}
OPTIONAL = re.compile(r"\s*\[(--[\w-]+)\]")  # `plan ... [--study]`: the command with and without the flag


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str
    copyable: bool  # a fenced line or a table cell: must run as written from a fresh clone

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def fenced_lines(text: str) -> list[tuple[int, str]]:
    """(line number, command) of every shell line in a fenced shell block; continuation lines joined, comments and
    a console's output dropped."""
    out, language, pending, start = [], None, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            language = None if language is not None else fence[2]
            continue
        if language not in SHELL_FENCES:
            continue
        if language == "console":
            if not line.startswith("$ ") and not pending:
                continue
            line = line[2:] if line.startswith("$ ") else line
        if not pending:
            start = number
        pending += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
        if line.rstrip().endswith("\\"):
            continue
        command, pending = _without_comment(pending.strip()), ""
        if command:
            out.append((start, command))
    return out


def _without_comment(command: str) -> str:
    """The command without a trailing `# ...` comment (shell comment rules: not inside quotes)."""
    quote, cut = None, len(command)
    for i, char in enumerate(command):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or command[i - 1].isspace()):
            cut = i
            break
    return command[:cut].rstrip()


def unclosed_fences(text: str) -> list[int]:
    """Line numbers of fences opened and never closed (GitHub then renders the rest of the page as code)."""
    opened = None
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            opened = number if opened is None else None
    return [] if opened is None else [opened]


def inline_commands(text: str) -> list[tuple[int, str, bool]]:
    """(line number, command, alone in a table cell) of inline code spans outside fences that are commands; a span
    may run over a line break."""
    lines, inside = text.splitlines(), False
    for number, line in enumerate(lines):
        if FENCE.match(line) or inside:
            inside = inside != bool(FENCE.match(line))
            lines[number] = ""
    prose = "\n".join(lines)
    out = []
    for span in INLINE.finditer(prose):
        command = " ".join(span[1].split())
        if not COMMAND_START.match(command):
            continue
        number = prose.count("\n", 0, span.start()) + 1
        line = lines[number - 1].strip()
        # a table cell holding only the command is one to copy; a span inside a sentence names one
        cells = {cell.strip() for cell in line.strip("|").split(" | ")} if line.startswith("|") else set()
        out.append((number, command, span[0] in cells))
    return out


def documented_commands(root: Path = REPO) -> list[Command]:
    commands = []
    for page in pages(root):
        text, name = page.read_text(), str(page.relative_to(root))
        found = [(n, c, True) for n, c in fenced_lines(text)] + inline_commands(text)
        for number, command, copyable in found:
            variants = [OPTIONAL.sub("", command), OPTIONAL.sub(r" \1", command)]
            for variant in dict.fromkeys(variants):
                commands.append(Command(name, number, variant, copyable))
    return commands


COMMANDS = documented_commands()


# ----- what each command is, and how it is checked ------------------------------------------------------------------

def split(command: str) -> tuple[dict[str, str], list[str]]:
    """(leading VAR=value assignments, the argument vector)."""
    words = shlex.split(command)
    env = {}
    while words and re.match(r"^[A-Z_]+=", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words


def kind(command: str) -> str:
    _, words = split(command)
    head = Path(words[0]).name
    if head == "snakemake":
        return "snakemake"
    if head in ("python", "python3") and words[1:2] == ["-m"] and words[2].split(".")[0] == "idunlearn":
        return "idunlearn"
    if head == "make":
        return "make"
    if head in OFFLINE or head == "huggingface-cli":
        return "offline"
    return "unknown"


def form_problems(command: Command) -> list[str]:
    """Why a copyable command would not run as written from a fresh clone's root."""
    _, words = split(command.text)
    problems = []
    what = kind(command.text)
    if what == "snakemake" and words[0] != ".venv/bin/snakemake":
        problems.append("write .venv/bin/snakemake (the environment make creates)")
    if what == "idunlearn" and words[0] != ".venv/bin/python":
        problems.append("write .venv/bin/python")
    if what == "snakemake" and not ({"--cores", "-c", "--profile", "-n", "--dry-run", "--lint", "--report"}
                                    & set(words)) and not any(w.startswith(("--cores=", "-c")) for w in words):
        problems.append("a Snakemake 9 run needs --cores (or a profile)")
    return problems


def snakemake_argv(command: str) -> list[str] | None:
    """The dry run's arguments after the program name; None for a command with a placeholder (`<id>`)."""
    if "<" in command:
        return None
    _, words = split(command)
    words = [w for w in words[1:] if w != "--report" and not w.endswith(".html")]  # a report: its DAG, dry
    return ["--dry-run", *words]


# ----- the checks, run once for every distinct command in one subprocess ---------------------------------------------

def scratch_world(folder: Path) -> Path:
    """A working folder in which the docs' relative paths resolve as in a fresh clone after `make assets`."""
    for name in ("config", "profiles", "Snakefile", "rules", "workflow"):
        (folder / name).symlink_to(REPO / name)
    (folder / "data").mkdir()
    (folder / "data" / "shipped").symlink_to(REPO / "data" / "shipped")
    (folder / "data" / "assets").symlink_to(ASSET_CACHE)
    shutil.copy(REPO / "README.md", folder / "README.md")
    shutil.copytree(REPO / "docs", folder / "docs")
    return folder


def _dry_run(argv: list[str], folder: Path) -> tuple[bool, str]:
    from snakemake.cli import args_to_api, parse_args

    err = io.StringIO()
    cwd = os.getcwd()
    try:
        os.chdir(folder)  # --configfile paths are relative to where the command is typed
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
            parser, args = parse_args(["--snakefile", str(folder / "Snakefile"), "--directory", str(folder), *argv])
            ok = bool(args_to_api(args, parser))
    except SystemExit as exit:
        ok = exit.code in (0, None)
    except Exception as error:  # a Snakefile error surfaces here when Snakemake does not catch it
        ok, err = False, io.StringIO(err.getvalue() + repr(error))
    finally:
        os.chdir(cwd)
    return ok, err.getvalue()[-4000:]


def _parse_only(words: list[str], folder: Path) -> tuple[bool, str]:
    """Parse ``python -m <module> args`` with the module's own parser and stop before it runs anything."""
    import argparse
    import runpy

    class Parsed(Exception):
        pass

    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        result = original(self, args, namespace)
        raise Parsed(result)

    err = io.StringIO()
    argv, cwd = sys.argv, os.getcwd()
    argparse.ArgumentParser.parse_args = parse_then_stop
    try:
        os.chdir(folder)
        sys.argv = [words[2], *words[3:]]
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
            runpy.run_module(words[2], run_name="__main__", alter_sys=True)
        return False, "the module ran without parsing arguments"
    except Parsed as parsed:
        return True, str(parsed)
    except SystemExit as exit:
        return False, f"exit {exit.code}: {err.getvalue()[-2000:]}"
    finally:
        argparse.ArgumentParser.parse_args = original
        sys.argv = argv
        os.chdir(cwd)


@functools.cache
def _hf_flags() -> set[str]:
    hf = Path(sys.executable).with_name("hf")
    text = subprocess.run([str(hf), "download", "--help"], capture_output=True, text=True, timeout=120).stdout
    return set(re.findall(r"(--[\w-]+)", text)) | {"-h", "-q"}


RULE = re.compile(r"^(?:(?:rule|checkpoint) (\w+)|use rule \w+ as (\w+))", re.M)


def rule_names() -> set[str]:
    return {name for f in [REPO / "Snakefile", *(REPO / "rules").glob("*.smk")]
            for names in RULE.findall(f.read_text()) for name in names if name}


PLACEHOLDER = re.compile(r"^<|>$|^[A-Z]$")  # `<id>`, `--threads T`: the reader fills them in


def check(command: str, folder: Path, copyable: bool = True) -> tuple[bool, str]:
    env, words = split(command)
    what = kind(command)
    if not copyable and any(PLACEHOLDER.search(w) for w in words):
        return True, "a sentence's command with placeholders: not run"
    if what == "snakemake" and not copyable and "--configfile" not in words:
        # a sentence naming a target (`snakemake tune`): its flags parse and its targets are rules of the workflow
        from snakemake.cli import parse_args
        try:
            _, args = parse_args(words[1:])
        except SystemExit:
            return False, "Snakemake does not accept these flags"
        unknown = sorted(t for t in set(args.targets or []) - rule_names() if "/" not in t)  # a path: a file target
        return not unknown, f"not rules of the workflow: {unknown}"
    if what == "snakemake":
        argv = snakemake_argv(command)
        if argv is None:
            return True, "a placeholder in it: not run"
        return _dry_run(argv, folder)
    if what == "idunlearn":
        if "<" in " ".join(words[2:4]):
            return True, "a placeholder for the module or verb: not run"
        ok, out = _parse_only(words, folder)
        if ok and words[3:4] == ["docs"]:  # cheap: it runs, on the scratch copy of the pages, without results
            proc = subprocess.run([sys.executable, *words[1:]], cwd=folder, capture_output=True, text=True,
                                  timeout=300)
            ok, out = proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return ok, out
    if what == "make":
        proc = subprocess.run(["make", "-n", *words[1:]], cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={**os.environ, **env})
        missing = [w for w in [*words, *env.values()] if w.startswith("config/") and not (REPO / w).exists()]
        return proc.returncode == 0 and not missing, proc.stdout[-1000:] + proc.stderr[-2000:] + str(missing)
    head = Path(words[0]).name
    if head == "huggingface-cli":
        return False, "huggingface-cli was removed in huggingface_hub 1.0: write `hf download`"
    if what == "offline":
        if head == "hf":
            unknown = [w.split("=")[0] for w in words[2:] if w.startswith("-") and w.split("=")[0] not in _hf_flags()]
            positional = [w for i, w in enumerate(words[2:], 2) if not w.startswith("-")
                          and not words[i - 1].startswith("--")]
            ok = words[1] == "download" and not unknown and bool(positional)
            return ok, f"hf {words[1]}: unknown flags {unknown}, repo {positional[:1]}"
        return True, f"not run: {OFFLINE[head]}"
    return False, f"no check for this kind of command ({words[0]}): add one to tests/test_docs_commands.py"


def run_batch(commands: list[tuple[str, bool]]) -> dict[str, tuple[bool, str]]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        folder = scratch_world(Path(tmp))
        return {f"{copyable}:{command}": check(command, folder, copyable) for command, copyable in commands}


@pytest.fixture(scope="module")
def outcomes() -> dict[str, tuple[bool, str]]:
    """Every distinct command's (passed, output), checked in one subprocess (Snakemake is imported once)."""
    distinct = sorted({(c.text, c.copyable) for c in COMMANDS})
    with tempfile.TemporaryDirectory() as tmp:
        request, answer = Path(tmp) / "commands.json", Path(tmp) / "outcomes.json"
        request.write_text(json.dumps(distinct))  # (command, copyable) pairs
        proc = subprocess.run([sys.executable, __file__, str(request), str(answer)], cwd=Path(__file__).parent,
                              capture_output=True, text=True, timeout=900,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr[-4000:]
        return {command: tuple(result) for command, result in json.loads(answer.read_text()).items()}


def test_the_docs_document_commands_of_every_kind():
    kinds = {kind(c.text) for c in COMMANDS}
    assert {"snakemake", "idunlearn", "make"} <= kinds
    assert "unknown" not in kinds, [c.id for c in COMMANDS if kind(c.text) == "unknown"]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.id)
def test_documented_command_runs(command, outcomes):
    if command.copyable:
        assert form_problems(command) == [], command.id
    passed, output = outcomes[f"{command.copyable}:{command.text}"]
    assert passed, f"{command.id}\n{output}"


@pytest.mark.parametrize("page", pages(REPO), ids=lambda p: str(p.relative_to(REPO)))
def test_every_fence_is_closed(page):
    assert unclosed_fences(page.read_text()) == []


def test_extraction_finds_fenced_inline_and_continued_commands():
    text = ("```bash\n.venv/bin/snakemake audit --cores 2 --config 'a={\"b\": [\"c\"]}'  # why\n# a comment\n"
            "make x \\\n  Y=1\n```\n```\noutput\n```\n```console\n$ make y\nprinted\n```\n"
            "| `make z` | `snakemake many` |\nsee `make w` and `--cores` and `results/`\n```python\nmake q\n")
    assert fenced_lines(text) == [(2, ".venv/bin/snakemake audit --cores 2 --config 'a={\"b\": [\"c\"]}'"),
                                  (4, "make x   Y=1"), (11, "make y")]
    assert inline_commands(text) == [(14, "make z", True), (14, "snakemake many", True), (15, "make w", False)]
    assert inline_commands("run `.venv/bin/snakemake --cores 2\n--configfile x.yaml` then") == [
        (1, ".venv/bin/snakemake --cores 2 --configfile x.yaml", False)]
    assert unclosed_fences(text) == [16] and unclosed_fences("```\nx\n```\n") == []


def test_form_problems_name_what_a_fresh_clone_lacks():
    def problems(text):
        return form_problems(Command("p.md", 1, text, True))
    assert problems("snakemake --configfile config/study.yaml") == [
        "write .venv/bin/snakemake (the environment make creates)", "a Snakemake 9 run needs --cores (or a profile)"]
    assert problems(".venv/bin/snakemake tune --cores 2 --configfile config/study.yaml") == []
    assert problems("python -m idunlearn docs --results results/") == ["write .venv/bin/python"]


def test_a_broken_command_fails_its_check(tmp_path):
    """The checks reject what a reader would trip on: an unknown target, a config file that is not there, a flag the
    parser does not know, a make target that does not exist, a removed Hub command."""
    folder = scratch_world(tmp_path)
    assert check(".venv/bin/snakemake no_such_target --cores 2", folder)[0] is False
    assert check(".venv/bin/snakemake --cores 2 --configfile config/nope.yaml", folder)[0] is False
    assert check(".venv/bin/python -m idunlearn docs --no-such-flag results/", folder)[0] is False
    assert check(".venv/bin/python -m idunlearn archive keep --archive x", folder)[0] is False  # not a choice
    assert check(".venv/bin/python -m idunlearn archive restore --archive x", folder)[0] is True
    assert check("make no-such-target", folder)[0] is False
    assert check("huggingface-cli download x", folder)[0] is False
    assert check("hf download x/y --revision abc --no-such-flag", folder)[0] is False
    assert check("hf download x/y --repo-type dataset --revision abc --include 'data/*'", folder)[0] is True
    assert check("snakemake no_such_rule", folder, copyable=False)[0] is False
    assert check("snakemake train_generator_reference", folder, copyable=False)[0] is True


if __name__ == "__main__":  # the fixture's subprocess: check every command of the request, write the outcomes
    request, answer = map(Path, sys.argv[1:3])
    answer.write_text(json.dumps(run_batch(json.loads(request.read_text()))))
