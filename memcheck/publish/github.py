"""GitHub: the memcheck comment on the pull request of the current workflow run (issue-comments API).

Detected from GITHUB_ACTIONS, GITHUB_REPOSITORY, GITHUB_API_URL and the event file (GITHUB_EVENT_PATH).
The pull-request number comes from the event, never from an artifact (a fork controls its artifacts and
could name another pull request):
  pull_request / pull_request_target:  pull_request.number
  issue_comment on a pull request:     issue.number
  workflow_run (the fork-safe pattern): workflow_run.pull_requests[0].number; for a fork that list is
                                       empty, so the open pull request whose head is the run's head
                                       repository, branch and commit is looked up.
The token comes from GITHUB_TOKEN and needs `pull-requests: write`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterator

from .base import Comment, Target
from .http import HttpClient, HttpStatusError, PublishError

TOKEN_VARIABLE = "GITHUB_TOKEN"
COMMENT_LIMIT = 65536  # characters GitHub accepts in a comment body
PER_PAGE = 100
MAX_PAGES = 1000
COMMENT_WORKFLOW = ".github/workflows/memcheck-comment.yml"


@dataclass
class GitHubSettings:
    api_url: str
    repository: str  # owner/name
    pr: int | None
    token_variable: str | None
    event_name: str = ""
    from_fork: bool = False
    workflow_run: dict | None = None  # the head of a workflow_run whose pull request must be looked up


def settings_from_env(env, api_url=None, repository=None, pr=None, token_variable=None,
                      event_path=None) -> GitHubSettings:
    api_url = api_url or env.get("GITHUB_API_URL") or "https://api.github.com"
    repository = repository or env.get("GITHUB_REPOSITORY")
    if not repository or repository.count("/") != 1:
        raise PublishError("GitHub: cannot tell the repository (GITHUB_REPOSITORY or --repo OWNER/NAME)")
    event_name = env.get("GITHUB_EVENT_NAME", "")
    event = _load_event(event_path or env.get("GITHUB_EVENT_PATH"))
    from_fork, run = False, None
    if pr is None:
        pr, from_fork, run = _pr_from_event(event_name, event, repository)
    else:
        try:
            pr = int(pr)
        except ValueError:
            raise PublishError(f"GitHub: the pull request number must be a number, got {pr!r}") from None
    if pr is None and run is None:
        raise PublishError(f"GitHub: no pull request in this run's event ({event_name or 'no event'}): comment from "
                           "a pull_request or workflow_run event, or pass --pr NUMBER")
    var = token_variable or TOKEN_VARIABLE
    return GitHubSettings(api_url, repository, pr, var if env.get(var) else None, event_name, from_fork, run)


def _load_event(path) -> dict:
    if not path:
        return {}
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise PublishError(f"GitHub: cannot read the event file {path}: {e}") from None
    return data if isinstance(data, dict) else {}


def _pr_from_event(event_name: str, event: dict, repository: str):
    """(pr number or None, from a fork, workflow_run head to look up or None)."""
    if "pull_request" in event and isinstance(event["pull_request"], dict):
        pr = event["pull_request"]
        head = ((pr.get("head") or {}).get("repo") or {}).get("full_name")
        base = ((pr.get("base") or {}).get("repo") or {}).get("full_name") or repository
        return pr.get("number"), bool(head and head != base), None
    issue = event.get("issue")
    if isinstance(issue, dict) and issue.get("pull_request"):
        return issue.get("number"), False, None
    run = event.get("workflow_run")
    if isinstance(run, dict):
        if run.get("event") not in ("pull_request", "pull_request_target"):
            raise PublishError(f"GitHub: the workflow run that triggered this one ran on {run.get('event')!r}, "
                               "not on a pull request: nothing to comment on")
        for pr in run.get("pull_requests") or []:
            base = ((pr.get("base") or {}).get("repo") or {}).get("url", "")
            if not base or base.endswith("/repos/" + repository):
                return pr.get("number"), False, None
        head_repo = run.get("head_repository") or {}
        head = {"owner": (head_repo.get("owner") or {}).get("login"), "branch": run.get("head_branch"),
                "sha": run.get("head_sha"), "repo": head_repo.get("full_name")}
        if not all((head["owner"], head["branch"], head["sha"])):
            raise PublishError("GitHub: the workflow_run event names no head repository, branch and commit")
        return None, head["repo"] not in (None, repository), head
    return None, False, None


class GitHubTarget(Target):
    platform = "GitHub"
    limit = COMMENT_LIMIT

    def __init__(self, settings: GitHubSettings, token: str, **client_options):
        self.settings = settings
        self.client = HttpClient(settings.api_url, {"Authorization": f"Bearer {token}",
                                                    "Accept": "application/vnd.github+json",
                                                    "X-GitHub-Api-Version": "2022-11-28"},
                                 (token,), platform="GitHub", **client_options)

    @property
    def repo_path(self) -> str:
        return f"repos/{self.settings.repository}"

    def describe(self) -> str:
        s = self.settings
        which = f"#{s.pr}" if s.pr else (f"the open pull request of {s.workflow_run['owner']}:"
                                         f"{s.workflow_run['branch']} at {s.workflow_run['sha'][:12]}")
        return f"GitHub repository {s.repository} pull request {which} ({s.api_url})"

    def resolve_pr(self) -> int:
        """The pull request of a workflow_run from a fork: the open one whose head is exactly that commit."""
        s = self.settings
        if s.pr is not None:
            return s.pr
        run = s.workflow_run
        pulls = self.client.request("GET", f"{self.repo_path}/pulls",
                                    params={"state": "open", "head": f"{run['owner']}:{run['branch']}",
                                            "per_page": PER_PAGE}).json()
        for pr in pulls:
            if (pr.get("head") or {}).get("sha") == run["sha"]:
                s.pr = int(pr["number"])
                return s.pr
        raise PublishError(f"GitHub: no open pull request in {s.repository} has head {run['owner']}:{run['branch']} "
                           f"at {run['sha'][:12]} (closed, or pushed to since): nothing to comment on")

    def comments(self) -> Iterator[Comment]:
        url, params = f"{self.repo_path}/issues/{self.resolve_pr()}/comments", {"per_page": PER_PAGE}
        for _ in range(MAX_PAGES):
            resp = self.client.request("GET", url, params=params)
            for c in resp.json():
                yield Comment(c["id"], c.get("body") or "", c.get("html_url"))
            url, params = resp.links.get("next", {}).get("url"), None
            if not url:
                return
        raise PublishError(f"GitHub: more than {MAX_PAGES} pages of comments on #{self.settings.pr}: giving up")

    def create(self, body: str) -> Comment:
        c = self.client.request("POST", f"{self.repo_path}/issues/{self.resolve_pr()}/comments", json={"body": body},
                                retry_5xx=False).json()
        return Comment(c["id"], c.get("body", body), c.get("html_url"))

    def update(self, comment: Comment, body: str) -> Comment:
        c = self.client.request("PATCH", f"{self.repo_path}/issues/comments/{comment.id}", json={"body": body}).json()
        return Comment(c["id"], c.get("body", body), c.get("html_url"))

    def explain(self, error: HttpStatusError) -> PublishError:
        s, var = self.settings, self.settings.token_variable or TOKEN_VARIABLE
        if error.status == 401:
            return PublishError(f"GitHub rejected the token in {var} (401 Bad credentials): it is wrong or expired")
        if error.status == 403:
            if s.from_fork and s.event_name.startswith("pull_request"):
                return PublishError("GitHub refused the comment (403): a pull_request run from a fork gets a "
                                    f"read-only {var}. Upload the report as an artifact and comment from a "
                                    f"workflow_run workflow ({COMMENT_WORKFLOW})")
            return PublishError(f"GitHub refused the comment on #{s.pr} (403 Forbidden): the token in {var} needs "
                                "`permissions: pull-requests: write` in the workflow. GitHub said: "
                                f"{str(error).split(': ', 2)[-1]}")
        return PublishError(f"GitHub found no pull request #{s.pr} in {s.repository} (404 Not Found), or the token "
                            f"in {var} cannot see the repository")
