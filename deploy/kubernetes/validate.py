"""Offline checks of the clockmesh Kubernetes manifests (run by test.sh).

1. Render deploy/kubernetes (kustomization: `resources` only) in Python, and
   with `kubectl kustomize` where kubectl exists; both must agree. kubectl
   also renders the overlays deploy/overlays/gpu-nodes and
   deploy/overlays/privileged (the `privileged: true` switch).
2. Schema-validate every rendered document, the overlays and the example
   training pod with `kubernetes-validate --strict` for each Kubernetes
   version in K8S_VERSIONS.
3. Check our own invariants (security context, probes, RBAC, wiring between
   objects) that a schema cannot express.
4. Negative tests: broken copies must fail (schema or invariants).
5. The ConfigMap's config file and the DaemonSet's environment must be
   accepted by the agent's own configuration parser (`clockmesh config`).

Usage: validate.py --kubernetes-validate BIN [--clockmesh BIN]
Prints one PASS/FAIL line per check and a closing "N passed, N failed".
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
OVERLAY = REPO / "deploy" / "overlays" / "gpu-nodes"
PRIVILEGED_OVERLAY = REPO / "deploy" / "overlays" / "privileged"
TRAINING_POD = HERE / "examples" / "training-pod.yaml"
K8S_VERSIONS = os.environ.get("K8S_VERSIONS", "1.30 1.37").split()

NAMESPACE = "clockmesh"
SELECTOR = "app.kubernetes.io/name=clockmesh"
LEASE = "clockmesh-leader"
CAPS = {"BPF", "PERFMON", "NET_ADMIN", "SYS_RESOURCE"}
# The only permissions the agent may have: resource -> verbs.
RBAC = {
    ("", "pods"): {"get", "list", "watch", "patch"},
    ("coordination.k8s.io", "leases"): {"get", "create", "update", "patch"},
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass"}
# Keys the agent's config file accepted before issue 7 (agent/src/config.rs);
# the ConfigMap keeps to these so an older agent still reads it.
FILE_KEYS = {
    "enabled", "interface", "node_name", "probe_port", "probe_cadence_us",
    "packet_spacing_us", "probe_window_s", "degree", "output_dir",
    "offsets_path", "metrics_addr", "snapshot_period_ms", "auth_key_file",
}


class Results:
    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def check(self, name: str, fn) -> None:
        """Runs fn(); an AssertionError (or any error) is a failure."""
        try:
            detail = fn()
        except Exception as e:  # noqa: BLE001 - report every failure the same way
            self.failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {e}")
        else:
            self.passed += 1
            print(f"PASS  {name}" + (f" ({detail})" if detail else ""))


# ---------------------------------------------------------------- rendering


def load_docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def render_python(root: Path) -> list[dict]:
    """kustomize for the subset our base uses: resources, in order."""
    kust = yaml.safe_load((root / "kustomization.yaml").read_text())
    extra = set(kust) - {"apiVersion", "kind", "resources"}
    assert not extra, f"kustomization uses {sorted(extra)}; the Python renderer only knows `resources`"
    docs: list[dict] = []
    for res in kust["resources"]:
        docs += load_docs((root / res).read_text())
    return docs


def kubectl() -> str | None:
    return shutil.which("kubectl")


def render_kubectl(root: Path) -> list[dict]:
    out = subprocess.run([kubectl(), "kustomize", str(root)], check=True, capture_output=True, text=True)
    return load_docs(out.stdout)


def ident(d: dict) -> tuple[str, str, str]:
    m = d.get("metadata", {})
    return (d["kind"], m.get("namespace", ""), m["name"])


def by_ident(docs: list[dict]) -> dict:
    return {ident(d): d for d in docs}


def one(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


# --------------------------------------------------------- schema validation


def schema_validate(kv: str, docs: list[dict], version: str, tmp: Path, label: str) -> tuple[bool, str]:
    path = tmp / f"{label}.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    r = subprocess.run([kv, "--strict", "--quiet", "-k", version, str(path)], capture_output=True, text=True)
    return r.returncode == 0, (r.stdout + r.stderr).strip()


# ------------------------------------------------------------------ invariants


def container(ds: dict) -> dict:
    cs = ds["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in cs] == ["agent"], f"containers {[c['name'] for c in cs]}"
    return cs[0]


def env_of(c: dict) -> dict:
    return {e["name"]: e for e in c.get("env", [])}


def selector_labels(s: str) -> dict:
    return dict(kv.split("=", 1) for kv in s.split(","))


def check_security(ds: dict, privileged: bool = False) -> str:
    """The base: not privileged. The privileged overlay: privileged, and
    allowPrivilegeEscalation true (the API server rejects false with it)."""
    pod = ds["spec"]["template"]["spec"]
    assert pod.get("hostNetwork") is True, "hostNetwork must be true"
    assert pod.get("dnsPolicy") == "ClusterFirstWithHostNet", "dnsPolicy must be ClusterFirstWithHostNet"
    assert not pod.get("hostPID") and not pod.get("hostIPC"), "no hostPID/hostIPC"
    sc = container(ds)["securityContext"]
    assert sc.get("privileged") is privileged, f"privileged must be {str(privileged).lower()}"
    assert sc.get("allowPrivilegeEscalation") is privileged, (
        f"allowPrivilegeEscalation must be {str(privileged).lower()}"
    )
    assert sc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem must be true"
    assert sc.get("runAsUser") == 0, "runAsUser must be 0"
    caps = sc["capabilities"]
    added = caps.get("add", [])
    assert len(added) == len(set(added)) and set(added) == CAPS, f"capabilities.add {added} != {sorted(CAPS)}"
    assert caps.get("drop") == ["ALL"], f"capabilities.drop {caps.get('drop')} != ['ALL']"
    assert "securityContext" not in pod or not pod["securityContext"].get("privileged"), "pod-level privileged"
    return ("privileged; " if privileged else "") + "add " + ",".join(added) + "; drop ALL"


def check_lifecycle(ds: dict) -> str:
    spec = ds["spec"]
    pod = spec["template"]["spec"]
    grace = pod.get("terminationGracePeriodSeconds", 30)
    assert grace >= 30, f"terminationGracePeriodSeconds {grace} < 30"
    assert pod.get("priorityClassName") == "system-node-critical", "priorityClassName"
    us = spec["updateStrategy"]
    assert us["type"] == "RollingUpdate", "updateStrategy.type"
    ru = us["rollingUpdate"]
    assert ru.get("maxUnavailable") == "10%", "maxUnavailable must be 10%"
    # Explicit, not left to the default: two agents on one node would fight
    # over host UDP port 31900 and the interface's TC hooks.
    assert "maxSurge" in ru and ru["maxSurge"] in (0, "0", "0%"), "maxSurge must be set to 0 (one agent per node)"
    tol = {(t["key"], t.get("operator"), t.get("effect")) for t in pod.get("tolerations", [])}
    for key in ("nvidia.com/gpu", "amd.com/gpu"):
        assert (key, "Exists", "NoSchedule") in tol, f"no toleration for {key}:NoSchedule"
    return f"grace {grace}s, maxUnavailable 10%, maxSurge 0, GPU taints tolerated"


def check_probes_ports(ds: dict) -> str:
    c = container(ds)
    ports = {p["name"]: p for p in c["ports"]}
    assert ports["probe"]["containerPort"] == 31900 and ports["probe"]["protocol"] == "UDP", "probe port"
    assert ports["metrics"]["containerPort"] == 9977 and ports["metrics"].get("protocol", "TCP") == "TCP", "metrics"
    for p in ports.values():
        # With hostNetwork the API server rejects hostPort != containerPort.
        assert p.get("hostPort", p["containerPort"]) == p["containerPort"], f"hostPort of {p['name']}"
    want = {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    for probe, path in want.items():
        g = c[probe]["httpGet"]
        assert g["path"] == path, f"{probe} path {g['path']} != {path}"
        assert g["port"] in ("metrics", 9977), f"{probe} port {g['port']}"
    ann = ds["spec"]["template"]["metadata"]["annotations"]
    assert ann.get("prometheus.io/scrape") == "true", "prometheus.io/scrape"
    assert ann.get("prometheus.io/port") == "9977", "prometheus.io/port"
    r = c["resources"]
    assert r["requests"] == {"cpu": "20m", "memory": "64Mi"}, f"requests {r['requests']}"
    assert r["limits"] == {"memory": "256Mi"}, f"limits {r['limits']} (memory only, no CPU limit)"
    assert c.get("args") == ["agent"], f"args {c.get('args')}"
    return "probe 31900/UDP, metrics 9977/TCP, /healthz /readyz, requests 20m/64Mi, limit 256Mi"


def check_env(ds: dict, cm: dict, base: bool) -> str:
    c = container(ds)
    env = env_of(c)
    field = {
        "CLOCKMESH_NODE_NAME": "spec.nodeName",
        "CLOCKMESH_ADVERTISE_ADDR": "status.hostIP",
        "CLOCKMESH_KUBE_NAMESPACE": "metadata.namespace",
        "NODE_NAME": "spec.nodeName",
        "HOST_IP": "status.hostIP",
        # The agent annotates its own pod; with hostNetwork HOSTNAME is the node's name.
        "POD_NAME": "metadata.name",
    }
    for name, path in field.items():
        if name == "CLOCKMESH_ADVERTISE_ADDR" and not base and name not in env:
            continue  # an overlay probing on another interface drops it
        got = env[name]["valueFrom"]["fieldRef"]["fieldPath"]
        assert got == path, f"{name} from {got}, want {path}"
    literal = {
        "CLOCKMESH_DISCOVERY": "kubernetes",
        "CLOCKMESH_KUBE_SELECTOR": SELECTOR,
        "CLOCKMESH_KUBE_LEASE": LEASE,
        "CLOCKMESH_METRICS_ADDR": "0.0.0.0:9977",
        "CLOCKMESH_AUTH_KEY_FILE": "/etc/clockmesh/auth/key",
        "CLOCKMESH_CONFIG": "/etc/clockmesh/config.toml",
    }
    for name, value in literal.items():
        assert env[name].get("value") == value, f"{name}={env[name].get('value')!r}, want {value!r}"
    ref = env["CLOCKMESH_INTERFACE"]["valueFrom"]["configMapKeyRef"]
    assert ref["name"] == cm["metadata"]["name"] and ref["key"] in cm["data"], "CLOCKMESH_INTERFACE ConfigMap ref"
    # The discovery selector must pick exactly the DaemonSet's pods.
    labels = ds["spec"]["template"]["metadata"]["labels"]
    for k, v in selector_labels(SELECTOR).items():
        assert labels.get(k) == v, f"pod template lacks {k}={v}"
    for k, v in ds["spec"]["selector"]["matchLabels"].items():
        assert labels.get(k) == v, f"DaemonSet selector {k}={v} not on the template"
    return f"{len(env)} variables; selector {SELECTOR} matches the pod template"


def mounts(ds: dict) -> dict:
    return {m["mountPath"]: m for m in container(ds)["volumeMounts"]}


def volumes(ds: dict) -> dict:
    return {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}


def check_volumes(ds: dict, cm: dict) -> str:
    ms, vs = mounts(ds), volumes(ds)
    for m in ms.values():
        assert m["name"] in vs, f"mount {m['mountPath']} has no volume {m['name']}"
    run = vs[ms["/run/clockmesh"]["name"]]["hostPath"]
    assert run == {"path": "/run/clockmesh", "type": "DirectoryOrCreate"}, f"/run/clockmesh volume {run}"
    assert not ms["/run/clockmesh"].get("readOnly"), "the agent writes /run/clockmesh"
    btf = ms["/sys/kernel/btf"]
    assert btf.get("readOnly") is True and vs[btf["name"]]["hostPath"]["path"] == "/sys/kernel/btf", "BTF mount"
    assert "/var/lib/clockmesh" in ms, "no /var/lib/clockmesh mount"
    auth = ms["/etc/clockmesh/auth"]
    secret = vs[auth["name"]]["secret"]
    assert auth.get("readOnly") is True, "auth mount must be read-only"
    assert secret["secretName"] == "clockmesh-auth" and secret.get("optional") is True, f"auth secret {secret}"
    assert [i["key"] for i in secret.get("items", [{"key": "key"}])] == ["key"], "auth secret key must be `key`"
    conf = ms["/etc/clockmesh/config.toml"]
    cmv = vs[conf["name"]]["configMap"]
    assert cmv["name"] == cm["metadata"]["name"], "config volume ConfigMap"
    assert conf.get("subPath") == "config.toml" and "config.toml" in cm["data"], "config.toml subPath"
    for path, m in ms.items():
        hp = vs[m["name"]].get("hostPath")
        if hp:  # every host path is one we meant to share
            assert hp["path"] in {"/run/clockmesh", "/sys/kernel/btf", "/var/lib/clockmesh", "/sys/fs/bpf"}, hp
    return f"{len(ms)} mounts, auth Secret optional"


def check_config_file(ds: dict, cm: dict) -> str:
    conf = tomllib.loads(cm["data"]["config.toml"])
    unknown = set(conf) - FILE_KEYS
    assert not unknown, f"config.toml has keys the agent's file parser rejects: {sorted(unknown)}"
    ms = mounts(ds)
    ports = {p["name"]: p for p in container(ds)["ports"]}
    assert conf["probe_port"] == ports["probe"]["containerPort"], "probe_port != DaemonSet probe port"
    assert str(Path(conf["offsets_path"]).parent) in ms, f"offsets_path {conf['offsets_path']} not on a mount"
    assert conf["output_dir"] in ms, f"output_dir {conf['output_dir']} not a mount"
    assert cm["data"]["interface"].strip(), "interface must not be empty"
    return f"keys {sorted(conf)}"


def check_rbac(docs: list[dict], ds: dict) -> str:
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding"}, "no cluster-wide RBAC expected"
    role = one(docs, "Role")
    seen: dict = {}
    for rule in role["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule.get(field, []), f"wildcard in {field}: {rule}"
        assert not rule.get("nonResourceURLs"), "nonResourceURLs"
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                seen.setdefault((g, r), set()).update(rule["verbs"])
    assert seen == RBAC, f"RBAC {seen} != {RBAC}"
    rb = one(docs, "RoleBinding")
    sa = one(docs, "ServiceAccount")
    assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    assert rb["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": sa["metadata"]["namespace"]}
    ], f"subjects {rb['subjects']}"
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"], "serviceAccountName"
    return "pods get/list/watch/patch; leases get/create/update/patch; namespaced"


def check_namespace_service(docs: list[dict], ds: dict) -> str:
    ns = one(docs, "Namespace")
    assert ns["metadata"]["name"] == NAMESPACE
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged", "PSA label"
    for d in docs:
        if d["kind"] not in CLUSTER_SCOPED:
            assert d["metadata"].get("namespace") == NAMESPACE, f"{ident(d)} not in {NAMESPACE}"
    svc = one(docs, "Service")["spec"]
    assert svc["clusterIP"] == "None" and svc["publishNotReadyAddresses"] is True, "headless, not-ready addresses"
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in svc["selector"].items()), "Service selector misses the pods"
    names = {p["name"] for p in container(ds)["ports"]}
    assert {p["targetPort"] for p in svc["ports"]} <= names, "Service targetPort not a container port"
    return "PSA enforce=privileged; headless Service selects the agents"


def check_training_pod(pod: dict) -> str:
    c = pod["spec"]["containers"][0]
    env = env_of(c)
    assert env["CLOCKMESH_OFFSETS_PATH"]["value"] == "/run/clockmesh/offsets", "CLOCKMESH_OFFSETS_PATH"
    m = next(m for m in c["volumeMounts"] if m["mountPath"] == "/run/clockmesh")
    assert m.get("readOnly") is True, "training pods must mount /run/clockmesh read-only"
    v = next(v for v in pod["spec"]["volumes"] if v["name"] == m["name"])
    assert v["hostPath"]["path"] == "/run/clockmesh", "hostPath"
    labels = pod["metadata"].get("labels", {})
    assert not all(labels.get(k) == val for k, val in selector_labels(SELECTOR).items()), "selected as an agent"
    return "/run/clockmesh read-only, CLOCKMESH_OFFSETS_PATH set"


def invariants(docs: list[dict], base: bool = True, privileged: bool = False) -> list[tuple[str, object]]:
    """Checks of deploy/kubernetes (base) or of an overlay built on it."""
    ds, cm = one(docs, "DaemonSet"), one(docs, "ConfigMap")
    return [
        ("hostNetwork, security context, capabilities", lambda: check_security(ds, privileged)),
        ("grace period, priority, rollout, tolerations", lambda: check_lifecycle(ds)),
        ("ports, probes, metrics annotations, resources", lambda: check_probes_ports(ds)),
        ("environment and discovery selector", lambda: check_env(ds, cm, base)),
        ("volumes and mounts", lambda: check_volumes(ds, cm)),
        ("ConfigMap config.toml", lambda: check_config_file(ds, cm)),
        ("RBAC minimal, no wildcards", lambda: check_rbac(docs, ds)),
        ("Namespace and headless Service", lambda: check_namespace_service(docs, ds)),
    ]


def invariants_fail(docs: list[dict]) -> str:
    """All invariants of docs, expecting at least one to fail."""
    failures = []
    for name, fn in invariants(docs):
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            failures.append(f"{name}: {e}")
    assert failures, "every invariant passed on a broken copy"
    return "rejected: " + "; ".join(failures)


# ----------------------------------------------------------- negative copies


def mutated(docs: list[dict], kind: str, fn) -> list[dict]:
    out = copy.deepcopy(docs)
    fn(one(out, kind))
    return out


def pod_spec(ds: dict) -> dict:
    return ds["spec"]["template"]["spec"]


def set_host_network_yes(ds: dict) -> None:
    pod_spec(ds)["hostNetwork"] = "yes"


def unknown_container_field(ds: dict) -> None:
    pod_spec(ds)["containers"][0]["hostNetwork"] = True  # a pod field, misplaced


def typo_max_unavailable(ds: dict) -> None:
    ru = ds["spec"]["updateStrategy"]["rollingUpdate"]
    ru["maxUnavailabl"] = ru.pop("maxUnavailable")


def add_sys_admin(ds: dict) -> None:
    pod_spec(ds)["containers"][0]["securityContext"]["capabilities"]["add"].append("SYS_ADMIN")


def short_grace(ds: dict) -> None:
    pod_spec(ds)["terminationGracePeriodSeconds"] = 1


def wildcard_verbs(role: dict) -> None:
    role["rules"][0]["verbs"] = ["*"]


def surge_one(ds: dict) -> None:
    ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] = 1


def no_pod_name(ds: dict) -> None:
    c = pod_spec(ds)["containers"][0]
    c["env"] = [e for e in c["env"] if e["name"] != "POD_NAME"]


def no_pod_patch(role: dict) -> None:
    for rule in role["rules"]:
        if "pods" in rule["resources"]:
            rule["verbs"] = [v for v in rule["verbs"] if v != "patch"]


def privileged_base(ds: dict) -> None:
    sc = pod_spec(ds)["containers"][0]["securityContext"]
    sc["privileged"] = True
    sc["allowPrivilegeEscalation"] = True


# ------------------------------------------------------- the agent's parser


def env_for_agent(ds: dict, cm: dict, config_path: Path) -> dict:
    """The DaemonSet's environment as the kubelet would set it on a node."""
    downward = {
        "spec.nodeName": "node-a",
        "status.hostIP": "198.18.0.1",
        "metadata.namespace": NAMESPACE,
        "metadata.name": "clockmesh-agent-x7k2p",
    }
    env = {}
    for e in container(ds)["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "fieldRef" in e["valueFrom"]:
            env[e["name"]] = downward[e["valueFrom"]["fieldRef"]["fieldPath"]]
        elif "configMapKeyRef" in e["valueFrom"]:
            env[e["name"]] = cm["data"][e["valueFrom"]["configMapKeyRef"]["key"]]
        else:
            raise AssertionError(f"unhandled env source for {e['name']}")
    env["CLOCKMESH_CONFIG"] = str(config_path)
    return env


def run_agent_config(clockmesh: str, env: dict) -> dict:
    """`clockmesh config --json` under exactly `env`: key -> {value, source}."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "RUST_LOG": "warn"}
    r = subprocess.run([clockmesh, "config", "--json"], env={**base, **env}, capture_output=True, text=True)
    assert r.returncode == 0, (r.stdout + r.stderr).strip().splitlines()[-1:] or r.returncode
    return json.loads(r.stdout)


def from_source(effective: dict, kind: str) -> dict:
    """{key: source name} for every key whose value came from `kind` (env, file)."""
    out = {}
    for key, v in effective.items():
        src = v.get("source") if isinstance(v, dict) else None
        if isinstance(src, dict) and src.get("kind") == kind:
            out[key] = src.get("name")
    return out


def check_agent_file(clockmesh: str, cm: dict, conf: Path) -> str:
    env = {"CLOCKMESH_CONFIG": str(conf), "CLOCKMESH_INTERFACE": cm["data"]["interface"]}
    from_file = set(from_source(run_agent_config(clockmesh, env), "file"))
    want = set(tomllib.loads(cm["data"]["config.toml"]))
    assert from_file == want, f"keys taken from the file {sorted(from_file)} != {sorted(want)}"
    return f"{len(want)} keys from the file"


def check_agent_env(clockmesh: str, ds: dict, cm: dict, conf: Path) -> str:
    env = env_for_agent(ds, cm, conf)
    effective = run_agent_config(clockmesh, env)
    used = {name: key for key, name in from_source(effective, "env").items()}
    # Every CLOCKMESH_* variable the DaemonSet sets must be one the agent
    # reads (CLOCKMESH_CONFIG names the file: its keys show as file sources).
    ignored = sorted(n for n in env if n.startswith("CLOCKMESH_") and n != "CLOCKMESH_CONFIG" and n not in used)
    assert not ignored, f"the agent ignores {ignored}"
    assert from_source(effective, "file"), "no key came from CLOCKMESH_CONFIG's file"
    # Kubernetes discovery, configured from the DaemonSet's environment.
    want = {
        "discovery": ("kubernetes", "CLOCKMESH_DISCOVERY"),
        "kube_namespace": (NAMESPACE, "CLOCKMESH_KUBE_NAMESPACE"),
        "kube_selector": (SELECTOR, "CLOCKMESH_KUBE_SELECTOR"),
        "kube_lease": (LEASE, "CLOCKMESH_KUBE_LEASE"),
        "node_name": ("node-a", "CLOCKMESH_NODE_NAME"),
    }
    for key, (value, var) in want.items():
        got = effective[key]
        assert (got["value"], got["source"]) == (value, {"kind": "env", "name": var}), f"{key}: {got}"
    return f"{len(used)} variables read: " + ", ".join(f"{k}<-{n}" for n, k in sorted(used.items()))


# ---------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubernetes-validate", required=True, dest="kv")
    ap.add_argument("--clockmesh", help="clockmesh binary for the configuration checks")
    a = ap.parse_args()
    res = Results()
    tmp = Path(tempfile.mkdtemp(prefix="clockmesh-k8s-"))
    try:
        docs = render_python(HERE)
        print(f"rendered deploy/kubernetes: {', '.join('/'.join(i[::2]) for i in map(ident, docs))}")
        if kubectl():
            def same_render():
                theirs, ours = by_ident(render_kubectl(HERE)), by_ident(docs)
                differ = sorted(k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k))
                assert not differ, f"objects render differently: {differ}"
                return f"{len(ours)} objects"

            res.check("kubectl kustomize renders the same objects as the Python renderer", same_render)
        else:
            print("SKIP  kubectl not found: rendered with the Python renderer only")

        overlay = None
        if kubectl():
            def render_overlay():
                nonlocal overlay
                overlay = render_kubectl(OVERLAY)
                return f"{len(overlay)} objects"

            res.check("kubectl kustomize renders deploy/overlays/gpu-nodes", render_overlay)

        privileged = None
        if kubectl():
            def render_privileged():
                nonlocal privileged
                privileged = render_kubectl(PRIVILEGED_OVERLAY)
                return f"{len(privileged)} objects"

            res.check("kubectl kustomize renders deploy/overlays/privileged", render_privileged)
        pod = load_docs(TRAINING_POD.read_text())
        for v in K8S_VERSIONS:
            def ok(d, label, v=v):
                good, msg = schema_validate(a.kv, d, v, tmp, label)
                assert good, msg
                return f"{len(d)} documents"

            res.check(f"kubernetes-validate --strict -k {v}: deploy/kubernetes", lambda: ok(docs, "base"))
            res.check(f"kubernetes-validate --strict -k {v}: examples/training-pod.yaml", lambda: ok(pod, "pod"))
            if overlay is not None:
                res.check(f"kubernetes-validate --strict -k {v}: deploy/overlays/gpu-nodes", lambda: ok(overlay, "ov"))
            if privileged is not None:
                res.check(f"kubernetes-validate --strict -k {v}: deploy/overlays/privileged",
                          lambda: ok(privileged, "priv"))

        for name, fn in invariants(docs):
            res.check(f"invariant: {name}", fn)
        res.check("invariant: examples/training-pod.yaml", lambda: check_training_pod(pod[0]))
        if overlay is not None:
            def overlay_ok():
                ds, cm = one(overlay, "DaemonSet"), one(overlay, "ConfigMap")
                assert pod_spec(ds)["nodeSelector"].get("nvidia.com/gpu.present") == "true", "GPU nodeSelector"
                assert container(ds)["image"].startswith("registry.example.com/"), "image not replaced"
                assert cm["data"]["interface"] != "eth0", "interface not replaced"
                assert "CLOCKMESH_ADVERTISE_ADDR" not in env_of(container(ds)), "still advertises status.hostIP"
                for name, fn in invariants(overlay, base=False):
                    fn()
                return "image, interface, nodeSelector, advertise address; every invariant holds"

            res.check("invariant: deploy/overlays/gpu-nodes", overlay_ok)
        if privileged is not None:
            def privileged_ok():
                for name, fn in invariants(privileged, privileged=True):
                    fn()
                sc = container(one(privileged, "DaemonSet"))["securityContext"]
                return f"privileged: {str(sc['privileged']).lower()}; every other invariant holds"

            res.check("invariant: deploy/overlays/privileged", privileged_ok)

        # Negative tests: each broken copy must be rejected.
        v = K8S_VERSIONS[-1]
        schema_breaks = [
            ('hostNetwork: "yes"', set_host_network_yes),
            ("unknown field `hostNetwork` under the container", unknown_container_field),
            ("typo `maxUnavailabl`", typo_max_unavailable),
        ]
        for label, fn in schema_breaks:
            def must_fail(fn=fn):
                good, msg = schema_validate(a.kv, mutated(docs, "DaemonSet", fn), v, tmp, "broken")
                assert not good, "validation passed a broken DaemonSet"
                return "rejected: " + msg.splitlines()[-1].split(": ", 2)[-1]

            res.check(f"negative: schema rejects {label}", must_fail)
        res.check("negative: invariants reject capability SYS_ADMIN",
                  lambda: invariants_fail(mutated(docs, "DaemonSet", add_sys_admin)))
        res.check("negative: invariants reject a 1 s grace period",
                  lambda: invariants_fail(mutated(docs, "DaemonSet", short_grace)))
        res.check("negative: invariants reject RBAC verb `*`",
                  lambda: invariants_fail(mutated(docs, "Role", wildcard_verbs)))
        res.check("negative: invariants reject maxSurge 1",
                  lambda: invariants_fail(mutated(docs, "DaemonSet", surge_one)))
        res.check("negative: invariants reject a DaemonSet without POD_NAME",
                  lambda: invariants_fail(mutated(docs, "DaemonSet", no_pod_name)))
        res.check("negative: invariants reject a Role without pods patch",
                  lambda: invariants_fail(mutated(docs, "Role", no_pod_patch)))
        res.check("negative: invariants reject a privileged base",
                  lambda: invariants_fail(mutated(docs, "DaemonSet", privileged_base)))

        # The agent's own configuration parser.
        if a.clockmesh:
            ds, cm = one(docs, "DaemonSet"), one(docs, "ConfigMap")
            conf = tmp / "config.toml"
            conf.write_text(cm["data"]["config.toml"])
            res.check("clockmesh config reads every key of the ConfigMap's config.toml",
                      lambda: check_agent_file(a.clockmesh, cm, conf))
            res.check("clockmesh config accepts and reads every CLOCKMESH_* variable of the DaemonSet",
                      lambda: check_agent_env(a.clockmesh, ds, cm, conf))
        else:
            print("SKIP  no clockmesh binary: configuration parser checks not run")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"{res.passed} passed, {res.failed} failed")
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())
