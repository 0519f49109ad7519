"""GitLab: the memcheck note on the merge request of the current pipeline (Notes API).

Detected from the CI variables: CI_API_V4_URL, CI_MERGE_REQUEST_PROJECT_ID (falling back to CI_PROJECT_ID),
CI_MERGE_REQUEST_IID. The token comes from MEMCHECK_GITLAB_TOKEN or GITLAB_TOKEN and is sent as
PRIVATE-TOKEN: a project or personal access token with the api scope and at least the Reporter role.
CI_JOB_TOKEN cannot write merge-request notes, so it is never used.
"""
from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Iterator

from .base import Comment, Target
from .http import HttpClient, HttpStatusError, PublishError

TOKEN_VARIABLES = ("MEMCHECK_GITLAB_TOKEN", "GITLAB_TOKEN")
NOTE_LIMIT = 1_000_000  # characters GitLab accepts in a note
PER_PAGE = 100
MAX_PAGES = 1000


@dataclass
class GitLabSettings:
    api_url: str
    project: str  # numeric id or "group/project"
    mr_iid: int
    token_variable: str | None
    web_url: str | None = None  # CI_PROJECT_URL: for the link to the note


def settings_from_env(env, api_url=None, project=None, mr=None, token_variable=None) -> GitLabSettings:
    api_url = api_url or env.get("CI_API_V4_URL")
    project = project or env.get("CI_MERGE_REQUEST_PROJECT_ID") or env.get("CI_PROJECT_ID")
    mr = mr or env.get("CI_MERGE_REQUEST_IID")
    missing = [what for what, v in (("the API URL (CI_API_V4_URL or --api-url)", api_url),
                                    ("the project (CI_MERGE_REQUEST_PROJECT_ID, CI_PROJECT_ID or --project)", project))
               if not v]
    if missing:
        raise PublishError(f"GitLab: cannot tell {' and '.join(missing)}")
    if not mr:
        raise PublishError("GitLab: not a merge-request pipeline (CI_MERGE_REQUEST_IID is unset): run the comment "
                           "job with `rules: - if: $CI_PIPELINE_SOURCE == \"merge_request_event\"`, or pass --mr IID")
    try:
        iid = int(mr)
    except ValueError:
        raise PublishError(f"GitLab: the merge request IID must be a number, got {mr!r}") from None
    names = (token_variable,) if token_variable else TOKEN_VARIABLES
    found = next((n for n in names if env.get(n)), None)
    return GitLabSettings(api_url, str(project), iid, found, env.get("CI_PROJECT_URL"))


def missing_token_message(env, token_variable=None) -> str:
    names = " or ".join((token_variable,) if token_variable else TOKEN_VARIABLES)
    message = f"GitLab: no token to write the note: set {names}"
    if env.get("CI_JOB_TOKEN"):
        message += (" (CI_JOB_TOKEN is set, but GitLab does not let a job token write merge-request notes: "
                    "create a project access token with the api scope and the Reporter role, and store it as "
                    "the masked CI/CD variable MEMCHECK_GITLAB_TOKEN)")
    else:
        message += " to a project access token with the api scope and the Reporter role"
    return message


class GitLabTarget(Target):
    platform = "GitLab"
    limit = NOTE_LIMIT

    def __init__(self, settings: GitLabSettings, token: str, **client_options):
        self.settings = settings
        self.client = HttpClient(settings.api_url, {"PRIVATE-TOKEN": token}, (token,), platform="GitLab",
                                 **client_options)
        project = urllib.parse.quote(settings.project, safe="")
        self.notes_path = f"projects/{project}/merge_requests/{settings.mr_iid}/notes"

    def describe(self) -> str:
        s = self.settings
        return f"GitLab project {s.project} merge request !{s.mr_iid} ({s.api_url})"

    def comments(self) -> Iterator[Comment]:
        first = {"per_page": PER_PAGE, "sort": "asc", "order_by": "created_at"}
        url, params = self.notes_path, first
        for _ in range(MAX_PAGES):
            resp = self.client.request("GET", url, params=params)
            for note in resp.json():
                if not note.get("system"):
                    yield Comment(note["id"], note.get("body") or "", self._note_url(note["id"]))
            url, params = _next_page(resp, self.notes_path, first)
            if not url:
                return
        raise PublishError(f"GitLab: more than {MAX_PAGES} pages of notes on !{self.settings.mr_iid}: giving up")

    def create(self, body: str) -> Comment:
        note = self.client.request("POST", self.notes_path, json={"body": body}, retry_5xx=False).json()
        return Comment(note["id"], note.get("body", body), self._note_url(note["id"]))

    def update(self, comment: Comment, body: str) -> Comment:
        note = self.client.request("PUT", f"{self.notes_path}/{comment.id}", json={"body": body}).json()
        return Comment(note["id"], note.get("body", body), self._note_url(note["id"]))

    def _note_url(self, note_id) -> str | None:
        web = self.settings.web_url
        return f"{web.rstrip('/')}/-/merge_requests/{self.settings.mr_iid}#note_{note_id}" if web else None

    def explain(self, error: HttpStatusError) -> PublishError:
        s, var = self.settings, self.settings.token_variable
        if error.status == 401:
            return PublishError(f"GitLab rejected the token in {var} (401 Unauthorized): it is wrong, expired or "
                                "revoked")
        if error.status == 403:
            return PublishError(f"GitLab refused the note on !{s.mr_iid} (403 Forbidden): the token in {var} needs "
                                f"the api scope and at least the Reporter role on project {s.project} (or the "
                                f"merge request's discussion is locked). GitLab said: {_said(error)}")
        return PublishError(f"GitLab found no merge request !{s.mr_iid} in project {s.project} (404 Not Found): "
                            f"check CI_MERGE_REQUEST_IID/--mr and the project, and that the token in {var} can see "
                            "the project")


def _next_page(resp, path: str, params: dict):
    """GitLab sends Link rel=next, and X-Next-Page (empty on the last page); either gets the next page."""
    nxt = resp.links.get("next", {}).get("url")
    if nxt:
        return nxt, None
    page = resp.headers.get("X-Next-Page", "").strip()
    if page:
        return path, {**params, "page": page}
    return None, None


def _said(error: HttpStatusError) -> str:
    return str(error).split(": ", 2)[-1]
