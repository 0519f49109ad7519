"""A real HTTP server on loopback (pytest-httpserver) speaking the subset of the GitLab notes API and the GitHub
issue-comments API that the publishers use, with paging, auth checks and injectable failures."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from werkzeug import Response

sys.path.insert(0, str(Path(__file__).parent.parent / "reports"))  # reportfactory

GITLAB_TOKEN = "glpat-SECRETgitlab0123456789"
GITHUB_TOKEN = "ghs_SECRETgithub0123456789"


class FakeForge:
    """State shared by both fakes: comments, a log of requests, and failures to inject."""

    per_page_cap = 100

    def __init__(self, server, token: str):
        self.server, self.token = server, token
        self.comments: list[dict] = []
        self.log: list[tuple[str, str, dict]] = []  # (method, path, args)
        self.bodies: list[str] = []  # bodies POSTed or PUT/PATCHed
        self.headers_seen: list[dict] = []
        self.raw_uris: list[str] = []  # as sent on the wire, before werkzeug decodes %2F
        self.failures: list[tuple] = []  # (method, path regex, status, headers, apply, message)
        self.next_id = 1000
        server.expect_request(re.compile(".*")).respond_with_handler(self.handle)

    def fail(self, method: str, path: str, status: int, headers: dict | None = None, times: int = 1,
             apply: bool = False, message: str | None = None):
        """The next `times` requests matching get `status`; with apply, the request takes effect first."""
        for _ in range(times):
            self.failures.append((method, path, status, headers or {}, apply, message or f"{status} injected"))

    def add(self, body: str, **extra) -> dict:
        self.next_id += 1
        comment = {"id": self.next_id, "body": body, **extra}
        self.comments.append(comment)
        return comment

    def marked(self) -> list[dict]:
        from memcheck.reports.markdown import MARKER

        return [c for c in self.comments if c["body"].startswith(MARKER)]

    def handle(self, request):
        self.log.append((request.method, request.path, dict(request.args)))
        self.headers_seen.append(dict(request.headers))
        self.raw_uris.append(request.environ.get("RAW_URI") or request.environ.get("REQUEST_URI", ""))
        for i, (method, path, status, headers, apply, message) in enumerate(self.failures):
            if method == request.method and re.search(path, request.path):
                del self.failures[i]
                if apply:
                    self.route(request)
                return Response(json.dumps({"message": message}), status, headers=headers,
                                content_type="application/json")
        if not self.authorized(request):
            return Response(json.dumps({"message": "401 Unauthorized"}), 401, content_type="application/json")
        return self.route(request)

    def page(self, request, items: list):
        per_page = min(int(request.args.get("per_page", 20)), self.per_page_cap)
        page = int(request.args.get("page", 1))
        chunk = items[(page - 1) * per_page: page * per_page]
        last = (len(items) + per_page - 1) // per_page or 1
        return chunk, page, last, per_page

    def json(self, data, status: int = 200, headers=None):
        return Response(json.dumps(data), status, headers=headers or {}, content_type="application/json")


class FakeGitLab(FakeForge):
    per_page_cap = 40  # so three pages hold a hundred notes

    def __init__(self, server, project: str = "42", iid: int = 7):
        super().__init__(server, GITLAB_TOKEN)
        self.base = f"/api/v4/projects/{project}/merge_requests/{iid}/notes"

    @property
    def api_url(self) -> str:
        return self.server.url_for("/api/v4")

    def env(self, **extra) -> dict:
        return {"GITLAB_CI": "true", "CI_API_V4_URL": self.api_url, "CI_PROJECT_ID": "42",
                "CI_MERGE_REQUEST_PROJECT_ID": "42", "CI_MERGE_REQUEST_IID": "7",
                "CI_PROJECT_URL": "https://gitlab.example/group/proj", "CI_PIPELINE_URL": "https://gitlab.example/p/1",
                "MEMCHECK_GITLAB_TOKEN": self.token, "CI_JOB_TOKEN": "job-token-not-for-notes", **extra}

    def authorized(self, request) -> bool:
        return request.headers.get("PRIVATE-TOKEN") == self.token

    def route(self, request):
        if not request.path.startswith(self.base):
            return self.json({"message": "404 Project Not Found"}, 404)
        rest = request.path[len(self.base):].strip("/")
        if request.method == "GET" and not rest:
            chunk, page, last, per_page = self.page(request, self.comments)
            headers = {"X-Page": str(page), "X-Total-Pages": str(last), "X-Next-Page": str(page + 1) if page < last
                       else ""}
            return self.json(chunk, headers=headers)
        if request.method == "POST" and not rest:
            body = request.get_json()["body"]
            self.bodies.append(body)
            return self.json(self.add(body, system=False), 201)
        if request.method == "PUT" and rest.isdigit():
            note = next((c for c in self.comments if c["id"] == int(rest)), None)
            if note is None:
                return self.json({"message": "404 Not found"}, 404)
            note["body"] = request.get_json()["body"]
            self.bodies.append(note["body"])
            return self.json(note)
        return self.json({"message": "405"}, 405)


class FakeGitHub(FakeForge):
    per_page_cap = 30

    def __init__(self, server, repo: str = "acme/llm", pr: int = 12):
        super().__init__(server, GITHUB_TOKEN)
        self.repo, self.pr = repo, pr
        self.pulls = [{"number": pr, "head": {"sha": "a" * 40, "ref": "feature", "repo": {"full_name": "fork/llm"}}}]

    @property
    def api_url(self) -> str:
        return self.server.url_for("/").rstrip("/")

    def env(self, event_path, **extra) -> dict:
        return {"GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": self.repo, "GITHUB_API_URL": self.api_url,
                "GITHUB_EVENT_PATH": str(event_path), "GITHUB_EVENT_NAME": "pull_request",
                "GITHUB_SERVER_URL": "https://github.example", "GITHUB_RUN_ID": "99", "GITHUB_TOKEN": self.token,
                **extra}

    def authorized(self, request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.token}"

    def route(self, request):
        prefix = f"/repos/{self.repo}"
        if not request.path.startswith(prefix):
            return self.json({"message": "Not Found"}, 404)
        rest = request.path[len(prefix):]
        m = re.fullmatch(r"/issues/(\d+)/comments", rest)
        if m and int(m.group(1)) != self.pr:
            return self.json({"message": "Not Found"}, 404)
        if m and request.method == "GET":
            chunk, page, last, per_page = self.page(request, self.comments)
            headers = {}
            if page < last:
                nxt = self.server.url_for(f"{request.path}?per_page={per_page}&page={page + 1}")
                headers["Link"] = f'<{nxt}>; rel="next", <{nxt.rsplit("=", 1)[0]}={last}>; rel="last"'
            return self.json(chunk, headers=headers)
        if m and request.method == "POST":
            body = request.get_json()["body"]
            if len(body) > 65536:
                return self.json({"message": "Validation Failed", "errors": [{"message": "body is too long"}]}, 422)
            self.bodies.append(body)
            c = self.add(body)
            c["html_url"] = f"https://github.example/{self.repo}/pull/{self.pr}#issuecomment-{c['id']}"
            return self.json(c, 201)
        m = re.fullmatch(r"/issues/comments/(\d+)", rest)
        if m and request.method == "PATCH":
            c = next((c for c in self.comments if c["id"] == int(m.group(1))), None)
            if c is None:
                return self.json({"message": "Not Found"}, 404)
            c["body"] = request.get_json()["body"]
            self.bodies.append(c["body"])
            return self.json(c)
        if rest == "/pulls" and request.method == "GET":
            owner, _, branch = request.args.get("head", "").partition(":")
            return self.json([p for p in self.pulls if p["head"]["ref"] == branch
                              and p["head"]["repo"]["full_name"].split("/")[0] == owner])
        return self.json({"message": "Not Found"}, 404)


@pytest.fixture(autouse=True)
def _loopback_without_proxy(monkeypatch):
    """The fake servers are on loopback: a proxy configured on the machine must not stand in between."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


@pytest.fixture
def gitlab(httpserver):
    return FakeGitLab(httpserver)


@pytest.fixture
def github(httpserver):
    return FakeGitHub(httpserver)


@pytest.fixture
def sleeps():
    """Record the waits instead of sleeping (the tests check Retry-After was honoured)."""
    waited: list[float] = []
    return waited


@pytest.fixture
def no_sleep(monkeypatch, sleeps):
    monkeypatch.setattr("memcheck.publish.http.time.sleep", sleeps.append)
    return sleeps
