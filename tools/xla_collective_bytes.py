#!/usr/bin/env python3
"""Bytes of communication: meshc's plan beside XLA's (GSPMD) for the same program and shardings.

For each case (a testdata graph under a layout spec) this script
  1. builds the graph's computation in jax.numpy, node by node from graph.json, with the
     ops as docs/ops.md defines them, and the params and inputs testdata holds (params
     given by an `init` are generated as meshc does, with tools/gen_testdata.py);
  2. gives every tensor whose layout the spec fixes (the lines `meshc check` prints: inputs
     and params by `in_shardings`, outputs by `out_shardings`, the others by
     `with_sharding_constraint`) the same sharding as a `NamedSharding` over a jax `Mesh` of
     the spec's shape and axis names, made of host devices
     (XLA_FLAGS=--xla_force_host_platform_device_count=8); tensors the spec leaves free are
     left to XLA's propagation, as meshc leaves them to its own;
  3. compiles it with jax.jit, runs it and checks the outputs against testdata's expected/
     (|got - want| <= 1e-5 + 1e-4 |want|): the comparison is about the same program;
  4. counts the bytes of every collective of XLA's optimized HLO (`compiled.as_text()`) and
     of meshc's lowered programs (`meshc compile --dump-after lower`), by one convention.

Convention: the bytes each device sends for one execution of a collective over a group of
n devices, by the standard bandwidth-optimal algorithms, from the per-device result R (in
bytes, what the collective leaves on each device) -- summed over every device that takes
part, so that a collective run by 2 groups of 4 counts 8 times:

    all-reduce          ring (reduce-scatter then all-gather)   2 (n-1)/n * R
    all-gather          ring                                      (n-1)/n * R
    reduce-scatter      ring                                      (n-1)   * R
    all-to-all          direct                                    (n-1)/n * R
    collective-permute  direct, per device that has a target            R
    send (meshc)        direct                                           R

This is not what meshc's fabric puts on its links (`meshc explain` counts forwarded bytes
on a mesh without wrap-around, and small collectives go direct, not by ring); those figures
are shown beside for reference but the comparison is by the convention above, applied the
same way to both sides.

Usage: python tools/xla_collective_bytes.py [--meshc target/release/meshc] [--json OUT]
       [--case GRAPH:LAYOUT ...]
Needs jax and numpy (a venv: python3 -m venv target/jax-venv &&
target/jax-venv/bin/pip install jax numpy). Exit 1 when an output does not match.
"""

import os

# Before jax is imported: one CPU device per mesh device.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_testdata  # noqa: E402  (the init generator meshc uses, and the safetensors reader)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

jax.config.update("jax_enable_x64", False)



def default_cases():
    """The cases of tools/xla_cases.txt: (graph, layout)."""
    with open(os.path.join(ROOT, "tools", "xla_cases.txt")) as f:
        return [tuple(line.split()) for line in f if line.strip() and not line.startswith("#")]

DTYPE = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64, "bool": np.bool_}

# ---------------------------------------------------------------------------------------
# The graph in jax.numpy
# ---------------------------------------------------------------------------------------


def load_values(gdir, graph):
    """The graph's inputs and params as numpy arrays, by name."""
    vals = {}
    st_cache = {}
    for t in graph["inputs"]:
        vals[t["name"]] = np.load(os.path.join(gdir, "inputs", t["name"] + ".npy"))
    for p in graph["params"]:
        dt = DTYPE[p["dtype"]]
        if "file" in p:
            path = os.path.join(gdir, p["file"])
            if path.endswith(".safetensors"):
                if path not in st_cache:
                    with open(path, "rb") as f:
                        st_cache[path] = gen_testdata.read_safetensors(f.read())
                v = st_cache[path][p.get("key", p["name"])]
            else:
                v = np.load(path)
        elif "init" in p:
            v = gen_testdata.init_values(p["init"], p["shape"], p["dtype"])
        elif "value" in p:
            v = np.full(p["shape"], p["value"])
        else:
            raise SystemExit("param %s: no data" % p["name"])
        vals[p["name"]] = np.asarray(v, dtype=dt).reshape(p["shape"])
    return vals


def erf_gelu(x):
    return x * 0.5 * (1.0 + jax.scipy.special.erf(x / math.sqrt(2.0)))


def tanh_gelu(x):
    return x * 0.5 * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def eval_node(node, args):
    """One node, as docs/ops.md defines its op (the ops the MLP and the transformer use)."""
    op, at = node["op"], node.get("attrs", {})
    if op == "matmul":
        return jnp.matmul(args[0], args[1])
    if op in ("add", "mul", "sub", "div"):
        return {"add": jnp.add, "mul": jnp.multiply, "sub": jnp.subtract, "div": jnp.divide}[op](*args)
    if op == "relu":
        return jnp.maximum(args[0], 0)
    if op == "gelu":
        return tanh_gelu(args[0]) if at.get("approximate", "none") == "tanh" else erf_gelu(args[0])
    if op == "softmax":
        x, axis = args[0], at.get("axis", -1)
        e = jnp.exp(x - jnp.max(x, axis=axis, keepdims=True))
        return e / jnp.sum(e, axis=axis, keepdims=True)
    if op == "layer_norm":
        x, g, b = args
        axis = at.get("axis", -1) % x.ndim
        axes = tuple(range(axis, x.ndim))
        mean = jnp.mean(x, axis=axes, keepdims=True)
        var = jnp.mean((x - mean) ** 2, axis=axes, keepdims=True)
        return (x - mean) / jnp.sqrt(var + at.get("eps", 1e-5)) * g + b
    if op == "reshape":
        return jnp.reshape(args[0], at["shape"])
    if op == "transpose":
        return jnp.transpose(args[0], at.get("perm"))
    if op == "gather":
        return jnp.take(args[0], args[1], axis=at.get("axis", 0))
    raise SystemExit("node %s: op %s is not written in jax here" % (node["name"], op))


# ---------------------------------------------------------------------------------------
# Shardings: the layouts `meshc check` says the spec fixes
# ---------------------------------------------------------------------------------------


def fixed_layouts(meshc, graph_path, spec_path):
    """{tensor: [axis name or None per dim]} from `meshc check`'s `layout NAME [..] (..)` lines."""
    out = subprocess.run([meshc, "check", graph_path, "--layout", spec_path], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("meshc check %s --layout %s: %s" % (graph_path, spec_path, out.stderr.strip()))
    layouts = {}
    for line in out.stdout.splitlines():
        m = re.match(r"layout (\S+) \[(.*)\] \((spec|rule)\)$", line)
        if m:
            dims = [d.strip() for d in m.group(2).split(",")] if m.group(2) else []
            layouts[m.group(1)] = [None if d == "-" else d for d in dims]
    return layouts


def sharding(mesh, layout):
    return NamedSharding(mesh, PartitionSpec(*layout))


# ---------------------------------------------------------------------------------------
# Bytes, by the convention of the module doc
# ---------------------------------------------------------------------------------------

ELEM = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s64": 8, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1,
        "i64": 8, "i32": 4, "bool": 1}


def bytes_sent(kind, n, result_bytes):
    """Bytes one member of an n-device group sends for one execution of the collective."""
    if kind == "all-reduce":
        return 2 * (n - 1) * result_bytes // n
    if kind in ("all-gather", "all-to-all"):
        return (n - 1) * result_bytes // n
    if kind == "reduce-scatter":
        return (n - 1) * result_bytes
    if kind in ("collective-permute", "send"):
        return result_bytes
    raise ValueError(kind)


def shape_bytes(text):
    """Bytes of an HLO shape such as `f32[8,32]{1,0}` or a tuple `(f32[8], s32[2])`."""
    total = 0
    for dt, dims in re.findall(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]", text):
        if dt not in ELEM:
            continue
        total += ELEM[dt] * math.prod(int(d) for d in dims.split(",") if d)
    return total


def replica_groups(attrs, ndev):
    """The groups of an HLO collective, in each form XLA prints: explicit `{{0,1},{2,3}}`,
    iota `[2,4]<=[8]` or `[4,2]<=[2,4]T(1,0)`, mesh axes `mesh['a'=2,'b'=4] {'b'}` (a group
    per value of the other axes; devices row-major over the mesh), or `{}` (every device)."""
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
    if m:
        if re.match(r"\s*(<=|T\()", attrs[m.end():]):
            raise SystemExit("replica_groups with a device order: %s" % attrs[:200])
        axes = re.findall(r"'(\w+)'=(\d+)", m.group(1))
        names, sizes = [a for a, _ in axes], [int(n) for _, n in axes]
        inner = re.findall(r"'(\w+)'", m.group(2))
        outer = [a for a in names if a not in inner]
        ids = np.arange(math.prod(sizes)).reshape(sizes).transpose([names.index(a) for a in outer + inner])
        return ids.reshape(-1, math.prod(sizes[names.index(a)] for a in inner)).tolist()
    m = re.search(r"replica_groups=\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?", attrs)
    if m:
        shape = [int(x) for x in m.group(1).split(",")]
        ids = np.arange(math.prod(int(x) for x in m.group(2).split(","))).reshape([int(x) for x in m.group(2).split(",")])
        if m.group(3):
            ids = ids.transpose([int(x) for x in m.group(3).split(",")])
        return ids.reshape(shape).tolist()
    m = re.search(r"replica_groups=\{((?:\{[0-9,]*\},?)*)\}", attrs)
    if m is None:
        raise SystemExit("a collective whose replica_groups this script cannot read: %s" % attrs[:200])
    if m.group(1) == "":
        return [list(range(ndev))]
    return [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([0-9,]*)\}", m.group(1))]


HLO_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT\s+)?(%?[\w.\-]+)\s*=\s*(.+?)\s+"
    r"(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(-start)?\((.*)$")


def xla_collectives(hlo, ndev):
    """Every collective of optimized HLO: (kind, name, result shape, groups, bytes)."""
    rows = []
    for line in hlo.splitlines():
        m = HLO_COLLECTIVE.match(line)
        if not m:
            continue
        name, result, kind, start, rest = m.groups()
        if start:
            # An async start's result is (operand, result[, context]): the result is the 2nd.
            parts = re.findall(r"[a-z]+[0-9]*\[[0-9,]*\]", result)
            result = parts[1] if len(parts) > 1 else parts[0]
        rb = shape_bytes(result)
        if kind == "collective-permute":
            pairs = re.findall(r"\{(\d+),(\d+)\}", rest.split("source_target_pairs=")[1])
            senders = {int(s) for s, t in pairs if s != t}
            total = rb * len(senders)
            groups = [sorted(senders)]
        else:
            groups = replica_groups(rest, ndev)
            total = sum(len(g) * bytes_sent(kind, len(g), rb) for g in groups)
        rows.append({"kind": kind, "name": name.lstrip("%"), "result": re.sub(r"\{[0-9,]*\}", "", result).strip(),
                     "groups": len(groups), "n": len(groups[0]), "bytes": total})
    return rows


MESHC_COLLECTIVE = re.compile(
    r"^\s+(\S+): (\w+)\[([0-9,]*)\] = (all_reduce|all_gather|reduce_scatter|all_to_all|send)\((.*)@(\d+)$")


def meshc_collectives(meshc, graph_path, spec_path):
    """Every collective of meshc's lowered programs (`--dump-after lower`), by the convention:
    (kind, name, result shape, groups, bytes), one row per collective summed over its members."""
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([meshc, "compile", graph_path, "--layout", spec_path, "-o", os.path.join(tmp, "a.mshc"),
                              "--dump-after", "lower", "--dump-dir", tmp], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit("meshc compile %s --layout %s: %s" % (graph_path, spec_path, out.stderr.strip()))
        dumps = [f for f in os.listdir(tmp) if "lower" in f]
        if len(dumps) != 1:
            raise SystemExit("meshc compile --dump-dir wrote %s, not one lower dump" % sorted(os.listdir(tmp)))
        with open(os.path.join(tmp, dumps[0])) as f:
            text = f.read()
    rows = {}
    for line in text.splitlines():
        m = MESHC_COLLECTIVE.match(line)
        if not m:
            continue
        name, dt, dims, op, rest, _dev = m.groups()
        kind = op.replace("_", "-")
        rb = ELEM[dt] * math.prod(int(d) for d in dims.split(",") if d)
        if kind == "send":
            # A send's line carries no type of its own: its operand is the moved tensor.
            raise SystemExit("%s: sends are not counted by this script (a spec with stages)" % spec_path)
        groups = json.loads(re.search(r"groups = (\[\[.*?\]\])", rest).group(1))
        row = rows.setdefault(name, {"kind": kind, "name": name, "result": "%s[%s]" % (dt, dims),
                                     "groups": len(groups), "n": len(groups[0]), "bytes": 0})
        row["bytes"] += bytes_sent(kind, len(groups[0]), rb)
    return list(rows.values())


def meshc_explain(meshc, graph_path, spec_path):
    out = subprocess.run([meshc, "explain", graph_path, "--layout", spec_path, "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("meshc explain %s --layout %s: %s" % (graph_path, spec_path, out.stderr.strip()))
    return json.loads(out.stdout)


# ---------------------------------------------------------------------------------------
# One case
# ---------------------------------------------------------------------------------------


def run_case(meshc, gname, lname):
    gdir = os.path.join(ROOT, "testdata", gname)
    graph_path = os.path.join(gdir, "graph.json")
    spec_path = os.path.join(gdir, "layouts", lname + ".json")
    with open(graph_path) as f:
        graph = json.load(f)
    with open(spec_path) as f:
        spec = json.load(f)
    layouts = fixed_layouts(meshc, graph_path, spec_path)
    vals = load_values(gdir, graph)

    shape, axes = spec["mesh"]["shape"], spec["mesh"]["axes"]
    ndev = math.prod(shape)
    mesh = Mesh(np.array(jax.devices()[:ndev]).reshape(shape), tuple(axes))
    arg_names = [t["name"] for t in graph["inputs"]] + [p["name"] for p in graph["params"]]
    replicated = NamedSharding(mesh, PartitionSpec())
    in_sh = tuple(sharding(mesh, layouts[n]) if n in layouts else replicated for n in arg_names)
    # An output the spec leaves free is left where propagation puts it, as meshc does: with
    # no mesh context, an out_shardings entry None is unspecified (XLA may keep the output
    # split), not replicated.
    out_sh = tuple(sharding(mesh, layouts[o]) if o in layouts else None for o in graph["outputs"])

    def fn(*args):
        env = dict(zip(arg_names, args))
        for node in graph["nodes"]:
            v = eval_node(node, [env[i] for i in node["inputs"]])
            if node["name"] in layouts and node["name"] not in graph["outputs"]:
                v = jax.lax.with_sharding_constraint(v, sharding(mesh, layouts[node["name"]]))
            env[node["name"]] = v
        return tuple(env[o] for o in graph["outputs"])

    args = [jax.device_put(vals[n], s) for n, s in zip(arg_names, in_sh)]
    compiled = jax.jit(fn, in_shardings=in_sh, out_shardings=out_sh).lower(*args).compile()
    hlo = compiled.as_text()
    got = compiled(*args)
    for o, g in zip(graph["outputs"], got):
        want = np.load(os.path.join(gdir, "expected", o + ".npy"))
        g = np.asarray(g)
        if g.shape != want.shape or not np.all(np.abs(g - want) <= 1e-5 + 1e-4 * np.abs(want)):
            raise SystemExit("%s under %s: JAX's %s differs from testdata's expected (max |diff| %g)"
                             % (gname, lname, o, float(np.max(np.abs(g - want)))))

    explain = meshc_explain(meshc, graph_path, spec_path)
    return {
        "graph": gname,
        "layout": lname,
        "mesh": dict(zip(axes, shape)),
        "meshc": meshc_collectives(meshc, graph_path, spec_path),
        "meshc_fabric_bytes": explain["bytes"],
        "xla": xla_collectives(hlo, ndev),
        "hlo": hlo,
    }


def total(rows):
    return sum(r["bytes"] for r in rows)


def print_case(c):
    mesh = " x ".join("%s=%d" % (a, n) for a, n in c["mesh"].items())
    print("== %s under %s (%s)" % (c["graph"], c["layout"], mesh))
    for side in ("meshc", "xla"):
        for r in c[side]:
            print("  %-5s %-18s %-22s %-16s %d group(s) of %d  %8d B" % (
                side, r["kind"], r["name"][:22], r["result"], r["groups"], r["n"], r["bytes"]))
    m, x = total(c["meshc"]), total(c["xla"])
    ratio = "%.2f" % (m / x) if x else ("-" if m == 0 else "inf")
    print("  total: meshc %d B, XLA %d B, meshc/XLA %s  (meshc's fabric, forwarding included: %d B)"
          % (m, x, ratio, c["meshc_fabric_bytes"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--meshc", default=os.path.join(ROOT, "target", "release", "meshc"))
    ap.add_argument("--json", help="write the cases (collectives of both sides) to this file")
    ap.add_argument("--hlo-dir", help="write each case's optimized HLO into this directory")
    ap.add_argument("--case", action="append", help="GRAPH:LAYOUT (repeatable); default: tools/xla_cases.txt")
    a = ap.parse_args()
    cases = [tuple(c.split(":", 1)) for c in a.case] if a.case else default_cases()
    if len(jax.devices()) < 8:
        raise SystemExit("jax sees %d devices, not 8 (XLA_FLAGS)" % len(jax.devices()))
    results = [run_case(a.meshc, g, l) for g, l in cases]
    for c in results:
        print_case(c)
    print()
    print("%-12s %-8s %12s %12s %8s" % ("graph", "layout", "meshc B", "XLA B", "ratio"))
    for c in results:
        m, x = total(c["meshc"]), total(c["xla"])
        print("%-12s %-8s %12d %12d %8s" % (c["graph"], c["layout"], m, x, "%.2f" % (m / x) if x else "-"))
    if a.hlo_dir:
        os.makedirs(a.hlo_dir, exist_ok=True)
        for c in results:
            with open(os.path.join(a.hlo_dir, "%s-%s.hlo.txt" % (c["graph"], c["layout"])), "w") as f:
                f.write(c["hlo"])
    if a.json:
        doc = {"convention": "bytes sent, summed over every member: all-reduce 2(n-1)/n R, all-gather (n-1)/n R, "
                             "reduce-scatter (n-1) R, all-to-all (n-1)/n R, collective-permute/send R "
                             "(R: the per-device result bytes, n: the group size)",
               "jax": jax.__version__,
               "cases": [{k: v for k, v in c.items() if k != "hlo"} | {"meshc_bytes": total(c["meshc"]),
                                                                        "xla_bytes": total(c["xla"])}
                         for c in results]}
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        os.replace(tmp, a.json)


if __name__ == "__main__":
    main()
