"""Post the report on the merge request (GitLab) or pull request (GitHub) of the current CI job, as one
comment updated in place. `memcheck comment` is the command; this is its logic."""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..reports import markdown
from . import github, gitlab
from .base import Comment, Target, upsert
from .http import PublishError

__all__ = ["Comment", "Options", "PublishError", "Target", "detect_platform", "publish", "target_from_env"]


@dataclass
class Options:
    """Overrides of what the CI variables say, for use outside CI (all optional)."""
    platform: str | None = None  # gitlab | github
    api_url: str | None = None
    project: str | None = None  # GitLab project id or path
    mr: str | None = None  # GitLab merge request IID
    repo: str | None = None  # GitHub owner/name
    pr: str | None = None  # GitHub pull request number
    event_path: str | None = None  # GitHub event file
    token_env: str | None = None  # name of the variable holding the token (never the token itself)
    artifact_url: str | None = None  # where the full report lives (linked when the body is shortened)


def detect_platform(env) -> str:
    if env.get("GITLAB_CI") or env.get("CI_API_V4_URL"):
        return "gitlab"
    if env.get("GITHUB_ACTIONS"):
        return "github"
    raise PublishError("not in a GitLab or GitHub CI job: pass --platform gitlab|github with its overrides "
                       "(see memcheck comment --help)")


def default_artifact_url(platform: str, env, event_path=None) -> str | None:
    """The page that lists the measuring job's artifacts: GitLab's pipeline, GitHub's triggering run."""
    if platform == "gitlab":
        return env.get("CI_PIPELINE_URL")
    event = github._load_event(event_path or env.get("GITHUB_EVENT_PATH"))
    run = event.get("workflow_run")
    if isinstance(run, dict) and run.get("html_url"):
        return run["html_url"]
    if env.get("GITHUB_SERVER_URL") and env.get("GITHUB_REPOSITORY") and env.get("GITHUB_RUN_ID"):
        return f"{env['GITHUB_SERVER_URL']}/{env['GITHUB_REPOSITORY']}/actions/runs/{env['GITHUB_RUN_ID']}"
    return None


def target_from_env(env, opts: Options, need_token: bool = True, **client_options) -> Target:
    platform = opts.platform or detect_platform(env)
    if platform == "gitlab":
        s = gitlab.settings_from_env(env, opts.api_url, opts.project, opts.mr, opts.token_env)
        if s.token_variable is None and need_token:
            raise PublishError(gitlab.missing_token_message(env, opts.token_env))
        return gitlab.GitLabTarget(s, env.get(s.token_variable or "", ""), **client_options)
    if platform == "github":
        s = github.settings_from_env(env, opts.api_url, opts.repo, opts.pr, opts.token_env, opts.event_path)
        if s.token_variable is None and need_token:
            raise PublishError(f"GitHub: no token: set {opts.token_env or github.TOKEN_VARIABLE} "
                               "(in a workflow: `env: GITHUB_TOKEN: ${{ secrets.GITHUB_TOKEN }}`)")
        return github.GitHubTarget(s, env.get(s.token_variable or "", ""), **client_options)
    raise PublishError(f"unknown platform {platform!r}: gitlab or github")


def publish(report, opts: Options, env=None, dry_run: bool = False, out=print, **client_options) -> str:
    """Render the report and create or update the memcheck comment; returns the line to print."""
    env = os.environ if env is None else env
    target = target_from_env(env, opts, need_token=not dry_run, **client_options)
    platform = "gitlab" if isinstance(target, gitlab.GitLabTarget) else "github"
    artifact_url = opts.artifact_url or default_artifact_url(platform, env, opts.event_path)
    body = markdown.render(report, artifact_url=artifact_url, limit=target.limit, platform=target.platform)
    if dry_run:
        token = target.settings.token_variable
        auth = f"with the token in {token}" if token else "with no token (none is set; a real run needs one)"
        out(f"memcheck comment (dry run): would create or update the memcheck comment on {target.describe()} {auth}")
        out(f"body ({len(body):,} characters):")
        out(body)
        return "dry run: nothing sent"
    action, comment = upsert(target, body)
    where = comment.url or f"comment {comment.id}"
    return f"memcheck comment: {action} {where} on {target.describe()}"
