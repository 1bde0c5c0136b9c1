#!/usr/bin/env python3
"""The code footprint of one call: the distinct 64-byte code lines a callgrind profile ran.

Usage: hack/callgrind-footprint.py PROFILE [CRATE]
  PROFILE  one profile of hack/callgrind-plugin.sh run with CALLGRIND_DUMP_INSTR=yes
           (hack/callgrind-calls.sh lists them: one per kubelet prepare call)
  CRATE    also list that crate's functions by their lines (e.g. gpu-dra, h2)

On a machine whose caches are cold when a call arrives, a call's CPU follows the lines it
touches rather than the instructions it runs (docs/architecture.md, "What a wake-up costs").
Lines are attributed to the crate of the function's source file (inlined generics count
where they were inlined from: the standard library's show as std/core).
"""
import collections
import re
import sys


def parse(path):
    """(object, function) -> executed instruction addresses, and each function's file."""
    tables = {"ob": {}, "fl": {}, "fn": {}}
    addrs = collections.defaultdict(set)
    file_of = {}
    ob = fl = fn = None
    last = 0
    after_calls = False

    def name(table, token):
        m = re.match(r"\((\d+)\)(?: (.*))?$", token)
        if not m:
            return token
        if m.group(2) is not None:
            tables[table][m.group(1)] = m.group(2)
        return tables[table].get(m.group(1), m.group(1))

    with open(path, encoding="utf-8", errors="replace") as profile:
        for line in profile:
            line = line.rstrip("\n")
            if not line:
                continue
            if line.startswith("positions:"):
                if "instr" not in line.split():
                    return {}, {}
                continue
            key, _, rest = line.partition("=")
            if key == "ob":
                ob = name("ob", rest)
            elif key in ("fl", "fi", "fe"):
                f = name("fl", rest)
                if key == "fl":
                    fl = f
            elif key == "fn":
                fn = name("fn", rest)
                file_of[fn] = fl
            elif key in ("cob", "cfi", "cfl", "cfn"):
                name({"cob": "ob", "cfn": "fn"}.get(key, "fl"), rest)
            elif key == "calls":
                after_calls = True
            elif line[0] in "0123456789+-*":
                token = line.split()[0]
                if token.startswith("0x"):
                    pos = int(token, 16)
                elif token[0] in "+-":
                    step = int(token[1:], 16) if token[1:3] == "0x" else int(token[1:])
                    pos = last + step if token[0] == "+" else last - step
                elif token == "*":
                    pos = last
                else:
                    pos = int(token)
                last = pos
                # The cost line after `calls=` is the call's inclusive cost at its call site,
                # which the caller's own lines already hold.
                if not after_calls and fn is not None:
                    addrs[(ob, fn)].add(pos)
                after_calls = False
    return addrs, file_of


def crate_of(ob, fn, file_of):
    if ob and "gpu-dra" not in ob:
        return ob.rsplit("/", 1)[-1]
    fl = file_of.get(fn) or ""
    m = re.search(r"index\.crates\.io-[0-9a-f]+/([A-Za-z0-9_\-]+?)-\d", fl)
    if m:
        return m.group(1)
    if "/rustc/" in fl:
        return "std/core"
    if fl.startswith("./") or "libc" in fl:
        return "libc"
    return "gpu-dra" if fl else "?"


def main():
    if len(sys.argv) not in (2, 3) or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) == 2 else 2
    addrs, file_of = parse(sys.argv[1])
    if not addrs:
        print(f"error: {sys.argv[1]} holds no instruction addresses; profile with "
              "CALLGRIND_DUMP_INSTR=yes", file=sys.stderr)
        return 1
    by_crate = collections.defaultdict(set)
    every = set()
    distinct = 0
    for (ob, fn), a in addrs.items():
        crate = crate_of(ob, fn, file_of)
        distinct += len(a)
        for x in a:
            by_crate[crate].add((ob, x >> 6))
            every.add((ob, x >> 6))
    print(f"{sys.argv[1]}: {distinct} distinct instructions on {len(every)} code lines "
          f"({len(every) * 64 / 1024:.0f} KiB)")
    for crate, lines in sorted(by_crate.items(), key=lambda kv: -len(kv[1]))[:25]:
        print(f"  {crate:28s} {len(lines) * 64 / 1024:7.1f} KiB")
    if len(sys.argv) == 3:
        rows = sorted(
            ((len({x >> 6 for x in a}), fn) for (ob, fn), a in addrs.items()
             if crate_of(ob, fn, file_of) == sys.argv[2]),
            reverse=True,
        )
        print(f"{sys.argv[2]}, by function:")
        for n, fn in rows[:40]:
            print(f"  {n * 64 / 1024:6.1f} KiB  {fn[:150]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
