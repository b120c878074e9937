#!/usr/bin/env bash
# Fails when a tracked text file cites a file that is not in the repository, so that docs
# and comments only ever point a reader at something they can open. One line per offence:
#   file:line: cites X which is not in the repository
#
# What counts as a citation:
#   - a file name ending in .md (README.md, docs/DEPLOY.md, ../README.md);
#   - a path under docs/, scripts/ or infra/;
#   - a relative path starting with ../ that leaves the repository, or names a missing
#     file in a directory that exists;
#   - an absolute path into a machine's home or work directory (/work/..., /home/...);
#   - the words "the design brief" (a document that is not in the repository).
# A path is found if it exists relative to the repository root or to the citing file's
# directory, or is ignored by .gitignore (generated: infra/.venv, dist/); a bare file name
# is found if any tracked file has that name; a glob (functions/*/src) must match a
# tracked path. URLs, placeholders (<name>, ..., $VAR, {a,b}) are not citations.
set -euo pipefail
cd "$(dirname "$0")/.."

exec python3 - "$@" <<'PY'
import fnmatch
import os
import re
import subprocess
import sys

SELF = "scripts/check-citations.sh"
tracked = subprocess.run(["git", "ls-files", "-z"], check=True, capture_output=True).stdout
tracked = [p for p in tracked.decode().split("\0") if p]
tracked_set = set(tracked)
dirs = {os.path.dirname(p) for p in tracked}
for d in list(dirs):
    while d:
        d = os.path.dirname(d)
        dirs.add(d)
basenames = {os.path.basename(p) for p in tracked}

URL = re.compile(r"[a-z][a-z0-9+.-]*://[^\s)\]>'\"`]*", re.I)
MD = re.compile(r"(?<![\w./@-])((?:\.{1,2}/)*(?:[\w.-]+/)*[\w.*-]+\.md)(?![\w-])")
UNDER = re.compile(r"(?<![\w./@$-])((?:\.\./)*(?:docs|scripts|infra)/[\w./*-]*[\w*/-])")
PARENT = re.compile(r"(?<![\w./@$-])(\.\./[\w./*-]*[\w*-])")
MACHINE = re.compile(r"(?<![\w.:/-])(/(?:work|home|Users)/[\w./-]*)")
BRIEF = re.compile(r"\bthe design brief\b", re.I)


def ignored(path):
    r = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], capture_output=True)
    return r.returncode == 0


def exists(path):
    path = os.path.normpath(path)
    if path.startswith(".."):
        return False
    if any(c in path for c in "*?["):
        return any(fnmatch.fnmatch(p, path) or fnmatch.fnmatch(p, path + "/*") for p in tracked)
    return path in tracked_set or path in dirs or ignored(path)


def found(cited, source):
    cited = cited.split("#", 1)[0].rstrip("/.") or cited
    here = os.path.dirname(source)
    if "/" not in cited:
        return cited in basenames or any(fnmatch.fnmatch(b, cited) for b in basenames)
    if cited.startswith(".."):
        # Inside the repository, a ../ path is a citation only where its directory exists
        # (`../admin/delete` in a test is data); outside, it always is one.
        target = os.path.normpath(os.path.join(here, cited))
        if target.startswith(".."):
            return False
        return exists(target) or os.path.dirname(target) not in dirs
    return exists(os.path.join(here, cited)) or exists(cited)


def placeholder(token):
    return "..." in token or any(c in token for c in "<>{}$")


offences = 0
for path in tracked:
    if path == SELF or not os.path.isfile(path):
        continue
    with open(path, "rb") as f:
        data = f.read()
    if b"\0" in data:
        continue
    text = data.decode("utf-8", "replace")
    for number, line in enumerate(text.splitlines(), 1):
        line = URL.sub(" ", line)
        cited = set()
        for rx in (MD, UNDER, PARENT):
            for m in rx.finditer(line):
                token = m.group(1)
                if not placeholder(token) and not found(token, path):
                    cited.add(token)
        cited.update(m.group(1) for m in MACHINE.finditer(line))
        cited.update(m.group(0) for m in BRIEF.finditer(line))
        for token in sorted(cited):
            print(f"{path}:{number}: cites {token} which is not in the repository")
            offences += 1

sys.exit(1 if offences else 0)
PY
