"""The index client: where to publish, and what the index already holds.

The destination comes from the environment alone (TWINE_REPOSITORY_URL, or
TWINE_REPOSITORY naming a .pypirc section); there is no default. Credentials
are twine's business (TWINE_USERNAME/TWINE_PASSWORD or a keyring) and are never
printed; here they only read the index's simple (PEP 503) pages.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import html.parser
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from packaging.utils import canonicalize_name

from harness.common.errors import PublishError
from harness.common.project import ENV_PREFIX, NAME

INDEX_URL = f"{ENV_PREFIX}_INDEX_URL"  # the simple page, when it is not <upload URL>/simple/

NO_DESTINATION = (
    "No destination index: nox -s publish never picks one by itself. Set either\n"
    "  TWINE_REPOSITORY_URL=<the index's upload URL>   or\n"
    "  TWINE_REPOSITORY=<a section of your .pypirc>\n"
    "and the credentials as TWINE_USERNAME / TWINE_PASSWORD (or in a keyring).\n"
    f"Set {INDEX_URL} to the index's simple (PEP 503) URL when it is not\n"
    "<upload URL>/simple/. Try it first with: nox -s publish -- --dry-run"
)


@dataclasses.dataclass(frozen=True)
class Destination:
    upload_url: str
    simple_url: str
    twine_args: tuple[str, ...]  # --repository-url URL or --repository NAME
    username: str | None = dataclasses.field(default=None, repr=False)
    password: str | None = dataclasses.field(default=None, repr=False)

    def describe(self) -> str:
        return f"{redact_url(self.upload_url)} (simple index {redact_url(self.simple_url)})"

    def credentials_source(self, env: Mapping[str, str]) -> str:
        if env.get("TWINE_PASSWORD"):
            return "TWINE_USERNAME/TWINE_PASSWORD from the environment"
        if self.password:
            return "the .pypirc section"
        return "a keyring, if one holds them (twine asks it)"


def redact_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password or parts.username:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        return urllib.parse.urlunsplit(parts._replace(netloc=f"***@{host}"))
    return url


def destination(env: Mapping[str, str] = os.environ) -> Destination:
    url = env.get("TWINE_REPOSITORY_URL", "").strip()
    name = env.get("TWINE_REPOSITORY", "").strip()
    username = env.get("TWINE_USERNAME") or None
    password = env.get("TWINE_PASSWORD") or None
    if url:
        twine_args: tuple[str, ...] = ("--repository-url", url)
    elif name:
        from twine import exceptions, utils

        config_file = env.get("TWINE_CONFIG_FILE", utils.DEFAULT_CONFIG_FILE)
        try:
            config = utils.get_repository_from_config(config_file, name)
        except exceptions.InvalidConfiguration as error:
            raise PublishError(f"TWINE_REPOSITORY={name}: {error}") from None
        url = str(config["repository"])
        username = username or config.get("username")
        password = password or config.get("password")
        twine_args = ("--repository", name, "--config-file", config_file)
    else:
        raise PublishError(NO_DESTINATION)
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise PublishError(f"the destination {url!r} is not an http(s) URL")
    simple = env.get(INDEX_URL, "").strip() or url.rstrip("/") + "/simple/"
    return Destination(url, simple.rstrip("/") + "/", twine_args, username, password)


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.links += [value for key, value in attrs if key == "href" and value]


def _open(dest: Destination, url: str, timeout: float) -> Any:
    request = urllib.request.Request(url)
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        if error.code != 401 or not dest.password:
            raise
    token = base64.b64encode(f"{dest.username or ''}:{dest.password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    return urllib.request.urlopen(request, timeout=timeout)


def _refuse_other_server(page: str, landed: str) -> None:
    """A project page sent on to another server lists that server's files, not the
    index's own: pypiserver sends a project it has no files of to PyPI unless
    started with --disable-fallback."""
    if urllib.parse.urlsplit(landed).netloc != urllib.parse.urlsplit(page).netloc:
        raise PublishError(
            f"the index sent {redact_url(page)} on to another server, {redact_url(landed)}, so what is "
            f"listed there is not the index's own; nothing was uploaded. Publish to an index that answers "
            f"for {NAME} itself (pypiserver: start it with --disable-fallback)"
        )


def index_files(dest: Destination, project: str = NAME, timeout: float = 30) -> dict[str, str]:
    """filename -> sha256 of every file of the project on the index."""
    page = dest.simple_url + canonicalize_name(project) + "/"
    try:
        with _open(dest, page, timeout) as response:
            base = response.geturl()
            _refuse_other_server(page, base)
            text = response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        _refuse_other_server(page, error.geturl())
        if error.code == 404:
            return {}
        if error.code in (401, 403):
            raise PublishError(
                f"the index refused to list {project} ({error.code} {error.reason}) at "
                f"{redact_url(page)}: check TWINE_USERNAME/TWINE_PASSWORD"
            ) from None
        raise PublishError(f"the index answered {error.code} {error.reason} for {redact_url(page)}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise PublishError(
            f"the index at {redact_url(dest.simple_url)} is not reachable ({reason}); nothing was uploaded"
        ) from None
    parser = _Links()
    parser.feed(text)
    files: dict[str, str] = {}
    for link in parser.links:
        absolute = urllib.parse.urljoin(base, link)
        path, _, fragment = absolute.partition("#")
        filename = urllib.parse.unquote(path.rsplit("/", 1)[-1])
        algorithm, _, value = fragment.partition("=")
        if algorithm == "sha256" and value:
            files[filename] = value
        else:  # no sha256 in the page: hash the file itself
            digest = hashlib.sha256()
            with _open(dest, path, timeout) as response:
                for block in iter(lambda: response.read(1 << 20), b""):
                    digest.update(block)
            files[filename] = digest.hexdigest()
    return files
