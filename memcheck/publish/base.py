"""The sticky comment: one memcheck comment per merge request, found again by its hidden marker through
every page of comments and updated in place, however many pipelines ran."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from ..reports.markdown import MARKER
from .http import HttpClient, HttpStatusError, PublishError


@dataclass
class Comment:
    id: int | str
    body: str
    url: str | None = None


class Target:
    """Where the comment goes: a GitLab merge request or a GitHub pull request."""

    platform = "the platform"
    limit = 65536  # characters a comment body may hold

    client: HttpClient

    def describe(self) -> str:
        raise NotImplementedError

    def comments(self) -> Iterator[Comment]:
        """Every comment, following the pagination to the last page."""
        raise NotImplementedError

    def create(self, body: str) -> Comment:
        raise NotImplementedError

    def update(self, comment: Comment, body: str) -> Comment:
        raise NotImplementedError

    def explain(self, error: HttpStatusError) -> PublishError:
        """A one-line error for a 401/403/404, in the platform's terms."""
        return error

    def find(self) -> Comment | None:
        for comment in self.comments():
            # The marker opens our body; a reply quoting the comment starts with '>' and is not ours.
            if (comment.body or "").lstrip().startswith(MARKER):
                return comment
        return None


def upsert(target: Target, body: str) -> tuple[str, Comment]:
    """Update the memcheck comment in place, or create it. Returns ('updated' | 'created', comment)."""
    try:
        return _upsert(target, body)
    except HttpStatusError as e:
        if e.status in (401, 403, 404):
            raise target.explain(e) from None
        raise


def _upsert(target: Target, body: str) -> tuple[str, Comment]:
    for attempt in range(1, target.client.attempts + 1):
        found = target.find()
        if found is not None:
            return "updated", target.update(found, body)
        try:
            return "created", target.create(body)  # sent once: a 5xx comes straight back here
        except HttpStatusError as e:
            if e.status < 500 or attempt == target.client.attempts:
                raise
            # The create may have been applied before the 5xx: look for it again before creating again.
            target.client.backoff_wait(attempt, e.response)
    raise PublishError("could not write the comment")
