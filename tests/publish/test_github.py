"""memcheck comment on GitHub, against a loopback server speaking the issue-comments API."""
import json

import pytest
import reportfactory as f
from conftest import GITHUB_TOKEN

from memcheck.cli import main
from memcheck.publish import Options, PublishError, publish
from memcheck.reports.markdown import MARKER
from memcheck.reports.report import Report

SHA = "a" * 40


def _event(tmp_path, data) -> str:
    path = tmp_path / "event.json"
    path.write_text(json.dumps(data))
    return str(path)


def pull_request_event(fork=False, number=12):
    head = "fork/llm" if fork else "acme/llm"
    return {"pull_request": {"number": number, "head": {"sha": SHA, "repo": {"full_name": head}},
                             "base": {"repo": {"full_name": "acme/llm"}}}}


def workflow_run_event(pull_requests):
    return {"workflow_run": {"id": 5, "event": "pull_request", "head_branch": "feature", "head_sha": SHA,
                             "html_url": "https://github.example/acme/llm/actions/runs/5",
                             "head_repository": {"full_name": "fork/llm", "owner": {"login": "fork"}},
                             "pull_requests": pull_requests}}


def _post(github, tmp_path, event=None, report=None, sleep=None, **env):
    env = github.env(_event(tmp_path, event or pull_request_event()), **env)
    return publish(report or f.gpu_report(), Options(), env=env, sleep=sleep or (lambda s: None))


def test_creates_then_updates_through_link_pages(github, tmp_path):
    for i in range(70):
        github.add(f"comment {i}")
    line = _post(github, tmp_path)
    assert line.startswith("memcheck comment: created https://github.example/acme/llm/pull/12#issuecomment-")
    gets = [args for m, _, args in github.log if m == "GET"]
    assert len(gets) == 3  # 70 comments at 30 a page, the next page taken from the Link header
    assert [m for m, _, _ in github.log][-1] == "POST"
    github.log.clear()
    line = _post(github, tmp_path, report=f.cpu_report())
    assert line.startswith("memcheck comment: updated")
    assert [m for m, _, _ in github.log] == ["GET", "GET", "GET", "PATCH"]  # found on the third page
    assert len(github.marked()) == 1 and "tiny-dense-batch" in github.marked()[0]["body"]
    assert all(h.get("Authorization") == f"Bearer {GITHUB_TOKEN}" for h in github.headers_seen)
    assert all(h.get("X-Github-Api-Version") == "2022-11-28" for h in github.headers_seen)


def test_workflow_run_takes_the_pr_from_the_event(github, tmp_path):
    event = workflow_run_event([{"number": 12, "base": {"repo": {"url": github.api_url + "/repos/acme/llm"}}}])
    _post(github, tmp_path, event, GITHUB_EVENT_NAME="workflow_run")
    assert [p for _, p, _ in github.log] == ["/repos/acme/llm/issues/12/comments"] * 2
    # the full report link is the triggering run's page
    assert "[Full report](https://github.example/acme/llm/actions/runs/5)" in github.marked()[0]["body"]


def test_workflow_run_from_a_fork_looks_the_pr_up_by_head(github, tmp_path):
    _post(github, tmp_path, workflow_run_event([]), GITHUB_EVENT_NAME="workflow_run")
    assert github.log[0][1] == "/repos/acme/llm/pulls"
    assert github.log[0][2]["head"] == "fork:feature"
    assert len(github.marked()) == 1


def test_workflow_run_whose_head_moved_on_comments_nowhere(github, tmp_path):
    github.pulls[0]["head"]["sha"] = "b" * 40
    with pytest.raises(PublishError, match="no open pull request in acme/llm has head fork:feature at aaaaaaaaaaaa"):
        _post(github, tmp_path, workflow_run_event([]), GITHUB_EVENT_NAME="workflow_run")
    assert not github.comments


def test_a_number_in_the_report_is_never_used(github, tmp_path):
    """The PR comes from the event: an artifact (the report) cannot steer the comment to another PR."""
    report = f.cpu_report()
    data = report.to_json()
    data["pr"] = 999
    _post(github, tmp_path, report=Report.from_json(data))
    assert all("/issues/12/" in p for _, p, _ in github.log)


def test_429_and_secondary_rate_limit_honour_retry_after(github, tmp_path):
    github.fail("GET", "/comments$", 429, {"Retry-After": "3"})
    github.fail("POST", "/comments$", 403, {"Retry-After": "5"})  # GitHub's secondary rate limit
    waits = []
    _post(github, tmp_path, sleep=waits.append)
    assert waits == [3.0, 5.0]
    assert len(github.marked()) == 1


def test_5xx_then_success(github, tmp_path):
    github.fail("GET", "/comments$", 502)
    github.fail("GET", "/comments$", 500)
    waits = []
    _post(github, tmp_path, sleep=waits.append)
    assert len(waits) == 2 and len(github.marked()) == 1


def test_403_from_a_fork_explains_the_workflow_run_pattern(github, tmp_path):
    github.fail("GET", "/comments$", 403, message="Resource not accessible by integration")
    with pytest.raises(PublishError) as e:
        _post(github, tmp_path, pull_request_event(fork=True))
    assert str(e.value) == ("GitHub refused the comment (403): a pull_request run from a fork gets a read-only "
                            "GITHUB_TOKEN. Upload the report as an artifact and comment from a workflow_run workflow "
                            "(.github/workflows/memcheck-comment.yml)")


@pytest.mark.parametrize("status, expected", [
    (401, "GitHub rejected the token in GITHUB_TOKEN (401 Bad credentials)"),
    (403, "GitHub refused the comment on #12 (403 Forbidden): the token in GITHUB_TOKEN needs "
          "`permissions: pull-requests: write` in the workflow. GitHub said: Resource not accessible by integration"),
    (404, "GitHub found no pull request #12 in acme/llm (404 Not Found)"),
])
def test_401_403_404_are_one_line(github, tmp_path, status, expected):
    github.fail("GET", "/comments$", status, message="Resource not accessible by integration")
    with pytest.raises(PublishError) as e:
        _post(github, tmp_path)
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)


def test_long_body_is_shortened_under_the_limit_with_a_link(github, tmp_path):
    report = f.big_report(40)
    _post(github, tmp_path, report=report)
    body = github.marked()[0]["body"]
    assert len(body) <= 65536
    assert "Shortened** to fit GitHub's limit of 65,536 characters" in body
    assert "[Full report](https://github.example/acme/llm/actions/runs/99)" in body


def test_no_token(github, tmp_path):
    env = github.env(_event(tmp_path, pull_request_event()))
    del env["GITHUB_TOKEN"]
    with pytest.raises(PublishError, match="GitHub: no token: set GITHUB_TOKEN"):
        publish(f.cpu_report(), Options(), env=env)


def test_push_event_has_no_pull_request(github, tmp_path):
    with pytest.raises(PublishError, match=r"no pull request in this run's event \(push\)"):
        _post(github, tmp_path, {"ref": "refs/heads/main"}, GITHUB_EVENT_NAME="push")


def test_cli_dry_run_and_errors_never_print_the_token(github, tmp_path, monkeypatch, capsys):
    report = f.write(f.hostile_report(), tmp_path / "r.json")
    for key, value in github.env(_event(tmp_path, pull_request_event())).items():
        monkeypatch.setenv(key, value)
    assert main(["comment", "--report", report, "--dry-run"]) == 0
    dry = capsys.readouterr()
    assert github.log == []  # a dry run sends nothing
    assert "would create or update the memcheck comment on GitHub repository acme/llm pull request #12" in dry.out
    assert dry.out.count(MARKER) == 1
    github.fail("GET", "/comments$", 401, message=f"Bad credentials for {GITHUB_TOKEN}")
    assert main(["comment", "--report", report]) == 1
    err = capsys.readouterr()
    for text in (dry.out, dry.err, err.out, err.err):
        assert GITHUB_TOKEN not in text


def test_a_netrc_entry_does_not_replace_the_token(github, tmp_path, monkeypatch):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine localhost login someone password other-secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    _post(github, tmp_path)
    assert {h.get("Authorization") for h in github.headers_seen} == {f"Bearer {GITHUB_TOKEN}"}
