"""memcheck comment on GitLab, against a loopback server speaking the Notes API."""
import pytest
import reportfactory as f
from conftest import GITLAB_TOKEN

from memcheck.cli import main
from memcheck.publish import Options, PublishError, publish
from memcheck.reports.markdown import MARKER


def _post(gitlab, report=None, env=None, **opts):
    return publish(report or f.gpu_report(), Options(**opts), env=env or gitlab.env(), sleep=lambda s: None)


def test_creates_the_note_when_there_is_none_after_reading_every_page(gitlab):
    for i in range(90):
        gitlab.add(f"review comment {i}", system=i % 3 == 0)
    line = _post(gitlab)
    assert line.startswith("memcheck comment: created https://gitlab.example/group/proj/-/merge_requests/7#note_")
    pages = [args.get("page", "1") for m, _, args in gitlab.log if m == "GET"]
    assert pages == ["1", "2", "3"]  # 90 notes at 40 a page: every page read before deciding to create
    assert [m for m, _, _ in gitlab.log] == ["GET"] * 3 + ["POST"]
    assert len(gitlab.marked()) == 1
    assert gitlab.marked()[0]["body"].startswith(MARKER + "\n## memcheck: ❌ memory regression")
    assert all(h.get("Private-Token") == GITLAB_TOKEN for h in gitlab.headers_seen)


def test_finds_the_note_on_a_later_page_and_updates_it_in_place(gitlab):
    for i in range(85):
        gitlab.add(f"comment {i}")
    old = gitlab.add(MARKER + "\n## memcheck: old run")
    gitlab.add("> " + MARKER + " a reply quoting it is not ours")
    line = _post(gitlab)
    assert line.startswith(f"memcheck comment: updated https://gitlab.example/group/proj/-/merge_requests/7#note_{old['id']}")
    assert [m for m, _, _ in gitlab.log] == ["GET", "GET", "GET", "PUT"]
    assert gitlab.log[-1][1].endswith(f"/notes/{old['id']}")
    assert len(gitlab.comments) == 87 and len(gitlab.marked()) == 1
    assert "old run" not in old["body"] and "r1-distill-batch8" in old["body"]


def test_many_pipelines_leave_one_note(gitlab):
    for report in (f.gpu_report(), f.cpu_report(), f.gpu_report()):
        _post(gitlab, report)
    assert len(gitlab.comments) == 1
    assert [m for m, _, _ in gitlab.log] == ["GET", "POST", "GET", "PUT", "GET", "PUT"]


def test_429_then_success_honours_retry_after(gitlab):
    gitlab.fail("GET", "/notes$", 429, {"Retry-After": "7"})
    waits = []
    publish(f.cpu_report(), Options(), env=gitlab.env(), sleep=waits.append)
    assert waits == [7.0]
    assert len(gitlab.marked()) == 1


def test_5xx_then_success_with_backoff(gitlab):
    gitlab.fail("GET", "/notes$", 503, times=2)
    gitlab.fail("PUT", "/notes/", 502)
    gitlab.add(MARKER + " old")
    waits = []
    publish(f.cpu_report(), Options(), env=gitlab.env(), sleep=waits.append)
    assert len(waits) == 3 and 0.8 <= waits[0] <= 1.0 and 1.6 <= waits[1] <= 2.0  # exponential, with jitter
    assert len(gitlab.comments) == 1 and "tiny-dense-batch" in gitlab.comments[0]["body"]


def test_a_create_that_failed_with_5xx_but_landed_is_not_duplicated(gitlab):
    gitlab.fail("POST", "/notes$", 502, apply=True)  # the note is stored, the answer is lost
    line = _post(gitlab)
    assert line.startswith("memcheck comment: updated")
    assert [m for m, _, _ in gitlab.log] == ["GET", "POST", "GET", "PUT"]
    assert len(gitlab.comments) == 1


def test_gives_up_after_the_attempts_with_one_line(gitlab):
    gitlab.fail("GET", "/notes$", 500, times=10)
    with pytest.raises(PublishError) as e:
        _post(gitlab)
    assert str(e.value).startswith("GitLab answered GET /api/v4/projects/42/merge_requests/7/notes with 500")
    assert "\n" not in str(e.value)


def test_retry_after_beyond_what_memcheck_waits_fails_at_once(gitlab):
    gitlab.fail("GET", "/notes$", 429, {"Retry-After": "3600"})
    with pytest.raises(PublishError, match="asks to wait 3600 s"):
        _post(gitlab)


@pytest.mark.parametrize("status, expected", [
    (401, "GitLab rejected the token in MEMCHECK_GITLAB_TOKEN (401 Unauthorized): it is wrong, expired or revoked"),
    (403, "GitLab refused the note on !7 (403 Forbidden): the token in MEMCHECK_GITLAB_TOKEN needs the api scope "
          "and at least the Reporter role on project 42"),
    (404, "GitLab found no merge request !7 in project 42 (404 Not Found)"),
])
def test_401_403_404_are_one_line(gitlab, status, expected):
    gitlab.fail("GET", "/notes$", status)
    with pytest.raises(PublishError) as e:
        _post(gitlab)
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)


def test_only_ci_job_token_says_it_cannot_write_notes(gitlab):
    env = gitlab.env()
    del env["MEMCHECK_GITLAB_TOKEN"]
    with pytest.raises(PublishError, match="CI_JOB_TOKEN is set, but GitLab does not let a job token write "
                                           "merge-request notes"):
        _post(gitlab, env=env)
    assert gitlab.log == []  # nothing was sent


def test_gitlab_token_is_the_fallback_variable(gitlab):
    env = gitlab.env()
    env["GITLAB_TOKEN"] = env.pop("MEMCHECK_GITLAB_TOKEN")
    _post(gitlab, env=env)
    assert len(gitlab.marked()) == 1


def test_not_a_merge_request_pipeline(gitlab):
    env = gitlab.env()
    del env["CI_MERGE_REQUEST_IID"]
    with pytest.raises(PublishError, match=r"not a merge-request pipeline \(CI_MERGE_REQUEST_IID is unset\)"):
        _post(gitlab, env=env)


def test_project_path_and_overrides_outside_ci(gitlab):
    gitlab.base = "/api/v4/projects/group/proj/merge_requests/3/notes"  # sent as group%2Fproj
    _post(gitlab, env={"MEMCHECK_GITLAB_TOKEN": GITLAB_TOKEN}, platform="gitlab", api_url=gitlab.api_url,
          project="group/proj", mr="3")
    assert len(gitlab.marked()) == 1
    assert gitlab.raw_uris[0].startswith("/api/v4/projects/group%2Fproj/merge_requests/3/notes?")


def test_redirects_are_not_followed_with_the_token(gitlab):
    gitlab.fail("GET", "/notes$", 301, {"Location": "http://elsewhere.invalid/steal"})
    with pytest.raises(PublishError, match="redirect .301. to http://elsewhere.invalid/steal"):
        _post(gitlab)


def test_cli_never_prints_the_token(gitlab, monkeypatch, capsys, tmp_path):
    report = f.write(f.hostile_report(), tmp_path / "r.json")
    for key, value in gitlab.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr("memcheck.publish.http.time.sleep", lambda s: None)
    outputs = []
    assert main(["comment", "--report", report, "--dry-run"]) == 0
    outputs.append(capsys.readouterr())
    assert main(["comment", "--report", report]) == 0
    outputs.append(capsys.readouterr())
    for status in (401, 403, 404, 500):
        gitlab.fail("GET", "/notes$", status, times=5 if status == 500 else 1)
        assert main(["comment", "--report", report]) == 1
        outputs.append(capsys.readouterr())
    # a server echoing the token back does not put it on the screen either
    gitlab.fail("GET", "/notes$", 400, message=f"token {GITLAB_TOKEN} is malformed")
    assert main(["comment", "--report", report]) == 1
    outputs.append(capsys.readouterr())
    assert "token *** is malformed" in outputs[-1].err
    text = "".join(o.out + o.err for o in outputs)
    assert GITLAB_TOKEN not in text and "job-token-not-for-notes" not in text
    assert "would create or update the memcheck comment on GitLab project 42 merge request !7" in outputs[0].out
    assert "with the token in MEMCHECK_GITLAB_TOKEN" in outputs[0].out
    assert outputs[1].out.startswith("memcheck comment: created")
    assert [o.err.count("\n") for o in outputs[2:]] == [1, 1, 1, 1, 1]
    assert outputs[2].err.startswith("memcheck comment: error: GitLab rejected the token in MEMCHECK_GITLAB_TOKEN")


def test_echoed_token_is_scrubbed(gitlab):
    from memcheck.publish.http import HttpClient

    client = HttpClient(gitlab.api_url, {"PRIVATE-TOKEN": GITLAB_TOKEN}, (GITLAB_TOKEN,))
    assert client.scrub(f"bad token {GITLAB_TOKEN} in header") == "bad token *** in header"
