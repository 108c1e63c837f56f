"""Every shell command in the README and docs/ runs in a test, or says why not (issue 74, item 2).

The commands are the lines of the fenced blocks marked ``sh``, ``bash``, ``shell`` or ``console``
(for ``console``: the lines after a ``$ `` prompt) of README.md and docs/*.md; a line ending in
``\\`` continues on the next. Each command must be one of:

* **run here**: cheap commands (a few seconds at most: ``--help``, ``pipeline validate``, listings
  of a home of the test's own) that this file runs itself, with the exit status each must have;
* **run beside the platform** (ON_THE_PLATFORM): commands a document gives for a shell beside
  ``make run``, which ``tests/test_live_platform.py`` runs as typed against the platform it starts;
* **walked through** (WALK_THROUGH): the shell walk-through of docs/definitions.md, which
  ``tests/test_docs_walkthrough.py`` runs as typed;
* **mapped** to the test that runs it (``tests/<file>.py::<test>``, which must exist), with a note
  saying how that test runs it: only where the test really runs the command;
* **marked** in the document, with a trailing comment that says ``not run by the tests`` and why
  (the platform must be running, it is the test suite itself, it needs a cluster of yours...).

Blocks of other languages (``text`` for output and synopses, ``yaml``, ``python``) are not
commands. A command that is none of the three fails the test, and so does a mapping or a command
to run here that no document contains any more (the documents changed: change this file too).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGUAGES = {"sh", "bash", "shell", "console"}
MARK = "not run by the tests"
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
SL = ".venv/bin/streamlake"

# Commands this file runs, each in a home of its own (STREAMLAKE_HOME in tmp_path, no broker, no
# platform), from the repository's root, with the exit status it must end with. `status`
# commands of services that do not run in that home exit 1, saying so.
RUN_HERE: dict[str, int] = {
    f"{SL} --help": 0,
    f"{SL} pipeline validate pipelines/sensors.yaml": 0,
    f"{SL} pipeline validate pipelines/orders.yaml": 0,
    f"{SL} job list": 0,
    f"{SL} job show sensors": 0,
    f"{SL} job status sensors": 0,
    f"{SL} savepoint list": 0,
    f"{SL} savepoint list --job sensors": 0,
    f"{SL} check --list": 0,
    f"{SL} check --job sensors --proofs": 0,
    f"{SL} quality show": 0,
    f"{SL} kafka status": 1,
}

# Commands for a shell beside `make run`'s platform: tests/test_live_platform.py runs each as
# typed (a shell, the repository's root, the platform's environment) once the operations of its
# first tests are done, and finds in its output (the terminal's: stdout and stderr) the regular
# expression given here.
ON_THE_PLATFORM: dict[str, str] = {
    f"{SL} backfill --job sensors --dry-run": r"would restate",
    f"{SL} savepoint create --job sensors": r"^sp-\d{8}-\d{6}-[0-9a-f]+$",
    f'{SL} savepoint create --job sensors --note "before the change"': r"^sp-\d{8}-\d{6}-[0-9a-f]+$",
    f'{SL} sql "SELECT * FROM sensors.gold_per_minute ORDER BY window_start DESC LIMIT 5"': r"\(5 rows\)",
    f'{SL} sql "SELECT sensor_id, window_start, count, avg_temperature FROM sensors.gold_per_minute '
    f'ORDER BY window_start DESC LIMIT 5"': r"\(5 rows\)",
    f'{SL} sql --json "SELECT reason, count(*) AS n FROM sensors.quarantine GROUP BY reason"': r'"reason": "',
}


# docs/definitions.md's walk-through: tests/test_docs_walkthrough.py runs it as typed (a scenario).
WALK_THROUGH = (
    f"{SL} produce --definition pipelines/orders.yaml --count 3000 --rate 500 --late-fraction 0.05 "
    "--out-of-order-seconds 10 --malformed-fraction 0.02 --duplicate-fraction 0.02 --seed 7",
    f"{SL} pipeline run --definition pipelines/orders.yaml --root data/orders --available-now",
    f"{SL} backfill --root data/orders --aggregate revenue_5m --dry-run",
    f"{SL} check --root data/orders",
    f"{SL} quality run --root data/orders --table gold/revenue_5m",
)


def key(command: str) -> str:
    """A command as the shell splits it, words joined by one space (quotes gone)."""
    return " ".join(shlex.split(command))


# Commands another test runs: the command -> (the test, how it runs it, the call in that test's
# body that runs it: a regular expression test_every_mapped_test_runs_its_command looks for).
MAPPED: dict[str, tuple[str, str, str]] = {
    f"{SL} kafka start": (
        "tests/test_kafka_broker.py::test_start_status_stop_and_topics_survive_a_restart",
        "runs `streamlake kafka start --port P` (a free port) in a home of its own, then status and stop",
        r'_cli\(home, "start", "--port"'),
    f"{SL} kafka stop": (
        "tests/test_kafka_broker.py::test_start_status_stop_and_topics_survive_a_restart",
        "runs `streamlake kafka stop` on the cluster it started",
        r'_cli\(home, "stop"\)'),
    f"{SL} metrics show": (
        "tests/test_live_platform.py::assert_operation_metrics",
        "runs `streamlake metrics show` on the platform as `make run` starts it, after its operations "
        "(test_a_rescale_no_worker_can_host_is_refused_before_the_stop calls it)",
        r'streamlake\("metrics", "show"'),
    f"{SL} check --job orders": (
        "tests/test_live_platform.py::test_airflow_backfill_restates_data_intervals_and_every_check_passed",
        "runs `streamlake check --job orders --operation check-by-hand` on the platform as `make run` starts it "
        "(the option only names the operation the checks are recorded under)",
        r'streamlake\("check", "--job", "orders"'),
}


@dataclass(frozen=True)
class Command:
    document: str
    line: int
    text: str  # the command as the document gives it, continuation lines joined, without its comment
    comment: str

    @property
    def key(self) -> str:
        return key(self.text)

    def __str__(self) -> str:
        return f"{self.document}:{self.line}: {self.text}"


def split_comment(line: str) -> tuple[str, str]:
    """``cmd  # comment`` -> (cmd, comment): the first ``#`` outside quotes that starts a word."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def shell_commands(path: Path) -> list[Command]:
    """Every command of the document's shell blocks."""
    out: list[Command] = []
    language = None  # inside a block: its language
    pending: list[str] = []
    comments: list[str] = []
    start = 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        fence = FENCE.match(raw)
        if fence:
            language = None if language is not None else fence.group(2).lower()
            continue
        if language not in SHELL_LANGUAGES:
            continue
        line = raw.strip()
        if not pending:
            if language == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if not line or line.startswith("#"):
                continue
            start = number
        text, comment = split_comment(line)
        comments.append(comment)
        if text.endswith("\\"):
            pending.append(text[:-1].strip())
            continue
        pending.append(text)
        out.append(Command(_document(path), start, " ".join(p for p in pending if p),
                           " ".join(c for c in comments if c)))
        pending, comments = [], []
    assert not pending, f"{path}: a command's last line ends in a backslash: {pending}"
    return out


def _document(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def every_command() -> list[Command]:
    return [command for path in DOCUMENTS for command in shell_commands(path)]


def test_the_parser_reads_blocks_continuations_comments_and_prompts(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("\n".join([
        "```sh", "# a comment line", "make run   # not run by the tests: it runs until stopped",
        "a --flag 'x # y' \\", "    --more   # why", "```",
        "```text", "not a command", "```",
        "  ```console", "  $ echo hi", "  hi", "  ```",
        "```yaml", "key: value", "```"]))
    found = shell_commands(doc)
    assert [(c.line, c.text, c.comment) for c in found] == [
        (3, "make run", "not run by the tests: it runs until stopped"),
        (4, "a --flag 'x # y' --more", "why"),
        (11, "echo hi", "")]
    assert found[1].key == "a --flag x # y --more"


def test_every_command_in_the_documents_is_run_mapped_or_marked():
    commands = every_command()
    assert len(commands) >= 20, f"only {len(commands)} commands found: is the parser still right?"
    run_elsewhere = {key(c) for c in [*ON_THE_PLATFORM, *WALK_THROUGH]}
    unaccounted = [str(c) for c in commands
                   if c.key not in RUN_HERE and c.key not in MAPPED and c.key not in run_elsewhere
                   and MARK not in c.comment]
    assert not unaccounted, (
        "commands neither run by a test nor marked in their document (run it in "
        "tests/test_docs_commands.py, map it to the test that runs it, or end it with "
        f"`# {MARK}: <why>`):\n" + "\n".join(unaccounted))
    marked_without_reason = [str(c) for c in commands if MARK in c.comment
                             and not re.search(re.escape(MARK) + r"[^:]*:\s*\S", c.comment)]
    assert not marked_without_reason, "marked as not run without saying why:\n" + "\n".join(marked_without_reason)
    keys = {c.key for c in commands}
    stale = sorted(k for k in [*RUN_HERE, *MAPPED, *run_elsewhere] if k not in keys)
    assert not stale, f"in this file but in no document any more: {stale}"
    doubly = sorted(c.key for c in commands if MARK in c.comment and (c.key in RUN_HERE or c.key in MAPPED
                                                                      or c.key in run_elsewhere))
    assert not doubly, f"marked as not run in a document, yet run or mapped here: {doubly}"


def test_every_mapped_test_runs_its_command():
    for command, (test_id, how, call) in MAPPED.items():
        assert how, f"{command}: say how the test runs it"
        file, _, name = test_id.partition("::")
        path = ROOT / file
        assert path.is_file(), f"{command}: {file} does not exist"
        source = path.read_text()
        start = re.search(rf"^def {re.escape(name)}\(", source, re.M)
        assert start, f"{command}: no {test_id}"
        following = re.search(r"^(def |@|class )", source[start.end():], re.M)
        body = source[start.start():start.end() + (following.start() if following else len(source))]
        assert re.search(call, body), f"{command}: {test_id} no longer makes the call {call!r}"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every RUN_HERE command, run once, in a home of its own."""
    home = tmp_path_factory.mktemp("home")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "AWS_"))}
    env.update(STREAMLAKE_HOME=str(home), STREAMLAKE_LAKE_ROOT=str(home / "data"))
    env.pop("STREAMLAKE_PLATFORM_ROOT", None)
    env.pop("STREAMLAKE_PIPELINES", None)
    assert (ROOT / SL).exists(), f"{SL} missing: run make setup"
    done = {}
    for command in RUN_HERE:
        done[command] = subprocess.run(shlex.split(command), cwd=ROOT, env=env, capture_output=True, text=True,
                                       timeout=60)
    return done


@pytest.mark.parametrize("command", list(RUN_HERE))
def test_the_cheap_commands_run_as_the_documents_give_them(outputs, command):
    done = outputs[command]
    assert done.returncode == RUN_HERE[command], f"{command}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert done.stdout.strip(), f"{command} printed nothing"
    assert "Traceback" not in done.stderr, done.stderr


def test_the_validate_output_the_documents_show_is_what_it_prints(outputs):
    """A ``text`` block that shows `pipeline validate`'s output (its first line `pipeline <name>:`)
    holds only lines the command prints for pipelines/<name>.yaml (`...` stands for the rest)."""
    shown = 0
    for path in DOCUMENTS:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() != "```text" or i + 1 >= len(lines):
                continue
            first = re.match(r"^pipeline ([a-z][a-z0-9_-]*):", lines[i + 1])
            if not first:
                continue
            block = []
            for body in lines[i + 1:]:
                if body.strip() == "```":
                    break
                block.append(body)
            printed = outputs[f"{SL} pipeline validate pipelines/{first.group(1)}.yaml"].stdout.splitlines()
            missing = [b for b in block if b.strip() != "..." and b not in printed]
            assert not missing, f"{path.name}:{i + 2}: not in the output of validate: {missing}"
            shown += 1
    assert shown >= 2, "the README and docs/definitions.md show validate's output"
