"""A small model mirror speaking the part of the Hugging Face Hub protocol that `hf download` uses.

The lab cannot reach the Hub, so model staging is tested against this server through the
same code path as on a fleet (`hf download` with HF_ENDPOINT pointing at a mirror). It serves
a directory laid out as ROOT/<org>/<name>/<commit>/<files>, with ROOT/<org>/<name>/refs/<branch>
holding a commit hash. Python standard library only, so it runs on a bare lab host.

Usage: python3 hf_mirror.py ROOT ADDRESS PORT [BYTES_PER_SECOND]
The optional rate slows every file body down, so a test can interrupt a transfer.
"""

import hashlib
import json
import os
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

COMMIT = re.compile(r"^[0-9a-f]{40}$")
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
CHUNK = 64 * 1024


class Mirror(BaseHTTPRequestHandler):
    root = "."
    rate = 0

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        sys.stderr.write(f"{self.address_string()} {format % args}\n")

    def resolve(self, repo, revision):
        if COMMIT.match(revision) and os.path.isdir(os.path.join(self.root, repo, revision)):
            return revision
        ref = os.path.join(self.root, repo, "refs", revision)
        if os.path.isfile(ref):
            with open(ref, encoding="utf-8") as handle:
                return handle.read().strip()
        return None

    def files(self, repo, commit):
        base = os.path.join(self.root, repo, commit)
        found = []
        for directory, _dirs, names in os.walk(base):
            for name in names:
                path = os.path.join(directory, name)
                found.append(os.path.relpath(path, base))
        return sorted(found)

    def entry(self, repo, commit, relative):
        path = os.path.join(self.root, repo, commit, relative)
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            content = handle.read()
        blob = hashlib.sha1(b"blob %d\0" % size + content).hexdigest()
        item = {"type": "file", "oid": blob, "size": size, "path": relative}
        if relative.endswith(LFS_SUFFIXES):
            item["lfs"] = {"oid": hashlib.sha256(content).hexdigest(), "size": size, "pointerSize": 134}
        return item

    def send_json(self, value, status=200):
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def not_found(self, what):
        self.send_response(404)
        self.send_header("X-Error-Code", "RevisionNotFound" if "revision" in what else "EntryNotFound")
        self.send_header("X-Error-Message", what)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self):  # noqa: N802 - http.server's naming
        self.do_GET()

    def do_GET(self):  # noqa: N802 - http.server's naming
        path = unquote(urlparse(self.path).path)
        api = re.match(r"^/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)(?:/(.*))?$", path)
        if api:
            repo, kind, revision, _subpath = api.groups()
            commit = self.resolve(repo, revision)
            if commit is None:
                return self.not_found(f"revision {revision} of {repo}")
            if kind == "revision":
                siblings = [{"rfilename": f} for f in self.files(repo, commit)]
                return self.send_json({"id": repo, "modelId": repo, "sha": commit, "siblings": siblings, "private": False})
            return self.send_json([self.entry(repo, commit, f) for f in self.files(repo, commit)])
        download = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if not download:
            return self.not_found(f"path {path}")
        repo, revision, relative = download.groups()
        commit = self.resolve(repo, revision)
        if commit is None:
            return self.not_found(f"revision {revision} of {repo}")
        full = os.path.join(self.root, repo, commit, relative)
        if not os.path.isfile(full):
            return self.not_found(f"file {relative}")
        return self.send_file(repo, commit, relative, full)

    def send_file(self, repo, commit, relative, full):
        item = self.entry(repo, commit, relative)
        size = item["size"]
        start = 0
        ranged = re.match(r"^bytes=(\d+)-$", self.headers.get("Range", ""))
        if ranged and self.command == "GET":
            start = min(int(ranged.group(1)), size)
        self.send_response(206 if start else 200)
        etag = item["lfs"]["oid"] if "lfs" in item else item["oid"]
        self.send_header("ETag", f'"{etag}"')
        self.send_header("X-Repo-Commit", commit)
        if "lfs" in item:
            self.send_header("X-Linked-Etag", f'"{etag}"')
            self.send_header("X-Linked-Size", str(size))
        self.send_header("Content-Length", str(size - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.end_headers()
        if self.command == "HEAD":
            return
        with open(full, "rb") as handle:
            handle.seek(start)
            while True:
                block = handle.read(CHUNK)
                if not block:
                    break
                self.wfile.write(block)
                if self.rate:
                    time.sleep(len(block) / self.rate)


def main():
    Mirror.root = sys.argv[1]
    Mirror.rate = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    ThreadingHTTPServer((sys.argv[2], int(sys.argv[3])), Mirror).serve_forever()


if __name__ == "__main__":
    main()
