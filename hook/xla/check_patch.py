#!/usr/bin/env python3
"""Checks hook/xla/clockmesh-xla-hook.patch: the new XLA files are exactly
the hook sources, existing XLA files get at most 20 added lines, and the
header names the upstream commit. Exit status 1 on any problem.

`check_patch.py --fix` rewrites the new-file sections from the current hook
sources (run it after editing clockmesh.h or hook/xla/*)."""
import pathlib
import re
import sys

HOOK = pathlib.Path(__file__).resolve().parent.parent
PATCH = HOOK / "xla" / "clockmesh-xla-hook.patch"
SOURCES = {
    "clockmesh.h": HOOK / "include" / "clockmesh.h",
    "clockmesh_xla_hook.h": HOOK / "xla" / "clockmesh_xla_hook.h",
    "clockmesh_xla_hook.cc": HOOK / "xla" / "clockmesh_xla_hook.cc",
    "BUILD": HOOK / "xla" / "BUILD.xla",
}
MAX_ADDED_IN_EXISTING = 20


def sections(text):
    parts = re.split(r"^diff --git ", text, flags=re.M)
    return parts[0], ["diff --git " + p for p in parts[1:]]


def new_file_diff(path, text):
    lines = text.splitlines()
    out = [
        f"diff --git a/{path} b/{path}",
        "new file mode 100644",
        "--- /dev/null",
        f"+++ b/{path}",
        f"@@ -0,0 +1,{len(lines)} @@",
    ]
    return "\n".join(out + ["+" + l for l in lines]) + "\n"


def fix():
    header, diffs = sections(PATCH.read_text())
    out = []
    for d in diffs:
        path = d.split()[3][2:]
        name = pathlib.Path(path).name
        if "new file mode" in d and name in SOURCES:
            d = new_file_diff(path, SOURCES[name].read_text())
        out.append(d)
    PATCH.write_text(header + "".join(out))


def main():
    if "--fix" in sys.argv:
        fix()
    header, diffs = sections(PATCH.read_text())
    problems = []
    if not re.search(r"openxla/xla commit [0-9a-f]{40}", header):
        problems.append("patch header does not name an upstream openxla/xla commit")
    added_existing = 0
    seen_new = set()
    for d in diffs:
        path = d.split()[3][2:]  # b/<path>
        body = [l for l in d.splitlines() if not l.startswith(("+++", "---"))]
        added = [l[1:] for l in body if l.startswith("+")]
        if "new file mode" in d:
            name = pathlib.Path(path).name
            src = SOURCES.get(name)
            if src is None:
                problems.append(f"unexpected new file {path}")
                continue
            seen_new.add(name)
            if "\n".join(added) + "\n" != src.read_text():
                problems.append(f"{path} differs from {src.relative_to(HOOK.parent)}; regenerate the patch")
        else:
            added_existing += len(added)
    missing = set(SOURCES) - seen_new
    if missing:
        problems.append(f"patch lacks new files {sorted(missing)}")
    if added_existing > MAX_ADDED_IN_EXISTING:
        problems.append(f"{added_existing} added lines in existing XLA files (limit {MAX_ADDED_IN_EXISTING})")
    for p in problems:
        print("check_patch:", p, file=sys.stderr)
    print(f"check_patch: {added_existing} added line(s) in existing XLA files, {len(seen_new)} new files in sync")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
