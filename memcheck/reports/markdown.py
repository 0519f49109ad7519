"""Markdown report rendered with jinja2: the file CI keeps, the GitHub job summary and the body of the
merge-request comment.

Everything that comes from a user or a run (workload names, exception messages, rule text) goes through
one of three filters, chosen by where it lands: `md` for Markdown text, `code` for a code span inside a
table, `h` for text inside the raw HTML of a <details> block. A workload named `<img src=x onerror=...>`
renders as those characters in all three.
"""
from __future__ import annotations

import html
import re
import urllib.parse

import jinja2

from .. import units
from ..floors import describe as describe_floors
from ..metrics.catalog import METRICS
from ..states import CheckStatus, Verdict
from .engine_profile import describe as describe_engine_profile
from .ranks import rank_columns

MARKER = "<!-- memcheck-report -->"  # finds our comment again on the merge request
ICONS = {Verdict.PASS: "✅", Verdict.REGRESSED: "❌", Verdict.ERROR: "💥", Verdict.IMPROVED: "🎉", Verdict.NEW: "🆕",
         Verdict.INCOMPARABLE: "⚠️", Verdict.SKIPPED: "⏭️"}
MEMORY_VIZ = "https://pytorch.org/memory_viz"
# Ways to shorten a body over a platform's limit, tried in order: which items keep their metric tables
# (<details>), how many of them at most, how many rows the verdict table keeps.
SHORTER = (("all", None, None), ("failed", None, None), ("failed", 20, None), ("failed", 5, None),
           ("failed", 1, None), ("none", 0, None), ("none", 0, 200), ("none", 0, 50), ("none", 0, 10))


def md_escape(text) -> str:
    """Text from users or exceptions as inert Markdown: no HTML, no table breaks, no links, no mentions."""
    text = html.escape(str(text), quote=False)
    text = re.sub(r"([\\`*_{}\[\]()|#!~<>])", r"\\\1", text).replace("\n", " ").replace("\r", " ")
    return text.replace("@", "@\u200b")  # `@team` in a workload name must not notify anyone


def code_span(text) -> str:
    """A code span for a table cell: its content is literal (HTML is inert there), a backtick run inside
    gets a longer fence, and `|` is escaped because GFM splits table cells before it parses code spans."""
    text = str(text).replace("\r", " ").replace("\n", " ").replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def html_text(text) -> str:
    """Text inside a raw HTML block (<summary>): entities only, no Markdown escapes (they would show)."""
    return html.escape(str(text), quote=True).replace("\n", " ").replace("@", "@\u200b")


def safe_url(url) -> str | None:
    """An http(s) URL fit for a Markdown link target, or None."""
    if not url:
        return None
    parts = urllib.parse.urlsplit(str(url).strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return urllib.parse.quote(parts.geturl(), safe=":/?#[]@!$&'*+,;=%~")


def split_checks(checks, left_out=()) -> tuple[list, list[tuple[str, list[str]]]]:
    """Checks worth a table row, and the metrics this runner could not measure grouped by reason (a CPU
    runner has a dozen null gpu.* metrics: one line says so instead of a dozen rows). `left_out`: metrics
    the report lists once for the whole run."""
    shown, missing = [], {}
    for c in checks:
        if c.metric in left_out:
            continue
        if c.status == CheckStatus.NOT_MEASURED:
            reason = c.message.removeprefix("not measured here: ")
            missing.setdefault(reason, []).append(c.metric)
        else:
            shown.append(c)
    return shown, list(missing.items())


# Fingerprint fields that name a package on the index: a bump of one can be bisected release by release.
BISECTABLE = {"torch": "torch", "triton": "triton", "transformers": "transformers", "vllm": "vllm",
              "flash_attn": "flash-attn"}
NOISY = "noisy metric"  # the start of a check's message when one round cannot judge a noisy metric


def bisect_commands(result) -> list[str]:
    """For a regressed item compared across a package bump: the command that finds the release, per package."""
    if result.verdict != Verdict.REGRESSED:
        return []
    commands = []
    for change in result.compared_across:
        key, _, versions = change.partition(" ")
        good, _, bad = versions.partition(" -> ")
        if key in BISECTABLE and good != "none" and bad != "none":
            commands.append(f"memcheck bisect '{result.id}' --package {BISECTABLE[key]} --good {good} --bad {bad}")
    return commands


def skipped_groups(items) -> list[tuple[str, list[str]]]:
    """Skipped items by reason: one line per reason instead of a row per item."""
    groups = {}
    for r in items:
        if r.verdict == Verdict.SKIPPED:
            groups.setdefault(r.reason or "no reason given", []).append(r.id)
    return list(groups.items())


def common_across(items) -> list[str]:
    """The software changes every judged item was compared across: said once above the table."""
    judged = [r.compared_across for r in items if r.verdict != Verdict.SKIPPED and r.baseline_path]
    if len(judged) < 2:  # one item says it in its own row
        return []
    return [change for change in judged[0] if all(change in other for other in judged[1:])]


def unjudged_metrics(items) -> list[str]:
    """Noisy metrics that no item of the run could judge (one round): listed once, left out of every table."""
    seen, judged = set(), set()
    for r in items:
        for c in r.checks:
            (seen if c.status == CheckStatus.NOT_COMPARED and c.message.startswith(NOISY) else judged).add(c.metric)
    return sorted(seen - judged)


def unmeasured_everywhere(items) -> list[tuple[str, list[str]]]:
    """Metrics that no item could measure, for the same reason (a CPU runner's gpu.*): said once for the run."""
    per_item = [{(c.metric, c.message) for c in r.checks if c.status == CheckStatus.NOT_MEASURED}
                for r in items if r.checks]
    common = set.intersection(*per_item) if len(per_item) > 1 else set()  # one item says it in its own table
    groups = {}
    for metric, message in sorted(common):
        groups.setdefault(message.removeprefix("not measured here: "), []).append(metric)
    return list(groups.items())


def _value(value, metric: str, signed: bool = False) -> str:
    if value is None:
        return "–"
    unit = METRICS[metric].unit if metric in METRICS else ""
    return units.format_value(value, unit, signed)


def environment(loader_pkg: str = "memcheck") -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader(loader_pkg, "reports/templates"),
                             autoescape=False, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.ChainableUndefined)
    env.filters.update(md=md_escape, code=code_span, h=html_text, value=_value, bytes=units.format_bytes,
                       percent=units.format_percent)
    env.globals.update(describe_floors=describe_floors, describe_engine_profile=describe_engine_profile, ICONS=ICONS,
                       MARKER=MARKER, METRICS=METRICS, MEMORY_VIZ=MEMORY_VIZ, split_checks=split_checks,
                       rank_columns=rank_columns, bisect_commands=bisect_commands)
    return env


def render(report, artifact_url: str | None = None, limit: int | None = None, platform: str = "the platform",
           marker: bool = True) -> str:
    """The Markdown report. With `limit` (characters), a body over it is shortened step by step (fewer
    details, fewer rows) with a note that says so and links the full report."""
    template = environment().get_template("report.md.j2")
    url = safe_url(artifact_url)
    ordered = sorted(report.items, key=lambda r: (not r.failed, r.verdict in (Verdict.PASS, Verdict.SKIPPED)))
    body = ""
    for level in SHORTER:
        details, max_details, max_rows = level
        shortened = level != SHORTER[0]
        items = ordered if shortened else report.items
        detailed = [r for r in items if r.checks and (details == "all" or (details == "failed" and r.failed))]
        body = template.render(report=report, items=[r for r in items if r.verdict != Verdict.SKIPPED],
                               skipped=skipped_groups(items), common=common_across(items),
                               unjudged=unjudged_metrics(items), unmeasured=unmeasured_everywhere(items),
                               detailed=detailed[:max_details], details=details,
                               left_out=len(detailed) - len(detailed[:max_details]), max_rows=max_rows,
                               artifact_url=url, shortened=shortened, limit=limit, platform=platform, marker=marker)
        if limit is None or len(body) <= limit:
            return body
    # Still too long (thousands of items): cut, and say where the rest is.
    note = f"\n\n… cut to fit {platform}'s limit of {limit:,} characters. " + (
        f"[Full report]({url})" if url else "The full report is in the job's artifacts.") + "\n"
    return body[: max(0, limit - len(note))] + note
