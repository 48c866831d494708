#!/usr/bin/env python3
"""The module map of the workspace as Graphviz: one cluster per crate (meshc-ir, meshc-runtime,
meshc-onnx, meshc), a node per module (a file, or a folder's mod.rs; a folder's modules in a
nested cluster, such as the runtime's rooms), an edge where a module names another
of its crate (`crate::x`, `super::x`). Edges between crates are summed up as one edge per pair
of crates, labelled with how many module-to-module uses it stands for: drawn one by one they
hide the structure.

    python3 tools/module_map.py > docs/modules.dot && dot -Tsvg docs/modules.dot -o docs/modules.svg

It reads the source as text (no build needed); tests and benches are left out.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CRATES = [("meshc_ir", "ir/src"), ("meshc_runtime", "runtime/src"), ("meshc_onnx", "onnx/src"), ("meshc", "src")]
PATH = re.compile(r"\b(crate|super|meshc_ir|meshc_runtime|meshc_onnx)((?:::[a-z_][a-z0-9_]*)+)")
USE_GROUP = re.compile(r"\b(crate|super|meshc_ir|meshc_runtime|meshc_onnx)::\{([^}]*)\}")


def modules(src):
    """Module path (tuple) -> file, for every .rs file under src (bin/ left out)."""
    out = {}
    for dirpath, _, files in os.walk(os.path.join(ROOT, src)):
        rel = os.path.relpath(dirpath, os.path.join(ROOT, src))
        if rel.split(os.sep)[0] == "bin":
            continue
        for f in files:
            if not f.endswith(".rs"):
                continue
            parts = [] if rel == "." else rel.split(os.sep)
            # A binary's main.rs beside the library's lib.rs is a crate root of its own.
            bin_root = f == "main.rs" and "lib.rs" in files
            if f not in ("mod.rs", "lib.rs", "main.rs") or bin_root:
                parts.append(f[:-3])
            out[tuple(parts)] = os.path.join(dirpath, f)
    return out


def strip_tests(text):
    """The file without its `#[cfg(test)]` modules (tests may reach anywhere) and comments."""
    i = min((text.find(t) for t in ("#[cfg(test)]\nmod tests", "#[cfg(test)]\npub(crate) mod tests") if t in text), default=-1)
    text = text if i < 0 else text[:i]
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def resolve(mods, path):
    """The longest module prefix of `path` that exists."""
    for n in range(len(path), 0, -1):
        if tuple(path[:n]) in mods:
            return tuple(path[:n])
    return None


def main():
    crates = {name: modules(src) for name, src in CRATES}
    edges = set()
    for name, mods in crates.items():
        for me, file in mods.items():
            if not me:
                continue
            text = strip_tests(open(file, encoding="utf-8").read())
            refs = [(m.group(1), m.group(2).split("::")[1:]) for m in PATH.finditer(text)]
            for m in USE_GROUP.finditer(text):
                for item in m.group(2).split(","):
                    item = item.strip().split("::")
                    if item and item[0] and item[0] != "self":
                        refs.append((m.group(1), item))
            for root, path in refs:
                if root == "crate":
                    crate, target = name, resolve(mods, path)
                elif root == "super":
                    crate, target = name, resolve(mods, list(me[:-1]) + path)
                else:
                    crate, target = root, resolve(crates[root], path)
                if target and (crate, target) != (name, me):
                    edges.add(((name, me), (crate, target)))
    node = lambda c, m: '"%s::%s"' % (c, "::".join(m))
    print("digraph modules {")
    print('  compound=true; rankdir=LR; node [shape=box, fontname="monospace", fontsize=10]; edge [color="#00000055"];')
    def cluster(name, mods, folder, indent):
        """The modules under `folder`, a folder's own in a nested cluster of its own."""
        inside = sorted(m for m in mods if len(m) == len(folder) + 1 and m[: len(folder)] == folder)
        for m in inside:
            if any(len(c) > len(m) and c[: len(m)] == m for c in mods):
                print('%ssubgraph "cluster_%s::%s" { label="%s/";' % (indent, name, "::".join(m), m[-1]))
                print('%s  %s [label="%s"];' % (indent, node(name, m), m[-1]))
                cluster(name, mods, m, indent + "  ")
                print("%s}" % indent)
            else:
                print('%s%s [label="%s"];' % (indent, node(name, m), m[-1]))

    for name, mods in crates.items():
        print('  subgraph "cluster_%s" { label="%s";' % (name, name.replace("_", "-")))
        cluster(name, mods, (), "    ")
        print("  }")
    across = {}
    for (a, b) in sorted(edges):
        if a[0] == b[0]:
            print("  %s -> %s;" % (node(*a), node(*b)))
        else:
            across[(a[0], b[0])] = across.get((a[0], b[0]), 0) + 1
    # A compound edge needs real endpoints: the first module of each cluster stands for it.
    first = {name: sorted(m for m in mods if m)[0] for name, mods in crates.items()}
    for (a, b), n in sorted(across.items()):
        print(
            '  %s -> %s [ltail="cluster_%s", lhead="cluster_%s", color="#1f77b4", penwidth=2, label="%d uses"];'
            % (node(a, first[a]), node(b, first[b]), a, b, n)
        )
    print("}")


if __name__ == "__main__":
    sys.exit(main())
