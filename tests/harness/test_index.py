"""The index client, against a small HTTP server of the test's own (the publish
tests in tests/publish run it against a real pypiserver)."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator

import pytest

from harness.common.errors import PublishError
from harness.publishing import index

FILE = b"the wheel's bytes"
PAGES = {
    "/simple/moe-xarch/": (200, b'<a href="../../files/a-1.0.tar.gz#sha256=abc">a</a>'
                                b'<a href="../../files/moe_xarch-1.0-py3-none-any.whl">w</a>'),
    "/files/moe_xarch-1.0-py3-none-any.whl": (200, FILE),
}


class Pages(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        status, body = PAGES.get(self.path, (404, b""))
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Pages)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def test_the_destination_comes_from_the_environment_alone():
    with pytest.raises(PublishError, match="No destination index"):
        index.destination({})
    dest = index.destination({"TWINE_REPOSITORY_URL": "https://up.example/legacy", "TWINE_PASSWORD": "pw"})
    assert (dest.upload_url, dest.simple_url) == ("https://up.example/legacy", "https://up.example/legacy/simple/")
    assert dest.twine_args == ("--repository-url", "https://up.example/legacy") and "pw" not in repr(dest)
    other = index.destination({"TWINE_REPOSITORY_URL": "https://up.example/", index.INDEX_URL: "https://s.example/x"})
    assert other.simple_url == "https://s.example/x/" and index.INDEX_URL == "MOE_XARCH_INDEX_URL"
    with pytest.raises(PublishError, match="is not an http"):
        index.destination({"TWINE_REPOSITORY_URL": "file:///tmp/index"})


def test_credentials_in_a_url_are_never_shown():
    assert index.redact_url("https://me:pw@up.example:8443/x") == "https://***@up.example:8443/x"
    assert index.redact_url("https://up.example/x") == "https://up.example/x"


def test_what_the_index_holds_by_its_hashes_or_the_files_own(server):
    dest = index.destination({"TWINE_REPOSITORY_URL": server})
    assert index.index_files(dest) == {"a-1.0.tar.gz": "abc",
                                       "moe_xarch-1.0-py3-none-any.whl": hashlib.sha256(FILE).hexdigest()}
    assert index.index_files(dest, project="nothing-here") == {}


def test_an_index_that_does_not_answer_is_one_message():
    dest = index.destination({"TWINE_REPOSITORY_URL": "http://127.0.0.1:9/"})
    with pytest.raises(PublishError, match="is not reachable .*nothing was uploaded"):
        index.index_files(dest, timeout=5)
