"""The HTTP client both publishers use: retries with backoff, Retry-After honoured, tokens never shown.

- 429, 5xx and connection failures are retried with exponential backoff (1, 2, 4, 8 s, with jitter), or
  after exactly the Retry-After the server asked for (seconds or an HTTP date; GitHub's secondary rate
  limit sends it with a 403). A wait longer than `max_wait` is not waited out: the error says so.
- A POST that failed with 5xx may have been applied anyway, so it is not repeated here: the caller looks
  again for what it tried to create before trying again (see base.upsert).
- Redirects are not followed: a header token (PRIVATE-TOKEN) would travel to wherever they point.
- Every message goes through scrub(): no token, whatever a server echoes back.
"""
from __future__ import annotations

import email.utils
import random
import time
import urllib.parse

import requests
import requests.auth

RETRIED = (429, 500, 502, 503, 504)
USER_AGENT = "memcheck-publisher"


class PublishError(Exception):
    """One line for the user: what failed and what to do. Never holds a token."""


class HttpStatusError(PublishError):
    def __init__(self, message: str, status: int, response: requests.Response | None = None):
        super().__init__(message)
        self.status, self.response = status, response


class _TokenHeaders(requests.auth.AuthBase):
    """The token headers, applied as requests' `auth`: so a ~/.netrc entry never replaces them, while the
    proxy settings of the environment (HTTPS_PROXY, NO_PROXY) still apply."""

    def __init__(self, headers: dict[str, str]):
        self.headers = headers

    def __call__(self, request):
        request.headers.update(self.headers)
        return request


class HttpClient:
    def __init__(self, base_url: str, headers: dict[str, str], secrets: tuple[str, ...] = (), *,
                 platform: str = "the API", attempts: int = 5, backoff_s: float = 1.0, max_wait_s: float = 120.0,
                 timeout_s: float = 30.0, sleep=None, session: requests.Session | None = None):
        self.base_url = base_url.rstrip("/")
        self.secrets = tuple(s for s in secrets if s)
        # Headers carrying a secret go through `auth`; the rest are plain headers.
        secret = {k: v for k, v in headers.items() if any(x in v for x in self.secrets)}
        self.auth = _TokenHeaders(secret)
        self.headers = {"User-Agent": USER_AGENT, **{k: v for k, v in headers.items() if k not in secret}}
        self.platform, self.attempts, self.backoff_s = platform, attempts, backoff_s
        self.max_wait_s, self.timeout_s = max_wait_s, timeout_s
        self.sleep = sleep or (lambda seconds: time.sleep(seconds))
        self.session = session or requests.Session()
        self.waits: list[float] = []  # what it slept, for the caller's message (and the tests)

    def scrub(self, text) -> str:
        text = str(text)
        for secret in self.secrets:
            text = text.replace(secret, "***")
            text = text.replace(urllib.parse.quote(secret, safe=""), "***")
        return text

    def url(self, path_or_url: str) -> str:
        if path_or_url.startswith(("http://", "https://")):
            if _origin(path_or_url) != _origin(self.base_url):
                raise PublishError(self.scrub(f"{self.platform} pointed to {_origin(path_or_url)}, not "
                                              f"{_origin(self.base_url)}: refusing to send the token there"))
            return path_or_url
        return f"{self.base_url}/{path_or_url.lstrip('/')}"

    def request(self, method: str, path_or_url: str, *, json=None, params=None, retry_5xx: bool = True):
        url = self.url(path_or_url)
        what = f"{method} {urllib.parse.urlsplit(url).path}"
        for attempt in range(1, self.attempts + 1):
            try:
                resp = self.session.request(method, url, headers=self.headers, auth=self.auth, json=json,
                                            params=params, timeout=self.timeout_s, allow_redirects=False)
            except requests.RequestException as e:
                if attempt == self.attempts or not retry_5xx:
                    raise PublishError(self.scrub(f"{self.platform} unreachable ({what}): "
                                                  f"{type(e).__name__}: {_first_line(e)}")) from None
                self._wait(self._backoff(attempt))
                continue
            status = resp.status_code
            if status < 300:
                return resp
            if 300 <= status < 400:
                raise HttpStatusError(self.scrub(
                    f"{self.platform} answered {what} with a redirect ({status}) to "
                    f"{resp.headers.get('Location', '?')}: point the API URL at the final address"), status, resp)
            rate_limited = status == 429 or (status == 403 and _rate_limit_exhausted(resp))
            retryable = rate_limited or (status >= 500 and status in RETRIED and retry_5xx)
            if not retryable or attempt == self.attempts:
                if retryable:
                    raise HttpStatusError(self.scrub(
                        f"{self.platform} answered {what} with {status} {resp.reason} {self.attempts} times "
                        f"(waited {sum(self.waits):.0f} s in all): try again later"), status, resp)
                raise HttpStatusError(self.scrub(f"{what}: {status} {resp.reason}: {_server_message(resp)}"),
                                      status, resp)
            wait = retry_after(resp)
            if wait is None:
                wait = self._backoff(attempt)
            if wait > self.max_wait_s:
                raise HttpStatusError(self.scrub(
                    f"{self.platform} is rate limiting {what} ({status}) and asks to wait {wait:.0f} s: "
                    "more than memcheck waits; run the job again later"), status, resp)
            self._wait(wait)
        raise AssertionError("unreachable")

    def _backoff(self, attempt: int) -> float:
        return min(self.max_wait_s, self.backoff_s * 2 ** (attempt - 1)) * random.uniform(0.8, 1.0)

    def _wait(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.sleep(seconds)

    def backoff_wait(self, attempt: int, resp=None) -> None:
        """Wait before the caller's own retry (a create after a 5xx)."""
        wait = retry_after(resp) if resp is not None else None
        self._wait(min(self.max_wait_s, wait if wait is not None else self._backoff(attempt)))


def retry_after(resp) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP date), or from GitHub's rate-limit reset."""
    value = resp.headers.get("Retry-After")
    if value:
        value = value.strip()
        if value.isdigit():
            return float(value)
        try:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, when.timestamp() - time.time())
        except (TypeError, ValueError):
            return None
    if resp.headers.get("x-ratelimit-remaining") == "0" and resp.headers.get("x-ratelimit-reset", "").isdigit():
        return max(0.0, float(resp.headers["x-ratelimit-reset"]) - time.time())
    return None


def _rate_limit_exhausted(resp) -> bool:
    """GitHub answers a rate limit with 403 (not 429), with Retry-After or x-ratelimit-remaining: 0."""
    return "Retry-After" in resp.headers or resp.headers.get("x-ratelimit-remaining") == "0"


def _server_message(resp, limit: int = 200) -> str:
    try:
        data = resp.json()
    except ValueError:
        text = resp.text
    else:
        text = (data.get("message") or data.get("error") or data) if isinstance(data, dict) else data
        if isinstance(text, dict):
            text = "; ".join(f"{k}: {v}" for k, v in text.items())
    text = " ".join(str(text).split())
    return (text[:limit] + "…") if len(text) > limit else (text or "no message")


def _first_line(e) -> str:
    return str(e).splitlines()[0] if str(e) else ""


def _origin(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
